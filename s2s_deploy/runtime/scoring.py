"""Teacher-forced scoring and token streaming over the step decoder. Imports numpy only.

Scoring feeds a given target through the same step decoder the search uses, so the score of a
greedy output is the greedy score (CTranslate2's ``score_batch``). A batched forward graph would
need a third exported graph per plugin; docs/decoding.md says why it is not one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
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


def score(backend: Backend, src: np.ndarray, src_len: np.ndarray, targets: Sequence[Sequence[int]]) -> list[Scored]:
    """Every target (ids without EOS) teacher-forced after its source, one step per position;
    a finished row is fed EOS until the longest target ends, its values ignored."""
    batch, eos = len(targets), backend.eos_id
    if batch != src.shape[0]:
        raise ValueError(f"{batch} targets for {src.shape[0]} sources")
    lengths = np.array([len(t) for t in targets], dtype=np.int64)
    padded = np.full((batch, int(lengths.max()) + 1), eos, dtype=np.int64)
    for row, target in enumerate(targets):
        padded[row, : len(target)] = target
    rows = np.arange(batch)
    reorder = rows.astype(np.int64)
    tokens = np.full(batch, backend.decoder_start_id, dtype=np.int64)
    found = np.zeros(padded.shape, dtype=np.float64)
    with backend.start(src, src_len) as run:
        for t in range(padded.shape[1]):
            log_probs = run.step(tokens, reorder)
            found[:, t] = log_probs[rows, padded[:, t]]
            tokens = padded[:, t].copy()
    return [Scored(tuple(int(x) for x in targets[i]), tuple(found[i, : lengths[i] + 1].tolist()))
            for i in range(batch)]


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
        step_top = options.bind(prompted(run, backend.decoder_start_id, config))
        for _ in range(options.max_len):
            values, ids = step_top(tokens, reorder, 1)
            token = int(ids[0, 0])
            if token == backend.eos_id:
                return
            yield token, float(values[0, 0])
            tokens = ids[:, 0].astype(np.int64)
