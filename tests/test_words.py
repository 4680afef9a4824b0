"""Word timestamps' numpy parts against transformers' own (``generation_whisper``): the median filter and
dynamic time warping on random matrices, and the word grouping of runtime/words.py."""

from __future__ import annotations

import numpy as np
import pytest

from s2s_deploy.runtime.words import dtw, median_filter

generation = pytest.importorskip("transformers.models.whisper.generation_whisper")
torch = pytest.importorskip("torch")


@pytest.mark.parametrize(("shape", "seed"), [((3, 5, 40), 0), ((2, 1, 9), 1), ((1, 4, 3), 2), ((4, 12, 150), 3)])
def test_median_filter_is_transformers(shape: tuple[int, ...], seed: int) -> None:
    x = np.random.default_rng(seed).normal(size=shape).astype(np.float32)
    theirs = generation._median_filter(torch.from_numpy(x), 7).numpy()
    assert np.array_equal(median_filter(x, 7), theirs)


@pytest.mark.parametrize(("shape", "seed"), [((1, 1), 0), ((1, 30), 1), ((6, 40), 2), ((20, 25), 3), ((25, 20), 4)])
def test_dtw_is_transformers(shape: tuple[int, int], seed: int) -> None:
    matrix = np.random.default_rng(seed).normal(size=shape)
    text, time = dtw(matrix)
    theirs = generation._dynamic_time_warping(matrix)
    assert np.array_equal(text, theirs[0]) and np.array_equal(time, theirs[1])


def test_dtw_breaks_ties_as_transformers() -> None:
    """Equal costs everywhere: every choice is a tie, decided by the same rule."""
    matrix = np.zeros((5, 9))
    text, time = dtw(matrix)
    theirs = generation._dynamic_time_warping(matrix)
    assert np.array_equal(text, theirs[0]) and np.array_equal(time, theirs[1])
