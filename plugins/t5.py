"""T5 (Hugging Face ``T5ForConditionalGeneration``), written from ``transformers``' arithmetic
without importing it.

No position embeddings: the first layer of each stack holds a relative position bias
``(buckets, heads)``, shared by every layer of its stack, added to the unscaled ``q @ k``
scores. The encoder's is bidirectional, the decoder's causal. Pre-norm layers with T5's RMS
LayerNorm (no mean, no bias), a final norm after each stack, ReLU or gated-GELU feed-forward,
and the output rescaled by ``d_model**-0.5`` before the tied projection (``scale_decoder_outputs``).

The bucket of a relative distance is a float ``log`` in Hugging Face; here it is computed once
with the same torch code into an integer table, and graphs only index it. Beyond
``max_distance`` every distance falls in the last bucket, so a table up to ``max_distance``
with the distance clamped is exact, and PyTorch and ONNX Runtime cannot round a log
differently at a bucket edge. As in plugins/transformer.py, the encoder computes every decoder
layer's cross-attention K/V and the step decoder carries one K/V cache per layer.

Module names follow ``transformers`` (``encoder.block.0.layer.0.SelfAttention.q``, ...), so a
Hugging Face state dict maps across by name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from s2s_deploy.export.contract import (
    ArchitecturePlugin,
    HFWeights,
    MemorySpec,
    Seq2SeqModel,
    StateSpec,
    StepOutput,
    cross_attention_memory,
    layer_name,
    self_attention_cache,
)
from s2s_deploy_plugins.bart import padding_bias


@dataclass(frozen=True)
class T5Config:
    d_model: int = 128
    d_kv: int = 32
    d_ff: int = 512
    num_layers: int = 2
    num_decoder_layers: int = 2
    num_heads: int = 4
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    feed_forward_proj: str = "relu"
    scale_decoder_outputs: bool = True
    tie_word_embeddings: bool = True
    dropout: float = 0.0


def relative_bucket(relative_position: Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> Tensor:
    """T5Attention._relative_position_bucket, step for step."""
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


class RMSNorm(nn.Module):
    """T5LayerNorm: ``x / sqrt(mean(x²) + eps) * weight``."""

    def __init__(self, d_model: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class Attention(nn.Module):
    """T5Attention without its bias logic: no projection biases, no score scaling."""

    def __init__(self, cfg: T5Config, relative_bias: bool) -> None:
        super().__init__()
        self.heads, self.head_dim = cfg.num_heads, cfg.d_kv
        inner = cfg.num_heads * cfg.d_kv
        self.q = nn.Linear(cfg.d_model, inner, bias=False)
        self.k = nn.Linear(cfg.d_model, inner, bias=False)
        self.v = nn.Linear(cfg.d_model, inner, bias=False)
        self.o = nn.Linear(inner, cfg.d_model, bias=False)
        if relative_bias:
            self.relative_attention_bias = nn.Embedding(cfg.relative_attention_num_buckets, cfg.num_heads)

    def split(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        return x.reshape(batch, length, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: Tensor, memory: Tensor, bias: Tensor) -> Tensor:
        q, k, v = self.split(self.q(x)), self.split(self.k(memory)), self.split(self.v(memory))
        out = torch.softmax(q @ k.transpose(-1, -2) + bias, dim=-1) @ v
        batch, _, length, _ = out.shape
        return self.o(out.transpose(1, 2).reshape(batch, length, self.heads * self.head_dim))

    def cross_memory(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Keys ``(B, H, d_kv, S)`` (transposed for the step's ``q @ k``), values ``(B, H, S, d_kv)``."""
        batch, length, _ = x.shape
        keys = self.k(x).reshape(batch, length, self.heads, self.head_dim).permute(0, 2, 3, 1)
        return keys, self.split(self.v(x))

    def one(self, x: Tensor) -> Tensor:
        return x.reshape(-1, self.heads, 1, self.head_dim)

    def merge_one(self, x: Tensor) -> Tensor:
        return self.o(x.reshape(-1, 1, self.heads * self.head_dim))

    def step_self(self, x: Tensor, past_k: Tensor, past_v: Tensor, bias: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        keys = torch.cat([past_k, self.one(self.k(x))], dim=2)
        values = torch.cat([past_v, self.one(self.v(x))], dim=2)
        weights = torch.softmax(self.one(self.q(x)) @ keys.transpose(-1, -2) + bias, dim=-1)
        return self.merge_one(weights @ values), keys, values

    def step_cross(self, x: Tensor, keys: Tensor, values: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
        weights = torch.softmax(self.one(self.q(x)) @ keys + bias, dim=-1)
        return self.merge_one(weights @ values), weights


class DenseReluDense(nn.Module):
    """T5DenseActDense (``wi``, ReLU) or T5DenseGatedActDense (``wi_0``, ``wi_1``, GELU-tanh)."""

    def __init__(self, cfg: T5Config) -> None:
        super().__init__()
        self.gated = cfg.feed_forward_proj.startswith("gated-")
        if self.gated:
            self.wi_0 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
            self.wi_1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        else:
            self.wi = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.wo = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)
        act = cfg.feed_forward_proj.split("-")[-1]
        self.act = {"relu": torch.relu, "gelu": lambda x: nn.functional.gelu(x, approximate="tanh"),
                    "gelu_new": lambda x: nn.functional.gelu(x, approximate="tanh"),
                    "silu": nn.functional.silu}[act]

    def forward(self, x: Tensor) -> Tensor:
        if self.gated:
            return self.wo(self.act(self.wi_0(x)) * self.wi_1(x))
        return self.wo(self.act(self.wi(x)))


class SelfAttentionLayer(nn.Module):
    def __init__(self, cfg: T5Config, relative_bias: bool) -> None:
        super().__init__()
        self.SelfAttention = Attention(cfg, relative_bias)
        self.layer_norm = RMSNorm(cfg.d_model, cfg.layer_norm_epsilon)


class CrossAttentionLayer(nn.Module):
    def __init__(self, cfg: T5Config) -> None:
        super().__init__()
        self.EncDecAttention = Attention(cfg, relative_bias=False)
        self.layer_norm = RMSNorm(cfg.d_model, cfg.layer_norm_epsilon)


class FFLayer(nn.Module):
    def __init__(self, cfg: T5Config) -> None:
        super().__init__()
        self.DenseReluDense = DenseReluDense(cfg)
        self.layer_norm = RMSNorm(cfg.d_model, cfg.layer_norm_epsilon)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.DenseReluDense(self.layer_norm(x))


class Block(nn.Module):
    def __init__(self, cfg: T5Config, decoder: bool, relative_bias: bool) -> None:
        super().__init__()
        parts: list[nn.Module] = [SelfAttentionLayer(cfg, relative_bias)]
        if decoder:
            parts.append(CrossAttentionLayer(cfg))
        parts.append(FFLayer(cfg))
        self.layer = nn.ModuleList(parts)

    def forward(self, x: Tensor, self_bias: Tensor, memory: Tensor | None = None,
                cross_bias: Tensor | None = None) -> Tensor:
        attention = self.layer[0]
        h = attention.layer_norm(x)
        x = x + attention.SelfAttention(h, h, self_bias)
        if memory is not None:
            cross = self.layer[1]
            x = x + cross.EncDecAttention(cross.layer_norm(x), memory, cross_bias)
        return self.layer[-1](x)

    def step(self, x: Tensor, past_k: Tensor, past_v: Tensor, self_bias: Tensor, cross_k: Tensor, cross_v: Tensor,
             cross_bias: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        attention, cross = self.layer[0], self.layer[1]
        out, keys, values = attention.SelfAttention.step_self(attention.layer_norm(x), past_k, past_v, self_bias)
        x = x + out
        out, weights = cross.EncDecAttention.step_cross(cross.layer_norm(x), cross_k, cross_v, cross_bias)
        return self.layer[2](x + out), keys, values, weights


class Stack(nn.Module):
    def __init__(self, cfg: T5Config, decoder: bool, count: int) -> None:
        super().__init__()
        self.block = nn.ModuleList(Block(cfg, decoder, relative_bias=i == 0) for i in range(count))
        self.final_layer_norm = RMSNorm(cfg.d_model, cfg.layer_norm_epsilon)
        distance = cfg.relative_attention_max_distance
        # the bucket of every relative position -max_distance..max_distance (encoder) or -max_distance..0
        # (decoder, indexed by distance); farther ones share the last bucket, so clamping is exact
        relative = torch.arange(-distance, distance + 1) if not decoder else -torch.arange(distance + 1)
        self.register_buffer("buckets", relative_bucket(relative, not decoder, cfg.relative_attention_num_buckets,
                                                        distance), persistent=False)
        self.max_distance = distance

    def bias_table(self) -> nn.Embedding:
        return self.block[0].layer[0].SelfAttention.relative_attention_bias


class T5(Seq2SeqModel):
    def __init__(self, cfg: T5Config, src_vocab_size: int, tgt_vocab_size: int) -> None:
        super().__init__()
        if src_vocab_size != tgt_vocab_size:
            raise ValueError("T5 shares one embedding: source and target vocabularies must match")
        self.cfg = cfg
        self.shared = nn.Embedding(tgt_vocab_size, cfg.d_model)
        self.encoder = Stack(cfg, decoder=False, count=cfg.num_layers)
        self.decoder = Stack(cfg, decoder=True, count=cfg.num_decoder_layers)
        self.lm_head = nn.Linear(cfg.d_model, tgt_vocab_size, bias=False)
        self.output_scale = cfg.d_model**-0.5 if cfg.scale_decoder_outputs else 1.0
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.shared.weight

    def encoder_bias(self, length: int, src: Tensor, src_len: Tensor) -> tuple[Tensor, Tensor]:
        """Self-attention bias ``(B, H, S, S)`` (relative positions + padding) and the padding bias."""
        stack = self.encoder
        positions = torch.arange(length, device=src.device)
        relative = (positions[None, :] - positions[:, None]).clamp(-stack.max_distance, stack.max_distance)
        table = stack.bias_table()(stack.buckets[relative + stack.max_distance])  # (S, S, H)
        pad = padding_bias(src, src_len)
        return table.permute(2, 0, 1)[None] + pad, pad

    def run_encoder(self, src: Tensor, src_len: Tensor) -> tuple[Tensor, Tensor]:
        self_bias, pad = self.encoder_bias(src.shape[1], src, src_len)
        x = self.shared(src)
        for block in self.encoder.block:
            x = block(x, self_bias)
        return self.encoder.final_layer_norm(x), pad

    def logits(self, x: Tensor) -> Tensor:
        return self.lm_head(self.decoder.final_layer_norm(x) * self.output_scale)

    def forward(self, src: Tensor, src_len: Tensor, tgt_in: Tensor) -> Tensor:
        memory, pad = self.run_encoder(src, src_len)
        stack, length = self.decoder, tgt_in.shape[1]
        positions = torch.arange(length, device=src.device)
        distance = (positions[:, None] - positions[None, :]).clamp(0, stack.max_distance)
        causal = torch.full((length, length), torch.finfo(torch.float32).min, device=src.device).triu(1)
        self_bias = stack.bias_table()(stack.buckets[distance]).permute(2, 0, 1)[None] + causal
        x = self.shared(tgt_in)
        for block in stack.block:
            x = block(x, self_bias, memory, pad)
        return self.logits(x)

    def encode(self, src: Tensor, src_len: Tensor) -> dict[str, Tensor]:
        memory, pad = self.run_encoder(src, src_len)
        out = {"src_bias": pad}
        for i, block in enumerate(self.decoder.block):
            out[layer_name("cross_k", i)], out[layer_name("cross_v", i)] = block.layer[1].EncDecAttention.cross_memory(
                memory)
        return out

    def decode_step(self, tokens: Tensor, step: Tensor, memory: dict[str, Tensor],
                    state: dict[str, Tensor]) -> StepOutput:
        stack = self.decoder
        keys_length = state[layer_name("self_k", 0)].shape[2] + 1
        distance = (step - torch.arange(keys_length, device=tokens.device)).clamp(0, stack.max_distance)
        self_bias = stack.bias_table()(stack.buckets[distance]).transpose(0, 1)[None, :, None, :]  # (1, H, 1, T+1)
        x = self.shared(tokens[:, None])
        new_state, attention = {}, []
        for i, block in enumerate(stack.block):
            k, v = layer_name("self_k", i), layer_name("self_v", i)
            x, new_state[k], new_state[v], weights = block.step(
                x, state[k], state[v], self_bias, memory[layer_name("cross_k", i)], memory[layer_name("cross_v", i)],
                memory["src_bias"])
            attention.append(weights)
        log_probs = torch.log_softmax(self.logits(x[:, 0]), dim=-1)
        return StepOutput(log_probs, new_state, torch.cat(attention, dim=2).transpose(1, 2))


class T5Plugin(ArchitecturePlugin):
    name = "t5"
    version = "1.0"
    description = "Hugging Face T5: relative position bias, RMS pre-norm, cross-attention K/V from the encoder"
    config_type = T5Config
    presets: ClassVar[dict[str, T5Config]] = {
        "tiny": T5Config(),
        "tiny-gated": T5Config(feed_forward_proj="gated-gelu", scale_decoder_outputs=False),
    }
    default_preset = "tiny"
    exporter = "dynamo"
    parity_atol = 1e-4
    has_attention = True
    hf_model_types = ("t5",)

    def build(self, config: T5Config, src_vocab_size: int, tgt_vocab_size: int) -> T5:
        return T5(config, src_vocab_size, tgt_vocab_size)

    def memory_specs(self, config: T5Config) -> tuple[MemorySpec, ...]:
        return (
            MemorySpec("src_bias", 0, description="(B, 1, 1, S) additive source padding mask"),
            *cross_attention_memory(config.num_decoder_layers),
        )

    def state_specs(self, config: T5Config) -> tuple[StateSpec, ...]:
        return self_attention_cache(config.num_decoder_layers, config.num_heads, config.d_kv)

    def from_hf(self, hf: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> HFWeights:
        """Hugging Face names as they are; ``embed_tokens`` copies dropped, ``lm_head`` kept only
        when it is not the shared embedding (older T5 v1.1 files store a separate one)."""
        shared = tensors.get("shared.weight", tensors.get("encoder.embed_tokens.weight"))
        head = tensors.get("lm_head.weight")
        tied = head is None or (shared is not None and torch.equal(head, shared))
        config = T5Config(
            d_model=hf["d_model"], d_kv=hf["d_kv"], d_ff=hf["d_ff"], num_layers=hf["num_layers"],
            num_decoder_layers=hf.get("num_decoder_layers") or hf["num_layers"], num_heads=hf["num_heads"],
            relative_attention_num_buckets=hf.get("relative_attention_num_buckets", 32),
            relative_attention_max_distance=hf.get("relative_attention_max_distance", 128),
            layer_norm_epsilon=hf.get("layer_norm_epsilon", 1e-6),
            feed_forward_proj=hf.get("feed_forward_proj", "relu"),
            scale_decoder_outputs=bool(hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True))),
            tie_word_embeddings=tied,
        )
        weights = {}
        for name, tensor in tensors.items():
            if name.endswith("embed_tokens.weight") or (tied and name == "lm_head.weight"):
                continue
            if name.endswith("EncDecAttention.relative_attention_bias.weight"):
                continue  # saved by some versions, never used (T5Model ignores it on load too)
            weights[name] = tensor
        if shared is not None:
            weights["shared.weight"] = shared
        vocab = int(hf["vocab_size"])
        return HFWeights(config, weights, vocab, vocab)


PLUGIN = T5Plugin()
