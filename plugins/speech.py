"""A small Whisper-style speech model: log-mel features in, text out (the bundled English speech →
French text demo, trained by ``s2s-deploy train --arch speech --task speech:DIR``).

The declaration, torch-free: config, presets and specs; the model is ``models/speech.py``,
imported only when one is built."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from s2s_deploy.architecture.declaration import (
    MemorySpec,
    SourceSpec,
    StateSpec,
)
from s2s_deploy.architecture.encoder_decoder import EncoderDecoderConfig, EncoderDecoderPlugin
from s2s_deploy.errors import ContractError
from s2s_deploy.format.source import FEATURES, FRAMES
from s2s_deploy.frontends import WhisperLogMel

SMALL_FRONTEND = WhisperLogMel(chunk_length=8)
"""Whisper's log-mel at 16 kHz, 80 bins, with an 8-s window: clips are cut or padded to it."""

FLAT_FRONTEND_KEYS = ("n_mels", "sampling_rate", "n_fft", "hop_length", "chunk_length")
"""The front end's parameters as checkpoints before format 7 of the config stored them: beside the
model's sizes rather than in a ``frontend`` object."""


@dataclass(frozen=True)
class SpeechConfig:
    frontend: WhisperLogMel = SMALL_FRONTEND
    """Stated once here: the source spec, the manifest and training's data check all read it."""
    conv1_stride: int = 2
    conv2_stride: int = 2
    d_model: int = 160
    encoder_layers: int = 4
    decoder_layers: int = 3
    attention_heads: int = 4
    ffn_dim: int = 512
    max_target_positions: int = 96
    dropout: float = 0.1
    freq_masks: int = 0
    """SpecAugment in training only: this many bands of mel bins, each up to ``freq_mask_width``
    wide, and ``time_masks`` spans of up to ``time_mask_width`` frames, set to 0 in every
    utterance, so the model leans on no one voice's formants or timing (0: off)."""
    freq_mask_width: int = 12
    time_masks: int = 0
    time_mask_width: int = 40
    warp: float = 0.0
    """Vocal tract length perturbation in training only: each utterance's mel axis is stretched by a
    factor drawn from ``[1 - warp, 1 + warp]``, so an unseen voice's formants, higher or lower than
    any training voice's, still land where the model looks (0: off)."""

    @property
    def n_mels(self) -> int:
        """The mel bins the first convolution reads."""
        return self.frontend.n_mels

    def layers(self) -> EncoderDecoderConfig:
        """The shared parts' config: pre-norm layers, final LayerNorms, a learned target table from 0,
        separate target embedding tied to the output projection."""
        return EncoderDecoderConfig(
            d_model=self.d_model, encoder_layers=self.encoder_layers, decoder_layers=self.decoder_layers,
            encoder_attention_heads=self.attention_heads, decoder_attention_heads=self.attention_heads,
            encoder_ffn_dim=self.ffn_dim, decoder_ffn_dim=self.ffn_dim,
            max_position_embeddings=self.max_target_positions, normalize_before=True, final_layer_norm=True,
            layernorm_embedding=False, positions="learned_from_zero", shared_embeddings=False,
            tie_word_embeddings=True, dropout=self.dropout)


class SpeechPlugin(EncoderDecoderPlugin):
    name = "speech"
    version = "1.0"
    description = "Whisper-style speech model: log-mel features, strided convolutions, pre-norm Transformer"
    config_type = SpeechConfig
    model = "s2s_deploy_plugins.models.speech:SpeechModel"
    has_attention = False  # the attention pictures label source tokens; this source is frames
    presets: ClassVar[dict[str, SpeechConfig]] = {
        "small": SpeechConfig(freq_masks=2, time_masks=2, warp=0.1),
        "tiny": SpeechConfig(frontend=WhisperLogMel(n_mels=16, chunk_length=1), d_model=32, encoder_layers=1,
                             decoder_layers=1, attention_heads=2, ffn_dim=64, max_target_positions=32, dropout=0.0),
    }
    default_preset = "small"

    def search_defaults(self, config: SpeechConfig) -> dict[str, Any]:
        """No timestamp tokens say where a window's text ends, and it was trained on whole utterances:
        long audio is read in windows that end at pauses, so no word is split between two."""
        return {"window_cut": "pause"}

    def source_spec(self, config: SpeechConfig) -> SourceSpec:
        """``(n_mels, frames)`` log-mel features; padding frames are masked, so their value is moot."""
        return SourceSpec(kind=FEATURES, shape=(config.n_mels, FRAMES), dtype="float32",
                          frontend=config.frontend.to_json())

    def memory_specs(self, config: SpeechConfig) -> tuple[MemorySpec, ...]:  # type: ignore[override]
        return super().memory_specs(config.layers())

    def state_specs(self, config: SpeechConfig) -> tuple[StateSpec, ...]:  # type: ignore[override]
        return super().state_specs(config.layers())

    def config_from_dict(self, data: Mapping[str, Any]) -> SpeechConfig:
        """Also reads the flat layout that the bundled checkpoint stores: the front end's parameters
        beside the model's sizes, gathered here into ``frontend``."""
        flat = {key: data[key] for key in FLAT_FRONTEND_KEYS if key in data}
        if flat:
            if "frontend" in data:
                raise ContractError(f"{self.name}: config has both frontend and {', '.join(flat)}")
            data = {**{k: v for k, v in data.items() if k not in flat}, "frontend": {**asdict(SMALL_FRONTEND), **flat}}
        return super().config_from_dict(data)

    def max_target_length(self, config: SpeechConfig) -> int | None:
        return config.max_target_positions

    def max_source_length(self, config: SpeechConfig) -> int | None:
        return None


PLUGIN = SpeechPlugin()
