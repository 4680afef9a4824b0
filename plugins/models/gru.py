"""The RNN encoder-decoder of seed 004 (d2l ``Seq2SeqEncoder`` / ``Seq2SeqDecoder``).

A multi-layer GRU encodes the source; its final state initialises the decoder GRU, and its
final top-layer state is also the fixed context concatenated to every target embedding.
Padding never reaches the recurrence: the encoder runs on a packed sequence, so each
sentence's final state is the one at its last real token. The helpers below are shared by
the other recurrent plugins (lstm, bahdanau, rnnsearch).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from s2s_deploy.modeling.contract import Seq2SeqModel, StepOutput
from s2s_deploy_plugins.gru import GRUConfig


def layer_dropout(num_layers: int, dropout: float) -> float:
    """PyTorch RNNs apply dropout only between layers and warn when there is none to apply."""
    return dropout if num_layers > 1 else 0.0


def xavier_init(model: nn.Module) -> None:
    """d2l's initialisation: xavier-uniform for every Linear and recurrent weight matrix."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
        elif isinstance(module, nn.RNNBase):
            for name, param in module.named_parameters():
                if name.startswith("weight"):
                    nn.init.xavier_uniform_(param)


def run_packed(rnn: nn.RNNBase, x: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor | tuple[Tensor, Tensor]]:
    """Runs a batch-first ``rnn`` over the real tokens of each sentence only.

    Returns outputs ``(B, S, D*H)`` with zeros on padding, and the final state taken at each
    sentence's last real token (a backward direction starts there). The TorchScript exporter
    turns the packing into the ONNX RNN ``sequence_lens`` input, so ORT does the same.
    """
    packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
    out, state = rnn(packed)
    out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
    return out, state


def padding_bias(src: Tensor, src_len: Tensor) -> Tensor:
    """``(B, S)`` additive attention mask: 0 on real tokens, the float minimum on padding."""
    valid = torch.arange(src.shape[1], device=src.device)[None, :] < src_len[:, None]
    bias = torch.zeros(valid.shape, dtype=torch.float32, device=src.device)
    return bias.masked_fill(~valid, torch.finfo(torch.float32).min)


class GRUSeq2Seq(Seq2SeqModel):
    def __init__(self, cfg: GRUConfig, src_vocab_size: int, tgt_vocab_size: int) -> None:
        super().__init__()
        dropout = layer_dropout(cfg.num_layers, cfg.dropout)
        self.src_embedding = nn.Embedding(src_vocab_size, cfg.embed_size)
        self.encoder = nn.GRU(cfg.embed_size, cfg.num_hiddens, cfg.num_layers, dropout=dropout, batch_first=True)
        self.tgt_embedding = nn.Embedding(tgt_vocab_size, cfg.embed_size)
        self.decoder = nn.GRU(
            cfg.embed_size + cfg.num_hiddens, cfg.num_hiddens, cfg.num_layers, dropout=dropout, batch_first=True
        )
        self.output = nn.Linear(cfg.num_hiddens, tgt_vocab_size)
        xavier_init(self)

    def run_decoder(self, tgt: Tensor, context: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """Logits ``(B, T, V)`` and the new state for target tokens ``(B, T)``."""
        x = self.tgt_embedding(tgt)
        x = torch.cat([x, context[:, None, :].expand(-1, x.shape[1], -1)], dim=-1)
        out, h = self.decoder(x, h)
        return self.output(out), h

    def encode(self, src: Tensor, src_len: Tensor) -> dict[str, Tensor]:
        _, h = run_packed(self.encoder, self.src_embedding(src), src_len)
        return {"context": h[-1], "h": h}

    def forward(self, src: Tensor, src_len: Tensor, tgt_in: Tensor) -> Tensor:
        memory = self.encode(src, src_len)
        return self.run_decoder(tgt_in, memory["context"], memory["h"])[0]

    def decode_step(
        self, tokens: Tensor, step: Tensor, memory: dict[str, Tensor], state: dict[str, Tensor]
    ) -> StepOutput:
        logits, h = self.run_decoder(tokens[:, None], memory["context"], state["h"])
        return StepOutput(torch.log_softmax(logits[:, 0, :], dim=-1), {"h": h})
