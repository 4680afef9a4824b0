"""Hugging Face Speech2Text (``Speech2TextForConditionalGeneration``, ``model_type`` ``speech_to_text``),
written from ``transformers``' arithmetic without importing it.

The encoder reads ``(batch, frames, num_mel_bins)`` Kaldi filterbank features from the
``kaldi_fbank`` front end (parameters from the folder's ``preprocessor_config.json``), of any
length: ``src_len`` counts each clip's frames, as ``attention_mask`` does for ``transformers``.
``Conv1dSubsampler``: ``num_conv_layers`` convolutions of stride 2 (kernel ``k``, padding
``k // 2``), each followed by a GLU over channels, so ``n`` frames become ``(n - 1) // 2 + 1`` per
convolution (``_get_feat_extract_output_lengths``). The convolutions' output is scaled by
``sqrt(d_model)`` (``scale_embedding``), given fairseq sinusoidal positions after the pad id, run
through pre-norm layers and a final LayerNorm. Frames past a clip's length are zeroed before each
convolution and masked in attention, so a clip decodes the same alone or padded in a batch
(``transformers`` lets a batch's padding into the last frame of its second convolution; it gives
the padding-free result only for a clip alone). The decoder is ``s2s_deploy.modeling.parts``' pre-norm
stack with the same positions, scaled embeddings and its output projection tied to the token
table or not (``tie_word_embeddings``).

Decoding is the generic ``generate``'s (``generation_config.json`` and its defaults: the decoder
start, a forced first token such as a multilingual model's ``<lang:fr>``, ``max_length``, ...),
which the export's ``hf_search`` defaults already reproduce.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from s2s_deploy.architecture.declaration import HFWeights
from s2s_deploy.architecture.encoder_decoder import EncoderDecoderConfig, EncoderDecoderPlugin
from s2s_deploy.errors import CheckpointError, S2SError
from s2s_deploy.format.source import FEATURES, FRAMES, SourceSpec
from s2s_deploy.format.specs import MemorySpec, StateSpec
from s2s_deploy.frontends import KaldiFbank

PREPROCESSOR_FILE = "preprocessor_config.json"
FRONTEND = KaldiFbank()
"""The tiny preset's front end: Speech2Text's defaults."""


@dataclass(frozen=True)
class Speech2TextConfig:
    """``config.json``'s sizes and the front end (``preprocessor_config.json``), whose parameters its
    own config states. ``conv_kernel_sizes`` is a comma-separated string of JSON scalars."""

    frontend: KaldiFbank = FRONTEND
    conv_kernel_sizes: str = "5,5"
    conv_channels: int = 128
    d_model: int = 64
    encoder_layers: int = 2
    decoder_layers: int = 2
    encoder_attention_heads: int = 4
    decoder_attention_heads: int = 4
    encoder_ffn_dim: int = 128
    decoder_ffn_dim: int = 128
    activation_function: str = "relu"
    scale_embedding: bool = True
    pad_token_id: int = 1
    tie_word_embeddings: bool = True

    def __post_init__(self) -> None:
        try:
            kernels = self.kernels
        except ValueError:
            kernels = ()
        if not kernels or min(kernels) < 1:
            raise ValueError(f"conv_kernel_sizes {self.conv_kernel_sizes!r} must be positive whole numbers")

    @property
    def kernels(self) -> tuple[int, ...]:
        return tuple(int(k) for k in self.conv_kernel_sizes.split(","))

    @property
    def num_mel_bins(self) -> int:
        """The mel bins the first convolution reads."""
        return self.frontend.num_mel_bins

    def layers(self) -> EncoderDecoderConfig:
        """The shared parts' config: pre-norm layers, final LayerNorms, fairseq sinusoidal positions
        after the pad id, a target table of its own (the encoder reads features)."""
        return EncoderDecoderConfig(
            d_model=self.d_model, encoder_layers=self.encoder_layers, decoder_layers=self.decoder_layers,
            encoder_attention_heads=self.encoder_attention_heads, decoder_attention_heads=self.decoder_attention_heads,
            encoder_ffn_dim=self.encoder_ffn_dim, decoder_ffn_dim=self.decoder_ffn_dim,
            activation_function=self.activation_function, scale_embedding=self.scale_embedding,
            normalize_before=True, final_layer_norm=True, layernorm_embedding=False, positions="tensor2tensor",
            pad_token_id=self.pad_token_id, shared_embeddings=False, tie_word_embeddings=self.tie_word_embeddings)


class Speech2TextPlugin(EncoderDecoderPlugin):
    name = "speech_to_text"
    version = "1.0"
    description = "Hugging Face Speech2Text: Kaldi filterbanks, a strided GLU convolution stack, pre-norm Transformer"
    config_type = Speech2TextConfig
    has_attention = False  # the attention pictures label source tokens; this source is frames
    presets: ClassVar[dict[str, Speech2TextConfig]] = {"tiny": Speech2TextConfig()}
    default_preset = "tiny"
    hf_model_types = ("speech_to_text",)
    hf_sentencepiece_files = ("sentencepiece.bpe.model", "sentencepiece.bpe.model", "vocab.json")  # the target's
    hf_language_codes = r"<lang:[a-z]{2,3}>"  # Speech2TextTokenizer's language tokens (multilingual models)
    hf_files = (PREPROCESSOR_FILE,)
    model = "s2s_deploy_plugins.models.speech_to_text:Speech2TextModel"

    def source_spec(self, config: Speech2TextConfig) -> SourceSpec:
        """``(frames, num_mel_bins)`` filterbanks, as the front end makes them and ``transformers``
        reads them; padding frames are zeroed and masked, so their value is moot."""
        return SourceSpec(kind=FEATURES, shape=(FRAMES, config.num_mel_bins), dtype="float32",
                          frontend=config.frontend.to_json())

    def memory_specs(self, config: Speech2TextConfig) -> tuple[MemorySpec, ...]:  # type: ignore[override]
        return super().memory_specs(config.layers())

    def state_specs(self, config: Speech2TextConfig) -> tuple[StateSpec, ...]:  # type: ignore[override]
        return super().state_specs(config.layers())

    def max_target_length(self, config: Speech2TextConfig) -> int | None:
        return None  # sinusoidal rows are computed for any position, as transformers grows its table

    def max_source_length(self, config: Speech2TextConfig) -> int | None:
        return None

    def from_hf(self, hf: Mapping[str, Any], tensors: Mapping[str, Any],
                files: Mapping[str, Mapping[str, Any]] | None = None) -> HFWeights:
        """``config.json`` and the front end of ``preprocessor_config.json``, whose mel bins must be
        what the first convolution reads; weights under ``transformers``' names minus ``model.``."""
        try:
            frontend = KaldiFbank.from_preprocessor_config((files or {})[PREPROCESSOR_FILE])
        except (S2SError, KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{PREPROCESSOR_FILE}: {exc}") from exc
        if int(hf.get("input_channels", 1)) != 1:
            raise CheckpointError(f"config.json: input_channels {hf['input_channels']} is not supported (1 is)")
        if int(hf.get("input_feat_per_channel", 80)) != frontend.num_mel_bins:
            raise CheckpointError(f"{PREPROCESSOR_FILE} makes {frontend.num_mel_bins} mel bins, config.json's "
                                  f"input_feat_per_channel is {hf['input_feat_per_channel']}")
        kernels = [int(k) for k in hf.get("conv_kernel_sizes", (5, 5))]
        if len(kernels) != int(hf.get("num_conv_layers", 2)):
            raise CheckpointError(f"config.json: num_conv_layers {hf.get('num_conv_layers', 2)} does not match "
                                  f"conv_kernel_sizes {kernels}")
        if hf.get("pad_token_id") is None:
            raise CheckpointError("config.json: pad_token_id is not set; the sinusoidal positions count from it")
        tie = hf.get("tie_word_embeddings", True) is not False
        try:
            config = Speech2TextConfig(
                frontend=frontend, conv_kernel_sizes=",".join(str(k) for k in kernels),
                conv_channels=int(hf.get("conv_channels", 1024)),
                d_model=int(hf["d_model"]), encoder_layers=int(hf["encoder_layers"]),
                decoder_layers=int(hf["decoder_layers"]), encoder_attention_heads=int(hf["encoder_attention_heads"]),
                decoder_attention_heads=int(hf["decoder_attention_heads"]), encoder_ffn_dim=int(hf["encoder_ffn_dim"]),
                decoder_ffn_dim=int(hf["decoder_ffn_dim"]),
                activation_function=str(hf.get("activation_function", "relu")),
                scale_embedding=bool(hf.get("scale_embedding", True)), pad_token_id=int(hf["pad_token_id"]),
                tie_word_embeddings=tie)
        except ValueError as exc:
            raise CheckpointError(f"config.json: {exc}") from exc
        vocab = int(hf["vocab_size"])
        weights: dict[str, Any] = {}
        for name, tensor in tensors.items():
            key = name.removeprefix("model.")
            if key == "lm_head.weight" and tie:
                continue
            if key.endswith("embed_positions.weights"):  # a stored sinusoid table: computed in the graph
                continue
            weights[key] = tensor
        if "final_logits_bias" not in weights:  # a zero bias, made by the tensors' own torch
            weights["final_logits_bias"] = next(iter(tensors.values())).new_zeros((1, vocab))
        return HFWeights(config, weights, vocab, vocab)


PLUGIN = Speech2TextPlugin()
