"""T5 (Hugging Face ``T5ForConditionalGeneration``), written from ``transformers``' arithmetic
without importing it.

The declaration, torch-free: config, presets and specs; the model is ``models/t5.py``,
imported only when one is built."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from s2s_deploy.architecture.declaration import (
    ArchitecturePlugin,
    HFWeights,
    MemorySpec,
    StateSpec,
    cross_memory_specs,
    self_attention_cache,
)


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
    relative_bias_every_layer: bool = False  # UMT5: each layer's self-attention holds its own table


class T5Plugin(ArchitecturePlugin):
    name = "t5"
    version = "1.0"
    description = "Hugging Face T5: relative position bias, RMS pre-norm, cross-attention K/V from the encoder"
    config_type = T5Config
    model = "s2s_deploy_plugins.models.t5:T5"
    presets: ClassVar[dict[str, T5Config]] = {
        "tiny": T5Config(),
        "tiny-gated": T5Config(feed_forward_proj="gated-gelu", scale_decoder_outputs=False),
    }
    default_preset = "tiny"
    exporter = "dynamo"
    parity_atol = 1e-3
    """As ``EncoderDecoderPlugin``'s: T5's cached step moved 4.73e-4 from its own forward on an AVX-512 Xeon."""
    has_attention = True
    hf_model_types = ("t5",)

    def memory_specs(self, config: T5Config) -> tuple[MemorySpec, ...]:
        return cross_memory_specs(config.num_decoder_layers)

    def state_specs(self, config: T5Config) -> tuple[StateSpec, ...]:
        return self_attention_cache(config.num_decoder_layers, config.num_heads, config.d_kv)

    def scales_outputs(self, hf: Mapping[str, Any]) -> bool:
        """Whether the decoder output is rescaled by ``d_model**-0.5`` before the projection."""
        return bool(hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True)))

    def config_from_hf(self, hf: Mapping[str, Any], tied: bool) -> T5Config:
        return T5Config(
            d_model=hf["d_model"], d_kv=hf["d_kv"], d_ff=hf["d_ff"], num_layers=hf["num_layers"],
            num_decoder_layers=hf.get("num_decoder_layers") or hf["num_layers"], num_heads=hf["num_heads"],
            relative_attention_num_buckets=hf.get("relative_attention_num_buckets", 32),
            relative_attention_max_distance=hf.get("relative_attention_max_distance", 128),
            layer_norm_epsilon=hf.get("layer_norm_epsilon", 1e-6),
            feed_forward_proj=hf.get("feed_forward_proj", "relu"),
            scale_decoder_outputs=self.scales_outputs(hf),
            tie_word_embeddings=tied,
        )

    def from_hf(self, hf: Mapping[str, Any], tensors: Mapping[str, Any]) -> HFWeights:
        """Hugging Face names as they are; ``embed_tokens`` copies dropped, ``lm_head`` kept only
        when it is not the shared embedding (older T5 v1.1 files store a separate one)."""
        shared = tensors.get("shared.weight", tensors.get("encoder.embed_tokens.weight"))
        head = tensors.get("lm_head.weight")
        tied = head is None or (shared is not None and bool(head.equal(shared)))
        config = self.config_from_hf(hf, tied)
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
