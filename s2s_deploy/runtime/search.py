"""Greedy and beam search over any Backend. Imports numpy only.

``min_len`` forbids EOS before that many tokens (benchmarks force a fixed output length).

Scores follow the seeds: a hypothesis of L tokens (its EOS included when it has one) scores
``log P / L**alpha``. Beam search keeps K live beams per sentence; an EOS candidate ranked
within the top K of a step becomes a finished hypothesis. A sentence stops when the best
candidate of a step is EOS and it holds at least n-best finished hypotheses (OpenNMT's rule:
stopping at K finished would let short, poor EOS candidates end the search before the best
hypothesis finishes), or at ``max_len``, where its live beams are finished as they stand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from s2s_deploy.runtime.backend import Backend


@dataclass(frozen=True)
class Hypothesis:
    tokens: tuple[int, ...]
    token_log_probs: tuple[float, ...]
    score: float
    finished: bool

    @property
    def log_prob(self) -> float:
        return float(sum(self.token_log_probs))


@dataclass(frozen=True)
class SearchConfig:
    beam_size: int = 1
    n_best: int = 1
    max_len: int = 256
    alpha: float = 0.75
    min_len: int = 0

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ValueError("beam size must be at least 1")
        if not 1 <= self.n_best <= self.beam_size:
            raise ValueError("n-best must be between 1 and the beam size")
        if self.max_len < 1:
            raise ValueError("max_len must be at least 1")
        if not 0 <= self.min_len <= self.max_len:
            raise ValueError("min_len must be between 0 and max_len")


def normalised(log_prob: float | np.ndarray, length: int | np.ndarray, alpha: float) -> float | np.ndarray:
    return log_prob / np.power(length, alpha)


class SearchEngine(Protocol):
    """Anything that turns a padded batch into n-best lists: the step loop below over any
    Backend, or a fused generate.onnx (runtime/graph_engine.py)."""

    name: str

    def search(self, src: np.ndarray, src_len: np.ndarray, config: SearchConfig) -> list[list[Hypothesis]]: ...


class StepLoop:
    """The Python search loop over a step-wise Backend, as a SearchEngine."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.name = backend.name

    def search(self, src: np.ndarray, src_len: np.ndarray, config: SearchConfig) -> list[list[Hypothesis]]:
        return search(self.backend, src, src_len, config)


def search(backend: Backend, src: np.ndarray, src_len: np.ndarray, config: SearchConfig) -> list[list[Hypothesis]]:
    """n-best hypotheses per sentence, best first. Tokens exclude the start token and the EOS."""
    if config.beam_size == 1:
        return [[h] for h in greedy(backend, src, src_len, config)]
    return beam_search(backend, src, src_len, config)


def greedy(backend: Backend, src: np.ndarray, src_len: np.ndarray, config: SearchConfig) -> list[Hypothesis]:
    batch = src.shape[0]
    run = backend.start(src, src_len)
    reorder = np.arange(batch, dtype=np.int64)
    tokens = np.full(batch, backend.decoder_start_id, dtype=np.int64)
    picked = np.zeros((batch, config.max_len), dtype=np.int64)
    picked_lp = np.zeros((batch, config.max_len), dtype=np.float64)
    length = np.full(batch, config.max_len, dtype=np.int64)
    done = np.zeros(batch, dtype=bool)
    for t in range(config.max_len):
        log_probs = run.step(tokens, reorder)
        if t < config.min_len:
            log_probs[:, backend.eos_id] = -np.inf
        tokens = log_probs.argmax(axis=1).astype(np.int64)
        picked[:, t] = tokens
        picked_lp[:, t] = log_probs[reorder, tokens]
        newly = ~done & (tokens == backend.eos_id)
        length[newly] = t + 1
        done |= newly
        if done.all():
            break
    results = []
    for i in range(batch):
        n = int(length[i])
        finished = bool(done[i])
        lps = tuple(float(x) for x in picked_lp[i, :n])
        body = tuple(int(x) for x in picked[i, : n - 1 if finished else n])
        results.append(Hypothesis(body, lps, float(normalised(sum(lps), n, config.alpha)), finished))
    return results


def beam_search(
    backend: Backend, src: np.ndarray, src_len: np.ndarray, config: SearchConfig
) -> list[list[Hypothesis]]:
    batch, k, eos = src.shape[0], config.beam_size, backend.eos_id
    if k >= backend.vocab_size:
        raise ValueError(f"beam size {k} must be smaller than the vocabulary ({backend.vocab_size})")
    run = backend.start(src, src_len, expand=k)
    rows = batch * k
    row_base = (np.arange(batch) * k)[:, None]
    scores = np.full((batch, k), -np.inf)
    scores[:, 0] = 0.0  # all K rows start identical: only the first may extend at step 0
    history = np.zeros((rows, 0), dtype=np.int64)
    history_lp = np.zeros((rows, 0), dtype=np.float64)
    tokens = np.full(rows, backend.decoder_start_id, dtype=np.int64)
    reorder = np.arange(rows, dtype=np.int64)
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    finished_count = np.zeros(batch, dtype=np.int64)
    active = np.ones(batch, dtype=bool)
    width = min(2 * k, backend.vocab_size)
    for t in range(config.max_len):
        log_probs = run.step(tokens, reorder)
        if t < config.min_len:
            log_probs[:, eos] = -np.inf
        # The best 2K of K*V candidates lie among each row's own best 2K: rank only those.
        row_tokens = np.argpartition(-log_probs, width - 1, axis=1)[:, :width]
        row_scores = np.take_along_axis(log_probs, row_tokens, axis=1).astype(np.float64)
        candidates = (scores.reshape(rows, 1) + row_scores).reshape(batch, k * width)
        flat = ((np.arange(rows) % k)[:, None] * backend.vocab_size + row_tokens).reshape(batch, k * width)
        top = _top_sorted(candidates, flat, 2 * k)
        top_scores = np.take_along_axis(candidates, top, axis=1)
        top_flat = np.take_along_axis(flat, top, axis=1)
        origin, token_of = top_flat // backend.vocab_size, top_flat % backend.vocab_size
        is_eos = (token_of == eos) & np.isfinite(top_scores)
        length = t + 1
        for i, j in zip(*np.nonzero(is_eos[:, :k] & active[:, None]), strict=True):
            row = row_base[i, 0] + origin[i, j]
            lps = (*history_lp[row].tolist(), float(log_probs[row, eos]))
            score = float(normalised(top_scores[i, j], length, config.alpha))
            finished[i].append(Hypothesis(tuple(history[row].tolist()), lps, score, True))
            finished_count[i] += 1
        keep = np.argsort(is_eos, axis=1, kind="stable")[:, :k]  # first K non-EOS candidates, in rank order
        scores = np.take_along_axis(top_scores, keep, axis=1)
        reorder = (row_base + np.take_along_axis(origin, keep, axis=1)).reshape(rows)
        tokens = np.take_along_axis(token_of, keep, axis=1).reshape(rows).astype(np.int64)
        history = np.concatenate([history[reorder], tokens[:, None]], axis=1)
        history_lp = np.concatenate([history_lp[reorder], log_probs[reorder, tokens][:, None]], axis=1)
        active &= ~(is_eos[:, 0] & (finished_count >= config.n_best))
        if not active.any():
            break
    for i in np.nonzero(active)[0]:
        for j in range(k):
            row = row_base[i, 0] + j
            if np.isfinite(scores[i, j]):
                score = float(normalised(scores[i, j], history.shape[1], config.alpha))
                finished[i].append(
                    Hypothesis(tuple(history[row].tolist()), tuple(history_lp[row].tolist()), score, False)
                )
    return [sorted(f, key=lambda h: -h.score)[: config.n_best] for f in finished]


def _top_sorted(values: np.ndarray, tie_keys: np.ndarray, count: int) -> np.ndarray:
    """Positions of the ``count`` largest values per row, best first; equal values are ordered
    by ``tie_keys`` (the flat beam*V + token index), so ties go to the lower beam, then token."""
    count = min(count, values.shape[1])
    part = np.argpartition(-values, count - 1, axis=1)[:, :count]
    part_values = np.take_along_axis(values, part, axis=1)
    part_keys = np.take_along_axis(tie_keys, part, axis=1)
    order = np.lexsort((part_keys, -part_values), axis=1)
    return np.take_along_axis(part, order, axis=1)
