"""BlenderbotSmall (Hugging Face ``BlenderbotSmallForConditionalGeneration``), from
``transformers``' arithmetic.

``s2s_deploy.modeling.parts.EncoderDecoder`` with learned positions read from row 0, post-norm
layers, and a LayerNorm on the embeddings that in the encoder follows the position sum but in the
decoder sees the token embeddings alone, before positions are added (``decoder_layernorm_tokens``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from s2s_deploy.architecture.encoder_decoder import (
    EncoderDecoderConfig,
    EncoderDecoderPlugin,
    hf_encoder_decoder_config,
)

FAMILY = {"positions": "learned_from_zero", "layernorm_embedding": True, "decoder_layernorm_tokens": True}


class BlenderbotSmallPlugin(EncoderDecoderPlugin):
    name = "blenderbot_small"
    version = "1.0"
    description = "Hugging Face BlenderbotSmall: learned positions from 0, post-norm, embedding LayerNorm"
    presets: ClassVar[dict[str, EncoderDecoderConfig]] = {"tiny": EncoderDecoderConfig(**FAMILY)}
    default_preset = "tiny"
    hf_model_types = ("blenderbot-small",)
    hf_ids_only: ClassVar[dict[str, str]] = {"blenderbot-small": (
        "transformers has no converter for its '@@' BPE to a tokenizer.json, and s2s-deploy writes none of "
        "its own (docs/families.md)")}

    def config_from_hf(self, hf: Mapping[str, Any]) -> EncoderDecoderConfig:
        return hf_encoder_decoder_config(hf, **FAMILY)


PLUGIN = BlenderbotSmallPlugin()
