"""The 4-layer LSTM sequence-to-sequence model of exercise 26.1 (seed 000).

The declaration, torch-free: config, presets and specs; the model is ``models/lstm.py``,
imported only when one is built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from s2s_deploy.architecture.declaration import (
    ArchitecturePlugin,
    MemorySpec,
    StateSpec,
)


@dataclass(frozen=True)
class LSTMConfig:
    embed_size: int = 64
    num_hiddens: int = 128
    num_layers: int = 4
    dropout: float = 0.1
    reverse_source: bool = True


class LSTMPlugin(ArchitecturePlugin):
    name = "lstm"
    version = "1.0"
    description = "4-layer LSTM encoder-decoder (exercise 26.1), decoder input = embedding ++ encoder's final h"
    config_type = LSTMConfig
    model = "s2s_deploy_plugins.models.lstm:LSTMSeq2Seq"
    presets: ClassVar[dict[str, LSTMConfig]] = {
        "small": LSTMConfig(),
        "base": LSTMConfig(embed_size=256, num_hiddens=512, num_layers=4, dropout=0.2),
    }
    default_preset = "small"
    # TorchScript: pack_padded_sequence fails under the dynamo exporter (data-dependent
    # batch sizes), while TorchScript maps it to the ONNX LSTM's sequence_lens input.
    exporter = "torchscript"
    parity_atol = 1e-4

    def memory_specs(self, config: LSTMConfig) -> tuple[MemorySpec, ...]:
        return (MemorySpec("context", 0, description="(B, H) encoder's final top-layer h, read at every step"),)

    def state_specs(self, config: LSTMConfig) -> tuple[StateSpec, ...]:
        return (
            StateSpec("h", batch_axis=1, init="encoder", description="(layers, B, H) decoder LSTM hidden state"),
            StateSpec("c", batch_axis=1, init="encoder", description="(layers, B, H) decoder LSTM cell state"),
        )


PLUGIN = LSTMPlugin()
