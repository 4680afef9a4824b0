"""PyTorch vs ONNX Runtime on the same inputs: per-step log-probs and whole search results.

Token disagreement is a failure, never a warning: it is what users would see.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from s2s_deploy.export.checkpoint import build_model, load_checkpoint
from s2s_deploy.export.registry import get_plugin
from s2s_deploy.export.torch_backend import TorchBackend
from s2s_deploy.runtime.backend import Backend
from s2s_deploy.runtime.errors import CheckpointError
from s2s_deploy.runtime.manifest import Manifest, sha256_of
from s2s_deploy.runtime.search import SearchConfig, search
from s2s_deploy.runtime.translator import encode_batch
from s2s_deploy.tools.quantize import MIN_TOKEN_AGREEMENT

SEARCHABLE_TOP = 16
SEARCHABLE_FLOOR = -10.0


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
    """``atol`` is None for a quantised export: it is judged on token agreement alone."""

    atol: float | None
    step_max_abs_diff: float
    searches: tuple[SearchAgreement, ...]
    inputs: int
    min_token_agreement: float = 1.0

    @property
    def log_probs_ok(self) -> bool:
        return self.atol is None or self.step_max_abs_diff <= self.atol

    @property
    def passed(self) -> bool:
        return self.log_probs_ok and all(s.agreement >= self.min_token_agreement for s in self.searches)


def torch_backend_for(
    manifest: Manifest, checkpoint: str | Path | None = None, device: str = "cpu"
) -> TorchBackend:
    """Rebuild the PyTorch original of an export from the checkpoint it was exported from."""
    plugin = get_plugin(manifest.plugin)
    recorded = manifest.raw["checkpoint"]
    path = Path(checkpoint) if checkpoint else manifest.directory / recorded["file"]
    if checkpoint is None and not recorded.get("included", True):
        raise CheckpointError(f"{manifest.directory} was exported without its checkpoint: pass --checkpoint FILE "
                              f"(the one with sha256 {recorded['sha256'][:16]}...)")
    if checkpoint is None and path.is_file() and sha256_of(path) != recorded["sha256"]:
        raise CheckpointError(f"{path} is not the checkpoint this folder was exported from (sha256 differs)")
    loaded = load_checkpoint(path)
    model = build_model(loaded, plugin)
    if loaded.tgt_vocab != manifest.tgt_vocab or loaded.src_vocab != manifest.src_vocab:
        raise CheckpointError(f"{path} has different vocabularies from the export in {manifest.directory}")
    return TorchBackend(plugin, model, loaded.config, loaded.tgt_vocab, device=device)


def check_parity(
    manifest: Manifest, reference: Backend, candidate: Backend, sources: Sequence[str], *,
    beam_size: int = 4, max_len: int = 64, atol: float | None = None, batch_size: int = 16,
) -> ParityReport:
    # The gate's tolerance comes from the plugin or the user, never from the manifest under test.
    quantized = manifest.raw.get("quantization")
    if atol is None and not quantized:
        atol = get_plugin(manifest.plugin).parity_atol
    min_agreement = MIN_TOKEN_AGREEMENT[quantized["kind"]] if quantized else 1.0
    modes = [("greedy", SearchConfig(1, 1, max_len)), (f"beam{beam_size}", SearchConfig(beam_size, 1, max_len))]
    agreements = {name: [0, 0.0, []] for name, _ in modes}
    step_diff = 0.0
    for start in range(0, len(sources), batch_size):
        chunk = list(sources[start : start + batch_size])
        src, src_len = encode_batch(chunk, manifest.src_vocab, manifest.max_source_length)
        for name, config in modes:
            want, got = search(reference, src, src_len, config), search(candidate, src, src_len, config)
            tally = agreements[name]
            for text, w, g in zip(chunk, want, got, strict=True):
                if w[0].tokens == g[0].tokens:
                    tally[0] += 1
                    tally[1] = _worse(tally[1], abs(w[0].score - g[0].score))
                else:
                    decode = manifest.tgt_vocab.decode
                    tally[2].append((text, decode(w[0].tokens), decode(g[0].tokens)))
            if name == "greedy":
                forced = [h[0].tokens for h in want]
                step_diff = _worse(step_diff, forced_step_diff(reference, candidate, src, src_len, forced))
    searches = tuple(
        SearchAgreement(name, len(sources), tally[0], tally[1], tuple(tally[2]))
        for name, tally in agreements.items()
    )
    return ParityReport(atol, step_diff, searches, len(sources), min_agreement)


def _worse(a: float, b: float) -> float:
    """max() that keeps NaN: ``max(0.0, nan)`` is 0.0, which would let a NaN model pass."""
    return math.inf if math.isnan(a) or math.isnan(b) else max(a, b)


def forced_step_diff(
    reference: Backend, candidate: Backend, src: np.ndarray, src_len: np.ndarray,
    targets: Sequence[Sequence[int]],
) -> float:
    """Teacher-force the same tokens through both backends; max |Δ log p| over every step, where a
    search can act: each side's best ``SEARCHABLE_TOP`` tokens and every token at log p >=
    ``SEARCHABLE_FLOOR``. A log-prob near -35 differs by ~1e-4 between CPUs' kernels through float32
    rounding alone and no search ever picks it (docs/parity.md). A NaN on either side is an infinite diff."""
    batch = src.shape[0]
    steps = max(len(t) for t in targets) + 1
    forced = np.full((batch, steps), reference.eos_id, dtype=np.int64)
    forced[:, 0] = reference.decoder_start_id
    for row, tokens in enumerate(targets):
        forced[row, 1 : 1 + len(tokens)] = tokens
    reorder = np.arange(batch, dtype=np.int64)
    worst = 0.0
    with reference.start(src, src_len) as first, candidate.start(src, src_len) as second:
        for t in range(steps):
            a, b = first.step(forced[:, t], reorder), second.step(forced[:, t], reorder)
            worst = _worse(worst, searchable_diff(a, b))
    return worst


def searchable_diff(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| over the entries either side could rank: see ``forced_step_diff``."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    if not (np.isfinite(a) | np.isneginf(a)).all() or not (np.isfinite(b) | np.isneginf(b)).all():
        return float("inf")
    top = min(SEARCHABLE_TOP, a.shape[-1])
    mask = (a >= SEARCHABLE_FLOOR) | (b >= SEARCHABLE_FLOOR)
    for side in (a, b):
        np.put_along_axis(mask, np.argpartition(-side, top - 1, axis=-1)[..., :top], True, axis=-1)
    with np.errstate(invalid="ignore"):
        diff = np.abs(np.where(mask & (a != b), a - b, 0.0))
    diff[np.isnan(diff)] = np.inf  # -inf on one side only
    return float(diff.max()) if diff.size else 0.0
