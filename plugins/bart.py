"""BART and mBART (Hugging Face ``BartForConditionalGeneration``, ``MBartForConditionalGeneration``),
written from ``transformers``' arithmetic without importing it.

Both are ``s2s_deploy.modeling.parts.EncoderDecoder`` (declared by
``s2s_deploy.architecture.encoder_decoder``): learned positions read at ``position + 2`` (the
table has two spare rows), an optional ``sqrt(d)`` embedding scale, a LayerNorm on the
embeddings. BART's layers are post-norm; mBART's pre-norm, with a final LayerNorm after each
stack. The output projection is tied to the one shared embedding, and ``final_logits_bias`` is
added to the logits as Hugging Face does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from s2s_deploy.architecture.encoder_decoder import (
    EncoderDecoderConfig,
    EncoderDecoderPlugin,
    hf_encoder_decoder_config,
)


class BartPlugin(EncoderDecoderPlugin):
    name = "bart"
    version = "1.0"
    description = "Hugging Face BART/mBART (learned positions +2; post-norm, or pre-norm with final norms)"
    presets: ClassVar[dict[str, EncoderDecoderConfig]] = {
        "tiny": EncoderDecoderConfig(),
        "tiny-mbart": EncoderDecoderConfig(normalize_before=True, final_layer_norm=True, scale_embedding=True),
    }
    default_preset = "tiny"
    hf_model_types = ("bart", "mbart")

    def config_from_hf(self, hf: Mapping[str, Any]) -> EncoderDecoderConfig:
        pre_norm = hf.get("model_type") == "mbart"
        return hf_encoder_decoder_config(hf, normalize_before=pre_norm, final_layer_norm=pre_norm)


PLUGIN = BartPlugin()
