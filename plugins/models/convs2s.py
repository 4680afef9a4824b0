"""The convolutional seq2seq model of exercise 26.4 of seed 000 (Gehring et al. 2017, arXiv 1705.03122).

Token + learned position embeddings; GLU convolutions with residuals scaled by sqrt(0.5); one
dot-product attention per decoder layer whose keys are the encoder's ``conved`` and values its
``combined``. The decoder convolutions are causal, so the step graph only needs each layer's
last ``kernel_size - 1`` inputs: one fixed-size rolling window per layer, stacked into one
state tensor, makes every step cost the same whatever the target length.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from s2s_deploy.modeling.contract import Seq2SeqModel, StepOutput
from s2s_deploy_plugins.convs2s import ConvS2SConfig

SCALE = math.sqrt(0.5)


def _linear(in_features: int, out_features: int, dropout: float = 0.0) -> nn.Linear:
    """The paper's init (section 3.5): keeps activation variance when the input is dropped out."""
    layer = nn.Linear(in_features, out_features)
    nn.init.normal_(layer.weight, std=math.sqrt((1 - dropout) / in_features))
    nn.init.zeros_(layer.bias)
    return layer


def _glu_conv(channels: int, kernel_size: int, dropout: float) -> nn.Conv1d:
    """Twice the channels for the GLU gate; the factor 4 compensates GLU halving the variance."""
    conv = nn.Conv1d(channels, 2 * channels, kernel_size)
    nn.init.normal_(conv.weight, std=math.sqrt(4 * (1 - dropout) / (kernel_size * channels)))
    nn.init.zeros_(conv.bias)
    return conv


def _embedding(num: int, dim: int) -> nn.Embedding:
    embedding = nn.Embedding(num, dim)
    nn.init.normal_(embedding.weight, std=0.1)
    return embedding


def conv_glu(conv: nn.Conv1d, window: Tensor) -> Tensor:
    """``(B, T + k - 1, hid)`` already padded -> ``(B, T, hid)``."""
    return F.glu(conv(window.transpose(1, 2)), dim=1).transpose(1, 2)


class Encoder(nn.Module):
    def __init__(self, cfg: ConvS2SConfig, vocab_size: int) -> None:
        super().__init__()
        self.tok_embedding = _embedding(vocab_size, cfg.emb_dim)
        self.pos_embedding = _embedding(cfg.max_positions, cfg.emb_dim)
        self.emb2hid = _linear(cfg.emb_dim, cfg.hid_dim, cfg.dropout)
        self.hid2emb = _linear(cfg.hid_dim, cfg.emb_dim)
        self.convs = nn.ModuleList(
            _glu_conv(cfg.hid_dim, cfg.kernel_size, cfg.dropout) for _ in range(cfg.encoder_layers)
        )
        self.pad = (cfg.kernel_size - 1) // 2
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, src: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
        """Returns ``conved`` and ``combined``, both ``(B, S, emb)``; ``valid`` is ``(B, S, 1)``."""
        positions = torch.arange(src.shape[1], device=src.device)
        embedded = self.dropout(self.tok_embedding(src) + self.pos_embedding(positions))
        conv_input = self.emb2hid(embedded)
        for conv in self.convs:
            # Zeroing padding before every convolution keeps it out of the real positions'
            # receptive fields, so a padded sentence encodes exactly as it would alone.
            x = self.dropout(conv_input * valid)
            conved = conv_glu(conv, F.pad(x, (0, 0, self.pad, self.pad)))
            conv_input = (conved + conv_input) * SCALE
        conved = self.hid2emb(conv_input)
        combined = (conved + embedded) * SCALE
        return conved, combined


class DecoderLayer(nn.Module):
    """A causal GLU convolution followed by its own attention over the source."""

    def __init__(self, cfg: ConvS2SConfig) -> None:
        super().__init__()
        self.conv = _glu_conv(cfg.hid_dim, cfg.kernel_size, cfg.dropout)
        self.attn_hid2emb = _linear(cfg.hid_dim, cfg.emb_dim)
        self.attn_emb2hid = _linear(cfg.emb_dim, cfg.hid_dim)

    def forward(
        self, window: Tensor, conv_input: Tensor, embedded: Tensor, memory: dict[str, Tensor]
    ) -> tuple[Tensor, Tensor]:
        """``window`` is ``conv_input`` (B, T, hid) with its k-1 previous inputs prepended.

        Returns the layer output ``(B, T, hid)`` and attention weights ``(B, T, S)``.
        """
        conved = conv_glu(self.conv, window)
        query = (self.attn_hid2emb(conved) + embedded) * SCALE
        energy = query @ memory["conved"].transpose(1, 2) + memory["src_bias"]
        weights = torch.softmax(energy, dim=-1)
        # Section 3.4: a weighted sum of m vectors shrinks their variance; m * sqrt(1/m) restores it.
        valid_count = (memory["src_bias"] == 0).sum(dim=-1, keepdim=True).to(weights.dtype)
        attended = (weights @ memory["combined"]) * valid_count.sqrt()
        conved = (conved + self.attn_emb2hid(attended)) * SCALE
        return (conved + conv_input) * SCALE, weights


class ConvS2S(Seq2SeqModel):
    def __init__(self, cfg: ConvS2SConfig, src_vocab_size: int, tgt_vocab_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg, src_vocab_size)
        self.tok_embedding = _embedding(tgt_vocab_size, cfg.emb_dim)
        self.pos_embedding = _embedding(cfg.max_positions, cfg.emb_dim)
        self.emb2hid = _linear(cfg.emb_dim, cfg.hid_dim, cfg.dropout)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        self.hid2emb = _linear(cfg.hid_dim, cfg.emb_dim)
        self.output = _linear(cfg.emb_dim, tgt_vocab_size, cfg.dropout)
        self.dropout = nn.Dropout(cfg.dropout)

    def encode(self, src: Tensor, src_len: Tensor) -> dict[str, Tensor]:
        valid = torch.arange(src.shape[1], device=src.device)[None, :] < src_len[:, None]
        conved, combined = self.encoder(src, valid[:, :, None].to(torch.float32))
        bias = torch.zeros(valid.shape, dtype=torch.float32, device=src.device)
        bias = bias.masked_fill(~valid, torch.finfo(torch.float32).min)[:, None, :]
        return {"conved": conved, "combined": combined, "src_bias": bias}

    def run_decoder(self, tgt_in: Tensor, memory: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Teacher-forced logits ``(B, T, V)`` and attention ``(B, layers, T, S)``."""
        positions = torch.arange(tgt_in.shape[1], device=tgt_in.device)
        embedded = self.dropout(self.tok_embedding(tgt_in) + self.pos_embedding(positions))
        conv_input = self.emb2hid(embedded)
        attention = []
        for layer in self.layers:
            x = self.dropout(conv_input)
            # Left padding with zeros: what the step's zero-initialised window holds at step 0.
            window = F.pad(x, (0, 0, self.cfg.kernel_size - 1, 0))
            conv_input, weights = layer(window, conv_input, embedded, memory)
            attention.append(weights)
        logits = self.output(self.dropout(self.hid2emb(conv_input)))
        return logits, torch.stack(attention, dim=1)

    def forward(self, src: Tensor, src_len: Tensor, tgt_in: Tensor) -> Tensor:
        return self.run_decoder(tgt_in, self.encode(src, src_len))[0]

    def decode_step(
        self, tokens: Tensor, step: Tensor, memory: dict[str, Tensor], state: dict[str, Tensor]
    ) -> StepOutput:
        position = self.pos_embedding(step.reshape(1))
        embedded = (self.tok_embedding(tokens) + position)[:, None, :]
        conv_input = self.emb2hid(embedded)
        windows, attention = [], []
        for i, layer in enumerate(self.layers):
            window = torch.cat([state["conv_window"][i], conv_input], dim=1)
            conv_input, weights = layer(window, conv_input, embedded, memory)
            windows.append(window[:, 1:, :])
            attention.append(weights[:, 0, :])
        log_probs = torch.log_softmax(self.output(self.hid2emb(conv_input[:, 0, :])), dim=-1)
        new_state = {"conv_window": torch.stack(windows)}
        return StepOutput(log_probs, new_state, torch.stack(attention, dim=1))
