"""FSMT (Hugging Face ``FSMTForConditionalGeneration``, fairseq's WMT19 models), from
``transformers``' arithmetic.

``s2s_deploy.modeling.parts.EncoderDecoder`` with separate source and target vocabularies and
embeddings (``encoder.embed_tokens``, ``decoder.embed_tokens``), the output projection
(``decoder.output_projection``) tied to the target table only when the config says so,
tensor2tensor sinusoidal positions counted from ``pad_token_id + 1``, embeddings scaled by
``sqrt(d)``, post-norm layers, no LayerNorm on the embeddings and no logits bias.

One difference is left: at a decoder step whose input token is the padding id, fairseq's
positions give row ``pad + step`` and these give the zero row; a search never feeds padding
to a live hypothesis.

``parity --reference`` steps transformers' model with its own cache, as ``generate`` does
(``hf_step_cache``): ``FSMTModel.forward`` builds the decoder's causal mask only when it is given
``input_ids``, and a reference that passes the encoder's states instead (as every uncached step
does) lets each earlier position of the prefix attend to the later ones, so from the second
layer on the last position's logits are not ``generate``'s (up to 5.7 apart in log-prob on a
tiny model while the tokens, from the cached ``generate``, agreed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from s2s_deploy.architecture.encoder_decoder import (
    EncoderDecoderConfig,
    EncoderDecoderPlugin,
    hf_encoder_decoder_config,
)

FAMILY = {"positions": "tensor2tensor", "layernorm_embedding": False, "shared_embeddings": False}


class FSMTPlugin(EncoderDecoderPlugin):
    name = "fsmt"
    version = "1.0"
    description = "Hugging Face FSMT (fairseq WMT19): separate vocabularies, fairseq sinusoidal positions, post-norm"
    presets: ClassVar[dict[str, EncoderDecoderConfig]] = {
        "tiny": EncoderDecoderConfig(**FAMILY, pad_token_id=1, scale_embedding=True, activation_function="relu",
                                     tie_word_embeddings=False)}
    default_preset = "tiny"
    hf_model_types = ("fsmt",)
    hf_moses_files = ("vocab-src.json", "vocab-tgt.json", "merges.txt")  # what FSMTTokenizer reads
    hf_renames: ClassVar[dict[str, str]] = {"decoder.output_projection.weight": "lm_head.weight"}
    hf_step_cache = True  # its uncached forward, fed encoder states, has no causal mask (above)

    def config_from_hf(self, hf: Mapping[str, Any]) -> EncoderDecoderConfig:
        return hf_encoder_decoder_config(hf, **FAMILY, pad_token_id=int(hf.get("pad_token_id", 1)),
                                         activation_function=hf.get("activation_function", "relu"),
                                         scale_embedding=bool(hf.get("scale_embedding", True)),
                                         tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)))

    def vocab_sizes(self, hf: Mapping[str, Any]) -> tuple[int, int]:
        return int(hf["src_vocab_size"]), int(hf["tgt_vocab_size"])


PLUGIN = FSMTPlugin()
