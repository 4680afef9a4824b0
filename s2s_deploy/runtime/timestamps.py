"""Timestamped decoding: an input's features read window by window, each window's timestamp tokens
cutting its output into segments and saying where the next window starts. Imports numpy only.

This is ``WhisperForConditionalGeneration.generate(return_timestamps=True)``'s seek loop
(transformers 5.24, ``_retrieve_segment``), stated by the search options alone (docs/decoding.md,
"Timestamps"): ids from ``timestamp_begin`` on are timestamps, ``time_precision`` seconds apart,
``timestamp_frames`` encoder frames apart. Every input starts at frame 0; its window is its next
``window`` frames (fewer at its end, zero-padded); a window's output is cut after every pair of
adjacent timestamps. If it ends with a lone timestamp, or holds no pair, the whole window is
consumed; else the tokens after the last pair are dropped and the next window starts at that
pair's first timestamp. An input is done once its window start reaches its frame count. Without
``timestamps`` (an export with no timestamp tokens) every window is consumed whole, as one holding no
timestamp pair is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.runtime.decoding import SearchConfig
from s2s_deploy.runtime.fallback import Outcome, Windows
from s2s_deploy.runtime.search import Hypothesis

if TYPE_CHECKING:
    from s2s_deploy.runtime.hallucination import TimedWord, WordTiming

Search = Callable[[np.ndarray, np.ndarray, SearchConfig], list[list[Hypothesis]]]


@dataclass(frozen=True)
class Piece:
    """One segment: its start and end in seconds from the input's start, and its tokens (the
    timestamps that bound it included, as ``generate`` returns them)."""

    start: float
    end: float
    tokens: tuple[int, ...]
    window: Outcome | None = None
    """With the temperature fallback (runtime/fallback.py): its window's outcome (temperature,
    average log-prob, compression ratio, no-speech probability); else None."""
    words: tuple[TimedWord, ...] = ()
    """With ``hallucination_silence_threshold`` (runtime/hallucination.py): its words, as faster-whisper
    times them."""


@dataclass(frozen=True)
class Window:
    """One decoded window: where it starts and how many frames it read, and its best hypothesis (what
    word timestamps feed again to read the decoder's attention)."""

    seek: int
    frames: int
    width: int
    """The encoder input's frames (``src_len``): the window, zero-padded past ``frames``."""
    best: Hypothesis
    kept: int
    """How many of the hypothesis's tokens its segments kept (the rest were dropped to seek back)."""


@dataclass(frozen=True)
class Sought:
    """One input's timestamped output: every window's segments in order, their tokens concatenated
    (``generate``'s sequence), each window's best hypothesis score, and the first window's prompt."""

    pieces: tuple[Piece, ...]
    scores: tuple[float, ...]
    prompt: tuple[int, ...]
    windows: tuple[Window, ...] = ()

    @property
    def tokens(self) -> tuple[int, ...]:
        return tuple(token for piece in self.pieces for token in piece.tokens)


def split(tokens: Sequence[int], seek: int, frames: int, config: SearchConfig) -> tuple[list[Piece], int]:
    """One window's output (its EOS excluded), read from frame ``seek`` for ``frames`` frames, as
    segments, and the frames to advance (``_retrieve_segment``'s arithmetic, float64 times)."""
    begin, precision, stride = config.timestamp_begin, config.time_precision, config.timestamp_frames
    offset = seek * precision / stride
    stamp = [token >= begin for token in tokens]
    single_ending = stamp[-2:] == [False, True]
    cuts = [i + 1 for i in range(len(stamp) - 1) if stamp[i] and stamp[i + 1]]
    if not cuts:  # one segment: to its last timestamp, else to the window's end
        end = int(np.float32(frames) * np.float32(precision / stride) / np.float32(precision))
        stamps = [token for token in tokens if token >= begin]
        if stamps and stamps[-1] != begin:
            end = stamps[-1] - begin
        return [Piece(offset, offset + end * precision, tuple(tokens))], frames
    if single_ending:
        cuts.append(len(tokens))
    else:  # the last pair stays whole in the last segment
        cuts[-1] += 1
    pieces, last = [], 0
    for i, cut in enumerate(cuts):
        piece = tuple(tokens[last:cut])
        closing = piece[-1] if i < len(cuts) - 1 or single_ending else piece[-2]
        pieces.append(Piece(offset + (piece[0] - begin) * precision, offset + (closing - begin) * precision, piece))
        last = cut
    if single_ending:
        return pieces, frames
    return pieces, (tokens[last - 2] - begin) * stride


def whole_window(tokens: Sequence[int], seek: int, frames: int, config: SearchConfig) -> tuple[list[Piece], int]:
    """One window's output without timestamps: one piece over the whole window, all of it consumed."""
    scale = config.time_precision / config.timestamp_frames
    return [Piece(seek * scale, (seek + frames) * scale, tuple(tokens))], frames


def seek_windows(features: Sequence[np.ndarray], window: int, search: Search, config: SearchConfig,
                 windows: Callable[[int], Windows] | None = None,
                 on_window: Callable[[int, list[Piece]], None] | None = None, *,
                 ends: Sequence[Sequence[int]] | None = None,
                 timing: Callable[[int], WordTiming] | None = None) -> list[Sought]:
    """Every input (features with frames last) decoded window by window, batched across inputs.
    An open language slot is chosen on an input's first window and kept for the rest, as
    ``generate`` detects the language once per input. ``windows`` (given the input count): the
    temperature fallback's decoder (runtime/fallback.py), which also skips silent windows and feeds
    each input's earlier text; inputs then share a batch only where their earlier texts agree.
    ``on_window(i, pieces)``: told each window's segments of input ``i`` as soon as that window is
    decoded, before the next one (``serve``'s streamed answers); a silent window it skips is not told.
    ``ends`` (without timestamps only): each input's window ends (runtime/pauses.py), each window
    then padded with its input's lowest value, the silence its front end writes; else windows of
    ``window`` frames padded with zeros. ``timing`` (given the input count): faster-whisper's word
    timing and silence skip (``hallucination_silence_threshold``, runtime/hallucination.py), which then
    cuts each window and says where the next starts; a window it drops is decoded again from a later start."""
    if ends is not None and config.timestamps:
        raise S2SError("windows cut at pauses are for decoding without timestamps")
    if config.n_best != 1:
        raise S2SError(f"window-by-window decoding gives one hypothesis per input: n_best must be 1, not "
                       f"{config.n_best}")
    cut = split if config.timestamps else whole_window
    count = len(features)
    totals = [int(f.shape[-1]) for f in features]
    floors = [f.min() for f in features] if ends is not None else []  # a window cut at a pause is padded with it
    seeks = [0] * count
    pieces: list[list[Piece]] = [[] for _ in range(count)]
    scores: list[list[float]] = [[] for _ in range(count)]
    prompts: list[tuple[int, ...] | None] = [None] * count
    carry = windows(count) if windows is not None else None
    timer = timing(count) if timing is not None else None
    kept: list[list[Window]] = [[] for _ in range(count)]
    while True:
        active = [i for i in range(count) if seeks[i] < totals[i]]
        if not active:
            break
        groups: dict[tuple[tuple[int, ...], tuple[int, ...]], list[int]] = {}
        for i in active:  # inputs past their first window feed the language their first one chose
            context = carry.context(i) if carry is not None else ()
            groups.setdefault((prompts[i] or tuple(config.decoder_prompt), context), []).append(i)
        for (prompt, context), members in groups.items():
            frames = [min(totals[i] - seeks[i], window) if ends is None
                      else next(end for end in ends[i] if end > seeks[i]) - seeks[i] for i in members]
            batch = np.zeros((len(members), *features[members[0]].shape[:-1], window), dtype=features[members[0]].dtype)
            for row, (i, n) in enumerate(zip(members, frames, strict=True)):
                if ends is not None:
                    batch[row] = floors[i]
                batch[row, ..., :n] = features[i][..., seeks[i]: seeks[i] + n]
            lengths = np.full(len(members), window, dtype=np.int64)
            window_config = replace(config, decoder_prompt=prompt)
            found = (carry.decode(batch, lengths, window_config, context) if carry is not None
                     else [hyps[0] for hyps in search(batch, lengths, window_config)])
            for row, (i, n, decoded) in enumerate(zip(members, frames, found, strict=True)):
                best = decoded.hypothesis if isinstance(decoded, Outcome) else decoded
                if prompts[i] is None:
                    prompts[i] = best.prompt or prompt
                if isinstance(decoded, Outcome) and decoded.skipped:  # silence: the whole window, no segment
                    seeks[i] += n
                    continue
                if timer is not None:
                    timed = timer.window(i, batch[row], prompts[i], best.tokens, seeks[i], n, window, totals[i])
                    if timed.again:  # a hallucination after a silence: decoded again from where it starts
                        seeks[i] = timed.seek
                        continue
                    window_pieces = [Piece(start, end, tokens, None, words)
                                     for start, end, tokens, words in timed.segments]
                    advance = timed.seek - seeks[i]
                else:
                    window_pieces, advance = cut(best.tokens, seeks[i], n, config)
                if advance <= 0:
                    raise S2SError("a window's timestamps did not advance the search (the model's timestamp "
                                   "tokens break the rules of docs/decoding.md)")
                if isinstance(decoded, Outcome):
                    window_pieces = [replace(piece, window=decoded) for piece in window_pieces]
                    carry.update(i, [(p.start, p.end, p.tokens) for p in window_pieces], decoded)  # type: ignore[union-attr]
                pieces[i] += window_pieces
                if on_window is not None:
                    on_window(i, window_pieces)
                kept[i].append(Window(seeks[i], n, window, best, sum(len(p.tokens) for p in window_pieces)))
                scores[i].append(best.score)
                seeks[i] += advance
    return [Sought(tuple(p), tuple(s), pr or (), tuple(w))
            for p, s, pr, w in zip(pieces, scores, prompts, kept, strict=True)]

