"""Marian (Hugging Face ``MarianMTModel``, the opus-mt models), from ``transformers``' arithmetic.

Marian is the BART layer stack (plugins/bart.py) with sinusoidal positions (sines in the first
half of the vector, cosines in the second, from position 0), embeddings scaled by ``sqrt(d)``,
post-norm layers and no LayerNorm on the embeddings. The sinusoid table is computed, not stored:
Hugging Face does not save it either.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from s2s_deploy_plugins.bart import BartFamilyConfig, BartFamilyPlugin

TINY = BartFamilyConfig(positions="sinusoidal", layernorm_embedding=False, scale_embedding=True,
                        activation_function="swish")


class MarianPlugin(BartFamilyPlugin):
    name = "marian"
    version = "1.0"
    description = "Hugging Face Marian (opus-mt): sinusoidal positions, scaled embeddings, post-norm"
    presets: ClassVar[dict[str, BartFamilyConfig]] = {"tiny": TINY}
    default_preset = "tiny"
    hf_model_types = ("marian",)
    hf_sentencepiece_files = ("source.spm", "target.spm", "vocab.json")  # what MarianTokenizer reads

    def config_from_hf(self, hf: Mapping[str, Any]) -> BartFamilyConfig:
        return BartFamilyConfig(
            d_model=hf["d_model"], encoder_layers=hf["encoder_layers"], decoder_layers=hf["decoder_layers"],
            encoder_attention_heads=hf["encoder_attention_heads"],
            decoder_attention_heads=hf["decoder_attention_heads"],
            encoder_ffn_dim=hf["encoder_ffn_dim"], decoder_ffn_dim=hf["decoder_ffn_dim"],
            max_position_embeddings=hf["max_position_embeddings"],
            activation_function=hf.get("activation_function", "gelu"),
            scale_embedding=bool(hf.get("scale_embedding", False)),
            normalize_before=False, final_layer_norm=False,
            layernorm_embedding=False, positions="sinusoidal",
            tie_word_embeddings=hf.get("tie_word_embeddings", True) is not False,
        )


PLUGIN = MarianPlugin()
