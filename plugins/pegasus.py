"""Pegasus (Hugging Face ``PegasusForConditionalGeneration``), from ``transformers``' arithmetic.

``s2s_deploy.modeling.parts.EncoderDecoder`` with split sinusoidal positions from 0 (as Marian's),
pre-norm layers with a final LayerNorm after each stack, no LayerNorm on the embeddings, and
``final_logits_bias``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from s2s_deploy.architecture.encoder_decoder import (
    EncoderDecoderConfig,
    EncoderDecoderPlugin,
    hf_encoder_decoder_config,
)

FAMILY = {"positions": "sinusoidal", "layernorm_embedding": False, "normalize_before": True, "final_layer_norm": True}


class PegasusPlugin(EncoderDecoderPlugin):
    name = "pegasus"
    version = "1.0"
    description = "Hugging Face Pegasus: sinusoidal positions, pre-norm with final norms"
    presets: ClassVar[dict[str, EncoderDecoderConfig]] = {"tiny": EncoderDecoderConfig(**FAMILY)}
    default_preset = "tiny"
    hf_model_types = ("pegasus",)

    def config_from_hf(self, hf: Mapping[str, Any]) -> EncoderDecoderConfig:
        return hf_encoder_decoder_config(hf, **FAMILY)


PLUGIN = PegasusPlugin()
