"""Timestamped decoding (the ``timestamps`` option, ``transcribe --timestamps``) under parity: the
candidate's tokens and timed segments against a reference's, greedy and beam, on inputs read whole,
so that an input longer than the encoder's window is sought through window by window.

What timestamps mean comes from the export's own search block (``timestamp_begin``,
``time_precision``, ``timestamp_frames``, ``max_initial_timestamp``) and its
``limits.max_source_length`` (the window), never from the model's name: the same rows
``runtime/timestamps.py`` decodes by. The window in seconds is ``max_source_length * time_precision /
timestamp_frames``, which is how long the seeded synthetic long clips are made.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.format.manifest import Manifest
from s2s_deploy.frontends.media import medium_of, synthetic_clips
from s2s_deploy.frontends.source import featurise, frontend_for
from s2s_deploy.runtime.decoding import SearchConfig, resolve
from s2s_deploy.runtime.search import SearchEngine
from s2s_deploy.runtime.timestamps import Piece, seek_windows
from s2s_deploy.verify.plan import ParityPlan

LONG_CLIPS = 4
"""Seeded synthetic clips longer than the window, added to the synthetic parity inputs."""
LONG_WINDOWS = (1.2, 3.5)
"""Their length, in windows: each crosses at least one window boundary, some three."""


@dataclass(frozen=True)
class Timed:
    """One input's timestamped output as a side reports it: its tokens (timestamps included, every
    window's concatenated) and its segments."""

    tokens: tuple[int, ...]
    segments: tuple[Piece, ...]


TimedSearch = Callable[[Sequence[np.ndarray], SearchConfig], list[Timed]]
"""Whole inputs (frames last) and a resolved config with ``timestamps`` on → one ``Timed`` per input."""


@dataclass(frozen=True)
class TimedAgreement:
    """One search mode's timestamped agreement: an input is ``identical`` when its tokens and every
    segment (start, end, tokens) agree; ``long`` counts the inputs longer than one window, ``segments``
    the reference's segments (more than ``total``: the timestamps did cut)."""

    mode: str
    total: int
    long: int
    segments: int
    tokens_identical: int
    segments_identical: int
    identical: int
    mismatches: tuple[tuple[str, str, str], ...] = field(default=())

    @property
    def agreement(self) -> float:
        return self.identical / self.total


def timestamp_window(manifest: Manifest) -> int | None:
    """The frames one window reads (``limits.max_source_length``; None: an input is one window), after
    checking, in one line each, that timestamps apply: the export sets ``timestamp_begin`` and its
    encoder reads features with a frames axis last to seek along."""
    resolve(manifest, {"timestamps": True, "n_best": 1})  # no timestamp tokens: one DecodingError line
    source = manifest.encoder_input
    if not source.is_features or source.length_axis != len(source.shape):
        raise S2SError("timestamps: this encoder's input has no frames axis last to seek along")
    return manifest.max_source_length


def window_seconds(manifest: Manifest) -> float | None:
    """How long one window is, by the timestamp rows: ``time_precision / timestamp_frames`` seconds a
    frame; None without a fixed window."""
    window = manifest.max_source_length
    if window is None:
        return None
    config = resolve(manifest, {"timestamps": True, "n_best": 1})
    return window * config.time_precision / config.timestamp_frames


def whole_features(manifest: Manifest, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
    """Each input through the export's own front end, uncut (``whole``), as ``transcribe --timestamps``
    reads it."""
    source = manifest.encoder_input
    frontend = frontend_for(source)
    return {label: featurise(source, item, label, whole=True, frontend=frontend) for label, item in inputs.items()}


def stepwise(engine: SearchEngine, window: int | None) -> TimedSearch:
    """Our window-by-window seeking (runtime/timestamps.py) over a search engine, batched across inputs;
    without a fixed window, each batch's longest input is the window (as ``Transcriber`` does)."""

    def timed(features: Sequence[np.ndarray], config: SearchConfig) -> list[Timed]:
        frames = window or max(int(f.shape[-1]) for f in features)
        return [Timed(s.tokens, s.pieces) for s in seek_windows(features, frames, engine.search, config)]

    return timed


def same_segments(want: Sequence[Piece], got: Sequence[Piece], precision: float) -> bool:
    """Same tokens and times, each within a thousandth of ``time_precision``: a wrong timestamp or seek
    moves a time by a frame (``time_precision / timestamp_frames``) or more, float rounding by ~1e-16."""
    return len(want) == len(got) and all(
        w.tokens == g.tokens and abs(w.start - g.start) <= precision / 1000 and abs(w.end - g.end) <= precision / 1000
        for w, g in zip(want, got, strict=True))


def check_timestamps(
    manifest: Manifest, reference: TimedSearch, candidate: TimedSearch, features: dict[str, np.ndarray], *,
    plan: ParityPlan, batch_size: int = 16,
) -> tuple[TimedAgreement, ...]:
    """``reference`` against ``candidate`` with timestamps on, in the plan's timed modes (greedy and
    beam), on ``features`` (whole inputs by label), ``batch_size`` inputs at a time."""
    window = manifest.max_source_length
    labels = list(features)
    long = sum(window is not None and features[label].shape[-1] > window for label in labels)
    found = []
    for mode, config in plan.timed_modes:
        tokens = segments = identical = cut = 0
        mismatches = []
        for start in range(0, len(labels), batch_size):
            chunk = labels[start : start + batch_size]
            items = [features[label] for label in chunk]
            for label, want, got in zip(chunk, reference(items, config), candidate(items, config), strict=True):
                cut += len(want.segments)
                same_tokens = want.tokens == got.tokens
                same_times = same_segments(want.segments, got.segments, config.time_precision)
                tokens, segments = tokens + same_tokens, segments + same_times
                if same_tokens and same_times:
                    identical += 1
                else:
                    mismatches.append((label, shown(manifest, want.segments), shown(manifest, got.segments)))
        found.append(TimedAgreement(f"{mode} timestamps", len(labels), long, cut, tokens, segments, identical,
                                    tuple(mismatches)))
    return tuple(found)


def shown(manifest: Manifest, segments: Sequence[Piece]) -> str:
    """Segments as a user reads them: ``[start-end] text`` each."""
    decode = manifest.tgt_vocab.decode
    return " ".join(f"[{p.start:.2f}-{p.end:.2f}] {decode(p.tokens)}".rstrip() for p in segments)


def long_inputs(manifest: Manifest) -> dict[str, np.ndarray]:
    """Seeded synthetic clips of ``LONG_WINDOWS`` windows, where the folder allows them: a front end that
    reads audio and a fixed window; else none."""
    seconds = window_seconds(manifest)
    frontend = frontend_for(manifest.encoder_input)
    if seconds is None or not medium_of(frontend).timed:
        return {}
    low, high = LONG_WINDOWS
    return synthetic_clips(frontend.sampling_rate, LONG_CLIPS, seed=1, seconds=(low * seconds, high * seconds),
                           label="synthetic long clip")
