"""Hugging Face vision encoder-decoders (``VisionEncoderDecoderModel``, ``model_type``
``vision-encoder-decoder``) with a ViT or DeiT encoder and a TrOCR decoder, as TrOCR is; written from
``transformers``' arithmetic without importing it.

The encoder reads ``(batch, 3, height, width)`` pixels from the ``vit_image`` front end, whose
parameters come from the folder's ``preprocessor_config.json`` (its size must be the encoder's
``image_size``): a patch convolution, a class token (and DeiT's distillation token), the stored
position table, pre-norm layers and a final LayerNorm. Its output goes through ``enc_to_dec_proj``
when the two hidden sizes differ, as ``transformers`` does. The decoder is ``s2s_deploy.modeling.parts``'
post-norm stack: a token table scaled by ``sqrt(d_model)`` under ``scale_embedding``, learned positions
read at ``index + 2`` or tensor2tensor sinusoids after the padding id (``use_learned_position_embeddings``),
the optional embedding LayerNorm, cross-attention to every image position, and the output projection
(tied to the token table unless ``tie_word_embeddings`` is false). Images are never padded: the
encoder reads every position, and ``src_len`` is 1 per image.

Other encoders (Swin, as Donut has) and decoders (BERT, GPT-2, ...) are refused at export in one line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from s2s_deploy.architecture.declaration import HFWeights
from s2s_deploy.architecture.encoder_decoder import EncoderDecoderConfig, EncoderDecoderPlugin
from s2s_deploy.errors import CheckpointError, S2SError
from s2s_deploy.format.source import FEATURES, SourceSpec
from s2s_deploy.format.specs import MemorySpec, StateSpec
from s2s_deploy.frontends import VitImage

PREPROCESSOR_FILE = "preprocessor_config.json"
ENCODERS = ("vit", "deit")
DECODERS = ("trocr",)
CHANNELS = 3
"""The front end makes RGB images; an encoder of another channel count is refused."""

OLD_VIT_NAMES = (
    (r"^encoder\.encoder\.layer\.", "encoder.layers."),
    (r"\.attention\.attention\.query\.", ".attention.q_proj."),
    (r"\.attention\.attention\.key\.", ".attention.k_proj."),
    (r"\.attention\.attention\.value\.", ".attention.v_proj."),
    (r"\.attention\.output\.dense\.", ".attention.o_proj."),
    (r"\.intermediate\.dense\.", ".mlp.fc1."),
    (r"\.output\.dense\.", ".mlp.fc2."),
)
"""Checkpoints saved before transformers 5 name the ViT/DeiT layers as BERT does; transformers
renames them on load (``conversion_mapping.py``, ``ViTModel``), and so does this plugin, in order."""

TINY_FRONTEND = VitImage(height=32, width=32, resample=0)
"""The tiny preset's front end: 32x32 images. Its ``resample`` is 0 (nearest) so that a checkpoint's
config may say nearest: a whole-number field is held to at least ``min(default, 1)``."""


@dataclass(frozen=True)
class VisionEncoderDecoderConfig:
    """The image front end (``preprocessor_config.json``), whose size is the encoder's image size, the
    encoder (``config.json``'s ``encoder``) and the decoder (its ``decoder``)."""

    frontend: VitImage = TINY_FRONTEND
    patch_size: int = 8
    encoder_hidden_size: int = 64
    encoder_layers: int = 2
    encoder_attention_heads: int = 4
    encoder_ffn_dim: int = 128
    encoder_activation: str = "gelu"
    encoder_layer_norm_eps: float = 1e-12
    qkv_bias: bool = True
    distillation_token: bool = False
    """DeiT: a second learned token after the class token, with its own position."""
    d_model: int = 64
    decoder_layers: int = 2
    decoder_attention_heads: int = 4
    decoder_ffn_dim: int = 128
    max_position_embeddings: int = 64
    activation_function: str = "gelu"
    scale_embedding: bool = False
    layernorm_embedding: bool = True
    learned_positions: bool = True
    pad_token_id: int = 1
    tie_word_embeddings: bool = True
    cross_attention_from_encoder: bool = False
    """The decoder's cross-attention reads the encoder's width itself (``cross_attention_hidden_size``);
    otherwise ``enc_to_dec_proj`` maps it when the widths differ."""

    @property
    def positions(self) -> int:
        """Encoder positions: one per patch, plus the class token (and DeiT's distillation token)."""
        patches = (self.frontend.height // self.patch_size) * (self.frontend.width // self.patch_size)
        return patches + 1 + int(self.distillation_token)

    @property
    def projects(self) -> bool:
        """Whether ``enc_to_dec_proj`` maps the encoder's output to the decoder's width."""
        return self.encoder_hidden_size != self.d_model and not self.cross_attention_from_encoder

    def layers(self) -> EncoderDecoderConfig:
        """The decoder as the shared parts' config: post-norm layers, no final LayerNorm, a target
        table of its own."""
        return EncoderDecoderConfig(
            d_model=self.d_model, encoder_layers=self.encoder_layers, decoder_layers=self.decoder_layers,
            encoder_attention_heads=self.encoder_attention_heads, decoder_attention_heads=self.decoder_attention_heads,
            encoder_ffn_dim=self.encoder_ffn_dim, decoder_ffn_dim=self.decoder_ffn_dim,
            max_position_embeddings=self.max_position_embeddings, activation_function=self.activation_function,
            scale_embedding=self.scale_embedding, normalize_before=False, final_layer_norm=False,
            layernorm_embedding=self.layernorm_embedding,
            positions="learned" if self.learned_positions else "tensor2tensor",
            tie_word_embeddings=self.tie_word_embeddings, pad_token_id=self.pad_token_id, shared_embeddings=False)


def _supported(hf: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """``config.json``'s encoder and decoder, refused in one line unless a ViT/DeiT and a TrOCR."""
    encoder, decoder = hf.get("encoder"), hf.get("decoder")
    if not isinstance(encoder, Mapping) or not isinstance(decoder, Mapping):
        raise CheckpointError("config.json: a vision-encoder-decoder names its encoder and decoder configs")
    pair = (encoder.get("model_type"), decoder.get("model_type"))
    if pair[0] not in ENCODERS or pair[1] not in DECODERS:
        raise CheckpointError(f"vision-encoder-decoder with a {pair[0]!r} encoder and a {pair[1]!r} decoder is not "
                              f"supported: the encoder must be {' or '.join(ENCODERS)} and the decoder "
                              f"{' or '.join(DECODERS)} (TrOCR's layout)")
    return encoder, decoder


def _size(value: Any, key: str) -> tuple[int, int]:
    """``image_size`` or ``patch_size``: one int, or (height, width)."""
    if isinstance(value, int):
        return value, value
    if isinstance(value, list | tuple) and len(value) == 2:
        return int(value[0]), int(value[1])
    raise CheckpointError(f"config.json: encoder {key} {value!r} is not a size")


def _renamed(name: str) -> str | None:
    """Our name for a Hugging Face weight, or None for one the deployed model never reads."""
    if name.startswith("encoder."):
        if name.startswith("encoder.pooler."):
            return None
        for pattern, replacement in OLD_VIT_NAMES:
            name = re.sub(pattern, replacement, name)
        return name
    if name.startswith("decoder.model.decoder."):
        return "decoder." + name.removeprefix("decoder.model.decoder.")
    if name == "decoder.output_projection.weight":
        return "lm_head.weight"
    return name


class VisionEncoderDecoderPlugin(EncoderDecoderPlugin):
    name = "vision_encoder_decoder"
    version = "1.0"
    description = "Hugging Face VisionEncoderDecoder (TrOCR): ViT/DeiT image encoder, TrOCR post-norm decoder"
    config_type = VisionEncoderDecoderConfig
    has_attention = False  # the attention pictures label source tokens; this source is image patches
    presets: ClassVar[dict[str, VisionEncoderDecoderConfig]] = {"tiny": VisionEncoderDecoderConfig()}
    default_preset = "tiny"
    hf_model_types = ("vision-encoder-decoder",)
    hf_files = (PREPROCESSOR_FILE,)
    model = "s2s_deploy_plugins.models.vision_encoder_decoder:VisionEncoderDecoderModel"

    def source_spec(self, config: VisionEncoderDecoderConfig) -> SourceSpec:
        """``(3, height, width)`` pixels, one fixed-size item per row: nothing is padded."""
        return SourceSpec(kind=FEATURES, shape=(CHANNELS, config.frontend.height, config.frontend.width),
                          dtype="float32", frontend=config.frontend.to_json())

    def memory_specs(self, config: VisionEncoderDecoderConfig) -> tuple[MemorySpec, ...]:  # type: ignore[override]
        return super().memory_specs(config.layers())

    def state_specs(self, config: VisionEncoderDecoderConfig) -> tuple[StateSpec, ...]:  # type: ignore[override]
        return super().state_specs(config.layers())

    def max_target_length(self, config: VisionEncoderDecoderConfig) -> int | None:
        return super().max_target_length(config.layers())

    def max_source_length(self, config: VisionEncoderDecoderConfig) -> int | None:
        return None

    def from_hf(self, hf: Mapping[str, Any], tensors: Mapping[str, Any],
                files: Mapping[str, Mapping[str, Any]] | None = None) -> HFWeights:
        """``config.json``'s encoder and decoder, the front end of ``preprocessor_config.json`` (which
        must make the encoder's image size); weights under our names (``_renamed``)."""
        encoder, decoder = _supported(hf)
        try:
            frontend = VitImage.from_preprocessor_config((files or {})[PREPROCESSOR_FILE])
        except (S2SError, KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{PREPROCESSOR_FILE}: {exc}") from exc
        height, width = _size(encoder.get("image_size", 224), "image_size")
        patch = _size(encoder.get("patch_size", 16), "patch_size")
        if patch[0] != patch[1]:
            raise CheckpointError(f"config.json: encoder patch_size {patch} is not square")
        if (frontend.height, frontend.width) != (height, width) or not frontend.do_resize:
            raise CheckpointError(f"{PREPROCESSOR_FILE} makes {frontend.width}x{frontend.height} images"
                                  f"{'' if frontend.do_resize else ' only when resizing, which it does not'}; the "
                                  f"encoder reads exactly {width}x{height} (its image_size)")
        if int(encoder.get("num_channels", CHANNELS)) != CHANNELS:
            raise CheckpointError(f"config.json: the encoder reads {encoder['num_channels']} channels; the image "
                                  f"front end makes {CHANNELS} (RGB)")
        cross = decoder.get("cross_attention_hidden_size")
        if cross is not None and int(cross) != int(encoder["hidden_size"]):
            raise CheckpointError(f"config.json: the decoder's cross_attention_hidden_size {cross} is not the "
                                  f"encoder's hidden_size {encoder['hidden_size']}")
        config = VisionEncoderDecoderConfig(
            frontend=frontend, patch_size=patch[0], encoder_hidden_size=int(encoder["hidden_size"]),
            encoder_layers=int(encoder["num_hidden_layers"]),
            encoder_attention_heads=int(encoder["num_attention_heads"]),
            encoder_ffn_dim=int(encoder["intermediate_size"]),
            encoder_activation=str(encoder.get("hidden_act", "gelu")),
            encoder_layer_norm_eps=float(encoder.get("layer_norm_eps", 1e-12)),
            qkv_bias=bool(encoder.get("qkv_bias", True)), distillation_token=encoder["model_type"] == "deit",
            d_model=int(decoder["d_model"]), decoder_layers=int(decoder["decoder_layers"]),
            decoder_attention_heads=int(decoder["decoder_attention_heads"]),
            decoder_ffn_dim=int(decoder["decoder_ffn_dim"]),
            max_position_embeddings=int(decoder["max_position_embeddings"]),
            activation_function=str(decoder.get("activation_function", "gelu")),
            scale_embedding=bool(decoder.get("scale_embedding", False)),
            layernorm_embedding=bool(decoder.get("layernorm_embedding", True)),
            learned_positions=bool(decoder.get("use_learned_position_embeddings", True)),
            pad_token_id=int(decoder.get("pad_token_id", 1)),
            tie_word_embeddings=decoder.get("tie_word_embeddings", True) is not False,
            cross_attention_from_encoder=cross is not None)
        vocab = int(decoder["vocab_size"])
        weights: dict[str, Any] = {}
        for name, tensor in tensors.items():
            key = _renamed(name)
            if key is None or (key == "lm_head.weight" and config.tie_word_embeddings):
                continue
            weights[key] = tensor
        if "final_logits_bias" not in weights:  # a zero bias, made by the tensors' own torch
            weights["final_logits_bias"] = next(iter(tensors.values())).new_zeros((1, vocab))
        return HFWeights(config, weights, vocab, vocab)


PLUGIN = VisionEncoderDecoderPlugin()
