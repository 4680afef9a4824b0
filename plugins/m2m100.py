"""M2M100 and NLLB (Hugging Face ``M2M100ForConditionalGeneration``, ``model_type`` ``m2m_100``),
from ``transformers``' arithmetic.

``s2s_deploy.modeling.parts.EncoderDecoder`` with tensor2tensor sinusoidal positions counted from
``pad_token_id + 1`` (a padding token takes the zero row, as fairseq's ``make_positions``),
embeddings scaled by ``sqrt(d)``, pre-norm layers with a final LayerNorm after each stack, no
LayerNorm on the embeddings, and the output projection tied to the shared embedding. The target
language is the forced first token (``forced_bos_token_id``), which the export keeps as its
default prefix; its language tokens (NLLB's ``fra_Latn``, M2M100's ``__fr__``) are listed in the
export, so ``target_lang`` picks another by code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from s2s_deploy.architecture.encoder_decoder import (
    EncoderDecoderConfig,
    EncoderDecoderPlugin,
    hf_encoder_decoder_config,
)

FAMILY = {"positions": "tensor2tensor", "layernorm_embedding": False, "normalize_before": True,
          "final_layer_norm": True}


class M2M100Plugin(EncoderDecoderPlugin):
    name = "m2m100"
    version = "1.0"
    description = "Hugging Face M2M100/NLLB: fairseq sinusoidal positions after the padding id, pre-norm"
    presets: ClassVar[dict[str, EncoderDecoderConfig]] = {
        "tiny": EncoderDecoderConfig(**FAMILY, pad_token_id=1, scale_embedding=True, activation_function="relu")}
    default_preset = "tiny"
    hf_model_types = ("m2m_100",)
    # M2M100Tokenizer's files (NLLB folders ship a tokenizer.json, or its slow tokenizer converts)
    hf_sentencepiece_files = ("sentencepiece.bpe.model", "sentencepiece.bpe.model", "vocab.json")
    hf_language_codes = r"[a-z]{3}_[A-Z][a-z]{3}|__[a-z]{2,3}__"  # NLLB's FLORES-200 codes, M2M100's

    def config_from_hf(self, hf: Mapping[str, Any]) -> EncoderDecoderConfig:
        return hf_encoder_decoder_config(hf, **FAMILY, pad_token_id=int(hf.get("pad_token_id", 1)),
                                         activation_function=hf.get("activation_function", "relu"),
                                         scale_embedding=bool(hf.get("scale_embedding", True)))


PLUGIN = M2M100Plugin()
