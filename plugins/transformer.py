"""The Transformer of seeds 002/004 (d2l) and exercise 26.5 of seed 000.

The declaration, torch-free: config, presets and specs; the model is ``models/transformer.py``,
imported only when one is built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from s2s_deploy.architecture.declaration import (
    ArchitecturePlugin,
    MemorySpec,
    StateSpec,
    cross_memory_specs,
    self_attention_cache,
)


@dataclass(frozen=True)
class TransformerConfig:
    d_model: int = 128
    num_heads: int = 4
    ffn_hidden: int = 512
    encoder_layers: int = 2
    decoder_layers: int = 2
    dropout: float = 0.1
    max_len: int = 256
    tie_output: bool = True


class TransformerPlugin(ArchitecturePlugin):
    name = "transformer"
    version = "2.0"
    description = "Transformer (post-norm, sinusoidal positions), cross-attention K/V from the encoder"
    config_type = TransformerConfig
    model = "s2s_deploy_plugins.models.transformer:Transformer"
    presets: ClassVar[dict[str, TransformerConfig]] = {
        "small": TransformerConfig(),
        "base": TransformerConfig(
            d_model=512, num_heads=8, ffn_hidden=2048, encoder_layers=6, decoder_layers=6, max_len=512
        ),
    }
    default_preset = "small"
    exporter = "dynamo"
    parity_atol = 1e-4
    has_attention = True

    def memory_specs(self, config: TransformerConfig) -> tuple[MemorySpec, ...]:
        return cross_memory_specs(config.decoder_layers)

    def state_specs(self, config: TransformerConfig) -> tuple[StateSpec, ...]:
        return self_attention_cache(config.decoder_layers, config.num_heads, config.d_model // config.num_heads)

    def max_target_length(self, config: TransformerConfig) -> int:
        return config.max_len

    def max_source_length(self, config: TransformerConfig) -> int:
        return config.max_len


PLUGIN = TransformerPlugin()
