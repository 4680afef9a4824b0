"""The parts every pre/post-norm encoder-decoder shares, for plugins to compose (torch).

A plugin that loads a Hugging Face family names its modules as ``transformers`` does, so a state
dict maps across by name; these parts take the names they need as arguments. What is here:

* **Specs and names** are declarations, torch-free (format/specs.py, which the contract
  re-exports): ``layer_name(kind, i)`` names one layer's tensor (``self_k0``, ``cross_v1``);
  ``self_attention_cache`` the self-attention caches, ``cross_memory_specs`` the encoder's
  ``src_bias`` and cross-attention K/V. ``Seq2SeqModel.decode_step`` reads and writes exactly these names.
* **Masks.** ``padding_bias(src, src_len)`` ``(B, 1, 1, S)`` and ``causal_bias(length)`` ``(T, T)``,
  additive, with the float minimum where a key is hidden (Hugging Face's mask value).
* **Local attention.** ``blocks`` cuts a padded sequence into blocks, ``three_blocks`` gives each
  block its neighbours': the keys of a query that sees at most one block's length either side
  (LongT5's local attention, LED's sliding window), ``O(L · block)`` instead of ``O(L²)``.
* **Attention.** ``Attention``: multi-head attention with or without projection biases, scores
  scaled by ``head_dim**-0.5`` or not, any head size; ``forward`` for whole sequences,
  ``cross_memory`` for the encoder-computed cross K/V, ``step_self`` (one query against a growing
  cache, an optional additive bias) and ``step_cross`` for one decoder step; ``steps_self`` and
  ``steps_cross`` for k positions at once (``decode_steps``, the k-position step).
* **Norms, residuals, activations.** ``residual(pre_norm, x, norm, fn)`` places the norm before
  ``fn`` or after the sum; ``RMSNorm`` (no mean, no bias); ``ACTIVATIONS`` by Hugging Face's
  ``activation_function`` names.
* **Positions.** ``sinusoids_split`` (sines in the first half, cosines in the second,
  ``10000 ** (2 * (j // 2) / d)``, from position 0), ``sinusoids_tensor2tensor`` (the same halves
  with ``exp(-j * log(10000) / (d/2 - 1))``; positions start after a padding id, whose row is
  zero, or at 0 for every token), learned tables (``LearnedPositions``, read at ``index + offset``), and the relative
  position bias of ``relative_bucket`` / ``RelativeBias`` (a bucket per distance, a table per
  stack or per layer). Embedding scales (``sqrt(d)`` or 1) are a plain factor at the call site.
* **A whole model.** ``EncoderDecoder``, built from an ``EncoderDecoderConfig``: the layer stack
  most families are (learned or sinusoidal positions, optional embedding LayerNorm, pre- or
  post-norm layers, attention projections with or without biases, optional final LayerNorms, one
  shared or two embeddings, tied or separate output projection, a logits bias). Its config and
  ``EncoderDecoderPlugin`` (specs, limits, Hugging Face weight mapping) are declarations,
  torch-free: ``architecture/encoder_decoder.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from s2s_deploy.architecture.encoder_decoder import EncoderDecoderConfig
from s2s_deploy.errors import CheckpointError
from s2s_deploy.modeling.contract import Seq2SeqModel, StepOutput, layer_name

SQRT_2 = math.sqrt(2.0)


def padding_bias(src: Tensor, src_len: Tensor) -> Tensor:
    """``(B, 1, 1, S)``: 0 on real tokens, the float minimum on padding (Hugging Face's mask value)."""
    valid = torch.arange(src.shape[1], device=src.device)[None, :] < src_len[:, None]
    bias = torch.zeros(valid.shape, dtype=torch.float32, device=src.device)
    return bias.masked_fill(~valid, torch.finfo(torch.float32).min)[:, None, None, :]


def blocks(x: Tensor, block: int) -> Tensor:
    """``(B, L, ...)`` → ``(B, L // block, block, ...)``; ``L`` is already a multiple of ``block``."""
    return x.reshape(x.shape[0], x.shape[1] // block, block, *x.shape[2:])


def three_blocks(x: Tensor) -> Tensor:
    """``(B, N, block, ...)`` → ``(B, N, 3 * block, ...)``: each block with its left and right
    neighbours (zeros past either end), the keys a local attention of reach ``block`` needs."""
    pad = [0, 0] * (x.dim() - 2) + [1, 1]
    padded = nn.functional.pad(x, pad)
    count = x.shape[1]
    return torch.cat([padded[:, i : i + count] for i in range(3)], dim=2)


def causal_bias(length: int, device: torch.device) -> Tensor:
    """``(T, T)``: the float minimum above the diagonal, so a position sees itself and earlier ones."""
    return torch.full((length, length), torch.finfo(torch.float32).min, device=device).triu(1)


def causal_tail(queries: int, keys: int, device: torch.device) -> Tensor:
    """``(queries, keys)``: the last ``queries`` rows of ``causal_bias(keys)``, the mask of k new
    positions over a cache that already holds ``keys - queries`` (a k-position decoder step)."""
    allowed = torch.arange(keys, device=device)[None, :] <= (torch.arange(queries, device=device)[:, None]
                                                              + (keys - queries))
    bias = torch.zeros(allowed.shape, dtype=torch.float32, device=device)
    return bias.masked_fill(~allowed, torch.finfo(torch.float32).min)


def erf_gelu(x: Tensor) -> Tensor:
    """GELU written in the order ONNX Runtime fuses into one ``Gelu`` node: the exporter's own
    decomposition of ``nn.functional.gelu`` scales ``1 + erf`` by 0.5 first, which no fusion
    pattern matches, and leaves five nodes per layer."""
    return x * (1.0 + torch.erf(x / SQRT_2)) * 0.5


def tanh_gelu(x: Tensor) -> Tensor:
    return nn.functional.gelu(x, approximate="tanh")


ACTIVATIONS: Mapping[str, Callable[[Tensor], Tensor]] = {
    "gelu": erf_gelu,
    "gelu_new": tanh_gelu,
    "gelu_pytorch_tanh": tanh_gelu,
    "relu": torch.relu,
    "swish": nn.functional.silu,
    "silu": nn.functional.silu,
    "tanh": torch.tanh,
}
"""Hugging Face's ``activation_function`` names, each as ``transformers`` computes it."""


def activation(name: str) -> Callable[[Tensor], Tensor]:
    if name not in ACTIVATIONS:
        raise CheckpointError(f"activation {name!r} is not supported; known: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x²) + eps) * weight`` (T5's LayerNorm: no mean, no bias)."""

    def __init__(self, d_model: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def residual(pre_norm: bool, x: Tensor, norm: nn.Module, fn: Callable[[Tensor], Any]) -> Any:
    """``x + fn(...)`` with the norm before ``fn`` (pre-norm) or after the sum (post-norm);
    extra outputs of ``fn`` (caches, attention weights) pass through."""
    out = fn(norm(x) if pre_norm else x)
    main, rest = (out[0], out[1:]) if isinstance(out, tuple) else (out, ())
    y = x + main if pre_norm else norm(x + main)
    return (y, *rest) if rest else y


PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")


class Attention(nn.Module):
    """Multi-head attention, projections named ``names`` (query, key, value, output) so a Hugging
    Face state dict loads by name. ``scaled``: scores times ``head_dim**-0.5`` (BART's layout);
    without it, as T5, the projections carry the scale. The step functions keep the query length
    at 1, so every head split or merge is a Reshape."""

    def __init__(self, d_model: int, heads: int, head_dim: int | None = None, bias: bool = True,
                 scaled: bool = True, names: tuple[str, str, str, str] = PROJECTIONS) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = head_dim if head_dim is not None else d_model // heads
        self.scaling = self.head_dim**-0.5 if scaled else None
        self.names = names
        inner = heads * self.head_dim
        for name, (fan_in, fan_out) in zip(names, ((d_model, inner),) * 3 + ((inner, d_model),), strict=True):
            setattr(self, name, nn.Linear(fan_in, fan_out, bias=bias))

    def project(self, which: int, x: Tensor) -> Tensor:
        """Projection ``which`` (0 query, 1 key, 2 value, 3 output) of ``x``."""
        return getattr(self, self.names[which])(x)

    def scores(self, q: Tensor, keys: Tensor) -> Tensor:
        """``q @ keys`` (keys already transposed), scaled when the family scales scores."""
        raw = q @ keys
        return raw if self.scaling is None else raw * self.scaling

    def split(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        return x.reshape(batch, length, self.heads, self.head_dim).transpose(1, 2)

    def merge(self, x: Tensor) -> Tensor:
        batch, _, length, _ = x.shape
        return self.project(3, x.transpose(1, 2).reshape(batch, length, self.heads * self.head_dim))

    def forward(self, x: Tensor, memory: Tensor, bias: Tensor) -> Tensor:
        """Whole sequences: queries from ``x``, keys and values from ``memory``, ``bias`` added to
        the scores (padding, causal mask, relative positions)."""
        q = self.split(self.project(0, x))
        k, v = self.split(self.project(1, memory)), self.split(self.project(2, memory))
        weights = torch.softmax(self.scores(q, k.transpose(-1, -2)) + bias, dim=-1)
        return self.merge(weights @ v)

    def cross_memory(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Keys ``(B, H, head_dim, S)``, transposed once per sentence so the step's ``q @ k`` needs
        no Transpose; values ``(B, H, S, head_dim)``."""
        batch, length, _ = x.shape
        keys = self.project(1, x).reshape(batch, length, self.heads, self.head_dim).permute(0, 2, 3, 1)
        return keys, self.split(self.project(2, x))

    def one(self, x: Tensor) -> Tensor:
        """``(B, 1, d)`` → ``(B, H, 1, head_dim)`` by a Reshape."""
        return x.reshape(-1, self.heads, 1, self.head_dim)

    def merge_one(self, x: Tensor) -> Tensor:
        return self.project(3, x.reshape(-1, 1, self.heads * self.head_dim))

    def step_self(self, x: Tensor, past_k: Tensor, past_v: Tensor,
                  bias: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """One query ``(B, 1, d)`` against the caches ``(B, H, T, head_dim)`` plus itself: the
        output and both caches grown by one. ``bias`` ``(1, H, 1, T+1)``: relative positions."""
        keys = torch.cat([past_k, self.one(self.project(1, x))], dim=2)
        values = torch.cat([past_v, self.one(self.project(2, x))], dim=2)
        scores = self.scores(self.one(self.project(0, x)), keys.transpose(-1, -2))
        weights = torch.softmax(scores if bias is None else scores + bias, dim=-1)
        return self.merge_one(weights @ values), keys, values

    def steps_self(self, x: Tensor, past_k: Tensor, past_v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """k queries ``(B, k, d)`` against the caches ``(B, H, T, head_dim)`` plus themselves, each
        seeing the past and the new positions up to its own: ``step_self`` k times, at once."""
        keys = torch.cat([past_k, self.split(self.project(1, x))], dim=2)
        values = torch.cat([past_v, self.split(self.project(2, x))], dim=2)
        scores = self.scores(self.split(self.project(0, x)), keys.transpose(-1, -2))
        weights = torch.softmax(scores + causal_tail(x.shape[1], keys.shape[2], x.device), dim=-1)
        return self.merge(weights @ values), keys, values

    def steps_cross(self, x: Tensor, keys: Tensor, values: Tensor, bias: Tensor) -> Tensor:
        """k queries ``(B, k, d)`` per row against ``cross_memory`` (one memory row per row)."""
        weights = torch.softmax(self.scores(self.split(self.project(0, x)), keys) + bias, dim=-1)
        return self.merge(weights @ values)

    def step_cross(self, x: Tensor, keys: Tensor, values: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
        """One query per row against ``cross_memory``: the output and the weights ``(B, H, 1, S)``.
        The memory may hold one row per sentence for rows grouped sentence-major (beams): each
        sentence's queries then share one product with its keys (``memory_per_sentence``)."""
        queries = grouped_queries(self.project(0, x), keys.shape[0], self.heads, self.head_dim)
        weights = torch.softmax(self.scores(queries, keys) + bias, dim=-1)
        return self.merge_one(ungrouped(weights @ values)), ungrouped(weights)


def grouped_queries(x: Tensor, sentences: int, heads: int, head_dim: int) -> Tensor:
    """``(rows, 1, heads * head_dim)`` queries → ``(sentences, heads, rows / sentences, head_dim)``:
    a sentence's rows (its beams) become the query positions of one attention over its memory."""
    return x.reshape(sentences, -1, heads, head_dim).transpose(1, 2)


def ungrouped(x: Tensor) -> Tensor:
    """``(sentences, heads, group, n)`` → ``(rows, heads, 1, n)``: ``grouped_queries`` undone."""
    return x.transpose(1, 2).reshape(-1, x.shape[1], 1, x.shape[3])


def split_denominators(dim: int) -> Tensor:
    """``10000 ** (2 * (j // 2) / dim)``, one per sine, in float64 as Hugging Face computes them."""
    return torch.from_numpy(np.power(10000, 2 * (np.arange(0, dim, 2) // 2) / dim))


def sinusoids_split(positions: Tensor, denominators: Tensor, dim: int) -> Tensor:
    """Rows of the split sinusoid table (sines in the first half, cosines in the second, not
    interleaved) for ``positions``; ``denominators`` from ``split_denominators``. Computed in the
    graph, in float64 then rounded to float32 as Hugging Face does, instead of stored."""
    angles = positions.to(torch.float64)[..., None] / denominators
    return torch.cat((torch.sin(angles), torch.cos(angles[..., : dim // 2])), dim=-1).to(torch.float32)


def tensor2tensor_frequencies(dim: int) -> Tensor:
    """``exp(-j * log(10000) / (dim/2 - 1))`` in float32, as the tensor2tensor-style tables compute them."""
    half = dim // 2
    return torch.exp(torch.arange(half, dtype=torch.int64).float() * -(math.log(10000) / (half - 1)))


def sinusoids_tensor2tensor(positions: Tensor, frequencies: Tensor, dim: int) -> Tensor:
    """Rows of the tensor2tensor-style table (sines then cosines) for ``positions``; the angles in
    float32 as the table's, the sines in float64 rounded to float32 (one rounding, the same in
    PyTorch and ONNX Runtime). An odd ``dim`` ends with a zero column."""
    angles = (positions.to(torch.float32)[..., None] * frequencies).to(torch.float64)
    rows = torch.cat((torch.sin(angles), torch.cos(angles)), dim=-1).to(torch.float32)
    return rows if dim % 2 == 0 else torch.cat((rows, torch.zeros_like(rows[..., :1])), dim=-1)


def relative_bucket(relative_position: Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> Tensor:
    """T5's bucket of a relative position (key minus query), step for step."""
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    scaled = torch.log(relative_position.float() / max_exact) / math.log(max_distance / max_exact)
    if_large = max_exact + (scaled * (num_buckets - max_exact)).to(torch.long)
    if_large = torch.min(if_large, torch.full_like(if_large, num_buckets - 1))
    return buckets + torch.where(is_small, relative_position, if_large)


class RelativeBias(nn.Module):
    """The relative positions of one stack as bucket indices, computed once into an integer table:
    graphs only index it. The bucket is a float ``log`` in Hugging Face; beyond ``max_distance``
    every distance falls in the last bucket, so a table up to ``max_distance`` with the distance
    clamped is exact, and PyTorch and ONNX Runtime cannot round a log differently at a bucket
    edge. The ``(buckets, heads)`` embedding itself lives where the family keeps it (the first
    layer's self-attention, or every layer's); these methods take it as an argument."""

    def __init__(self, bidirectional: bool, num_buckets: int, max_distance: int) -> None:
        super().__init__()
        # encoder: every relative position -max..max; decoder: every distance 0..max (query minus key)
        relative = torch.arange(-max_distance, max_distance + 1) if bidirectional else -torch.arange(max_distance + 1)
        self.register_buffer("buckets", relative_bucket(relative, bidirectional, num_buckets, max_distance),
                             persistent=False)
        self.max_distance = max_distance
        self.bidirectional = bidirectional

    def square(self, table: nn.Embedding, length: int, device: torch.device) -> Tensor:
        """``(1, H, L, L)`` for a whole sequence (decoder: no causal mask added here)."""
        positions = torch.arange(length, device=device)
        if self.bidirectional:
            relative = (positions[None, :] - positions[:, None]).clamp(-self.max_distance, self.max_distance)
            index = self.buckets[relative + self.max_distance]
        else:
            index = self.buckets[(positions[:, None] - positions[None, :]).clamp(0, self.max_distance)]
        return table(index).permute(2, 0, 1)[None]

    def step(self, table: nn.Embedding, step: Tensor, keys_length: int, device: torch.device) -> Tensor:
        """``(1, H, 1, T+1)``: decoder position ``step`` against keys ``0..T``."""
        distance = (step - torch.arange(keys_length, device=device)).clamp(0, self.max_distance)
        return table(self.buckets[distance]).transpose(0, 1)[None, :, None, :]


class LearnedPositions(nn.Embedding):
    """A learned table read at ``index + offset`` (BART keeps two spare rows first)."""

    def __init__(self, positions: int, dim: int, offset: int) -> None:
        super().__init__(positions + offset, dim)
        self.offset = offset

    def rows(self, indices: Tensor) -> Tensor:
        # a Gather on the weight's slice, so int8 quantises this table like the token embedding
        return nn.functional.embedding(indices, self.weight[self.offset:])


LEARNED_OFFSET = 2  # BART's learned table: positions are read at index + 2


class EncoderLayer(nn.Module):
    def __init__(self, cfg: EncoderDecoderConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg.d_model, cfg.encoder_attention_heads, bias=cfg.attention_bias)
        self.self_attn_layer_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.fc1 = nn.Linear(cfg.d_model, cfg.encoder_ffn_dim)
        self.fc2 = nn.Linear(cfg.encoder_ffn_dim, cfg.d_model)
        self.final_layer_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.act = activation(cfg.activation_function)
        self.pre_norm = cfg.normalize_before

    def forward(self, x: Tensor, bias: Tensor) -> Tensor:
        x = residual(self.pre_norm, x, self.self_attn_layer_norm, lambda h: self.self_attn(h, h, bias))
        return residual(self.pre_norm, x, self.final_layer_norm, lambda h: self.fc2(self.act(self.fc1(h))))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: EncoderDecoderConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg.d_model, cfg.decoder_attention_heads, bias=cfg.attention_bias)
        self.self_attn_layer_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.encoder_attn = Attention(cfg.d_model, cfg.decoder_attention_heads, bias=cfg.attention_bias)
        self.encoder_attn_layer_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.fc1 = nn.Linear(cfg.d_model, cfg.decoder_ffn_dim)
        self.fc2 = nn.Linear(cfg.decoder_ffn_dim, cfg.d_model)
        self.final_layer_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.act = activation(cfg.activation_function)
        self.pre_norm = cfg.normalize_before

    def ffn(self, h: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(h)))

    def forward(self, x: Tensor, causal: Tensor, memory: Tensor, bias: Tensor) -> Tensor:
        x = residual(self.pre_norm, x, self.self_attn_layer_norm, lambda h: self.self_attn(h, h, causal))
        x = residual(self.pre_norm, x, self.encoder_attn_layer_norm, lambda h: self.encoder_attn(h, memory, bias))
        return residual(self.pre_norm, x, self.final_layer_norm, self.ffn)

    def step(self, x: Tensor, past_k: Tensor, past_v: Tensor, cross_k: Tensor, cross_v: Tensor,
             bias: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        x, keys, values = residual(self.pre_norm, x, self.self_attn_layer_norm,
                                   lambda h: self.self_attn.step_self(h, past_k, past_v))
        x, weights = residual(self.pre_norm, x, self.encoder_attn_layer_norm,
                              lambda h: self.encoder_attn.step_cross(h, cross_k, cross_v, bias))
        return residual(self.pre_norm, x, self.final_layer_norm, self.ffn), keys, values, weights


    def steps(self, x: Tensor, past_k: Tensor, past_v: Tensor, cross_k: Tensor, cross_v: Tensor,
              bias: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``step`` over k positions ``(B, k, d)``: the output and the caches grown by k."""
        x, keys, values = residual(self.pre_norm, x, self.self_attn_layer_norm,
                                   lambda h: self.self_attn.steps_self(h, past_k, past_v))
        x = residual(self.pre_norm, x, self.encoder_attn_layer_norm,
                     lambda h: self.encoder_attn.steps_cross(h, cross_k, cross_v, bias))
        return residual(self.pre_norm, x, self.final_layer_norm, self.ffn), keys, values


class Stack(nn.Module):
    """Positions, the optional embedding LayerNorm, the layers and the optional final LayerNorm."""

    def __init__(self, cfg: EncoderDecoderConfig, layer: type[nn.Module], count: int, decoder: bool,
                 vocab_size: int) -> None:
        super().__init__()
        if not cfg.shared_embeddings:
            self.embed_tokens = nn.Embedding(vocab_size, cfg.d_model)
        if cfg.positions in ("learned", "learned_from_zero"):
            offset = LEARNED_OFFSET if cfg.positions == "learned" else 0
            self.embed_positions = LearnedPositions(cfg.max_position_embeddings, cfg.d_model, offset)
        elif cfg.positions == "sinusoidal":
            self.register_buffer("denominators", split_denominators(cfg.d_model), persistent=False)
        else:
            self.register_buffer("frequencies", tensor2tensor_frequencies(cfg.d_model), persistent=False)
        self.cfg = cfg
        self.layernorm_embedding = (nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
                                    if cfg.layernorm_embedding else None)
        self.norm_tokens_only = decoder and cfg.decoder_layernorm_tokens
        self.layers = nn.ModuleList(layer(cfg) for _ in range(count))
        self.layer_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.final_layer_norm else None

    def positions(self, indices: Tensor, tokens: Tensor) -> Tensor:
        """``(..., d)``: the embedding of each position in ``indices`` (counted from 0), for
        ``tokens`` of the same shape as ``indices`` after broadcasting."""
        cfg = self.cfg
        if cfg.positions in ("learned", "learned_from_zero"):
            return self.embed_positions.rows(indices)
        if cfg.positions == "sinusoidal":
            return sinusoids_split(indices, self.denominators, cfg.d_model)
        if cfg.positions == "tensor2tensor_from_zero":
            return sinusoids_tensor2tensor(indices, self.frequencies, cfg.d_model)
        rows = sinusoids_tensor2tensor(indices + (cfg.pad_token_id + 1), self.frequencies, cfg.d_model)
        return rows * (tokens != cfg.pad_token_id)[..., None].to(rows.dtype)

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        if self.layernorm_embedding is None:
            return tokens + positions
        if self.norm_tokens_only:
            return self.layernorm_embedding(tokens) + positions
        return self.layernorm_embedding(tokens + positions)

    def finish(self, x: Tensor) -> Tensor:
        return x if self.layer_norm is None else self.layer_norm(x)


class EncoderDecoder(Seq2SeqModel):
    """The model of ``EncoderDecoderConfig``: module names as ``transformers``' BART-style models
    minus ``model.``; the encoder computes every decoder layer's cross K/V and the step decoder
    carries one K/V cache per layer (``cross_memory_specs``, ``self_attention_cache``)."""

    memory_per_sentence = True
    multi_step = True

    def __init__(self, cfg: EncoderDecoderConfig, src_vocab_size: int, tgt_vocab_size: int) -> None:
        super().__init__()
        if cfg.shared_embeddings and src_vocab_size != tgt_vocab_size:
            raise CheckpointError("this family shares one embedding: source and target vocabularies must match")
        self.cfg = cfg
        self.embed_scale = math.sqrt(cfg.d_model) if cfg.scale_embedding else 1.0
        if cfg.shared_embeddings:
            self.shared = nn.Embedding(tgt_vocab_size, cfg.d_model)
            nn.init.normal_(self.shared.weight, std=0.02)
        self.encoder = Stack(cfg, EncoderLayer, cfg.encoder_layers, False, src_vocab_size)
        self.decoder = Stack(cfg, DecoderLayer, cfg.decoder_layers, True, tgt_vocab_size)
        self.lm_head = nn.Linear(cfg.d_model, tgt_vocab_size, bias=False)
        self.register_buffer("final_logits_bias", torch.zeros(1, tgt_vocab_size))
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.table(self.decoder).weight

    def table(self, stack: Stack) -> nn.Embedding:
        return self.shared if self.cfg.shared_embeddings else stack.embed_tokens

    def run_encoder(self, src: Tensor, src_len: Tensor) -> tuple[Tensor, Tensor]:
        bias = padding_bias(src, src_len)
        stack = self.encoder
        # a Gather, as in the step decoder, so int8 quantises a learned table like the decoder's
        positions = stack.positions(torch.arange(src.shape[1], device=src.device)[None, :], src)
        x = stack.embed(self.table(stack)(src) * self.embed_scale, positions)
        for layer in stack.layers:
            x = layer(x, bias)
        return stack.finish(x), bias

    def logits(self, x: Tensor) -> Tensor:
        return self.lm_head(self.decoder.finish(x)) + self.final_logits_bias

    def forward(self, src: Tensor, src_len: Tensor, tgt_in: Tensor) -> Tensor:
        memory, bias = self.run_encoder(src, src_len)
        length = tgt_in.shape[1]
        causal = causal_bias(length, src.device)
        stack = self.decoder
        positions = stack.positions(torch.arange(length, device=tgt_in.device)[None, :], tgt_in)
        x = stack.embed(self.table(stack)(tgt_in) * self.embed_scale, positions)
        for layer in stack.layers:
            x = layer(x, causal, memory, bias)
        return self.logits(x)

    def encode(self, src: Tensor, src_len: Tensor) -> dict[str, Tensor]:
        memory, bias = self.run_encoder(src, src_len)
        out = {"src_bias": bias}
        for i, layer in enumerate(self.decoder.layers):
            out[layer_name("cross_k", i)], out[layer_name("cross_v", i)] = layer.encoder_attn.cross_memory(memory)
        return out

    def decode_step(self, tokens: Tensor, step: Tensor, memory: dict[str, Tensor],
                    state: dict[str, Tensor]) -> StepOutput:
        stack = self.decoder
        x_tokens = tokens[:, None]
        x = stack.embed(self.table(stack)(x_tokens) * self.embed_scale, stack.positions(step, x_tokens))
        new_state, attention = {}, []
        for i, layer in enumerate(stack.layers):
            k, v = layer_name("self_k", i), layer_name("self_v", i)
            x, new_state[k], new_state[v], weights = layer.step(
                x, state[k], state[v], memory[layer_name("cross_k", i)], memory[layer_name("cross_v", i)],
                memory["src_bias"])
            attention.append(weights)
        log_probs = torch.log_softmax(self.logits(x[:, 0]), dim=-1)
        return StepOutput(log_probs, new_state, torch.cat(attention, dim=2).transpose(1, 2))

    def decode_steps(self, tokens: Tensor, step: Tensor, memory: dict[str, Tensor],
                     state: dict[str, Tensor]) -> StepOutput:
        stack = self.decoder
        indices = (step + torch.arange(tokens.shape[1], device=tokens.device))[None, :]
        x = stack.embed(self.table(stack)(tokens) * self.embed_scale, stack.positions(indices, tokens))
        new_state = {}
        for i, layer in enumerate(stack.layers):
            k, v = layer_name("self_k", i), layer_name("self_v", i)
            x, new_state[k], new_state[v] = layer.steps(
                x, state[k], state[v], memory[layer_name("cross_k", i)], memory[layer_name("cross_v", i)],
                memory["src_bias"])
        return StepOutput(torch.log_softmax(self.logits(x), dim=-1), new_state)
