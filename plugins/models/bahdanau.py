"""The d2l ``Seq2SeqAttentionDecoder`` (seed 004): Bahdanau attention on a GRU encoder-decoder.

The encoder is the d2l ``Seq2SeqEncoder`` of the gru plugin. At each target step the
previous top-layer decoder state queries the encoder outputs with additive attention
w_v^T tanh(W_q q + W_k k), masked by the source lengths, and the context is concatenated to
the target embedding. For deployment the encoder graph also emits the projected keys W_k k,
so the step graph never recomputes them.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from s2s_deploy.modeling.contract import Seq2SeqModel, StepOutput
from s2s_deploy_plugins.bahdanau import BahdanauConfig
from s2s_deploy_plugins.models.recurrent import layer_dropout, padding_bias, run_packed, xavier_init


class AdditiveAttention(nn.Module):
    """a(q, k) = w_v^T tanh(W_q q + W_k k), split so that W_k k is computed once per sentence."""

    def __init__(self, key_size: int, query_size: int, num_hiddens: int, dropout: float) -> None:
        super().__init__()
        self.w_k = nn.Linear(key_size, num_hiddens, bias=False)
        self.w_q = nn.Linear(query_size, num_hiddens, bias=False)
        self.w_v = nn.Linear(num_hiddens, 1, bias=False)
        self.dropout = nn.Dropout(dropout)

    def project_keys(self, keys: Tensor) -> Tensor:
        return self.w_k(keys)

    def forward(self, query: Tensor, projected_keys: Tensor, values: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
        """``query (B, Q)``, keys ``(B, S, A)``, values ``(B, S, D)``, bias ``(B, S)`` ->
        context ``(B, D)`` and weights ``(B, S)``."""
        features = torch.tanh(self.w_q(query)[:, None, :] + projected_keys)
        weights = torch.softmax(self.w_v(features)[:, :, 0] + bias, dim=-1)
        context = torch.bmm(self.dropout(weights)[:, None, :], values)[:, 0, :]
        return context, weights


class BahdanauSeq2Seq(Seq2SeqModel):
    def __init__(self, cfg: BahdanauConfig, src_vocab_size: int, tgt_vocab_size: int) -> None:
        super().__init__()
        dropout = layer_dropout(cfg.num_layers, cfg.dropout)
        self.src_embedding = nn.Embedding(src_vocab_size, cfg.embed_size)
        self.encoder = nn.GRU(cfg.embed_size, cfg.num_hiddens, cfg.num_layers, dropout=dropout, batch_first=True)
        self.attention = AdditiveAttention(cfg.num_hiddens, cfg.num_hiddens, cfg.num_hiddens, cfg.dropout)
        self.tgt_embedding = nn.Embedding(tgt_vocab_size, cfg.embed_size)
        self.decoder = nn.GRU(
            cfg.num_hiddens + cfg.embed_size, cfg.num_hiddens, cfg.num_layers, dropout=dropout, batch_first=True
        )
        self.output = nn.Linear(cfg.num_hiddens, tgt_vocab_size)
        xavier_init(self)

    def step(self, embedded: Tensor, memory: dict[str, Tensor], h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One target position: embedding ``(B, E)`` -> top-layer output ``(B, H)``, new state, weights."""
        context, weights = self.attention(h[-1], memory["enc_keys"], memory["enc_outputs"], memory["src_bias"])
        out, h = self.decoder(torch.cat([context, embedded], dim=-1)[:, None, :], h)
        return out[:, 0, :], h, weights

    def encode(self, src: Tensor, src_len: Tensor) -> dict[str, Tensor]:
        outputs, h = run_packed(self.encoder, self.src_embedding(src), src_len)
        return {
            "enc_outputs": outputs,
            "enc_keys": self.attention.project_keys(outputs),
            "src_bias": padding_bias(src, src_len),
            "h": h,
        }

    def forward(self, src: Tensor, src_len: Tensor, tgt_in: Tensor) -> Tensor:
        memory = self.encode(src, src_len)
        h = memory["h"]
        embedded = self.tgt_embedding(tgt_in)
        outputs = []
        for t in range(embedded.shape[1]):
            out, h, _ = self.step(embedded[:, t, :], memory, h)
            outputs.append(out)
        return self.output(torch.stack(outputs, dim=1))

    def decode_step(
        self, tokens: Tensor, step: Tensor, memory: dict[str, Tensor], state: dict[str, Tensor]
    ) -> StepOutput:
        out, h, weights = self.step(self.tgt_embedding(tokens), memory, state["h"])
        return StepOutput(torch.log_softmax(self.output(out), dim=-1), {"h": h}, weights[:, None, :])
