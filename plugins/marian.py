"""Marian (Hugging Face ``MarianMTModel``, the opus-mt models), from ``transformers``' arithmetic.

``s2s_deploy.modeling.parts.EncoderDecoder`` with split sinusoidal positions (sines in the first
half of the vector, cosines in the second, from position 0), embeddings scaled by ``sqrt(d)``,
post-norm layers and no LayerNorm on the embeddings. The sinusoid table is computed, not stored:
Hugging Face does not save it either.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from s2s_deploy.architecture.encoder_decoder import (
    EncoderDecoderConfig,
    EncoderDecoderPlugin,
    hf_encoder_decoder_config,
)

TINY = EncoderDecoderConfig(positions="sinusoidal", layernorm_embedding=False, scale_embedding=True,
                            activation_function="swish")


class MarianPlugin(EncoderDecoderPlugin):
    name = "marian"
    version = "1.0"
    description = "Hugging Face Marian (opus-mt): sinusoidal positions, scaled embeddings, post-norm"
    presets: ClassVar[dict[str, EncoderDecoderConfig]] = {"tiny": TINY}
    default_preset = "tiny"
    hf_model_types = ("marian",)
    hf_sentencepiece_files = ("source.spm", "target.spm", "vocab.json")  # what MarianTokenizer reads

    def config_from_hf(self, hf: Mapping[str, Any]) -> EncoderDecoderConfig:
        return hf_encoder_decoder_config(hf, layernorm_embedding=False, positions="sinusoidal")


PLUGIN = MarianPlugin()
