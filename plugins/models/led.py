"""LED's torch modules (the declaration and its docstring of the arithmetic are ``plugins/led.py``):
``EncoderDecoder`` with the encoder's self-attention replaced by the sliding window, computed block
by block, and the encoder's own position table."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from s2s_deploy.modeling.parts import EncoderDecoder, LearnedPositions, blocks, padding_bias, three_blocks
from s2s_deploy_plugins.led import LEDConfig


class LongformerProjections(nn.Module):
    """``longformer_self_attn``: the local query, key and value (``transformers``' names)."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.query = nn.Linear(d_model, d_model)
        self.key = nn.Linear(d_model, d_model)
        self.value = nn.Linear(d_model, d_model)


class SlidingWindowAttention(nn.Module):
    """LEDEncoderAttention without global tokens, called as ``parts.Attention`` is (so
    ``parts.EncoderLayer`` runs it): each token sees ``reach`` tokens either side."""

    def __init__(self, cfg: LEDConfig, window: int) -> None:
        super().__init__()
        self.longformer_self_attn = LongformerProjections(cfg.d_model)
        self.output = nn.Linear(cfg.d_model, cfg.d_model)
        self.heads = cfg.encoder_attention_heads
        self.head_dim = cfg.d_model // self.heads
        self.reach = window // 2

    def forward(self, x: Tensor, memory: Tensor, bias: Tensor) -> Tensor:
        """``x`` ``(B, L, d)``, ``L`` a whole number of ``reach`` blocks (``memory`` is ``x``);
        ``bias`` ``(B, N, 1, reach, 3 * reach)`` from ``window_bias``."""
        batch, length, _ = x.shape
        heads, dim, projections = self.heads, self.head_dim, self.longformer_self_attn

        def split(t: Tensor) -> Tensor:
            return blocks(t.reshape(batch, length, heads, dim), self.reach)

        q = split(projections.query(x) / math.sqrt(dim))  # transformers scales the query itself
        k, v = three_blocks(split(projections.key(x))), three_blocks(split(projections.value(x)))
        weights = torch.softmax(torch.einsum("...qhd,...khd->...hqk", q, k) + bias, dim=-1)
        return self.output(torch.einsum("...hqk,...khd->...qhd", weights, v).reshape(batch, length, heads * dim))


def window_bias(valid: Tensor, reach: int) -> Tensor:
    """``(B, N, 1, reach, 3 * reach)``: 0 where a query block's key (its own block and both
    neighbours') is a real token at most ``reach`` away, the float minimum elsewhere, added once."""
    offsets = torch.arange(3 * reach, device=valid.device)[None, :] - torch.arange(reach, 2 * reach,
                                                                                   device=valid.device)[:, None]
    allowed = three_blocks(blocks(valid, reach))[..., None, :] & (offsets.abs() <= reach)
    return torch.where(allowed, 0.0, torch.finfo(torch.float32).min)[:, :, None]


class LED(EncoderDecoder):
    """BART's model (``EncoderDecoder``): the decoder, ``encode``'s cross K/V and ``decode_step``
    are its own; the encoder's attention, position table and ``run_encoder`` are LED's."""

    def __init__(self, cfg: LEDConfig, src_vocab_size: int, tgt_vocab_size: int) -> None:
        super().__init__(cfg, src_vocab_size, tgt_vocab_size)
        self.encoder.embed_positions = LearnedPositions(cfg.max_encoder_position_embeddings, cfg.d_model, 0)
        for layer, window in zip(self.encoder.layers, cfg.attention_window, strict=True):
            layer.self_attn = SlidingWindowAttention(cfg, window)
        self.widest = max(cfg.attention_window) // 2  # every layer's reach divides it

    def run_encoder(self, src: Tensor, src_len: Tensor) -> tuple[Tensor, Tensor]:
        stack, length = self.encoder, src.shape[1]
        x = stack.embed(self.table(stack)(src), stack.positions(torch.arange(length, device=src.device)[None, :], src))
        padded = (length + self.widest - 1) // self.widest * self.widest  # a product: exports with L dynamic
        x = nn.functional.pad(x, [0, 0, 0, padded - length])
        valid = torch.arange(padded, device=src.device)[None, :] < src_len[:, None]
        biases = {reach: window_bias(valid, reach) for reach in {layer.self_attn.reach for layer in stack.layers}}
        for layer in stack.layers:
            x = layer(x, biases[layer.self_attn.reach])
        return stack.finish(x[:, :length]), padding_bias(src, src_len)
