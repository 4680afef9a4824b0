"""BART and mBART (Hugging Face ``BartForConditionalGeneration``, ``MBartForConditionalGeneration``),
written from ``transformers``' arithmetic without importing it.

BART: learned positions read at ``position + 2`` (the table has two spare rows), an optional
``sqrt(d)`` embedding scale, a LayerNorm on the embeddings, post-norm layers. mBART: the same
with pre-norm layers and a final LayerNorm after each stack. Marian (plugins/marian.py) is this
family with sinusoidal positions and no embedding LayerNorm, so it reuses the model below.

Module names follow ``transformers`` (``encoder.layers.0.self_attn.q_proj``, ...) minus the
``model.`` prefix, so a Hugging Face state dict maps across by name. The output projection is
tied to the one shared embedding (stored once), and ``final_logits_bias`` is added to the logits
as Hugging Face does. As in plugins/transformer.py, the encoder computes every decoder layer's
cross-attention K/V (keys stored transposed), and the step decoder carries one K/V cache per
layer; there is no ``If`` and no second decoder.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch import Tensor, nn

from s2s_deploy.errors import CheckpointError
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

LEARNED_OFFSET = 2  # BartLearnedPositionalEmbedding: positions are read at index + 2
SQRT_2 = math.sqrt(2.0)


def erf_gelu(x: Tensor) -> Tensor:
    """GELU written in the order ONNX Runtime fuses into one ``Gelu`` node: the exporter's own
    decomposition of ``nn.functional.gelu`` scales ``1 + erf`` by 0.5 first, which no fusion
    pattern matches, and leaves five nodes per layer."""
    return x * (1.0 + torch.erf(x / SQRT_2)) * 0.5


ACTIVATIONS = {
    "gelu": erf_gelu,
    "gelu_new": lambda x: nn.functional.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: nn.functional.gelu(x, approximate="tanh"),
    "relu": torch.relu,
    "swish": nn.functional.silu,
    "silu": nn.functional.silu,
    "tanh": torch.tanh,
}


@dataclass(frozen=True)
class BartFamilyConfig:
    d_model: int = 128
    encoder_layers: int = 2
    decoder_layers: int = 2
    encoder_attention_heads: int = 4
    decoder_attention_heads: int = 4
    encoder_ffn_dim: int = 512
    decoder_ffn_dim: int = 512
    max_position_embeddings: int = 128
    activation_function: str = "gelu"
    scale_embedding: bool = False
    normalize_before: bool = False  # pre-norm layers (mBART)
    final_layer_norm: bool = False  # a LayerNorm after each stack (mBART)
    layernorm_embedding: bool = True  # a LayerNorm on the embeddings (BART, mBART; not Marian)
    positions: Literal["learned", "sinusoidal"] = "learned"
    tie_word_embeddings: bool = True
    dropout: float = 0.0


def sinusoid_denominators(dim: int) -> Tensor:
    """MarianSinusoidalPositionalEmbedding's ``10000 ** (2 * (j // 2) / dim)``, one per sine,
    in float64 as Hugging Face computes them."""
    return torch.from_numpy(np.power(10000, 2 * (np.arange(0, dim, 2) // 2) / dim))


def marian_sinusoids(positions: Tensor, denominators: Tensor, dim: int) -> Tensor:
    """Marian's position rows: sines in the first half, cosines in the second (not interleaved).
    Computed in the graph, in float64 then rounded to float32 as Hugging Face does, instead of
    stored: the 512-row table was 1 MiB of every export."""
    angles = positions.to(torch.float64)[..., None] / denominators
    return torch.cat((torch.sin(angles), torch.cos(angles[..., : dim // 2])), dim=-1).to(torch.float32)


def padding_bias(src: Tensor, src_len: Tensor) -> Tensor:
    """``(B, 1, 1, S)``: 0 on real tokens, the float minimum on padding (Hugging Face's mask value)."""
    valid = torch.arange(src.shape[1], device=src.device)[None, :] < src_len[:, None]
    bias = torch.zeros(valid.shape, dtype=torch.float32, device=src.device)
    return bias.masked_fill(~valid, torch.finfo(torch.float32).min)[:, None, None, :]


class Attention(nn.Module):
    """BartAttention: biased projections, ``(q @ k^T) * head_dim**-0.5``."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, d_model // heads
        self.scaling = self.head_dim**-0.5
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def split(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        return x.reshape(batch, length, self.heads, self.head_dim).transpose(1, 2)

    def merge(self, x: Tensor) -> Tensor:
        batch, _, length, _ = x.shape
        return self.out_proj(x.transpose(1, 2).reshape(batch, length, self.heads * self.head_dim))

    def forward(self, x: Tensor, memory: Tensor, bias: Tensor) -> Tensor:
        q, k, v = self.split(self.q_proj(x)), self.split(self.k_proj(memory)), self.split(self.v_proj(memory))
        weights = torch.softmax((q @ k.transpose(-1, -2)) * self.scaling + bias, dim=-1)
        return self.merge(weights @ v)

    def cross_memory(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Keys ``(B, H, head_dim, S)``, transposed so the step's ``q @ k`` needs no Transpose; values
        ``(B, H, S, head_dim)``."""
        batch, length, _ = x.shape
        keys = self.k_proj(x).reshape(batch, length, self.heads, self.head_dim).permute(0, 2, 3, 1)
        return keys, self.split(self.v_proj(x))

    def one(self, x: Tensor) -> Tensor:
        """``(B, 1, d)`` → ``(B, H, 1, head_dim)`` by a Reshape."""
        return x.reshape(-1, self.heads, 1, self.head_dim)

    def merge_one(self, x: Tensor) -> Tensor:
        return self.out_proj(x.reshape(-1, 1, self.heads * self.head_dim))

    def step_self(self, x: Tensor, past_k: Tensor, past_v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        keys = torch.cat([past_k, self.one(self.k_proj(x))], dim=2)
        values = torch.cat([past_v, self.one(self.v_proj(x))], dim=2)
        weights = torch.softmax((self.one(self.q_proj(x)) @ keys.transpose(-1, -2)) * self.scaling, dim=-1)
        return self.merge_one(weights @ values), keys, values

    def step_cross(self, x: Tensor, keys: Tensor, values: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
        weights = torch.softmax((self.one(self.q_proj(x)) @ keys) * self.scaling + bias, dim=-1)
        return self.merge_one(weights @ values), weights


def residual(pre_norm: bool, x: Tensor, norm: nn.LayerNorm, fn: Any) -> Any:
    """``x + fn(...)`` with the LayerNorm before ``fn`` (pre-norm) or after the sum (post-norm);
    extra outputs of ``fn`` (caches, attention weights) pass through."""
    out = fn(norm(x) if pre_norm else x)
    main, rest = (out[0], out[1:]) if isinstance(out, tuple) else (out, ())
    y = x + main if pre_norm else norm(x + main)
    return (y, *rest) if rest else y


class EncoderLayer(nn.Module):
    def __init__(self, cfg: BartFamilyConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg.d_model, cfg.encoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(cfg.d_model)
        self.fc1 = nn.Linear(cfg.d_model, cfg.encoder_ffn_dim)
        self.fc2 = nn.Linear(cfg.encoder_ffn_dim, cfg.d_model)
        self.final_layer_norm = nn.LayerNorm(cfg.d_model)
        self.act = ACTIVATIONS[cfg.activation_function]
        self.pre_norm = cfg.normalize_before

    def forward(self, x: Tensor, bias: Tensor) -> Tensor:
        x = residual(self.pre_norm, x, self.self_attn_layer_norm, lambda h: self.self_attn(h, h, bias))
        return residual(self.pre_norm, x, self.final_layer_norm, lambda h: self.fc2(self.act(self.fc1(h))))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: BartFamilyConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg.d_model, cfg.decoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(cfg.d_model)
        self.encoder_attn = Attention(cfg.d_model, cfg.decoder_attention_heads)
        self.encoder_attn_layer_norm = nn.LayerNorm(cfg.d_model)
        self.fc1 = nn.Linear(cfg.d_model, cfg.decoder_ffn_dim)
        self.fc2 = nn.Linear(cfg.decoder_ffn_dim, cfg.d_model)
        self.final_layer_norm = nn.LayerNorm(cfg.d_model)
        self.act = ACTIVATIONS[cfg.activation_function]
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


class Stack(nn.Module):
    """Positions, the optional embedding LayerNorm, the layers and the optional final LayerNorm."""

    def __init__(self, cfg: BartFamilyConfig, layer: type[nn.Module], count: int) -> None:
        super().__init__()
        if cfg.positions == "learned":
            self.embed_positions = nn.Embedding(cfg.max_position_embeddings + LEARNED_OFFSET, cfg.d_model)
        else:
            self.register_buffer("denominators", sinusoid_denominators(cfg.d_model), persistent=False)
        self.dim = cfg.d_model
        self.layernorm_embedding = nn.LayerNorm(cfg.d_model) if cfg.layernorm_embedding else None
        self.layers = nn.ModuleList(layer(cfg) for _ in range(count))
        self.layer_norm = nn.LayerNorm(cfg.d_model) if cfg.final_layer_norm else None

    def positions(self, indices: Tensor) -> Tensor:
        """``(..., d)``: the embedding of each position in ``indices``."""
        if hasattr(self, "embed_positions"):
            return nn.functional.embedding(indices, self.embed_positions.weight[LEARNED_OFFSET:])
        return marian_sinusoids(indices, self.denominators, self.dim)

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        x = tokens + positions
        return x if self.layernorm_embedding is None else self.layernorm_embedding(x)

    def finish(self, x: Tensor) -> Tensor:
        return x if self.layer_norm is None else self.layer_norm(x)


class BartFamily(Seq2SeqModel):
    def __init__(self, cfg: BartFamilyConfig, src_vocab_size: int, tgt_vocab_size: int) -> None:
        super().__init__()
        if src_vocab_size != tgt_vocab_size:
            raise CheckpointError("this family shares one embedding: source and target vocabularies must match")
        self.cfg = cfg
        self.embed_scale = math.sqrt(cfg.d_model) if cfg.scale_embedding else 1.0
        self.shared = nn.Embedding(tgt_vocab_size, cfg.d_model)
        self.encoder = Stack(cfg, EncoderLayer, cfg.encoder_layers)
        self.decoder = Stack(cfg, DecoderLayer, cfg.decoder_layers)
        self.lm_head = nn.Linear(cfg.d_model, tgt_vocab_size, bias=False)
        self.register_buffer("final_logits_bias", torch.zeros(1, tgt_vocab_size))
        nn.init.normal_(self.shared.weight, std=0.02)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.shared.weight

    def run_encoder(self, src: Tensor, src_len: Tensor) -> tuple[Tensor, Tensor]:
        bias = padding_bias(src, src_len)
        stack = self.encoder
        # a Gather, as in the step decoder, so int8 quantises this table like the decoder's (one Slice stayed fp32)
        positions = stack.positions(torch.arange(src.shape[1], device=src.device))
        x = stack.embed(self.shared(src) * self.embed_scale, positions)
        for layer in stack.layers:
            x = layer(x, bias)
        return stack.finish(x), bias

    def logits(self, x: Tensor) -> Tensor:
        return self.lm_head(self.decoder.finish(x)) + self.final_logits_bias

    def forward(self, src: Tensor, src_len: Tensor, tgt_in: Tensor) -> Tensor:
        memory, bias = self.run_encoder(src, src_len)
        length = tgt_in.shape[1]
        causal = torch.full((length, length), torch.finfo(torch.float32).min, device=src.device).triu(1)
        stack = self.decoder
        positions = stack.positions(torch.arange(length, device=tgt_in.device))
        x = stack.embed(self.shared(tgt_in) * self.embed_scale, positions)
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
        position = stack.positions(step)  # (d,)
        x = stack.embed(self.shared(tokens[:, None]) * self.embed_scale, position)
        new_state, attention = {}, []
        for i, layer in enumerate(stack.layers):
            k, v = layer_name("self_k", i), layer_name("self_v", i)
            x, new_state[k], new_state[v], weights = layer.step(
                x, state[k], state[v], memory[layer_name("cross_k", i)], memory[layer_name("cross_v", i)],
                memory["src_bias"])
            attention.append(weights)
        log_probs = torch.log_softmax(self.logits(x[:, 0]), dim=-1)
        return StepOutput(log_probs, new_state, torch.cat(attention, dim=2).transpose(1, 2))


class BartFamilyPlugin(ArchitecturePlugin):
    """Shared by the BART/mBART and Marian plugins: specs, limits and the Hugging Face mapping."""

    config_type = BartFamilyConfig
    exporter = "dynamo"
    parity_atol = 1e-4
    has_attention = True

    def build(self, config: BartFamilyConfig, src_vocab_size: int, tgt_vocab_size: int) -> BartFamily:
        return BartFamily(config, src_vocab_size, tgt_vocab_size)

    def memory_specs(self, config: BartFamilyConfig) -> tuple[MemorySpec, ...]:
        return (
            MemorySpec("src_bias", 0, description="(B, 1, 1, S) additive source padding mask"),
            *cross_attention_memory(config.decoder_layers),
        )

    def state_specs(self, config: BartFamilyConfig) -> tuple[StateSpec, ...]:
        heads = config.decoder_attention_heads
        return self_attention_cache(config.decoder_layers, heads, config.d_model // heads)

    def max_target_length(self, config: BartFamilyConfig) -> int:
        return config.max_position_embeddings

    def max_source_length(self, config: BartFamilyConfig) -> int:
        return config.max_position_embeddings

    def config_from_hf(self, hf: Mapping[str, Any]) -> BartFamilyConfig:
        raise NotImplementedError

    def from_hf(self, hf: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> HFWeights:
        """Hugging Face names minus ``model.``; the tied copies (per-stack ``embed_tokens``,
        ``lm_head`` when tied) and Marian's stored sinusoids are dropped."""
        config = self.config_from_hf(hf)
        if hf.get("decoder_vocab_size") not in (None, hf["vocab_size"]) or hf.get(
                "share_encoder_decoder_embeddings", True) is False:
            raise CheckpointError(f"{self.name}: separate source and target embeddings are not supported")
        weights: dict[str, Tensor] = {}
        for name, tensor in tensors.items():
            key = name.removeprefix("model.")
            if key in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
                weights.setdefault("shared.weight", tensor)
                continue
            if key == "lm_head.weight" and config.tie_word_embeddings:
                weights.setdefault("shared.weight", tensor)
                continue
            if config.positions == "sinusoidal" and key.endswith("embed_positions.weight"):
                continue
            weights[key] = tensor
        vocab = int(hf["vocab_size"])
        weights.setdefault("final_logits_bias", torch.zeros(1, vocab))
        return HFWeights(config, weights, vocab, vocab)


def _bart_config(hf: Mapping[str, Any], pre_norm: bool) -> BartFamilyConfig:
    return BartFamilyConfig(
        d_model=hf["d_model"], encoder_layers=hf["encoder_layers"], decoder_layers=hf["decoder_layers"],
        encoder_attention_heads=hf["encoder_attention_heads"], decoder_attention_heads=hf["decoder_attention_heads"],
        encoder_ffn_dim=hf["encoder_ffn_dim"], decoder_ffn_dim=hf["decoder_ffn_dim"],
        max_position_embeddings=hf["max_position_embeddings"],
        activation_function=hf.get("activation_function", "gelu"),
        scale_embedding=bool(hf.get("scale_embedding", False)),
        normalize_before=pre_norm, final_layer_norm=pre_norm, layernorm_embedding=True, positions="learned",
        tie_word_embeddings=hf.get("tie_word_embeddings", True) is not False,
    )


class BartPlugin(BartFamilyPlugin):
    name = "bart"
    version = "1.0"
    description = "Hugging Face BART/mBART (learned positions +2; post-norm, or pre-norm with final norms)"
    presets: ClassVar[dict[str, BartFamilyConfig]] = {
        "tiny": BartFamilyConfig(),
        "tiny-mbart": BartFamilyConfig(normalize_before=True, final_layer_norm=True, scale_embedding=True),
    }
    default_preset = "tiny"
    hf_model_types = ("bart", "mbart")

    def config_from_hf(self, hf: Mapping[str, Any]) -> BartFamilyConfig:
        return _bart_config(hf, pre_norm=hf.get("model_type") == "mbart")


PLUGIN = BartPlugin()
