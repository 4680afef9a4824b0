"""The RNN encoder-decoder of seed 004 (d2l ``Seq2SeqEncoder`` / ``Seq2SeqDecoder``).

A multi-layer GRU encodes the source; its final state initialises the decoder GRU, and its
final top-layer state is also the fixed context concatenated to every target embedding.
Padding never reaches the recurrence: the encoder runs on a packed sequence (models/recurrent.py),
so each sentence's final state is the one at its last real token.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from s2s_deploy.modeling.contract import Seq2SeqModel, StepOutput
from s2s_deploy_plugins.gru import GRUConfig
from s2s_deploy_plugins.models.recurrent import layer_dropout, run_packed, xavier_init


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
