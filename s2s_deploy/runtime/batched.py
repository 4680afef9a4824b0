"""Batched long-form (the ``batched`` option), as faster-whisper's ``BatchedInferencePipeline`` reads
audio: each input cut into independent windows, every window decoded exactly once, the windows of
all inputs decoded together in shared batches. Imports numpy only.

The seek loop (runtime/timestamps.py) decodes an input's windows one after another, each starting
where the last one's complete segments ended; here the cuts are fixed before anything is decoded:
window ``k`` of an input reads frames ``[k * window, (k + 1) * window)`` (the last one fewer,
zero-padded to the window, as the seek loop pads it). So no window waits for another, and a 10-minute
input is 20 rows of one batch rather than 20 batches of one row. A window is fed no earlier text
(``condition_on_previous_text`` and ``initial_prompt`` are refused; ``prompt`` feeds every window) and
an open language slot is chosen per window, as the batched pipeline does with ``multilingual=True``;
so a window's result depends on its own features alone, never on its batchmates or neighbours.

A window's output is cut into segments by faster-whisper's ``_split_segments_by_timestamps`` with
``seek=0`` (as ``BatchedInferencePipeline.forward`` calls it): a segment ends at every pair of adjacent
timestamps; a window that ends on a lone timestamp keeps its last segment; otherwise the tokens after
the last pair (an unfinished segment) are dropped, since no later decode of that window will read them
again. A window without a timestamp pair is one segment from its start to its last timestamp, else to
its end. Times are the window's start plus the timestamps, unrounded (faster-whisper rounds to 1 ms).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from s2s_deploy.runtime.decoding import SearchConfig
from s2s_deploy.runtime.fallback import Outcome, Windows
from s2s_deploy.runtime.timestamps import Piece, Search, Sought, Window


@dataclass(frozen=True)
class Cut:
    """One window: its input, its first frame and the frames it reads (at most the window)."""

    item: int
    start: int
    frames: int


def fixed_windows(totals: Sequence[int], window: int) -> list[Cut]:
    """Every input's windows, in order: ``window`` frames each from frame 0, the last one what is left."""
    return [Cut(i, start, min(window, total - start)) for i, total in enumerate(totals)
            for start in range(0, total, window)]


def window_segments(tokens: Sequence[int], start: int, frames: int, config: SearchConfig) -> list[Piece]:
    """One window's output (its EOS excluded), read from frame ``start`` for ``frames`` frames, as
    segments: ``_split_segments_by_timestamps``' rule with the window's offset and duration in seconds."""
    begin, precision = config.timestamp_begin, config.time_precision
    offset = start * precision / config.timestamp_frames
    duration = frames * precision / config.timestamp_frames
    if begin < 1:  # an export without timestamp tokens: the whole window
        return [Piece(offset, offset + duration, tuple(tokens))]
    stamp = [token >= begin for token in tokens]
    single_ending = len(tokens) >= 2 and not stamp[-2] and stamp[-1]
    cuts = [i for i in range(1, len(tokens)) if stamp[i] and stamp[i - 1]]
    if not cuts:
        stamps = [token for token in tokens if token >= begin]
        if stamps and stamps[-1] != begin:
            duration = (stamps[-1] - begin) * precision
        return [Piece(offset, offset + duration, tuple(tokens))]
    if single_ending:
        cuts.append(len(tokens))
    pieces, last = [], 0
    for cut in cuts:
        piece = tuple(tokens[last:cut])
        pieces.append(Piece(offset + (piece[0] - begin) * precision, offset + (piece[-1] - begin) * precision, piece))
        last = cut
    return pieces


def decode_windows(features: Sequence[np.ndarray], window: int, search: Search, config: SearchConfig,
                   windows: Callable[[int], Windows] | None = None, batch_size: int | None = None) -> list[Sought]:
    """Every input (features with frames last) cut into fixed windows, the windows of all inputs decoded
    ``batch_size`` at a time (None: all at once), each once; one ``Sought`` per input. ``windows``: the
    temperature fallback's decoder (runtime/fallback.py), applied to each window on its own; a window it
    skips as silence gives no segment."""
    cuts = fixed_windows([int(f.shape[-1]) for f in features], window)
    step = batch_size or max(len(cuts), 1)
    pieces: list[list[Piece]] = [[] for _ in features]
    scores: list[list[float]] = [[] for _ in features]
    prompts: list[tuple[int, ...] | None] = [None] * len(features)
    kept: list[list[Window]] = [[] for _ in features]
    for first in range(0, len(cuts), step):
        group = cuts[first: first + step]
        shape = features[group[0].item].shape[:-1]
        batch = np.zeros((len(group), *shape, window), dtype=features[group[0].item].dtype)
        for row, cut in enumerate(group):
            batch[row, ..., : cut.frames] = features[cut.item][..., cut.start: cut.start + cut.frames]
        lengths = np.full(len(group), window, dtype=np.int64)
        found = (windows(len(group)).decode(batch, lengths, config, tuple(config.prompt)) if windows is not None
                 else [hyps[0] for hyps in search(batch, lengths, config)])
        for cut, decoded in zip(group, found, strict=True):
            best = decoded.hypothesis if isinstance(decoded, Outcome) else decoded
            if prompts[cut.item] is None:
                prompts[cut.item] = best.prompt or tuple(config.decoder_prompt)
            if isinstance(decoded, Outcome) and decoded.skipped:  # silence: no segment
                continue
            window_pieces = window_segments(best.tokens, cut.start, cut.frames, config)
            if isinstance(decoded, Outcome):
                window_pieces = [Piece(p.start, p.end, p.tokens, decoded) for p in window_pieces]
            pieces[cut.item] += window_pieces
            used = sum(len(p.tokens) for p in window_pieces)
            kept[cut.item].append(Window(cut.start, cut.frames, window, best, used))
            scores[cut.item].append(best.score)
    return [Sought(tuple(p), tuple(s), pr or (), tuple(w)) for p, s, pr, w in zip(pieces, scores, prompts, kept,
                                                                                  strict=True)]
