"""RNNsearch (exercise 26.2 of seed 000): BiLSTM encoder, LSTM decoder with additive attention.

The declaration, torch-free: config, presets and specs; the model is ``models/rnnsearch.py``,
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
class RNNSearchConfig:
    embed_size: int = 64
    encoder_hiddens: int = 128
    decoder_hiddens: int = 128
    attention_hiddens: int = 128
    num_layers: int = 1
    dropout: float = 0.1


class RNNSearchPlugin(ArchitecturePlugin):
    name = "rnnsearch"
    version = "1.0"
    description = "RNNsearch: BiLSTM encoder, LSTM decoder with additive attention (exercise 26.2)"
    config_type = RNNSearchConfig
    model = "s2s_deploy_plugins.models.rnnsearch:RNNSearch"
    presets: ClassVar[dict[str, RNNSearchConfig]] = {
        "small": RNNSearchConfig(),
        "paper": RNNSearchConfig(
            embed_size=620, encoder_hiddens=1000, decoder_hiddens=1000, attention_hiddens=1000, dropout=0.2
        ),
    }
    default_preset = "small"
    # TorchScript: the dynamo export of a bidirectional LSTM fails in ONNX Runtime ("Got
    # invalid dimensions for input") and pack_padded_sequence does not export under dynamo;
    # TorchScript maps the packing to the ONNX LSTM's sequence_lens, which ORT honours in both
    # directions.
    exporter = "torchscript"
    parity_atol = 1e-4
    has_attention = True

    def memory_specs(self, config: RNNSearchConfig) -> tuple[MemorySpec, ...]:
        return (
            MemorySpec("enc_outputs", 0, description="(B, S, 2*He) BiLSTM annotations, the attention values"),
            MemorySpec("enc_keys", 0, description="(B, S, A) annotations projected by W_h"),
            MemorySpec("src_bias", 0, description="(B, S) additive source padding mask"),
        )

    def state_specs(self, config: RNNSearchConfig) -> tuple[StateSpec, ...]:
        return (
            StateSpec("h", batch_axis=1, init="encoder", description="(layers, B, Hd) decoder LSTM hidden state"),
            StateSpec("c", batch_axis=1, init="encoder", description="(layers, B, Hd) decoder LSTM cell state"),
        )


PLUGIN = RNNSearchPlugin()
