"""RNNsearch (exercise 26.2 of seed 000): BiLSTM encoder, LSTM decoder with additive attention.

Encoder: h_j = [h_j^fwd; h_j^bwd], packed so that the backward direction starts at each
sentence's last real token. Attention: e_ij = v^T tanh(W_s s_{i-1} + W_h h_j), masked by the
source lengths, with s_{i-1} the previous top-layer decoder state; the context c_i is
concatenated to the target embedding. The encoder graph emits W_h h_j once per sentence.

Bridge (the decoder's initial state), for every layer l with its own weights:
    h_0^l = tanh(W_b^l [h_fwd_final^l; h_bwd_first^l] + b^l)
    c_0^l = W_c^l [c_fwd_final^l; c_bwd_first^l] + b_c^l      (no tanh: cells are unbounded)
where *_fwd_final is the forward state at the last real token and *_bwd_first the backward
state at the first token, i.e. each direction's summary of the whole sentence.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from s2s_deploy.modeling.contract import Seq2SeqModel, StepOutput
from s2s_deploy_plugins.models.bahdanau import AdditiveAttention
from s2s_deploy_plugins.models.recurrent import layer_dropout, padding_bias, run_packed, xavier_init
from s2s_deploy_plugins.rnnsearch import RNNSearchConfig


class Bridge(nn.Module):
    """Maps the BiLSTM's final (h, c) ``(2*layers, B, He)`` to the decoder's ``(layers, B, Hd)``."""

    def __init__(self, num_layers: int, encoder_hiddens: int, decoder_hiddens: int) -> None:
        super().__init__()
        self.num_layers = num_layers
        self.h = nn.ModuleList(nn.Linear(2 * encoder_hiddens, decoder_hiddens) for _ in range(num_layers))
        self.c = nn.ModuleList(nn.Linear(2 * encoder_hiddens, decoder_hiddens) for _ in range(num_layers))

    def per_layer(self, state: Tensor) -> Tensor:
        """PyTorch orders the directions layer-major; join them to ``(layers, B, 2*He)``."""
        state = state.reshape(self.num_layers, 2, -1, state.shape[-1])
        return torch.cat([state[:, 0], state[:, 1]], dim=-1)

    def forward(self, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
        h, c = self.per_layer(h), self.per_layer(c)
        h0 = torch.stack([torch.tanh(linear(h[i])) for i, linear in enumerate(self.h)])
        c0 = torch.stack([linear(c[i]) for i, linear in enumerate(self.c)])
        return h0, c0


class RNNSearch(Seq2SeqModel):
    def __init__(self, cfg: RNNSearchConfig, src_vocab_size: int, tgt_vocab_size: int) -> None:
        super().__init__()
        dropout = layer_dropout(cfg.num_layers, cfg.dropout)
        annotation_size = 2 * cfg.encoder_hiddens
        self.src_embedding = nn.Embedding(src_vocab_size, cfg.embed_size)
        self.encoder = nn.LSTM(
            cfg.embed_size, cfg.encoder_hiddens, cfg.num_layers,
            dropout=dropout, batch_first=True, bidirectional=True,
        )
        self.bridge = Bridge(cfg.num_layers, cfg.encoder_hiddens, cfg.decoder_hiddens)
        self.attention = AdditiveAttention(annotation_size, cfg.decoder_hiddens, cfg.attention_hiddens, cfg.dropout)
        self.tgt_embedding = nn.Embedding(tgt_vocab_size, cfg.embed_size)
        self.decoder = nn.LSTM(
            cfg.embed_size + annotation_size, cfg.decoder_hiddens, cfg.num_layers, dropout=dropout, batch_first=True
        )
        self.output = nn.Linear(cfg.decoder_hiddens, tgt_vocab_size)
        xavier_init(self)

    def step(
        self, embedded: Tensor, memory: dict[str, Tensor], h: Tensor, c: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One target position: embedding ``(B, E)`` -> top-layer output ``(B, Hd)``, new (h, c), weights."""
        context, weights = self.attention(h[-1], memory["enc_keys"], memory["enc_outputs"], memory["src_bias"])
        out, (h, c) = self.decoder(torch.cat([embedded, context], dim=-1)[:, None, :], (h, c))
        return out[:, 0, :], h, c, weights

    def encode(self, src: Tensor, src_len: Tensor) -> dict[str, Tensor]:
        outputs, (h, c) = run_packed(self.encoder, self.src_embedding(src), src_len)
        h0, c0 = self.bridge(h, c)
        return {
            "enc_outputs": outputs,
            "enc_keys": self.attention.project_keys(outputs),
            "src_bias": padding_bias(src, src_len),
            "h": h0,
            "c": c0,
        }

    def forward(self, src: Tensor, src_len: Tensor, tgt_in: Tensor) -> Tensor:
        memory = self.encode(src, src_len)
        h, c = memory["h"], memory["c"]
        embedded = self.tgt_embedding(tgt_in)
        outputs = []
        for t in range(embedded.shape[1]):
            out, h, c, _ = self.step(embedded[:, t, :], memory, h, c)
            outputs.append(out)
        return self.output(torch.stack(outputs, dim=1))

    def decode_step(
        self, tokens: Tensor, step: Tensor, memory: dict[str, Tensor], state: dict[str, Tensor]
    ) -> StepOutput:
        out, h, c, weights = self.step(self.tgt_embedding(tokens), memory, state["h"], state["c"])
        return StepOutput(torch.log_softmax(self.output(out), dim=-1), {"h": h, "c": c}, weights[:, None, :])
