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


def their_token_times(weights: np.ndarray, positions: int) -> np.ndarray:
    """``_extract_token_timestamps``' steps after the heads are picked: torch's normalisation, its median
    filter and head mean, its DTW, the first step into each row."""
    w = torch.from_numpy(weights[..., :positions])
    std = torch.std(w, dim=-2, keepdim=True, unbiased=False)
    w = generation._median_filter((w - torch.mean(w, dim=-2, keepdim=True)) / std, 7).mean(dim=0)
    text, time = generation._dynamic_time_warping(-w.double().numpy())
    return time[np.pad(np.diff(text), (1, 0), constant_values=1).astype(bool)] * 0.02


@pytest.mark.parametrize(("rows", "seed"), [(2, 0), (2, 9), (2, 76), (2, 186), (3, 3), (5, 4), (12, 5)])
def test_token_times_are_transformers(rows: int, seed: int) -> None:
    """Short outputs make matrices of exact ties (two rows normalise to +-1): the normalisation must round
    as torch's does (its std accumulates in float64) for the ties to fall the same way: seeds 9, 76 and 186
    moved the second token by 0.02-0.14 s when numpy's float32 std was used."""
    from s2s_deploy.runtime.words import token_times

    weights = np.random.default_rng(seed).dirichlet(np.ones(50), size=(4, rows)).astype(np.float32)
    assert np.array_equal(token_times(weights, 21, 0.02), their_token_times(weights, 21))
