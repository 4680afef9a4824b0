"""How two per-step log-prob tables are compared: only where a search can act.

A diff over the whole vocabulary is ruled by log-probs near -35 that no search can pick, and
their fp32 rounding changes with the CPU's kernels and thread count (1.18e-4 on one x86-64
machine, 6.7e-6 on another). A search reads each row's best few candidates, so each side's top
``top`` and every log-prob at or above ``floor`` (on either side) are compared, each within
``atol + rtol * |log p|``. docs/parity.md has the margins behind the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-5


@dataclass(frozen=True)
class StepDiff:
    """``max_abs_diff`` over the compared entries; ``worst`` = the largest diff divided by its
    allowance (pass: at most 1; NaN or an infinite diff is inf)."""

    max_abs_diff: float
    worst: float

    def merge(self, other: StepDiff) -> StepDiff:
        return StepDiff(max(self.max_abs_diff, other.max_abs_diff), max(self.worst, other.worst))


NO_DIFF = StepDiff(0.0, 0.0)


@dataclass(frozen=True)
class StepTolerance:
    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    top: int = 16
    floor: float = -10.0

    def __post_init__(self) -> None:
        if not (self.atol >= 0 and self.rtol >= 0 and self.atol + self.rtol > 0):
            raise ValueError("atol and rtol must be non-negative, and not both zero")

    def compare(self, reference: np.ndarray, candidate: np.ndarray) -> StepDiff:
        """``reference`` and ``candidate``: (rows, vocab) log-probs of the same step."""
        ref = np.asarray(reference, dtype=np.float64).reshape(-1, reference.shape[-1])
        got = np.asarray(candidate, dtype=np.float64).reshape(ref.shape)
        if ref.size == 0:
            return NO_DIFF
        compared = (ref >= self.floor) | (got >= self.floor)
        top = min(self.top, ref.shape[1])
        rows = np.arange(ref.shape[0])[:, None]
        for side in (ref, got):
            compared[rows, np.argpartition(-np.nan_to_num(side, nan=np.inf), top - 1, axis=1)[:, :top]] = True
        with np.errstate(invalid="ignore"):
            diff = np.abs(ref - got)[compared]
            diff = np.where(ref[compared] == got[compared], 0.0, diff)  # -inf == -inf is no diff
        if not np.all(np.isfinite(diff)):
            return StepDiff(float("inf"), float("inf"))
        allowed = self.atol + self.rtol * np.abs(ref[compared])
        return StepDiff(float(diff.max(initial=0.0)), float((diff / allowed).max(initial=0.0)))


def plugin_tolerance(plugin: Any, atol: float | None = None, rtol: float | None = None) -> StepTolerance:
    """From the plugin's ``parity_atol``/``parity_rtol`` or the user's values, never from the
    manifest under test (a folder must not set the bar it is judged by)."""
    return StepTolerance(plugin.parity_atol if atol is None else atol,
                         getattr(plugin, "parity_rtol", DEFAULT_RTOL) if rtol is None else rtol)
