"""Teacher-forced scoring and token streaming over the step decoder. Imports numpy only.

Scoring feeds a given target through the same step decoder the search uses, so the score of a
greedy output is the greedy score (CTranslate2's ``score_batch``). A batched forward graph would
need a third exported graph per plugin; docs/decoding.md says why it is not one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass

import numpy as np

from s2s_deploy.runtime.backend import Backend
from s2s_deploy.runtime.decoding import SearchConfig
from s2s_deploy.runtime.options import StepOptions
from s2s_deploy.runtime.search import prompted


@dataclass(frozen=True)
class Scored:
    """Log-probs of each target token and of the closing EOS (``len(tokens) + 1`` values)."""

    tokens: tuple[int, ...]
    token_log_probs: tuple[float, ...]

    @property
    def log_prob(self) -> float:
        return float(sum(self.token_log_probs))


def forced_tokens(start: int, eos: int, targets: Sequence[Sequence[int]]) -> np.ndarray:
    """``(batch, longest + 1)``: the start token, each target, then EOS (and EOS padding): what
    each teacher-forced step is fed."""
    forced = np.full((len(targets), max(len(t) for t in targets) + 1), eos, dtype=np.int64)
    forced[:, 0] = start
    for row, tokens in enumerate(targets):
        forced[row, 1 : 1 + len(tokens)] = tokens
    return forced


@dataclass(frozen=True)
class ForcedStep:
    """One teacher-forced position: ``gold`` the token each row is scored on, ``live`` the rows
    whose target (EOS included) reaches this far, ``log_probs`` each backend's (rows, V), valid
    until the next step."""

    position: int
    gold: np.ndarray
    live: np.ndarray
    log_probs: tuple[np.ndarray, ...]


def teacher_forced(backends: Sequence[Backend], src: np.ndarray, src_len: np.ndarray,
                   targets: Sequence[Sequence[int]]) -> Iterator[ForcedStep]:
    """Every target (ids without EOS) fed after its source through each backend in step, one
    position at a time up to the longest target's EOS; a finished row is fed EOS. The one
    teacher-forced loop: scoring and the export's parity and forward/step checks all use it."""
    if len(targets) != src.shape[0]:
        raise ValueError(f"{len(targets)} targets for {src.shape[0]} sources")
    first = backends[0]
    forced = forced_tokens(first.decoder_start_id, first.eos_id, targets)
    gold = np.concatenate([forced[:, 1:], np.full((len(targets), 1), first.eos_id, dtype=np.int64)], axis=1)
    lengths = np.array([len(t) for t in targets], dtype=np.int64)
    reorder = np.arange(len(targets), dtype=np.int64)
    with ExitStack() as stack:
        runs = [stack.enter_context(backend.start(src, src_len)) for backend in backends]
        for t in range(forced.shape[1]):
            fed = forced[:, t].copy()
            yield ForcedStep(t, gold[:, t], t <= lengths, tuple(run.step(fed, reorder) for run in runs))


def score(backend: Backend, src: np.ndarray, src_len: np.ndarray, targets: Sequence[Sequence[int]]) -> list[Scored]:
    """Every target (ids without EOS) teacher-forced after its source; a finished row's later
    values are ignored."""
    rows = np.arange(len(targets))
    found = [[] for _ in targets]
    for step in teacher_forced([backend], src, src_len, targets):
        picked = step.log_probs[0][rows, step.gold]
        for row in rows[step.live]:
            found[row].append(float(picked[row]))
    return [Scored(tuple(int(x) for x in target), tuple(values)) for target, values in zip(targets, found, strict=True)]


def stream_tokens(backend: Backend, src: np.ndarray, src_len: np.ndarray,
                  config: SearchConfig) -> Iterator[tuple[int, float]]:
    """One sentence, greedy or sampled: each (token, log-prob) as soon as its step ends, EOS
    excluded. Every option applies; the full log-probs are fetched even when none is on (one
    interactive sentence, where the in-graph TopK saves nothing worth a second code path)."""
    if src.shape[0] != 1:
        raise ValueError("streaming decodes one sentence at a time")
    if config.beam_size != 1:
        raise ValueError("streaming needs beam_size 1 (greedy or sampling), as CTranslate2's generate_tokens")
    options = StepOptions(config, src, src_len, backend.eos_id, backend.vocab_size, backend.unk_id)
    tokens = np.full(1, backend.decoder_start_id, dtype=np.int64)
    reorder = np.zeros(1, dtype=np.int64)
    with backend.start(src, src_len) as run:
        step_top = options.bind(prompted(run, backend, config))
        for _ in range(options.max_len):
            values, ids = step_top(tokens, reorder, 1)
            token = int(ids[0, 0])
            if token == backend.eos_id:
                return
            yield token, float(values[0, 0])
            tokens = ids[:, 0].astype(np.int64)
