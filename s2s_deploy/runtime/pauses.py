"""Where a long input without timestamp tokens is cut into encoder windows: at its quietest moment
near each window's end, not at fixed offsets, so no word is read half in one window and half in the next.

An export whose decoder writes no timestamps cannot say where its text ends in a window, so the search
advances one whole window at a time (runtime/timestamps.py). Cut at fixed offsets, a window can end in
the middle of a word, and both halves come out garbled (``2décembre 23 févrerere-vier``). Here each
window ends instead at the frame of least loudness (the mean over the feature rows, smoothed over
``SMOOTH`` frames) in its last ``SEARCH`` part; ties go to the latest such frame, and the last window
takes what is left. Every window but the last is thus at least ``1 - SEARCH`` of the encoder's window.

The rule reads only the features, so any client that computes them can follow it: docs/manifest.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np

SEARCH = 0.4
"""The share of each window, counted back from its end, searched for a pause."""
SMOOTH = 15
"""Frames the loudness is averaged over (150 ms at a 10-ms hop): a pause, not a gap between two sounds."""


def loudness(features: np.ndarray) -> np.ndarray:
    """Each frame's loudness: the mean of its feature rows (frames last), smoothed by a centred moving
    average of ``SMOOTH`` frames (edges averaged over the frames they have)."""
    frames = features.reshape(-1, features.shape[-1]).mean(axis=0, dtype=np.float64)
    kernel = np.ones(SMOOTH)
    total = np.convolve(frames, kernel, mode="same")
    count = np.convolve(np.ones_like(frames), kernel, mode="same")
    return total / count


def pause_windows(features: Any, window: int) -> list[int]:
    """The end frame of each window of ``features`` (frames last), in order, the last one the frame count:
    each window starts where the one before ended and ends at the quietest frame of its last ``SEARCH``
    part (the latest of equals), or at the input's end where that is within one window.

    Only the frames each search reads are taken, with ``SMOOTH // 2`` more on each side (the moving
    average's reach), as ``features[..., a:b]`` in increasing order: an array, or streamed features
    (frontends/frames.py) that make a long file's frames as they are asked for, never the whole clip."""
    total = int(features.shape[-1])
    reach = SMOOTH // 2
    ends, start = [], 0
    while total - start > window:
        low, high = start + max(1, int(window * (1 - SEARCH))), start + window
        first, last = max(0, low - reach), min(total, high + reach + 1)
        level = loudness(np.asarray(features[..., first:last]))[low - first : high - first + 1]
        end = high - int(np.argmin(level[::-1]))
        ends.append(end)
        start = end
    ends.append(total)
    return ends
