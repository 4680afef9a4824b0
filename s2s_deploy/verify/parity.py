"""PyTorch vs ONNX Runtime on the same inputs: per-step log-probs and whole search results.

Token disagreement is a failure, never a warning: it is what users would see.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from s2s_deploy.architecture.registry import exported_plugin
from s2s_deploy.format.manifest import Manifest
from s2s_deploy.modeling.contract import Seq2SeqModel
from s2s_deploy.runtime.backend import Backend
from s2s_deploy.runtime.decoding import SearchConfig
from s2s_deploy.runtime.features import pad_features
from s2s_deploy.runtime.scoring import teacher_forced
from s2s_deploy.runtime.search import SearchEngine, StepLoop, search
from s2s_deploy.runtime.translator import encode_batch
from s2s_deploy.transforms.quantize import MIN_TOKEN_AGREEMENT
from s2s_deploy.verify.checks import forward_step_comparison
from s2s_deploy.verify.plan import ParityPlan, plan_parity
from s2s_deploy.verify.tolerance import NO_DIFF, StepDiff, StepTolerance, plugin_tolerance


@dataclass(frozen=True)
class SearchAgreement:
    mode: str
    total: int
    identical: int
    max_score_diff: float
    mismatches: tuple[tuple[str, str, str], ...] = field(default=())

    @property
    def agreement(self) -> float:
        return self.identical / self.total


@dataclass(frozen=True)
class ParityReport:
    """``tolerance`` is None for a quantised export: it is judged on token agreement alone.
    ``forward_step`` compares the PyTorch model's teacher-forced ``forward`` with its own
    step-by-step ``decode_step`` (a cached step that forgets a layer fails here, not in users' hands)."""

    tolerance: StepTolerance | None
    step: StepDiff
    searches: tuple[SearchAgreement, ...]
    inputs: int
    min_token_agreement: float = 1.0
    forward_step: StepDiff | None = None
    forward_tolerance: StepTolerance | None = None
    batch: SearchAgreement | None = None
    batch_must_agree: bool = True

    @property
    def atol(self) -> float | None:
        return None if self.tolerance is None else self.tolerance.atol

    @property
    def step_max_abs_diff(self) -> float:
        return self.step.max_abs_diff

    @property
    def log_probs_ok(self) -> bool:
        return self.tolerance is None or self.step.worst <= 1.0

    @property
    def forward_ok(self) -> bool:
        return self.forward_step is None or self.forward_step.worst <= 1.0

    @property
    def passed(self) -> bool:
        batch_ok = self.batch is None or not self.batch_must_agree or self.batch.identical == self.batch.total
        return (self.log_probs_ok and self.forward_ok and batch_ok
                and all(s.agreement >= self.min_token_agreement for s in self.searches))


Encode = Callable[[Sequence[str]], tuple[np.ndarray, np.ndarray]]
"""Parity inputs (texts, or labels of audio clips) → the encoder's padded ``src`` and ``src_len``."""


def text_encoder(manifest: Manifest) -> Encode:
    return lambda texts: encode_batch(list(texts), manifest.src_vocab, manifest.max_source_length)


def feature_encoder(manifest: Manifest, inputs: dict[str, Any]) -> Encode:
    """Inputs by label (audio at the front end's rate, or images), through the export's own front end,
    padded along the frames."""
    from s2s_deploy.frontends.source import featurise, frontend_for

    source = manifest.encoder_input
    frontend = frontend_for(source)
    featurised = {label: featurise(source, item, label, frontend=frontend) for label, item in inputs.items()}
    return lambda labels: pad_features([featurised[label] for label in labels], source)


def check_parity(
    manifest: Manifest, reference: Backend, candidate: Backend, sources: Sequence[str], *,
    beam_size: int = 4, max_len: int = 64, atol: float | None = None, rtol: float | None = None,
    batch_size: int = 16, reference_search: SearchEngine | None = None, encode: Encode | None = None,
    plan: ParityPlan | None = None,
) -> ParityReport:
    """Tokens of ``reference_search`` (default: our search over ``reference``) against our search
    over ``candidate``, greedy and beam, and each step's log-probs of ``reference`` against
    ``candidate``'s. With a ``reference_search`` of its own (``generate``), both sides decode at the
    export's own settings (the manifest's ``search`` block), but the beam size and ``max_len``, and
    untimed (verify/timestamps.py checks timestamps); without one, plain searches from the
    export's decoder prompt. ``encode``: how ``sources`` become the encoder's input (default: texts
    through the source vocabulary). ``plan``: the searches to make (default: planned from ``beam_size``
    and ``max_len``)."""
    plan = plan or plan_parity(manifest, beam_size=beam_size, max_len=max_len,
                               own_settings=reference_search is not None)
    plugin = exported_plugin(manifest.plugin, manifest.plugin_origin)
    quantised = manifest.quantization is not None
    tolerance = None if quantised and atol is None and rtol is None else plugin_tolerance(plugin, atol, rtol)
    forward_tolerance = plugin_tolerance(plugin, atol, rtol)
    encode = encode or text_encoder(manifest)
    reference_search = reference_search or StepLoop(reference)
    modes = plan.modes
    agreements = {name: [0, 0.0, []] for name, _ in modes}
    step_diff, forward_diff = NO_DIFF, NO_DIFF
    model = getattr(reference, "model", None)  # a PyTorch reference: check its step against its forward
    for start in range(0, len(sources), batch_size):
        chunk = list(sources[start : start + batch_size])
        src, src_len = encode(chunk)
        for name, config in modes:
            want, got = reference_search.search(src, src_len, config), search(candidate, src, src_len, config)
            tally = agreements[name]
            for text, w, g in zip(chunk, want, got, strict=True):
                if w[0].tokens == g[0].tokens:
                    tally[0] += 1
                    if np.isfinite(w[0].score):  # generate reports no greedy score
                        tally[1] = max(tally[1], abs(w[0].score - g[0].score))
                else:
                    decode = manifest.tgt_vocab.decode
                    tally[2].append((text, decode(w[0].tokens), decode(g[0].tokens)))
            if name == "greedy":  # teacher-forced after the decoder prompt each sentence was fed (its language)
                forced = [(*h[0].prompt, *h[0].tokens) for h in want]
                step_diff = step_diff.merge(
                    forced_step_comparison(reference, candidate, src, src_len, forced, tolerance or forward_tolerance))
                if isinstance(model, Seq2SeqModel):
                    forward_diff = forward_diff.merge(
                        forward_step_comparison(model, reference, src, src_len, forced, forward_tolerance))
    searches = tuple(
        SearchAgreement(name, len(sources), tally[0], tally[1], tuple(tally[2]))
        for name, tally in agreements.items()
    )
    per_tensor = quantised and manifest.quantization.per_tensor  # batch-dependent by choice
    # the token agreement a quantised copy must keep comes from its kind, not from the manifest under test
    min_agreement = MIN_TOKEN_AGREEMENT[manifest.quantization.kind] if quantised else 1.0
    return ParityReport(tolerance, step_diff, searches, len(sources), min_agreement,
                        forward_diff if isinstance(model, Seq2SeqModel) else None, forward_tolerance,
                        batch_agreement(manifest, candidate, sources, plan.batch, encode), not per_tensor)


BATCH_ROWS = 32


def batch_agreement(manifest: Manifest, backend: Backend, sources: Sequence[str], config: SearchConfig,
                    encode: Encode | None = None) -> SearchAgreement:
    """Greedy tokens of ``backend`` in batches of 32 against one sentence at a time: a
    sentence's translation must not depend on its batchmates."""
    encode = encode or text_encoder(manifest)
    identical, mismatches = 0, []
    for start in range(0, len(sources), BATCH_ROWS):
        chunk = list(sources[start : start + BATCH_ROWS])
        together = search(backend, *encode(chunk), config)
        for text, hyps in zip(chunk, together, strict=True):
            alone = search(backend, *encode([text]), config)
            if alone[0][0].tokens == hyps[0].tokens:
                identical += 1
            else:
                decode = manifest.tgt_vocab.decode
                mismatches.append((text, decode(alone[0][0].tokens), decode(hyps[0].tokens)))
    return SearchAgreement(f"batch {BATCH_ROWS}", len(sources), identical, 0.0, tuple(mismatches))


def forced_step_diff(
    reference: Backend, candidate: Backend, src: np.ndarray, src_len: np.ndarray,
    targets: Sequence[Sequence[int]],
) -> float:
    """Max |Δ log p| where a search can act, teacher-forcing the same tokens through both."""
    return forced_step_comparison(reference, candidate, src, src_len, targets, StepTolerance()).max_abs_diff


def forced_step_comparison(
    reference: Backend, candidate: Backend, src: np.ndarray, src_len: np.ndarray,
    targets: Sequence[Sequence[int]], tolerance: StepTolerance,
) -> StepDiff:
    """Teacher-force the same tokens through both backends; compare every step's log-probs
    where a search can act (``StepTolerance``)."""
    worst = NO_DIFF
    for step in teacher_forced([reference, candidate], src, src_len, targets):
        worst = worst.merge(tolerance.compare(*step.log_probs))
    return worst
