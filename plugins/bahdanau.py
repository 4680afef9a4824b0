"""The d2l ``Seq2SeqAttentionDecoder`` (seed 004): Bahdanau attention on a GRU encoder-decoder.

The declaration, torch-free: config, presets and specs; the model is ``models/bahdanau.py``,
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
class BahdanauConfig:
    embed_size: int = 64
    num_hiddens: int = 128
    num_layers: int = 2
    dropout: float = 0.1


class BahdanauPlugin(ArchitecturePlugin):
    name = "bahdanau"
    version = "1.0"
    description = "GRU encoder-decoder with additive (Bahdanau) attention (d2l Seq2SeqAttentionDecoder)"
    config_type = BahdanauConfig
    model = "s2s_deploy_plugins.models.bahdanau:BahdanauSeq2Seq"
    presets: ClassVar[dict[str, BahdanauConfig]] = {
        "small": BahdanauConfig(),
        "d2l": BahdanauConfig(embed_size=32, num_hiddens=32, num_layers=2, dropout=0.1),
        "base": BahdanauConfig(embed_size=256, num_hiddens=512, num_layers=2, dropout=0.2),
    }
    default_preset = "small"
    # TorchScript: pack_padded_sequence fails under the dynamo exporter (data-dependent
    # batch sizes), while TorchScript maps it to the ONNX GRU's sequence_lens input.
    exporter = "torchscript"
    parity_atol = 1e-4
    has_attention = True

    def memory_specs(self, config: BahdanauConfig) -> tuple[MemorySpec, ...]:
        return (
            MemorySpec("enc_outputs", 0, description="(B, S, H) top-layer encoder outputs, the attention values"),
            MemorySpec("enc_keys", 0, description="(B, S, H) encoder outputs projected by W_k"),
            MemorySpec("src_bias", 0, description="(B, S) additive source padding mask"),
        )

    def state_specs(self, config: BahdanauConfig) -> tuple[StateSpec, ...]:
        return (StateSpec("h", batch_axis=1, init="encoder", description="(layers, B, H) decoder GRU state"),)


PLUGIN = BahdanauPlugin()
