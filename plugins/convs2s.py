"""The convolutional seq2seq model of exercise 26.4 of seed 000 (Gehring et al. 2017, arXiv 1705.03122).

The declaration, torch-free: config, presets and specs; the model is ``models/convs2s.py``,
imported only when one is built."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from s2s_deploy.architecture.declaration import (
    BATCH,
    ArchitecturePlugin,
    MemorySpec,
    StateSpec,
)


@dataclass(frozen=True)
class ConvS2SConfig:
    emb_dim: int = 128
    hid_dim: int = 256
    encoder_layers: int = 4
    decoder_layers: int = 4
    kernel_size: int = 3
    dropout: float = 0.1
    max_positions: int = 128

    def __post_init__(self) -> None:
        # Odd: the encoder pads (k-1)/2 on each side to keep lengths. At least 3: the decoder
        # state holds k-1 inputs, and an empty state tensor is a needless edge case for exporters.
        if self.kernel_size < 3 or self.kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd and >= 3, got {self.kernel_size}")


class ConvS2SPlugin(ArchitecturePlugin):
    name = "convs2s"
    version = "1.0"
    description = "Convolutional seq2seq (GLU convolutions, per-layer attention), rolling conv windows"
    config_type = ConvS2SConfig
    model = "s2s_deploy_plugins.models.convs2s:ConvS2S"
    presets: ClassVar[Mapping[str, ConvS2SConfig]] = {
        "small": ConvS2SConfig(),
        # the bundled checkpoint's: half the channels, a quarter of small's convolution weights (under 5 MB)
        "compact": ConvS2SConfig(hid_dim=128),
        "base": ConvS2SConfig(
            emb_dim=256, hid_dim=512, encoder_layers=10, decoder_layers=10, kernel_size=3, max_positions=512
        ),
    }
    default_preset = "small"
    # Dynamo: Conv1d, the rolling-window concat and the dynamic batch/source axes export cleanly
    # (ORT matches PyTorch to ~5e-7). TorchScript gives the same numbers, but exports nothing dynamo can't.
    exporter = "dynamo"
    parity_atol = 1e-4
    has_attention = True

    def memory_specs(self, config: ConvS2SConfig) -> tuple[MemorySpec, ...]:
        return (
            MemorySpec("conved", 0, description="(B, S, emb) encoder output: the attention keys"),
            MemorySpec("combined", 0, description="(B, S, emb) (conved + embedded) * sqrt(0.5): the values"),
            MemorySpec("src_bias", 0, description="(B, 1, S) additive source padding mask"),
        )

    def state_specs(self, config: ConvS2SConfig) -> tuple[StateSpec, ...]:
        shape = (config.decoder_layers, BATCH, config.kernel_size - 1, config.hid_dim)
        return (
            StateSpec("conv_window", batch_axis=1, init="zeros", shape=shape,
                      description="(layers, B, k-1, hid) each decoder layer's last k-1 conv inputs"),
        )

    def max_target_length(self, config: ConvS2SConfig) -> int:
        return config.max_positions

    def max_source_length(self, config: ConvS2SConfig) -> int:
        return config.max_positions


PLUGIN = ConvS2SPlugin()
