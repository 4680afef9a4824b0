"""What the speech and image APIs share: an export whose encoder reads features, opened once,
its front end rebuilt from the manifest, inputs featurised, padded and decoded ``batch_size`` at a
time with the text path's search (greedy, beam, n-best, every option of docs/decoding.md).

A subclass says what it reads (``reads``, the front end's medium) and how one input becomes the
front end's input; nothing here names a model.

An input longer than the encoder's window is never cut: it is read window by window
(runtime/timestamps.py), with timestamps on inside where the export has timestamp tokens, as
``generate`` does for long-form input without ``return_timestamps``, else one window after another,
each ending at a pause where ``window_cut`` says so (runtime/pauses.py); its result is then the text
alone, unless the caller asked for ``timestamps``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.format.source import SourceSpec
from s2s_deploy.frontends.frames import StreamedFeatures
from s2s_deploy.frontends.media import Medium
from s2s_deploy.frontends.source import checked_features, featurise, frontend_for, use_instead
from s2s_deploy.runtime.batched import decode_windows
from s2s_deploy.runtime.decoding import (
    LOG_PROB_THRESHOLD,
    NO_SPEECH_THRESHOLD,
    SearchConfig,
    window_options_on,
    with_timestamps,
)
from s2s_deploy.runtime.fallback import Confidence, Windows
from s2s_deploy.runtime.hallucination import WordTiming
from s2s_deploy.runtime.pauses import pause_windows
from s2s_deploy.runtime.search import Hypothesis
from s2s_deploy.runtime.timestamps import Piece, Sought, Window, seek_windows
from s2s_deploy.runtime.translator import Translator


@dataclass(frozen=True)
class Decoded:
    """One input's text: its best hypothesis, and every hypothesis kept (n-best) with its score."""

    source: str
    """The file's path, or ``clip N`` / ``image N`` for an array."""
    text: str
    score: float
    hypotheses: tuple[tuple[str, float], ...]
    language: str | None = None
    """The code of the language token its decoder prompt held (detected where the prompt left it
    open, ``en`` for ``<|en|>``); None without one."""
    segments: tuple[Segment, ...] = ()
    """With ``timestamps``: the timed segments, in order (the text is theirs joined); else empty."""
    words: tuple[Word, ...] = ()
    """With word timestamps: every word, timed, in order; else empty."""
    confidence: Confidence | None = None
    """How sure the model was (runtime/fallback.py): the mean log-prob per token over the windows
    decoded, and the no-speech probability where the export has one; ``confidence.doubt()`` says
    whether the text falls under faster-whisper's thresholds. None only for an input with no window."""

    @property
    def avg_log_prob(self) -> float | None:
        return None if self.confidence is None else self.confidence.avg_log_prob

    @property
    def no_speech_prob(self) -> float | None:
        return None if self.confidence is None else self.confidence.no_speech_prob

    def doubt(self, config: SearchConfig | None = None) -> str | None:
        """Why the text is doubtful (``Confidence.doubt``), under ``config``'s ``log_prob_threshold`` and
        ``no_speech_threshold`` where it sets them, else faster-whisper's defaults (-1, 0.6); None: not."""
        if self.confidence is None:
            return None
        log_prob = config.log_prob_threshold if config is not None else None
        no_speech = config.no_speech_threshold if config is not None else None
        return self.confidence.doubt(LOG_PROB_THRESHOLD if log_prob is None else log_prob,
                                     NO_SPEECH_THRESHOLD if no_speech is None else no_speech)

    def row(self, config: SearchConfig | None = None) -> dict[str, Any]:
        """The fields every JSON result carries (``--output x.json``, ``serve``): text, score, the mean
        log-prob per token, the no-speech probability (null where the export has no such token) and
        ``doubt`` (null, or why the text falls under the thresholds ``doubt`` reads)."""
        return {"text": self.text, "score": self.score, "avg_log_prob": self.avg_log_prob,
                "no_speech_prob": self.no_speech_prob, "doubt": self.doubt(config)}


@dataclass(frozen=True)
class Segment:
    """A stretch of the input the model timed: seconds from the input's start, and its text."""

    start: float
    end: float
    text: str
    temperature: float | None = None
    """With the temperature fallback: the temperature its window ended at, and that window's average
    log-prob, compression ratio and no-speech probability (None where not read), as faster-whisper's
    ``Segment`` reports them; else all None."""
    avg_log_prob: float | None = None
    compression_ratio: float | None = None
    no_speech_prob: float | None = None

    def row(self) -> dict[str, Any]:
        """As JSON (``--output x.json``, ``serve``): start, end and text, and with the fallback its
        window's temperature, avg_log_prob, compression_ratio and no_speech_prob."""
        row: dict[str, Any] = {"start": self.start, "end": self.end, "text": self.text}
        if self.temperature is None:
            return row
        return row | {"temperature": self.temperature, "avg_log_prob": self.avg_log_prob,
                      "compression_ratio": self.compression_ratio, "no_speech_prob": self.no_speech_prob}


@dataclass(frozen=True)
class Word:
    """One word and the stretch of the input its tokens were aligned to, in seconds (runtime/words.py)."""

    start: float
    end: float
    text: str


Told = Callable[[tuple[Segment, ...]], None]
"""Told one input's segments of one window as soon as it is decoded, on the thread that decodes
(``serve`` streams them); an input read as one window is told its whole text as one segment."""


def pad_features(items: Sequence[np.ndarray], source: SourceSpec) -> tuple[np.ndarray, np.ndarray]:
    """``src`` ``(batch, *shape)`` right-padded along the frames axis with the source's ``pad_value``, and
    each item's frame count as ``src_len``; fixed-size items are stacked, with ``src_len`` 1 each."""
    if source.length_axis is None:
        return np.stack(items).astype(source.dtype, copy=False), np.ones(len(items), dtype=np.int64)
    axis = source.length_axis - 1
    lengths = np.array([item.shape[axis] for item in items], dtype=np.int64)
    batch = np.full((len(items), *source.item_shape(int(lengths.max()))), source.pad_value, dtype=source.dtype)
    for row, item in enumerate(items):
        index = [slice(None)] * item.ndim
        index[axis] = slice(0, item.shape[axis])
        batch[(row, *index)] = item
    return batch, lengths


def window_facts(piece: Piece) -> tuple[float | None, ...]:
    """A segment's window's temperature, average log-prob, compression ratio and no-speech probability
    (all None without the temperature fallback)."""
    if piece.window is None:
        return (None, None, None, None)
    kept = piece.window.kept
    return (piece.window.temperature, kept.avg_log_prob, kept.compression_ratio, kept.no_speech_prob)


class FeatureReader:
    """An export whose front end reads ``medium``: subclasses turn one input into the front end's input
    (``load``) and say which arguments are one input rather than a list (``single``)."""

    medium: ClassVar[Medium]

    @property
    def reads(self) -> str:
        return self.medium.name

    @property
    def label(self) -> str:
        """How an array input is named in results and messages: ``clip``, ``image``."""
        return self.medium.item

    def __init__(self, export_dir: str | Path | Translator, device: str = "auto", threads: int | None = None,
                 spin: bool = True) -> None:
        """``export_dir``: a folder, or a Translator already open on one (whose sessions are then shared)."""
        self.translator = (export_dir if isinstance(export_dir, Translator)
                           else Translator(export_dir, device=device, threads=threads, spin=spin))
        self.manifest = self.translator.manifest
        self.source = self.manifest.encoder_input
        if not self.source.is_features:
            raise S2SError(f"{self.manifest.directory} translates text (its encoder reads token ids): use translate")
        self.frontend = frontend_for(self.source)
        if self.frontend.reads != self.reads:
            raise S2SError(f"{self.manifest.directory} reads {self.frontend.reads} ({self.frontend.kind}), "
                           f"not {self.reads}: use {use_instead(self.source)}")
        self.notice = self.translator.notice
        self.provider = self.translator.provider

    def load(self, item: Any, label: str) -> Any:
        """One input as the front end takes it."""
        raise NotImplementedError

    def single(self, items: Any) -> bool:
        """Whether ``items`` is one input rather than a sequence of them."""
        return isinstance(items, str | Path)

    def stream(self, item: Any, label: str) -> Any:
        """``item`` opened for the front end's ``stream`` (a file read block by block), or None where it
        is read whole (``load``)."""
        return None

    def features(self, item: Any, label: str | None = None, whole: bool = False) -> np.ndarray | StreamedFeatures:
        """One input's encoder input: the front end's features, checked against the declared shape;
        ``whole``: uncut, for window-by-window decoding (what ``__call__`` and ``serve`` read), made
        block by block from what ``stream`` opens, where it opens one. An input longer than the window
        whose frames come last is then ``StreamedFeatures`` where the front end makes them window by
        window: the decoder reads each window as it is made, and memory does not grow with duration."""
        label = label or self.label
        opened = self.stream(item, label) if whole else None
        if opened is not None:
            frames_last = self.source.length_axis == len(self.source.shape)
            window = self.manifest.max_source_length or self.frontend.window if frames_last else None
            made = self.frontend.frames(opened, label, window) if frames_last else \
                self.frontend.stream(opened, label, opened.expected)
            return checked_features(self.source, made, label)
        return featurise(self.source, self.load(item, label), label, whole, self.frontend)

    def __call__(self, items: Any, beam: int | None = None, n_best: int | None = None, max_len: int | None = None,
                 alpha: float | None = None, batch_size: int = 16, *, config: SearchConfig | None = None,
                 on_error: Callable[[str], None] | None = None, **options: Any) -> list[Decoded]:
        """One result per input, in order; inputs are featurised and decoded ``batch_size`` at a time.
        ``options``: any decoding option by name, or ``config``, one made by ``translator.search_config``.
        ``on_error``: an input that cannot be read is told to it in one line and left out of the
        results, and the rest are decoded (a batch of files with one bad one); without it, it raises."""
        if self.single(items):
            items = [items]
        if not len(items):
            raise S2SError(f"no {self.reads} given")
        config = self.translator.config_for(config, beam, n_best, max_len, alpha, options)
        labels = [str(item) if isinstance(item, str | Path) else f"{self.label} {i + 1}"
                  for i, item in enumerate(items)]
        found: list[Decoded] = []
        for start in range(0, len(items), batch_size):
            read: dict[int, np.ndarray] = {}
            for i in range(start, min(start + batch_size, len(items))):
                try:
                    read[i] = self.features(items[i], labels[i], whole=True)
                except S2SError as exc:
                    if on_error is None:
                        raise
                    on_error(str(exc))
            if read:
                found += self.decode(list(read.values()), config, [labels[i] for i in read], batch_size=batch_size)
        return found

    def decode(self, features: Sequence[np.ndarray], config: SearchConfig,
               labels: Sequence[str] | None = None, windows: list[tuple[Window, ...]] | None = None,
               told: Sequence[Told | None] | None = None, batch_size: int | None = None) -> list[Decoded]:
        """Items from ``features`` decoded as one batch with a resolved ``config`` (``serve`` batches inputs
        from several requests this way). ``windows``: filled with each item's decoded windows (word
        timestamps feed them again). ``told``: per item, None or a ``Told`` given its segments window by
        window, as they are decoded (the results are the same either way). ``batch_size``: with ``batched``, the most
        windows decoded together (None: every window of these items at once)."""
        labels = labels if labels is not None else [f"{self.label} {i + 1}" for i in range(len(features))]
        if config.batched:
            found = self.batched(features, config, batch_size)
            if windows is not None:
                windows[:] = [sought.windows for sought in found]
            return [self._with_segments(label, sought, config.timestamps, whole_windows=not config.timestamps)
                    for label, sought in zip(labels, found, strict=True)]
        if config.timestamps:
            timed = self.timed(features, config, self._telling(told, range(len(features))))
            if windows is not None:
                windows[:] = [sought.windows for sought in timed]
            return [self._with_segments(label, sought, True) for label, sought in zip(labels, timed, strict=True)]
        window = self.window(features) if self.source.length_axis == len(self.source.shape) else None
        long = [i for i, f in enumerate(features) if window is not None and int(f.shape[-1]) > window]
        found: list[Decoded | None] = [None] * len(features)
        read: list[tuple[Window, ...]] = [() for _ in features]
        if long:
            for i, sought in zip(long, self.long_form([features[i] for i in long], config, [labels[i] for i in long],
                                                      self._telling(told, long)), strict=True):
                found[i] = self._with_segments(labels[i], sought, False, whole_windows=config.timestamp_begin < 1)
                read[i] = sought.windows
        short = [i for i in range(len(features)) if found[i] is None]
        if short and window_options_on(config):  # the fallback reads every clip as windows, a short one as one
            window = self.window(features)
            for i, sought in zip(short, seek_windows([features[i] for i in short], window,
                                                     self.translator.engine.search, config,
                                                     self._windows(config), self._telling(told, short),
                                                     timing=self._timing(config)),
                                      strict=True):
                found[i] = self._with_segments(labels[i], sought, False)
        elif short:
            src, src_len = pad_features([features[i] for i in short], self.source)
            for i, n, hyps in zip(short, src_len.tolist(), self.translator.engine.search(src, src_len, config),
                                  strict=True):
                found[i] = self._decoded(labels[i], hyps)
                read[i] = (Window(0, n, n, hyps[0], len(hyps[0].tokens)),)
                if told is not None and told[i] is not None:  # one window: its text, over its frames
                    told[i]((Segment(0.0, n * config.time_precision / config.timestamp_frames, found[i].text),))
        if windows is not None:
            windows[:] = read
        return [decoded for decoded in found if decoded is not None]

    def window(self, features: Sequence[np.ndarray]) -> int:
        """The frames one encoder call reads: ``limits.max_source_length``, else the front end's fixed
        window, else the longest of ``features``."""
        return self.manifest.max_source_length or self.frontend.window or max(int(f.shape[-1]) for f in features)

    def timed(self, features: Sequence[np.ndarray], config: SearchConfig,
              on_window: Callable[[int, list[Piece]], None] | None = None) -> list[Sought]:
        """Timestamped decoding (runtime/timestamps.py), ``window`` frames at a time."""
        if self.source.length_axis != len(self.source.shape):
            raise S2SError("timestamps: this encoder's input has no frames axis last to seek along")
        return seek_windows(features, self.window(features), self.translator.engine.search, config,
                            self._windows(config), on_window, timing=self._timing(config))

    def _telling(self, told: Sequence[Told | None] | None,
                 inputs: Sequence[int]) -> Callable[[int, list[Piece]], None] | None:
        """``seek_windows``' hook over the items at ``inputs`` (its i-th input is item ``inputs[i]``),
        telling each item's ``Told`` its window's segments; None where no item listens."""
        if told is None or not any(told[j] is not None for j in inputs):
            return None

        def on_window(i: int, pieces: list[Piece]) -> None:
            hook = told[inputs[i]]
            if hook is not None:
                hook(tuple(self._segment(piece) for piece in pieces))

        return on_window

    def _segment(self, piece: Piece) -> Segment:
        """A piece as a segment: its text (timestamps are among the vocabulary's hidden ids, the plugin's
        ``hf_hidden_tokens``) and its window's fallback facts."""
        return Segment(piece.start, piece.end, self.manifest.tgt_vocab.decode(piece.tokens), *window_facts(piece))

    def batched(self, features: Sequence[np.ndarray], config: SearchConfig, batch_size: int | None = None) -> list[
            Sought]:
        """Batched long-form (runtime/batched.py): every input's fixed windows decoded once each, the
        windows of all inputs together, ``batch_size`` at a time."""
        if self.source.length_axis != len(self.source.shape):
            raise S2SError("batched: this encoder's input has no frames axis last to cut into windows")
        if config.n_best != 1:
            raise S2SError(f"batched reads each input as windows, which gives one hypothesis: n_best must be 1, "
                           f"not {config.n_best}")
        return decode_windows(features, self.window(features), self.translator.engine.search, config,
                              self._windows(config), batch_size)

    def _windows(self, config: SearchConfig) -> Callable[[int], Windows] | None:
        """The temperature fallback's window decoder for ``count`` inputs where one of its options is
        on (runtime/fallback.py), else None: the seek loop's plain search."""
        if not window_options_on(config):
            return None
        engine, manifest = self.translator.engine, self.manifest
        return lambda count: Windows(engine.search, manifest.tgt_vocab, manifest.max_target_length, config, count)

    def _timing(self, config: SearchConfig) -> Callable[[int], WordTiming] | None:
        """faster-whisper's word timing and silence skip for ``count`` inputs where
        ``hallucination_silence_threshold`` is on (runtime/hallucination.py), else None."""
        if config.hallucination_silence_threshold is None:
            return None
        if not self.manifest.alignment_heads:
            raise S2SError(f"hallucination_silence_threshold times words: {self.manifest.directory} has no alignment "
                           "heads; export it with --word-timestamps")
        backend = getattr(self.translator, "backend", None)
        if backend is None:
            raise S2SError("hallucination_silence_threshold reads the step decoder's attention: use engine='loop'")
        vocab = self.manifest.tgt_vocab
        return lambda count: WordTiming(backend, vocab, config, count)

    def long_form(self, features: Sequence[np.ndarray], config: SearchConfig, labels: Sequence[str],
                  on_window: Callable[[int, list[Piece]], None] | None = None) -> list[Sought]:
        """Inputs longer than the window, without ``timestamps`` asked for: read window by window with
        timestamps on where the export has timestamp tokens (``generate`` turns them on for such input),
        else one window after another, each ending at a pause where ``window_cut`` says ``pause``."""
        if config.n_best != 1:
            raise S2SError(f"{labels[0]} is longer than the encoder's window of {self.window(features)} frames and "
                           f"is read window by window, which gives one hypothesis: n_best must be 1, not "
                           f"{config.n_best}")
        windows = self._windows(config)
        window = self.window(features)
        if config.timestamp_begin >= 1:
            config = with_timestamps(config, len(self.manifest.tgt_vocab))
            return seek_windows(features, window, self.translator.engine.search, config, windows, on_window,
                                timing=self._timing(config))
        ends = [pause_windows(f, window) for f in features] if config.window_cut == "pause" else None
        return seek_windows(features, window, self.translator.engine.search, config, windows, on_window, ends=ends)

    def _with_segments(self, label: str, sought: Sought, timed: bool, whole_windows: bool = False) -> Decoded:
        """``sought`` as text, with its segments when the caller asked for ``timestamps`` (``timed``).
        ``whole_windows`` (an export without timestamp tokens, read one whole window after another):
        the windows' texts, stripped, joined by one space, since a window may end mid-word and ids
        laid end to end would run two windows' words together."""
        vocab = self.manifest.tgt_vocab
        segments = tuple(self._segment(piece) for piece in sought.pieces)
        if whole_windows:
            text = " ".join(stripped for segment in segments if (stripped := segment.text.strip()))
        else:
            text = vocab.decode(sought.tokens)
        score = float(np.mean(sought.scores)) if sought.scores else 0.0
        language = next((vocab.code_of(i) for i in sought.prompt if i in vocab.languages), None)
        confidence = Confidence.of([window.best for window in sought.windows])
        words = tuple(Word(w.start, w.end, w.word.strip()) for piece in sought.pieces for w in piece.words)
        return Decoded(label, text, score, ((text, score),), language, segments if timed else (),
                       confidence=confidence, words=words)

    def _decoded(self, label: str, hyps: list[Hypothesis]) -> Decoded:
        vocab = self.manifest.tgt_vocab
        texts = tuple((vocab.decode(h.tokens), h.score) for h in hyps)
        language = next((vocab.code_of(i) for i in hyps[0].prompt if i in vocab.languages), None)
        return Decoded(label, texts[0][0], texts[0][1], texts, language, confidence=Confidence.of(hyps[:1]))
