"""The 4-layer LSTM sequence-to-sequence model of exercise 26.1 (seed 000).

The encoder's final (h, c) of every layer initialises the decoder (s_0 = h_m), and the
encoder's final top-layer hidden state h_E^4 is concatenated to every target embedding.
The encoder runs on a packed sequence so padding never changes a sentence's final state.

``reverse_source`` (default on) feeds each source sentence to the encoder back to front, as
Sutskever et al. (2014) did for their deep LSTM: the first source words, which the first
target words depend on most, are then the last the encoder reads.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from s2s_deploy.modeling.contract import Seq2SeqModel, StepOutput
from s2s_deploy_plugins.lstm import LSTMConfig
from s2s_deploy_plugins.models.recurrent import layer_dropout, run_packed, xavier_init


def reverse_within_length(src: Tensor, src_len: Tensor) -> Tensor:
    """Each row's first ``src_len`` tokens in reverse order; padding stays where it is."""
    index = src_len[:, None] - 1 - torch.arange(src.shape[1], device=src.device)[None, :]
    return torch.where(index >= 0, src.gather(1, index.clamp(min=0)), src)


def open_forget_gates(lstm: nn.LSTM) -> None:
    """Forget-gate bias 1 (Jozefowicz et al. 2015): with zero biases a 4-layer LSTM forgets its
    input early in training, and on the date task it stalled below 1% exact match for 5 epochs."""
    hidden = lstm.hidden_size
    for name, bias in lstm.named_parameters():
        if name.startswith("bias_ih"):
            with torch.no_grad():
                bias[hidden : 2 * hidden].fill_(1.0)


class LSTMSeq2Seq(Seq2SeqModel):
    def __init__(self, cfg: LSTMConfig, src_vocab_size: int, tgt_vocab_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        dropout = layer_dropout(cfg.num_layers, cfg.dropout)
        self.src_embedding = nn.Embedding(src_vocab_size, cfg.embed_size)
        self.encoder = nn.LSTM(cfg.embed_size, cfg.num_hiddens, cfg.num_layers, dropout=dropout, batch_first=True)
        self.tgt_embedding = nn.Embedding(tgt_vocab_size, cfg.embed_size)
        self.decoder = nn.LSTM(
            cfg.embed_size + cfg.num_hiddens, cfg.num_hiddens, cfg.num_layers, dropout=dropout, batch_first=True
        )
        self.output = nn.Linear(cfg.num_hiddens, tgt_vocab_size)
        xavier_init(self)
        open_forget_gates(self.encoder)
        open_forget_gates(self.decoder)

    def run_decoder(self, tgt: Tensor, context: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Logits ``(B, T, V)`` and the new (h, c) for target tokens ``(B, T)``."""
        x = self.tgt_embedding(tgt)
        x = torch.cat([x, context[:, None, :].expand(-1, x.shape[1], -1)], dim=-1)
        out, (h, c) = self.decoder(x, (h, c))
        return self.output(out), h, c

    def encode(self, src: Tensor, src_len: Tensor) -> dict[str, Tensor]:
        if self.cfg.reverse_source:
            src = reverse_within_length(src, src_len)
        _, (h, c) = run_packed(self.encoder, self.src_embedding(src), src_len)
        return {"context": h[-1], "h": h, "c": c}

    def forward(self, src: Tensor, src_len: Tensor, tgt_in: Tensor) -> Tensor:
        memory = self.encode(src, src_len)
        return self.run_decoder(tgt_in, memory["context"], memory["h"], memory["c"])[0]

    def decode_step(
        self, tokens: Tensor, step: Tensor, memory: dict[str, Tensor], state: dict[str, Tensor]
    ) -> StepOutput:
        logits, h, c = self.run_decoder(tokens[:, None], memory["context"], state["h"], state["c"])
        return StepOutput(torch.log_softmax(logits[:, 0, :], dim=-1), {"h": h, "c": c})
