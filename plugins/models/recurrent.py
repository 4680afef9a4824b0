"""What the recurrent models (gru, lstm, bahdanau, rnnsearch) share: d2l's initialisation, dropout
between layers only, a recurrence that never sees padding (a packed sequence, which the TorchScript
exporter turns into the ONNX RNN's ``sequence_lens``), and the additive mask their attention reads.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


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
