"""A parity run's outcome, one object: whether it passed, as JSON (``parity --json``) and as the
lines ``parity`` prints. The JSON is the dataclasses' own fields, so a new field cannot be forgotten."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from s2s_deploy.verify.parity import ParityReport, SearchAgreement
from s2s_deploy.verify.timestamps import TimedAgreement


class Section(Protocol):
    """A further check a parity run makes (the tokenizer against transformers'), reported beside the rest."""

    @property
    def passed(self) -> bool: ...

    def lines(self) -> list[str]: ...

    def to_json(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Verdict:
    report: ParityReport
    timed: tuple[TimedAgreement, ...]
    reference: str
    """What the tokens were compared with, in messages: ``pytorch`` or ``generate``."""
    tokenizer: Section | None = None

    @property
    def passed(self) -> bool:
        floor = self.report.min_token_agreement
        return (self.report.passed and all(t.agreement >= floor for t in self.timed)
                and (self.tokenizer is None or self.tokenizer.passed))

    def to_json(self) -> dict[str, Any]:
        r = self.report
        return {
            "passed": self.passed, "inputs": r.inputs, "atol": r.atol,
            "rtol": None if r.tolerance is None else r.tolerance.rtol,
            "min_token_agreement": r.min_token_agreement,
            "step_max_abs_diff": r.step_max_abs_diff, "step_worst_ratio": r.step.worst,
            "forward_step_max_abs_diff": None if r.forward_step is None else r.forward_step.max_abs_diff,
            "forward_step_ok": r.forward_ok,
            "batch_agreement": None if r.batch is None else {
                "identical": r.batch.identical, "total": r.batch.total, "rows": r.batch.mode},
            "searches": [_search_json(s) for s in r.searches],
            "timestamps": [_timed_json(t) for t in self.timed],
            "tokenizer": None if self.tokenizer is None else self.tokenizer.to_json(),
        }

    def lines(self) -> Iterator[str]:
        r = self.report
        if r.atol is None:
            yield (f"per-step log-prob max |diff| {r.step_max_abs_diff:.2e} (quantised: informative; "
                   f"tokens must agree on >= {r.min_token_agreement:.0%} of inputs)")
        else:
            yield (f"per-step log-prob max |diff| {r.step_max_abs_diff:.2e} where a search can act "
                   f"(atol {r.atol:g} + rtol {r.tolerance.rtol:g}*|log p|) {_ok(r.log_probs_ok)}")
        if r.forward_step is not None:
            tol = r.forward_tolerance
            yield (f"PyTorch decode_step vs teacher-forced forward: max |diff| {r.forward_step.max_abs_diff:.2e} "
                   f"(atol {tol.atol:g} + rtol {tol.rtol:g}*|log p|) {_ok(r.forward_ok)}")
        if r.batch is not None:
            b = r.batch
            yield f"ONNX Runtime {b.mode} vs one at a time: tokens identical {b.identical}/{b.total} " + _ok(
                b.identical == b.total)
        for s in r.searches:
            yield (f"{s.mode:<8} tokens identical {s.identical}/{s.total} ({s.agreement:.1%}), "
                   f"score max |diff| {s.max_score_diff:.2e} {_ok(s.agreement >= r.min_token_agreement)}")
            yield from self._mismatches(s.mismatches)
        for t in self.timed:
            yield (f"{t.mode:<8} tokens identical {t.tokens_identical}/{t.total}, segments identical "
                   f"{t.segments_identical}/{t.total} ({t.segments} segments; {t.long} inputs longer than the "
                   f"window) {_ok(t.agreement >= r.min_token_agreement)}")
            yield from self._mismatches(t.mismatches)
        if self.tokenizer is not None:
            yield from self.tokenizer.lines()
        yield "parity: PASS" if self.passed else "parity: FAIL"

    def _mismatches(self, mismatches: tuple[tuple[str, str, str], ...], shown: int = 5) -> Iterator[str]:
        for source, want, got in mismatches[:shown]:
            yield f"  {source!r}: {self.reference} {want!r} onnx {got!r}"


def _ok(good: bool) -> str:
    return "ok" if good else "FAIL"


def _pairs(mismatches: tuple[tuple[str, str, str], ...]) -> list[dict[str, str]]:
    """Mismatch rows under the keys every reader of ``--json`` knows: the reference is ``pytorch``."""
    return [dict(zip(("source", "pytorch", "onnx"), m, strict=True)) for m in mismatches]


def _search_json(s: SearchAgreement) -> dict[str, Any]:
    return dataclasses.asdict(s) | {"agreement": s.agreement, "mismatches": _pairs(s.mismatches)}


def _timed_json(t: TimedAgreement) -> dict[str, Any]:
    return {"mode": t.mode, "inputs": t.total, "longer_than_window": t.long, "segments": t.segments,
            "tokens_identical": t.tokens_identical, "segments_identical": t.segments_identical,
            "identical": t.identical, "agreement": t.agreement, "mismatches": _pairs(t.mismatches)}
