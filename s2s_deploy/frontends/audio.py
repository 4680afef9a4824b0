"""Audio front ends in numpy: Whisper's log-mel spectrogram and Speech2Text's Kaldi filterbank.

They compute what transformers' ``WhisperFeatureExtractor`` and ``Speech2TextFeatureExtractor``
compute (``docs/parity.md``, "Front ends", has the measured agreement), without transformers or
torch at run time. Files are read with soundfile and resampled with soxr, the resampler that
librosa (and so the Hugging Face datasets pipeline) uses by default.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.frontends.config import FrontEndConfig, expect_type, positive
from s2s_deploy.frontends.optional import optional_module

WHISPER_MAX_FREQUENCY = 8000.0
"""Whisper's mel filters stop at 8 kHz whatever the sampling rate (as transformers' do)."""

KALDI_LOG_FLOOR = float(np.finfo(np.float32).eps)
"""torchaudio's Kaldi fbank takes the log of ``max(energy, float32 eps)``."""


AUDIO = "audio"


class AudioFrontEnd(FrontEndConfig):
    """What the audio front ends share: samples at ``sampling_rate`` in, features out."""

    sampling_rate: int

    def probe(self) -> np.ndarray:
        return np.zeros(int(self.sampling_rate), dtype=np.float32)

    @property
    def frame_seconds(self) -> float:
        """Seconds between two feature frames: how a window of frames is measured in audio (VAD windows)."""
        raise NotImplementedError

    def content_frames(self, audio: np.ndarray) -> int | None:
        """The frames that hold the clip itself, not the padding the front end adds (word timestamps align
        tokens to these only); None: every frame of the features."""
        return None


def mono(audio: np.ndarray) -> np.ndarray:
    """One channel as float64: a (samples, channels) array is averaged, as librosa's ``to_mono`` does."""
    audio = np.asarray(audio, dtype=np.float64)
    if audio.ndim == 2:
        audio = audio.mean(axis=1)
    if audio.ndim != 1:
        raise S2SError(f"audio must be (samples,) or (samples, channels), got shape {audio.shape}")
    return audio


def resample(audio: np.ndarray, rate: int, target: int) -> np.ndarray:
    """``audio`` at ``rate`` Hz brought to ``target`` Hz with soxr's high-quality mode (librosa's default)."""
    if rate == target:
        return audio
    soxr = optional_module("soxr", "resampling audio")
    return soxr.resample(audio, rate, target, quality="HQ")


def load_audio(path: str | Path, sampling_rate: int) -> np.ndarray:
    """A file's audio as float32 mono at ``sampling_rate``: channels averaged, then resampled."""
    path = Path(path)
    if not path.is_file():
        raise S2SError(f"audio file not found: {path}")
    return _read(str(path), str(path), sampling_rate)


def decode_audio(data: bytes, sampling_rate: int, label: str = "the audio") -> np.ndarray:
    """An encoded audio file's bytes (an upload) as ``load_audio`` reads a file."""
    return _read(io.BytesIO(data), label, sampling_rate)


def _read(source: str | io.BytesIO, label: str, sampling_rate: int) -> np.ndarray:
    soundfile = optional_module("soundfile", "reading audio")
    try:
        data, rate = soundfile.read(source, dtype="float32", always_2d=True)
    except (RuntimeError, OSError, TypeError) as exc:  # soundfile.LibsndfileError is a RuntimeError
        raise S2SError(f"cannot read audio {label}: {exc}") from exc
    return resample(mono(data).astype(np.float32), int(rate), sampling_rate).astype(np.float32)


@lru_cache(maxsize=8)
def slaney_mel_filters(sampling_rate: int, n_fft: int, n_mels: int, max_frequency: float) -> np.ndarray:
    """(n_fft // 2 + 1, n_mels) triangular filters on the Slaney mel scale, area-normalised (librosa's default)."""

    def to_mel(hz: np.ndarray) -> np.ndarray:
        # Linear below 1 kHz, logarithmic above (Slaney's Auditory Toolbox).
        above = 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) * 27.0 / np.log(6.4)
        return np.where(hz < 1000.0, 3.0 * hz / 200.0, above)

    def to_hz(mel: np.ndarray) -> np.ndarray:
        return np.where(mel < 15.0, 200.0 * mel / 3.0, 1000.0 * np.exp(np.log(6.4) / 27.0 * (mel - 15.0)))

    edges = to_hz(np.linspace(to_mel(np.array(0.0)), to_mel(np.array(max_frequency)), n_mels + 2))
    bins = np.linspace(0, sampling_rate // 2, n_fft // 2 + 1)
    slopes = edges[None, :] - bins[:, None]
    widths = np.diff(edges)
    rising, falling = -slopes[:, :-2] / widths[:-1], slopes[:, 2:] / widths[1:]
    filters = np.maximum(0.0, np.minimum(rising, falling))
    filters *= 2.0 / (edges[2:] - edges[:-2])
    filters.flags.writeable = False
    return filters


@lru_cache(maxsize=8)
def kaldi_mel_banks(sampling_rate: int, n_fft: int, num_bins: int, low_frequency: float = 20.0) -> np.ndarray:
    """(n_fft // 2, num_bins) Kaldi filters: triangles in mel space up to Nyquist, unnormalised (torchaudio's)."""

    def to_mel(hz: np.ndarray | float) -> np.ndarray:
        return 1127.0 * np.log1p(np.asarray(hz) / 700.0)

    low, high = to_mel(low_frequency), to_mel(sampling_rate / 2)
    delta = (high - low) / (num_bins + 1)
    left = low + np.arange(num_bins)[None, :] * delta
    mel = to_mel(sampling_rate / n_fft * np.arange(n_fft // 2))[:, None]
    banks = np.maximum(0.0, np.minimum((mel - left) / delta, (left + 2 * delta - mel) / delta))
    banks.flags.writeable = False
    return banks


@dataclass(frozen=True)
class WhisperLogMel(AudioFrontEnd):
    """Whisper's input: a log10 mel spectrogram of a fixed window, scaled to about [-1, 1].

    The clip is cut or zero-padded to ``chunk_length`` seconds first, because the encoder was
    trained on fixed windows; the padding's silence is part of what it sees. A model trained on
    short clips (the bundled speech demo) declares a shorter window here.
    """

    kind: ClassVar[str] = "whisper_log_mel"
    reads: ClassVar[str] = AUDIO
    sampling_rate: int = 16000
    n_mels: int = 80
    n_fft: int = 400
    hop_length: int = 160
    chunk_length: int = 30

    def __post_init__(self) -> None:
        positive(
            self.kind,
            sampling_rate=self.sampling_rate,
            n_mels=self.n_mels,
            n_fft=self.n_fft,
            hop_length=self.hop_length,
            chunk_length=self.chunk_length,
        )

    @classmethod
    def from_preprocessor_config(cls, config: Mapping[str, Any]) -> WhisperLogMel:
        expect_type(config, "feature_extractor_type", ("WhisperFeatureExtractor",))
        if config.get("dither", 0.0):
            raise S2SError("preprocessor_config.json: dither adds random noise; a deployed front end has none")
        return cls(
            sampling_rate=int(config.get("sampling_rate", 16000)),
            n_mels=int(config.get("feature_size", 80)),
            n_fft=int(config.get("n_fft", 400)),
            hop_length=int(config.get("hop_length", 160)),
            chunk_length=int(config.get("chunk_length", 30)),
        )

    @property
    def n_samples(self) -> int:
        return self.chunk_length * self.sampling_rate

    @property
    def n_frames(self) -> int:
        return self.n_samples // self.hop_length

    @property
    def window(self) -> int:
        return self.n_frames

    @property
    def frame_seconds(self) -> float:
        return self.hop_length / self.sampling_rate

    def content_frames(self, audio: np.ndarray) -> int | None:
        """Frames starting inside the clip: the sum of ``WhisperFeatureExtractor``'s attention mask."""
        return -(-len(audio) // self.hop_length)

    def __call__(self, audio: np.ndarray) -> np.ndarray:
        """(n_mels, n_frames) float32 features of one clip at ``sampling_rate``."""
        clip = mono(audio)[: self.n_samples]
        return self._log_mel(np.pad(clip, (0, self.n_samples - len(clip))))

    def whole(self, audio: np.ndarray) -> np.ndarray:
        """The whole clip's features, for a search that seeks through it window by window: a clip
        shorter than the window is padded to it (as ``__call__``); a longer one is not cut, and makes
        ``samples // hop_length`` frames scaled by its own loudest, as ``WhisperFeatureExtractor``
        with ``truncation=False`` does."""
        clip = mono(audio)
        return self._log_mel(np.pad(clip, (0, max(0, self.n_samples - len(clip)))))

    def _log_mel(self, clip: np.ndarray) -> np.ndarray:
        frames_out = len(clip) // self.hop_length
        # A centred STFT (reflect-padded, as torch.stft), periodic Hann window; the last frame is dropped.
        padded = np.pad(clip, self.n_fft // 2, mode="reflect")
        frames = np.lib.stride_tricks.sliding_window_view(padded, self.n_fft)[:: self.hop_length][:frames_out]
        window = np.hanning(self.n_fft + 1)[:-1]
        power = np.abs(np.fft.rfft(frames * window, axis=-1)) ** 2
        mel = power @ slaney_mel_filters(self.sampling_rate, self.n_fft, self.n_mels, WHISPER_MAX_FREQUENCY)
        log_mel = np.log10(np.maximum(mel, 1e-10))
        log_mel = np.maximum(log_mel, log_mel.max() - 8.0)
        return ((log_mel + 4.0) / 4.0).T.astype(np.float32)


@dataclass(frozen=True)
class KaldiFbank(AudioFrontEnd):
    """Speech2Text's input: Kaldi log filterbank energies (torchaudio's ``kaldi.fbank`` defaults),
    then each utterance normalised to zero mean and unit variance per bin.

    Frames are 25 ms every 10 ms with no padding (``snip_edges``), so a clip shorter than one
    frame has no features. A bin that never varies (digital silence) is left at zero rather than
    divided by a zero deviation: transformers returns NaN there.
    """

    kind: ClassVar[str] = "kaldi_fbank"
    reads: ClassVar[str] = AUDIO
    sampling_rate: int = 16000
    num_mel_bins: int = 80
    normalize_means: bool = True
    normalize_vars: bool = True

    def __post_init__(self) -> None:
        positive(self.kind, sampling_rate=self.sampling_rate, num_mel_bins=self.num_mel_bins)

    @property
    def frame_seconds(self) -> float:
        return (self.sampling_rate * 10 // 1000) / self.sampling_rate  # a frame every 10 ms

    @classmethod
    def from_preprocessor_config(cls, config: Mapping[str, Any]) -> KaldiFbank:
        expect_type(config, "feature_extractor_type", ("Speech2TextFeatureExtractor",))
        if config.get("dither", 0.0):
            raise S2SError("preprocessor_config.json: dither adds random noise; a deployed front end has none")
        cmvn = bool(config.get("do_ceptral_normalize", True))
        return cls(
            sampling_rate=int(config.get("sampling_rate", 16000)),
            num_mel_bins=int(config.get("num_mel_bins", 80)),
            normalize_means=cmvn and bool(config.get("normalize_means", True)),
            normalize_vars=cmvn and bool(config.get("normalize_vars", True)),
        )

    def __call__(self, audio: np.ndarray) -> np.ndarray:
        """(frames, num_mel_bins) float32 features of one clip at ``sampling_rate``."""
        samples = mono(audio) * 32768.0  # Kaldi works on 16-bit sample values
        frame_length, shift = self.sampling_rate * 25 // 1000, self.sampling_rate * 10 // 1000
        n_fft = 1 << (frame_length - 1).bit_length()
        if len(samples) < frame_length:
            return np.zeros((0, self.num_mel_bins), dtype=np.float32)
        frames = np.lib.stride_tricks.sliding_window_view(samples, frame_length)[::shift]
        frames = frames - frames.mean(axis=1, keepdims=True)
        # Pre-emphasis 0.97, the first sample against itself (Kaldi's convention).
        frames = frames - 0.97 * np.concatenate([frames[:, :1], frames[:, :-1]], axis=1)
        window = np.hanning(frame_length) ** 0.85  # Kaldi's "povey" window
        power = np.abs(np.fft.rfft(frames * window, n=n_fft, axis=-1)) ** 2
        energies = power[:, : n_fft // 2] @ kaldi_mel_banks(self.sampling_rate, n_fft, self.num_mel_bins)
        features = np.log(np.maximum(energies, KALDI_LOG_FLOOR))
        if self.normalize_means:
            features = features - features.mean(axis=0)
        if self.normalize_vars:
            deviation = features.std(axis=0)
            features = features / np.where(deviation > 0, deviation, 1.0)
        return features.astype(np.float32)
