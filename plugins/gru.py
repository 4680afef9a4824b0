"""The RNN encoder-decoder of seed 004 (d2l ``Seq2SeqEncoder`` / ``Seq2SeqDecoder``).

The declaration, torch-free: config, presets and specs; the model is ``models/gru.py``,
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
class GRUConfig:
    embed_size: int = 64
    num_hiddens: int = 128
    num_layers: int = 2
    dropout: float = 0.1


class GRUPlugin(ArchitecturePlugin):
    name = "gru"
    version = "1.0"
    description = "GRU encoder-decoder (d2l), decoder input = embedding ++ encoder's final state"
    config_type = GRUConfig
    model = "s2s_deploy_plugins.models.gru:GRUSeq2Seq"
    presets: ClassVar[dict[str, GRUConfig]] = {
        "small": GRUConfig(),
        "d2l": GRUConfig(embed_size=32, num_hiddens=32, num_layers=2, dropout=0.1),
        "base": GRUConfig(embed_size=256, num_hiddens=512, num_layers=2, dropout=0.2),
    }
    default_preset = "small"
    # TorchScript: pack_padded_sequence fails under the dynamo exporter (data-dependent
    # batch sizes), while TorchScript maps it to the ONNX GRU's sequence_lens input.
    exporter = "torchscript"
    parity_atol = 1e-4

    def memory_specs(self, config: GRUConfig) -> tuple[MemorySpec, ...]:
        return (MemorySpec("context", 0, description="(B, H) encoder's final top-layer state, read at every step"),)

    def state_specs(self, config: GRUConfig) -> tuple[StateSpec, ...]:
        return (StateSpec("h", batch_axis=1, init="encoder", description="(layers, B, H) decoder GRU state"),)


PLUGIN = GRUPlugin()
