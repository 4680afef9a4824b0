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

Options and prompts. Position j of a pass starting at step t gets plain greedy's log-prob edits
of step t + j after the hypothesis and the first j drafts (``StepOptions.positions_top``, over
``StepOptions.edit``, the one function both searches edit with); ``min_len`` alone masks EOS in the
in-graph top 3. A decoder prompt, a prompt's context and the start token (``Feeding.prefill``, what
``PromptedRun`` feeds plain greedy) go first, in passes of at most K + 1 positions. ``refusal`` names
what the drift bound cannot hold.

Each sentence is decoded alone (rows of one): its tokens and scores then do not depend on its
batchmates, and its acceptance is its own, not the batch's least. The search's loop over the
sentences is ``runtime/search.speculative_greedy``; this module holds its parts. Numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from s2s_deploy.format.decoding import OPEN_SLOT
from s2s_deploy.format.vocab import Vocabulary
from s2s_deploy.runtime.backend import Backend, DecodeRun
from s2s_deploy.runtime.decoding import SearchConfig, not_greedy, window_options_on
from s2s_deploy.runtime.options import StepOptions, top_of

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
    """Why ``speculative`` cannot apply with these options, in one line; None where it can. Every
    option that edits a step's log-probs from its step index and its hypothesis is applied per
    position (``StepOptions.edit``); refused are those whose effect the drift bound cannot hold."""
    problem = not_greedy(config.beam_size, config.sampling_topk)
    if problem is not None:
        return problem
    if config.timestamps:
        return ("speculative decoding takes no timestamps: their rule compares the timestamps' summed probability "
                "with the best text token's, a decision the acceptance margin does not cover")
    if window_options_on(config):
        return ("speculative decoding takes no temperature fallback, threshold or carried text: they judge a "
                "window by its scores, which speculation gives within the drift bound, not to the bit")
    if OPEN_SLOT in config.decoder_prompt:
        return "speculative decoding feeds a chosen decoder prompt: choose its language first (search() does)"
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


@dataclass(frozen=True)
class Feeding:
    """What one sentence is fed and edited with, besides its drafts: ``prefill``, the tokens before
    the first generated one (a prompt's context, the start token, a decoder prompt: what a
    ``PromptedRun`` feeds), its last one fed with the first pass that decides a token; the index in
    it whose output gives ``no_speech``'s probability (-1: none); ``min_len`` where no ``edits``
    apply it; ``edits``, plain greedy's log-prob options (``StepOptions`` for this sentence alone),
    None where none is on."""

    prefill: tuple[int, ...]
    start: int
    """The decoder start token (what the search feeds its first step, before a prompt run's feeding)."""
    no_speech_at: int = -1
    no_speech: int = -1
    min_len: int = 0
    edits: StepOptions | None = None


@dataclass(frozen=True)
class Decoded:
    """One sentence's tokens (EOS included where it ended so), their log-probs, whether it ended,
    and the no-speech probability where one was read."""

    tokens: list[int]
    log_probs: list[float]
    finished: bool
    no_speech_prob: float | None


def _min_len_applied(values: np.ndarray, ids: np.ndarray, step: int, min_len: int,
                     eos: int) -> tuple[np.ndarray, np.ndarray]:
    """Each position's two best of the three given, EOS dropped where its step (``step`` + its
    index) is below ``min_len``: what greedy's ``min_len`` does, taking the runner-up where EOS
    ranks first."""
    banned = (ids == eos) & (step + np.arange(len(ids)) < min_len)[:, None]
    order = np.argsort(banned, axis=1, kind="stable")[:, :2]
    return np.take_along_axis(values, order, axis=1), np.take_along_axis(ids, order, axis=1)


def _probability(log_probs: np.ndarray, token: int) -> float:
    """The model's own probability of ``token`` (no option applied), as ``PromptedRun`` reads no-speech."""
    return float(np.exp(np.float64(log_probs[token])))


def _verified(run: DecodeRun, feed: list[int], rollback: int, lead: int, history: list[int], drafts: list[int],
              feeding: Feeding, eos: int, read_no_speech: int) -> tuple[np.ndarray, np.ndarray, float | None]:
    """One k-position pass: the two best of each position after the first ``lead`` (a prefill's,
    whose outputs are dropped), edited as plain greedy's step there is; and the no-speech
    probability at position ``read_no_speech`` (-1: none read)."""
    tokens = np.array([feed], dtype=np.int64)
    edits, step = feeding.edits, len(history)
    if edits is not None and not edits.edits_between(step, step + len(feed) - lead - 1):
        edits = None  # no option edits these steps (a forced BOS or EOS elsewhere): ranked in the graph
    masked = edits is None and step < feeding.min_len  # edits forbid EOS below min_len themselves
    k = 3 if masked else 2
    no_speech = None
    if edits is None and read_no_speech < 0:  # the in-graph TopK: no vocabulary-wide copy
        values, ids = run.steps_top(tokens, rollback, k)
        values, ids = values[0, lead:], ids[0, lead:]
    else:
        log_probs = run.steps_log_probs(tokens, rollback)[0]
        if read_no_speech >= 0:
            no_speech = _probability(log_probs[read_no_speech], feeding.no_speech)
        if edits is not None:
            values, ids = edits.positions_top(log_probs[lead:], history, drafts, feeding.start, 2)
        else:
            values, ids = top_of(np.asarray(log_probs[lead:], dtype=np.float32), k)
    if masked:
        values, ids = _min_len_applied(values, ids, step, feeding.min_len, eos)
    return values, ids, no_speech


def decode_sentence(backend: Backend, src: np.ndarray, src_len: np.ndarray, source: list[int], limit: int,
                    most: int, margin: float, counts: Accepting, feeding: Feeding) -> Decoded | None:
    """One sentence, None at a margin of at most ``margin`` (plain greedy must decide). Its
    prefill goes first, in passes of at most ``most + 1`` positions (the widths drafting uses),
    the last of them with the first pass that decides a token."""
    eos, width = backend.eos_id, most + 1
    history: list[int] = []
    lps: list[float] = []
    prefill = list(feeding.prefill)
    cut = (len(prefill) - 1) // width * width  # the last pass's part of the prefill starts here
    no_speech: float | None = None
    with backend.start(src, src_len) as run:
        for begin in range(0, cut, width):  # outputs dropped, but for the no-speech probability
            chunk, at = np.array([prefill[begin:begin + width]], dtype=np.int64), feeding.no_speech_at - begin
            if 0 <= at < width:
                no_speech = _probability(run.steps_log_probs(chunk, 0)[0, at], feeding.no_speech)
            else:
                run.steps_top(chunk, 0, 1)
            counts.calls += 1
        lead, rollback = prefill[cut:-1], 0
        last = prefill[-1]
        while True:
            drafts = draft(history, source, min(most, limit - len(history) - 1))
            feed = [*lead, last, *drafts]
            at = feeding.no_speech_at - cut if 0 <= feeding.no_speech_at - cut < len(lead) else -1
            values, ids, read = _verified(run, feed, rollback, len(lead), history, drafts, feeding, eos, at)
            no_speech = read if read is not None else no_speech
            lead = []
            counts.calls += 1
            counts.drafted += len(drafts)
            accepted = 0
            for j in range(len(drafts) + 1):
                if not values[j, 0] - values[j, 1] > margin:  # NaN too: not a decision
                    if np.isnan(values[j, 0]):
                        return Decoded([*history, int(ids[j, 0])], [*lps, float("nan")], False, no_speech)
                    return None
                token = int(ids[j, 0])
                history.append(token)
                lps.append(float(values[j, 0]))
                if token == eos or len(history) >= limit:
                    counts.accepted += accepted
                    counts.tokens += len(history)
                    return Decoded(history, lps, token == eos, no_speech)
                if j < len(drafts) and drafts[j] == token:
                    accepted += 1
                    continue
                break
            counts.accepted += accepted
            rollback = len(drafts) - accepted  # the rejected drafts' positions, dropped inside the next pass
            last = history[-1]
