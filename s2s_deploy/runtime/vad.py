"""Audio read through voice activity detection (``Transcriber(...)(clips, vad=True)``,
``transcribe --vad``), as faster-whisper's ``BatchedInferencePipeline`` reads it: each clip's speech
spans (frontends/vad.py) laid end to end into windows of at most the encoder's length, the silence
between them never decoded; the windows of every clip decoded together, ``batch_size`` at a time,
each as an input of its own; a window's segment times mapped back to the original clip.

A clip's text is its windows' texts, stripped, joined by one space (a window may end mid-sentence);
its score the mean of its windows'; its language its first window's (each window detects its own
where the prompt leaves the language open). A clip without speech has empty text and score 0. A
segment time past a window's speech (the model may time its last segment into the window's padding)
is held to the window's end, so no segment reaches into the silence that was cut. A word's start and
end map through the span its middle falls in (faster-whisper's ``restore_speech_timestamps``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.frontends.vad import SpeechWindow, VadOptions, speech_spans, speech_windows
from s2s_deploy.runtime.decoding import SearchConfig
from s2s_deploy.runtime.features import Decoded, FeatureReader, Segment, Word
from s2s_deploy.runtime.words import decode_words


def window_seconds(reader: FeatureReader) -> float:
    """The audio one encoder window reads: ``limits.max_source_length`` frames, else the front end's
    fixed window, in seconds; unbounded where neither is set."""
    frames = reader.manifest.max_source_length or reader.frontend.window
    return frames * reader.frontend.frame_seconds if frames else math.inf


def speech_inputs(reader: FeatureReader, audio: np.ndarray, label: str,
                  vad: VadOptions) -> list[tuple[SpeechWindow, np.ndarray, int]]:
    """One clip's speech windows, each with its features and its frames of audio (what word
    timestamps crop to): what ``decode_speech`` decodes, and ``serve`` queues window by window."""
    rate, seconds = int(reader.frontend.sampling_rate), window_seconds(reader)
    found = []
    for window in speech_windows(speech_spans(audio, rate, vad, seconds), rate, seconds):
        speech = window.audio(audio)
        features = reader.features(speech, label, whole=True)
        found.append((window, features, reader.frontend.content_frames(speech) or features.shape[-1]))
    return found


def check_one_hypothesis(config: SearchConfig) -> None:
    """--vad reads speech window by window, which gives one hypothesis."""
    if config.n_best != 1:
        raise S2SError(f"--vad reads each clip's speech window by window, which gives one hypothesis: n_best must "
                       f"be 1, not {config.n_best}")


def decode_speech(reader: FeatureReader, items: Sequence[Any], labels: Sequence[str], config: SearchConfig,
                  vad: VadOptions, batch_size: int, words: bool = False) -> list[Decoded]:
    """One result per item, in order: only its speech decoded, ``batch_size`` windows at a time;
    ``words``: with word timestamps (runtime/words.py), aligned to each window's audio alone."""
    check_one_hypothesis(config)
    found: list[Decoded] = []
    for start in range(0, len(items), batch_size):
        group = range(start, min(start + batch_size, len(items)))
        windows: list[tuple[int, SpeechWindow, np.ndarray, int]] = []
        for i in group:
            windows += [(i, *read) for read in speech_inputs(reader, reader.load(items[i], labels[i]), labels[i], vad)]
        decoded: list[Decoded] = []
        for first in range(0, len(windows), batch_size):
            batch = windows[first: first + batch_size]
            features, labelled = [f for _, _, f, _ in batch], [labels[i] for i, _, _, _ in batch]
            decoded += (decode_words(reader, features, [c for *_, c in batch], config, labelled) if words
                        else reader.decode(features, config, labelled))
        for i in group:
            mine = [(w, d) for (j, w, _, _), d in zip(windows, decoded, strict=True) if j == i]
            found.append(joined(labels[i], mine, config.timestamps))
    return found


def restored(window: SpeechWindow, segment: Segment) -> Segment:
    """A segment of one speech window, timed in the original clip (held to the window's speech)."""
    return Segment(window.original(min(segment.start, window.duration)),
                   window.original(min(segment.end, window.duration), end=True), segment.text)


def joined(label: str, windows: list[tuple[SpeechWindow, Decoded]], timed: bool) -> Decoded:
    """One clip's windows as one result, segment times in the original clip."""
    if not windows:
        return Decoded(label, "", 0.0, (("", 0.0),), None, ())
    text = " ".join(stripped for _, d in windows if (stripped := d.text.strip()))
    score = float(np.mean([d.score for _, d in windows]))
    language = next((d.language for _, d in windows if d.language is not None), None)
    segments = tuple(restored(w, s) for w, d in windows for s in d.segments) if timed else ()
    words = tuple(Word(w.original(min(word.start, w.duration), span=span), w.original(min(word.end, w.duration),
                                                                                        end=True, span=span), word.text)
                  for w, d in windows for word in d.words
                  for span in (w.span_of(min((word.start + word.end) / 2, w.duration)),))
    return Decoded(label, text, score, ((text, score),), language, segments, words)
