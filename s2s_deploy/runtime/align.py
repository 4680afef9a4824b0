"""CTranslate2's ``Whisper.align`` on our engine: the alignment faster-whisper's word timing reads
(``find_alignment``), which differs from ``generate(return_token_timestamps=True)``'s (runtime/words.py).

For each text, the step decoder of an export with alignment heads (``export --word-timestamps``) is fed
``start_sequence + [<|notimestamps|>] + text + [<|endoftext|>]`` over one window's features. The text
tokens' probabilities are the softmax of each step's scores over the ids below ``<|endoftext|>`` at the
token predicted. The alignment heads' cross-attention of every row is cropped to ``num_frames // 2``
encoder positions and renormalised there (our decoder gives the softmax over the whole window, so this
is the softmax of the cropped scores, as CTranslate2 and openai-whisper take it), normalised per head
and position over all the rows (mean 0, variance 1, no epsilon), median-filtered along the positions
(width 7, reflected edges), averaged over the heads; the rows from ``<|notimestamps|>`` to the last text
token (one per token predicted, ``<|endoftext|>`` last) are aligned by DTW on the negated matrix. This is
CTranslate2 4's ``WhisperReplica::align`` and openai-whisper's ``timing.find_alignment``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.runtime.backend import Backend

MEDIAN_WIDTH = 7
"""transformers' ``median_filter_width`` default and openai-whisper's ``medfilt_width``."""


def median_filter(x: np.ndarray, width: int) -> np.ndarray:
    """A running median of odd ``width`` along the last axis, edges reflected (torch's ``reflect``);
    an axis no longer than half the width is left as it is, as transformers leaves it."""
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    return np.median(np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1), axis=-1).astype(x.dtype)


def dtw(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest monotonic path through ``matrix`` (rows: tokens, columns: positions), as
    ``_dynamic_time_warping`` finds it (float32 costs, the same tie rules), one anti-diagonal at a
    time: (row indices, column indices) along the path, in order."""
    rows, columns = matrix.shape
    cost = np.full((rows + 1, columns + 1), np.inf, dtype=np.float32)
    trace = np.full((rows + 1, columns + 1), -1, dtype=np.int8)
    cost[0, 0] = 0
    for diagonal in range(2, rows + columns + 1):
        i = np.arange(max(1, diagonal - columns), min(rows, diagonal - 1) + 1)
        j = diagonal - i
        c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
        step = np.where((c0 < c1) & (c0 < c2), 0, np.where((c1 < c0) & (c1 < c2), 1, 2))
        cost[i, j] = matrix[i - 1, j - 1] + np.choose(step, (c0, c1, c2))
        trace[i, j] = step
    trace[0, :], trace[:, 0] = 2, 1
    i, j = rows, columns
    text, time = [], []
    while i > 0 or j > 0:
        text.append(i - 1)
        time.append(j - 1)
        move = trace[i, j]
        i, j = (i - 1, j - 1) if move == 0 else (i - 1, j) if move == 1 else (i, j - 1)
    return np.array(text[::-1]), np.array(time[::-1])


@dataclass(frozen=True)
class Alignment:
    """One text's alignment as CTranslate2's ``WhisperAlignmentResult``: the DTW path as (text index,
    time index) pairs (text index ``len(text)`` is ``<|endoftext|>``) and each text token's probability."""

    alignments: tuple[tuple[int, int], ...]
    text_token_probs: tuple[float, ...]


def align(backend: Backend, features: np.ndarray, start_sequence: Sequence[int], text_tokens: Sequence[Sequence[int]],
          num_frames: int, no_timestamps: int, median_filter_width: int = MEDIAN_WIDTH) -> list[Alignment]:
    """Each of ``text_tokens`` aligned to its row of ``features`` (batch, mels, frames: one window each),
    ``num_frames`` of which are audio."""
    eot = backend.eos_id
    fed = [[*start_sequence, no_timestamps, *text, eot] for text in text_tokens]
    rows, longest = len(fed), max(len(f) for f in fed)
    tokens = np.full((rows, longest), eot, dtype=np.int64)
    for row, sequence in enumerate(fed):
        tokens[row, : len(sequence)] = sequence
    attention: list[list[np.ndarray]] = [[] for _ in fed]
    probs: list[list[float]] = [[] for _ in fed]
    offset = len(start_sequence)
    identity = np.arange(rows, dtype=np.int64)
    src = np.ascontiguousarray(features, dtype=np.float32)
    with backend.start(src, np.full(rows, src.shape[-1], dtype=np.int64), keep_attention=True) as run:
        for t in range(longest):
            log_probs = run.step(tokens[:, t].copy(), identity)
            weights = run.attention()
            if weights is None:
                raise S2SError(f"the {backend.name} backend returned no attention weights")
            for row, sequence in enumerate(fed):
                if t >= len(sequence):
                    continue
                attention[row].append(np.array(weights[row], dtype=np.float32))
                if offset <= t < len(sequence) - 2:  # this step predicts text token t - offset
                    text = log_probs[row, :eot].astype(np.float64)
                    top = text.max()
                    probs[row].append(float(np.exp(text[sequence[t + 1]] - top) / np.exp(text - top).sum()))
    found = []
    for row in range(rows):
        matrix = alignment_matrix(np.stack(attention[row], axis=1), num_frames // 2, median_filter_width)
        text, time = dtw(-matrix[offset:-1].astype(np.float64))
        found.append(Alignment(tuple(zip(text.tolist(), time.tolist(), strict=True)), tuple(probs[row])))
    return found


def alignment_matrix(weights: np.ndarray, positions: int, width: int) -> np.ndarray:
    """``weights`` (heads, rows, source), the softmax over every source position, as the softmax over
    the first ``positions``, normalised over the rows, median-filtered and averaged over the heads."""
    w = weights[..., :positions].astype(np.float64)
    w = (w / w.sum(axis=-1, keepdims=True)).astype(np.float32)
    mean = w.astype(np.float64).mean(axis=-2, keepdims=True)
    std = w.astype(np.float64).std(axis=-2, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):  # one row: 0 / 0, NaN as theirs
        w = ((w - mean) / std).astype(np.float32)
    return median_filter(w, width).mean(axis=0)
