"""Exact speculative greedy: tokens drafted from the source and the hypothesis, verified k at a time.

Plain greedy runs one decoder step per token, and at one sentence a step reads every weight
for one position. Here each sentence drafts up to ``speculative`` tokens by prompt lookup (the
hypothesis' last n tokens, n = 3, 2, 1, found earlier in the hypothesis or in the source, and
what followed them there) and feeds its last token and the drafts to the k-position decoder
step (``decoder_multi``) at once. Position j's best token is plain greedy's next token; the
drafts are accepted while they equal it, the first one that does not is replaced by it, and
the positions after it are rolled back inside the next call (``DecodeRun.steps_top``).

Exactness. The k-position products round differently from k single steps in the last bits
(export measures the largest log-prob difference, ``multi_step_max_abs_diff``; 7.6e-6 on the
bundled transformer), and so does the cache they leave. A token is taken only where its margin
over the runner-up exceeds ``2 * bound``, with ``bound = max(MIN_BOUND, SAFETY * measured)``:
a difference below ``bound`` on both sides cannot reorder them, so the token is plain greedy's.
Where a margin is that close (a near-tie), the sentence is decoded again by plain greedy from
the start, so its tokens stay plain greedy's in every case. Scores are the k-position step's
log-probs: within the bound of plain greedy's, not bit-identical (docs/decoding.md).

Each sentence is decoded alone (rows of one): its tokens and scores then do not depend on its
batchmates, and its acceptance is its own, not the batch's least. The search's loop over the
sentences is ``runtime/search.speculative_greedy``; this module holds its parts. Numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from s2s_deploy.format.vocab import Vocabulary
from s2s_deploy.runtime.backend import Backend
from s2s_deploy.runtime.decoding import SearchConfig, not_greedy
from s2s_deploy.runtime.options import options_on

MAX_NGRAM = 3
"""The longest hypothesis tail looked up; shorter tails are tried when it is not found."""
MIN_NGRAM = 1
"""The shortest tail looked up: below it, nothing is drafted (a one-position call)."""
SAFETY = 16.0
MIN_BOUND = 1e-4
"""The bound on a log-prob's drift from plain greedy's: ``SAFETY`` times what export measured,
and never below ``MIN_BOUND`` (a fp32 log-prob of a few units has a last bit near 5e-7)."""


def drift_bound(measured: float | None) -> float:
    """The largest log-prob difference from plain greedy the acceptance rule allows for."""
    return max(MIN_BOUND, SAFETY * (measured or 0.0))


def source_in_target(source: Vocabulary, target: Vocabulary) -> np.ndarray:
    """Each source id's target id where the target vocabulary holds the same token string, else
    -1; special tokens map to -1 (a draft never proposes a source's framing)."""
    index = {token: i for i, token in enumerate(target.tokens)}
    special = {i for i in source.special_ids().values() if i is not None}
    return np.array([-1 if i in special else index.get(token, -1) for i, token in enumerate(source.tokens)],
                    dtype=np.int64)


def draft(history: Sequence[int], source: Sequence[int], count: int) -> list[int]:
    """Up to ``count`` tokens that followed the hypothesis' last n tokens (n = ``MAX_NGRAM`` down to
    1) at their latest earlier occurrence in the hypothesis, else in the source; [] where none."""
    if count <= 0 or not history:
        return []
    for n in range(min(MAX_NGRAM, len(history)), MIN_NGRAM - 1, -1):
        tail = list(history[-n:])
        for seq, end in ((history, len(history) - n), (source, len(source) - n + 1)):
            for i in range(end - 1, -1, -1):
                if seq[i] == tail[0] and list(seq[i:i + n]) == tail:
                    follow = [int(t) for t in seq[i + n:i + n + count] if t >= 0]
                    if follow:
                        return follow
    return []


def refusal(config: SearchConfig) -> str | None:
    """Why ``speculative`` cannot apply with these options, in one line; None where it can."""
    problem = not_greedy(config.beam_size, config.sampling_topk)
    if problem is not None:
        return problem
    if config.min_len or options_on(config):
        return ("speculative decoding takes no option that edits log-probs (min_len, penalties, bans, prefixes, "
                "timestamps, vmap)")
    if config.decoder_prompt or config.prompt:
        return "speculative decoding does not feed a decoder prompt yet"
    return None


class Accepting:
    """What speculative greedy did: k-position calls, tokens drafted and accepted, tokens
    output, sentences redone by plain greedy after a near-tie."""

    def __init__(self) -> None:
        self.calls = 0
        self.drafted = 0
        self.accepted = 0
        self.tokens = 0
        self.redone = 0

    @property
    def rate(self) -> float:
        """Accepted drafts over drafted ones."""
        return self.accepted / self.drafted if self.drafted else 0.0


def decode_sentence(backend: Backend, src: np.ndarray, src_len: np.ndarray, source: list[int], limit: int,
                    most: int, margin: float, counts: Accepting) -> tuple[list[int], list[float], bool] | None:
    """One sentence: its tokens (EOS included when it ends so), their log-probs and whether it
    ended; None at a margin of at most ``margin`` (plain greedy must decide)."""
    eos = backend.eos_id
    history: list[int] = []
    lps: list[float] = []
    last, rollback = backend.decoder_start_id, 0
    with backend.start(src, src_len) as run:
        while True:
            drafts = draft(history, source, min(most, limit - len(history) - 1))
            feed = np.array([[last, *drafts]], dtype=np.int64)
            values, ids = run.steps_top(feed, rollback, 2)
            counts.calls += 1
            counts.drafted += len(drafts)
            accepted = 0
            for j in range(feed.shape[1]):
                if not values[0, j, 0] - values[0, j, 1] > margin:  # NaN too: not a decision
                    if np.isnan(values[0, j, 0]):
                        return [*history, int(ids[0, j, 0])], [*lps, float("nan")], False
                    return None
                token = int(ids[0, j, 0])
                history.append(token)
                lps.append(float(values[0, j, 0]))
                if token == eos or len(history) >= limit:
                    counts.accepted += accepted
                    counts.tokens += len(history)
                    return history, lps, token == eos
                if j < len(drafts) and drafts[j] == token:
                    accepted += 1
                    continue
                break
            counts.accepted += accepted
            rollback = feed.shape[1] - 1 - accepted
            last = history[-1]
