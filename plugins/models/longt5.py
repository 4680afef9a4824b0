"""LongT5's torch modules (the declaration and its docstring of the arithmetic are ``plugins/longt5.py``):
T5's model with the local (and transient-global) encoder attention."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from s2s_deploy.modeling.parts import RelativeBias, RMSNorm, blocks, padding_bias, relative_bucket, three_blocks
from s2s_deploy_plugins.longt5 import LongT5Config
from s2s_deploy_plugins.models.t5 import T5, FFLayer, T5Attention

MASKED = -1e10  # transformers' value for a masked local score (the original implementation's)


class LocalAttention(T5Attention):
    """LongT5LocalAttention: T5's projections and relative table, over blocks."""

    def __init__(self, cfg: LongT5Config, relative_bias: bool) -> None:
        super().__init__(cfg, relative_bias)
        self.block = cfg.local_radius + 1
        offsets = torch.arange(3 * self.block)[None, :] - torch.arange(self.block, 2 * self.block)[:, None]
        self.register_buffer("local_buckets", relative_bucket(
            offsets, True, cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance), persistent=False)
        self.register_buffer("locality", offsets.abs() < self.block, persistent=False)
        if cfg.transient_global:
            if relative_bias:
                self.global_relative_attention_bias = nn.Embedding(cfg.relative_attention_num_buckets, cfg.num_heads)
                self.side = RelativeBias(True, cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance)
            self.global_input_layer_norm = RMSNorm(cfg.d_model, cfg.layer_norm_epsilon)

    def local_bias(self, valid: Tensor) -> Tensor:
        """``(B, N, H, block, 3 * block)``: the relative position bias and the mask, for ``valid``
        ``(B, L)`` (real tokens; ``L`` a whole number of blocks)."""
        blocked = blocks(valid, self.block)
        allowed = blocked[..., :, None] & three_blocks(blocked)[..., None, :] & self.locality
        position = self.relative_attention_bias(self.local_buckets).permute(2, 0, 1)[None, None]
        return position + torch.where(allowed, 0.0, MASKED)[:, :, None]

    def side_bias(self, block_ids: Tensor, present: Tensor, valid: Tensor) -> Tensor:
        """``(B, N, H, block, G)``: each query's bias towards the global blocks: the first layer's
        table by block distance, and ``-1e10`` where the sentence lacks that block (for a real
        token; ``transformers`` lets padding see exactly the absent ones, which changes nothing)."""
        segments = torch.arange(present.shape[1], device=block_ids.device)
        reach = self.side.max_distance
        distance = (segments[None, None, :] - block_ids[..., None]).clamp(-reach, reach)
        bias = self.global_relative_attention_bias(self.side.buckets[distance + reach]).permute(0, 3, 1, 2)
        bias = bias + torch.where(valid[..., None] == present[:, None, :], 0.0, MASKED)[:, None]
        count = block_ids.shape[1] // self.block
        return bias.reshape(bias.shape[0], bias.shape[1], count, self.block, bias.shape[-1]).transpose(1, 2)

    def attend(self, h: Tensor, bias: Tensor, members: Tensor | None = None) -> Tensor:
        """``h`` ``(B, L, d)``, ``L`` a whole number of blocks; ``bias`` from ``local_bias`` (and
        ``side_bias`` after it, with ``members`` ``(B, L, G)``: each token's one-hot global block)."""
        batch, length, _ = h.shape
        heads, dim = self.heads, self.head_dim

        def split(x: Tensor) -> Tensor:
            return blocks(x.reshape(batch, length, heads, dim), self.block)

        q, k, v = split(self.project(0, h)), split(self.project(1, h)), split(self.project(2, h))
        k, v = three_blocks(k), three_blocks(v)
        if members is not None:
            inputs = self.global_input_layer_norm(members.transpose(1, 2) @ h)
            count, block_count = inputs.shape[1], q.shape[1]
            side_k = self.project(1, inputs).reshape(batch, 1, count, heads, dim).expand(-1, block_count, -1, -1, -1)
            side_v = self.project(2, inputs).reshape(batch, 1, count, heads, dim).expand(-1, block_count, -1, -1, -1)
            k, v = torch.cat([k, side_k], dim=2), torch.cat([v, side_v], dim=2)
        weights = torch.softmax(torch.einsum("...qhd,...khd->...hqk", q, k) + bias, dim=-1)
        out = torch.einsum("...hqk,...khd->...qhd", weights, v).reshape(batch, length, heads * dim)
        return self.project(3, out)


class LocalLayer(nn.Module):
    """LongT5LayerLocalSelfAttention, or LongT5LayerTransientGlobalSelfAttention: the same
    attention under another name, with the global parts."""

    def __init__(self, cfg: LongT5Config, relative_bias: bool) -> None:
        super().__init__()
        self.name = "TransientGlobalSelfAttention" if cfg.transient_global else "LocalSelfAttention"
        setattr(self, self.name, LocalAttention(cfg, relative_bias))
        self.layer_norm = RMSNorm(cfg.d_model, cfg.layer_norm_epsilon)

    @property
    def attention(self) -> LocalAttention:
        return getattr(self, self.name)


class EncoderBlock(nn.Module):
    def __init__(self, cfg: LongT5Config, relative_bias: bool) -> None:
        super().__init__()
        self.layer = nn.ModuleList([LocalLayer(cfg, relative_bias), FFLayer(cfg)])

    def forward(self, x: Tensor, bias: Tensor, members: Tensor | None) -> Tensor:
        attention = self.layer[0]
        return self.layer[1](x + attention.attention.attend(attention.layer_norm(x), bias, members))


def global_blocks(valid: Tensor, size: int, count: int) -> tuple[Tensor, Tensor]:
    """Each token's global block ``(B, L)``: ``position // size``, a tail short of a whole block in
    the last whole one, ``-1`` on padding and throughout a sentence shorter than one block; and
    ``(B, count)``, whether the sentence has each block (``count``: at least the whole blocks of
    the batch's longest sentence)."""
    whole = valid.sum(-1, keepdim=True) // size
    blocks = torch.minimum(torch.arange(valid.shape[1], device=valid.device)[None, :] // size, whole - 1)
    present = torch.arange(count, device=valid.device)[None, :] < whole
    return torch.where(valid, blocks, -1), present


class LongT5(T5):
    """T5 with the local encoder: its blocks replaced, its run_encoder rewritten; the decoder,
    ``encode``'s cross K/V and ``decode_step`` are T5's."""

    def __init__(self, cfg: LongT5Config, src_vocab_size: int, tgt_vocab_size: int) -> None:
        super().__init__(cfg, src_vocab_size, tgt_vocab_size)
        self.encoder.block = nn.ModuleList(EncoderBlock(cfg, relative_bias=i == 0) for i in range(cfg.num_layers))
        self.block_len = cfg.local_radius + 1

    def run_encoder(self, src: Tensor, src_len: Tensor) -> tuple[Tensor, Tensor]:
        length = src.shape[1]
        padded = (length + self.block_len - 1) // self.block_len * self.block_len  # a product: exports with L dynamic
        positions = torch.arange(padded, device=src.device)
        valid = positions[None, :] < src_len[:, None]
        x = nn.functional.pad(self.shared(src), [0, 0, 0, padded - length])
        first = self.encoder.block[0].layer[0].attention  # its tables serve every layer
        bias, members = first.local_bias(valid), None
        if self.cfg.transient_global:
            # two more global blocks than the longest sentence can have, absent for every sentence (so
            # masked, and summing nothing): the count is never 0 or 1, which tracing would specialise
            # on, and a masked score adds exp(-1e10) = 0 to the softmax, so the result is unchanged
            count = length // self.cfg.global_block_size + 2
            block_ids, present = global_blocks(valid, self.cfg.global_block_size, count)
            bias = torch.cat([bias, first.side_bias(block_ids, present, valid)], dim=-1)
            members = (block_ids[..., None] == torch.arange(count, device=src.device)).to(x.dtype)
        for block in self.encoder.block:
            x = block(x, bias, members)
        return self.encoder.final_layer_norm(x[:, :length]), padding_bias(src, src_len)
