"""Audio front ends in numpy: Whisper's log-mel spectrogram and Speech2Text's Kaldi filterbank.

They compute what transformers' ``WhisperFeatureExtractor`` and ``Speech2TextFeatureExtractor``
compute (``docs/parity.md``, "Front ends", has the measured agreement), without transformers or
torch at run time. Files are read with soundfile and resampled with soxr, the resampler that
librosa (and so the Hugging Face datasets pipeline) uses by default.

A file is read block by block (``AudioFile``) and resampled with soxr's streaming resampler, whose
output equals its one-shot ``resample`` sample for sample; the Whisper front end makes its features
from those blocks as they come (``stream``), so memory holds the features and one block, never the
whole clip's samples or spectrum. The header is judged before anything is decoded: a sampling rate
outside ``MIN_SAMPLING_RATE``-``MAX_SAMPLING_RATE`` or a duration over the caller's limit is one line.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.frontends.config import FrontEndConfig, expect_type, positive
from s2s_deploy.frontends.frames import StreamedFeatures
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

    def stream(self, blocks: Iterable[np.ndarray], label: str, expected: int | None = None) -> np.ndarray:
        """``whole``'s features of the clip ``blocks`` make up (``expected``: its length, if known). This
        default joins the blocks first; a front end that can work block by block overrides it."""
        return self.whole(read_audio(blocks, label))  # type: ignore[attr-defined]

    def frames(self, opened: AudioFile, label: str, window: int | None) -> np.ndarray | StreamedFeatures:
        """A file's uncut features (``whole``'s) for window-by-window reading: ``StreamedFeatures`` where
        the front end can make them window by window and the clip is longer than ``window`` frames, so
        memory holds a window, not the clip; else the array. This default makes the array (a front end
        that normalises by statistics of the whole utterance needs them all)."""
        return self.stream(opened, label, opened.expected)

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


MIN_SAMPLING_RATE = 1000
MAX_SAMPLING_RATE = 384_000
"""The plausible sampling rates: below 1 kHz no speech is left, above 384 kHz no recorder writes; a
header outside them is a forgery or a mistake (a 4 KB WAV claiming 1 Hz would resample to 33 minutes)."""

BLOCK_FRAMES = 1 << 16
"""Frames read from a file at a time (4 s at 16 kHz): with one front end's workspace, the bound on what
reading costs beyond the features."""


class AudioTooLongError(S2SError):
    """An input longer than the caller's ``max_duration`` (``serve`` answers 413)."""


def check_rate(rate: float, label: str) -> None:
    """One line for a sampling rate outside the plausible range."""
    if not MIN_SAMPLING_RATE <= rate <= MAX_SAMPLING_RATE:
        raise S2SError(f"{label}: a sampling rate of {rate:g} Hz is outside the plausible "
                       f"{MIN_SAMPLING_RATE}-{MAX_SAMPLING_RATE} Hz")


def check_duration(frames: int, rate: float, max_duration: float | None, label: str) -> None:
    """One line (an ``AudioTooLongError``) for ``frames`` at ``rate`` over ``max_duration`` seconds."""
    if max_duration is not None and frames > max_duration * rate:
        raise AudioTooLongError(f"{label}: {frames / rate:.1f} s of audio is over the limit of {max_duration:g} s")


def check_samples(audio: np.ndarray, label: str) -> None:
    """One line for samples the front ends cannot read: NaN or infinite ones."""
    if not np.isfinite(audio).all():
        raise S2SError(f"{label}: the audio holds NaN or infinite samples")


FULL_SCALE = 0.999
"""A sample this close to ±1 sits at full scale: where a recording clipped."""
CLIPPED_SHARE = 0.01
"""More than 1% of samples at full scale: the clip is heavily clipped (distorted), so one warning line."""
FAR_OUTSIDE = 2.0
"""A peak over twice full scale: float samples never scaled to ±1 (the front ends' features saturate)."""


class Level:
    """A clip's loudness as it is read block by block: its peak and its samples at full scale, and the
    one warning line they call for (none for a clip within ±1 and seldom at full scale)."""

    def __init__(self) -> None:
        self.peak, self.clipped, self.count = 0.0, 0, 0

    def add(self, samples: np.ndarray) -> None:
        if samples.size:
            magnitude = np.abs(samples)
            self.peak = max(self.peak, float(magnitude.max()))
            self.clipped += int(np.count_nonzero(magnitude >= FULL_SCALE))
            self.count += samples.size

    def warning(self, label: str) -> str | None:
        if self.peak > FAR_OUTSIDE:
            return (f"warning: {label} peaks at {self.peak:.3g}, far outside ±1: scale float samples to [-1, 1] "
                    "(the text will be unreliable)")
        if self.count and self.clipped > CLIPPED_SHARE * self.count:
            return (f"warning: {label} is heavily clipped: {100 * self.clipped / self.count:.1f}% of its samples are "
                    "at full scale (the text may be unreliable)")
        return None


_SHORT_DATA = re.compile(r"^data\s*:\s*(\d+)\s*\(should be (\d+)\)", re.MULTILINE)
"""libsndfile's log line for a RIFF/AIFF data chunk longer than the file: it reads what is there."""
_UNKNOWN_SIZES = (0, 0xFFFFFFFF, 0x7FFFFFFF)
"""Data sizes a streaming writer puts in a header it cannot go back to fill: no promise at all."""


def reason(exc: Exception) -> str:
    """libsndfile's own words, without the Python repr of an in-memory file (``<_io.BytesIO object at
    0x...>``) that soundfile puts before them."""
    return getattr(exc, "error_string", None) or re.sub(r"<[^<>]* object at 0x[0-9a-f]+>:? ?", "", str(exc))


class AudioFile:
    """An audio file opened for reading block by block at ``sampling_rate``, mono float32.

    Opening reads the header only, and refuses in one line a rate outside the plausible range or a
    duration over ``max_duration`` seconds, so a few kilobytes that claim hours cost nothing. A header
    that promises more audio than the file holds gets one warning line (``warn``), and what the file
    holds is read. ``expected``: the samples at ``sampling_rate`` the header promises."""

    def __init__(self, source: str | Path | bytes, label: str, sampling_rate: int, max_duration: float | None = None,
                 warn: Callable[[str], None] | None = None) -> None:
        soundfile = optional_module("soundfile", "reading audio")
        self.source, self.label, self.sampling_rate, self.warn = source, label, sampling_rate, warn
        try:
            self.file = soundfile.SoundFile(io.BytesIO(source) if isinstance(source, bytes) else str(source))
        except (RuntimeError, OSError, TypeError) as exc:  # soundfile.LibsndfileError is a RuntimeError
            raise S2SError(f"cannot read audio {label}: {reason(exc)}") from exc
        try:
            self.rate = int(self.file.samplerate)
            check_rate(self.rate, f"audio {label}")
            check_duration(int(self.file.frames), self.rate, max_duration, f"audio {label}")
        except S2SError:
            self.file.close()
            raise
        self.expected = math.ceil(int(self.file.frames) * sampling_rate / self.rate)
        self.samples = 0
        """Samples at ``sampling_rate`` read so far (all of them once the blocks are read)."""

    def again(self) -> AudioFile:
        """The same file opened afresh, for a second pass over its blocks: its header was judged and its
        warnings given on the first, so this one gives none."""
        return AudioFile(self.source, self.label, self.sampling_rate)

    def __iter__(self) -> Iterator[np.ndarray]:
        """The blocks, resampled in a stream (equal to one-shot ``resample`` of the whole); NaN refused."""
        stream = None
        if self.rate != self.sampling_rate:
            soxr = optional_module("soxr", "resampling audio")
            stream = soxr.ResampleStream(self.rate, self.sampling_rate, 1, dtype="float32", quality="HQ")
        read, level = 0, Level()
        try:
            with self.file:
                for block in self.file.blocks(BLOCK_FRAMES, dtype="float32", always_2d=True):
                    read += len(block)
                    samples = mono(block).astype(np.float32)
                    check_samples(samples, f"audio {self.label}")
                    level.add(samples)
                    resampled = samples if stream is None else stream.resample_chunk(samples, last=False)
                    self.samples += len(resampled)
                    yield resampled
                self._check_length(read)
            if self.warn is not None and (line := level.warning(f"audio {self.label}")):
                self.warn(line)
        except (RuntimeError, OSError) as exc:
            raise S2SError(f"cannot read audio {self.label}: {reason(exc)}") from exc
        if stream is not None:
            resampled = stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
            self.samples += len(resampled)
            yield resampled

    def _check_length(self, read: int) -> None:
        """One warning line when the header promised more than was there."""
        short = _SHORT_DATA.search(self.file.extra_info or "")
        if short and int(short.group(1)) not in _UNKNOWN_SIZES and int(short.group(2)) < int(short.group(1)):
            promised, held = f"{short.group(1)} bytes", f"{short.group(2)}"
        elif read < self.file.frames:
            promised, held = f"{self.file.frames / self.rate:.2f} s", f"{read / self.rate:.2f} s"
        else:
            return
        if self.warn is not None:
            self.warn(f"warning: audio {self.label} is truncated: its header promises {promised} of audio, "
                      f"the file holds {held}; reading what it holds")


def read_audio(blocks: Iterable[np.ndarray], label: str) -> np.ndarray:
    """Blocks joined into one clip, refused in one line if it holds no samples."""
    audio = np.concatenate([np.zeros(0, dtype=np.float32), *blocks]).astype(np.float32, copy=False)
    if audio.size == 0:
        raise S2SError(f"{label}: no audio samples")
    return audio


def load_audio(path: str | Path, sampling_rate: int, max_duration: float | None = None,
               warn: Callable[[str], None] | None = None) -> np.ndarray:
    """A file's audio as float32 mono at ``sampling_rate``: channels averaged, then resampled."""
    path = Path(path)
    if path.is_dir():
        raise S2SError(f"{path} is a directory, not an audio file")
    if not path.is_file():
        raise S2SError(f"audio file not found: {path}")
    return read_audio(AudioFile(path, str(path), sampling_rate, max_duration, warn), str(path))


def decode_audio(data: bytes, sampling_rate: int, label: str = "the audio", max_duration: float | None = None,
                 warn: Callable[[str], None] | None = None) -> np.ndarray:
    """An encoded audio file's bytes (an upload) as ``load_audio`` reads a file."""
    return read_audio(AudioFile(data, label, sampling_rate, max_duration, warn), label)


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
        """Frames starting inside the clip: the sum of ``WhisperFeatureExtractor``'s attention mask, which
        has one entry per frame of the padded input (the STFT's last frame dropped): a clip longer than the
        window, not padded, has ``samples // hop_length`` frames, so its partial last hop is not counted."""
        return min(-(-len(audio) // self.hop_length), max(len(audio), self.n_samples) // self.hop_length)

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

    def stream(self, blocks: Iterable[np.ndarray], label: str, expected: int | None = None) -> np.ndarray:
        """``whole``'s features, bit for bit, made from the blocks as they come: the STFT runs over each
        gathered stretch, its log-mel is scaled and stored as float32 at once, and the floor 8 below the
        clip's loudest is applied at the end. Rounding to float32 never reverses an order, so
        ``max(float32(x), float32(floor))`` equals ``float32(max(x, floor))``: no float64 spectrum of
        the whole clip is ever held. A clip no longer than the window is made in one go, as ``whole``."""
        out = _Growing(self.n_mels, (expected or 0) // self.hop_length)
        peak = -np.inf
        for columns, piece_peak in self._pieces(blocks, label):
            if piece_peak is None:  # the one-shot path: ``whole``'s features
                return columns
            peak = max(peak, out.add((columns, piece_peak)))
        features = out.result()
        return np.maximum(features, self._floor(peak), out=features)

    def frames(self, opened: AudioFile, label: str, window: int | None) -> np.ndarray | StreamedFeatures:
        """``stream``'s features, bit for bit, in two passes over the file when it is longer than ``window``
        frames: the first finds the clip's loudest log-mel (the floor every frame is held to) and counts
        the frames, keeping none beyond the first ``window``; the second, run as the decoder reads
        windows (``StreamedFeatures``), makes the same pieces again and floors each as it comes."""
        kept: list[np.ndarray] | None = []
        peak, count = -np.inf, 0
        for columns, piece_peak in self._pieces(opened, label):
            if piece_peak is None:
                return columns
            peak, count = max(peak, piece_peak), count + columns.shape[1]
            if kept is not None and (window is None or count <= window):
                kept.append(columns)
            else:
                kept = None
        floor = self._floor(peak)
        if kept is not None:  # within one window: the array, as ``stream`` makes it
            features = np.concatenate(kept, axis=1) if len(kept) > 1 else kept[0]
            return np.maximum(features, floor, out=features)

        def pieces() -> Iterator[np.ndarray]:
            for columns, _ in self._pieces(opened.again(), label):
                yield np.maximum(columns, floor, out=columns)

        return StreamedFeatures(pieces, (self.n_mels, count))

    @staticmethod
    def _floor(peak: float) -> np.float32:
        """The scaled floor 8 below the loudest log-mel: ``((peak - 8) + 4) / 4`` as float32."""
        return np.float32((peak - 8.0 + 4.0) / 4.0)

    def _pieces(self, blocks: Iterable[np.ndarray], label: str) -> Iterator[tuple[np.ndarray, float | None]]:
        """The clip's frames in order as ``(n_mels, frames)`` float32 pieces of ``(log-mel + 4) / 4``, not yet
        floored, each with its largest log-mel; a clip no longer than the gathered stretch is one piece,
        ``whole``'s features (floored), with None. The pieces are the same whichever pass makes them."""
        half, hop = self.n_fft // 2, self.hop_length
        gather = max(self.n_samples, STREAM_SAMPLES) + self.n_fft  # beyond the window: no zero padding
        pending: list[np.ndarray] = []
        held = 0
        padded: np.ndarray | None = None  # the reflect-padded clip from padded index ``base``
        base = done = 0
        for block in blocks:
            pending.append(np.asarray(block, dtype=np.float32))
            held += len(block)
            if held < gather:
                continue
            clip = mono(np.concatenate(pending))
            pending, held = [], 0
            padded = np.concatenate([clip[half:0:-1] if padded is None else padded, clip])
            count = (base + len(padded) - self.n_fft) // hop + 1 - done  # frames whose window is all here
            yield self._scaled_log_mel(padded[done * hop - base:], count)
            done += count
            keep = min(done * hop, base + len(padded) - self.n_fft)  # the rest, and the tail to reflect
            padded, base = padded[keep - base:], keep
        if padded is None:  # never beyond the window: the one-shot path
            yield self.whole(read_audio(pending, label)), None
            return
        clip = mono(np.concatenate([np.zeros(0, dtype=np.float32), *pending]))
        padded = np.concatenate([padded, clip])
        padded = np.concatenate([padded, padded[-2: -half - 2: -1]])
        total = base + len(padded) - 2 * half  # the clip's samples
        yield self._scaled_log_mel(padded[done * hop - base:], total // hop - done)

    def _scaled_log_mel(self, padded: np.ndarray, count: int) -> tuple[np.ndarray, float]:
        """``count`` frames from the start of ``padded`` as ``(log-mel + 4) / 4`` in float32, (n_mels,
        count), with the largest log-mel before scaling; at most ``STFT_FRAMES`` frames' spectra at once."""
        scaled = np.empty((self.n_mels, count), dtype=np.float32)
        peak = -np.inf
        for first in range(0, count, STFT_FRAMES):
            last = min(count, first + STFT_FRAMES)
            piece = padded[first * self.hop_length: (last - 1) * self.hop_length + self.n_fft]
            log_mel = self._unscaled(piece, last - first)
            peak = max(peak, float(log_mel.max()))
            scaled[:, first:last] = ((log_mel + 4.0) / 4.0).T
        return scaled, peak

    def _unscaled(self, padded: np.ndarray, count: int) -> np.ndarray:
        """(count, n_mels) float64 log10 mel energies of the first ``count`` frames of a padded clip."""
        # A centred STFT (reflect-padded, as torch.stft), periodic Hann window.
        frames = np.lib.stride_tricks.sliding_window_view(padded, self.n_fft)[:: self.hop_length][:count]
        window = np.hanning(self.n_fft + 1)[:-1]
        power = np.abs(np.fft.rfft(frames * window, axis=-1)) ** 2
        mel = power @ slaney_mel_filters(self.sampling_rate, self.n_fft, self.n_mels, WHISPER_MAX_FREQUENCY)
        return np.log10(np.maximum(mel, 1e-10))

    def _log_mel(self, clip: np.ndarray) -> np.ndarray:
        # The last frame of the centred STFT is dropped.
        log_mel = self._unscaled(np.pad(clip, self.n_fft // 2, mode="reflect"), len(clip) // self.hop_length)
        log_mel = np.maximum(log_mel, log_mel.max() - 8.0)
        return ((log_mel + 4.0) / 4.0).T.astype(np.float32)


STREAM_SAMPLES = 1 << 19
"""Samples (33 s at 16 kHz) gathered before ``stream`` makes their frames."""
STFT_FRAMES = 2048
"""Frames whose spectra ``stream`` holds at once (6.6 MB of float64 at n_fft 400)."""


class _Growing:
    """A (rows, columns) float32 array filled column block by column block: sized from the expected
    length, so the usual clip fills it exactly and is returned without a copy; grown if it was short."""

    def __init__(self, rows: int, capacity: int) -> None:
        self.data = np.empty((rows, max(capacity, 1)), dtype=np.float32)
        self.used = 0

    def add(self, block: tuple[np.ndarray, float]) -> float:
        """Append a ``(columns, peak)`` pair's columns; return its peak."""
        columns, peak = block
        end = self.used + columns.shape[1]
        if end > self.data.shape[1]:
            grown = np.empty((self.data.shape[0], max(end, 2 * self.data.shape[1])), dtype=np.float32)
            grown[:, : self.used] = self.data[:, : self.used]
            self.data = grown
        self.data[:, self.used: end] = columns
        self.used = end
        return peak

    def result(self) -> np.ndarray:
        """The filled columns, C-contiguous (copied only when the capacity was not met exactly)."""
        return self.data if self.used == self.data.shape[1] else np.ascontiguousarray(self.data[:, : self.used])


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
