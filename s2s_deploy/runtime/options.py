"""Every option that changes a step's log-probs or picks its token, applied in one place.

When all options are off the search never builds a ``StepOptions`` and keeps its in-graph TopK
path untouched. When one is on, a step fetches the full ``log_probs`` (rows, V), and
``StepOptions.step_top`` applies the options, then ranks (or samples) in numpy, returning what
``DecodeRun.step_top`` returns: each row's ``k`` best values and ids, ties to the lower id.
Semantics follow CTranslate2 and Hugging Face; docs/decoding.md says where they differ.
Imports numpy only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from s2s_deploy.runtime.backend import DecodeRun
from s2s_deploy.runtime.decoding import prefixes_of, window_options_on
from s2s_deploy.runtime.shortlist import restrict

if TYPE_CHECKING:
    from s2s_deploy.runtime.decoding import SearchConfig

StepTop = Callable[[np.ndarray, np.ndarray, int], tuple[np.ndarray, np.ndarray]]


def options_on(config: SearchConfig) -> bool:
    """Whether any option needs the full log-probs (``min_len`` alone does not: the search
    masks EOS among the in-graph top-k)."""
    return (config.sampling_topk != 1 or config.repetition_penalty != 1.0 or config.no_repeat_ngram_size > 0
            or config.encoder_no_repeat_ngram_size > 0 or any(prefixes_of(config)) or bool(config.suppress_tokens)
            or config.disable_unk or bool(config.bad_words_ids) or config.forced_eos or config.forced_bos >= 0
            or bool(config.begin_suppress_tokens) or config.timestamps or window_options_on(config)
            or config.vmap is not None)


def sentence_limits(config: SearchConfig, src_len: np.ndarray) -> np.ndarray:
    """Each sentence's most target tokens (its EOS included): ``SearchConfig.sentence_limits``,
    else ``max_len``. The search loop stops a sentence there; ``forced_eos`` makes it end with EOS."""
    limits = config.sentence_limits(src_len)
    return np.full(len(src_len), config.max_len, dtype=np.int64) if limits is None else limits


def sentence_seeds(seed: int, src: np.ndarray, src_len: np.ndarray) -> list[np.random.Generator]:
    """One generator per sentence, from the seed and the sentence's own source ids: a sentence
    samples the same tokens whatever its batch, its place in it, or the backend. A features source
    (floats) is seeded by the sha256 of its row's bytes and its length instead: a window read window
    by window is always padded to the encoder's window, so its draws do not depend on its batchmates."""
    if np.issubdtype(src.dtype, np.integer):
        return [np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, *src[i, : int(n)].tolist()])))
                for i, n in enumerate(src_len)]
    return [np.random.Generator(np.random.PCG64(np.random.SeedSequence(
        [seed, int(n), *np.frombuffer(hashlib.sha256(np.ascontiguousarray(src[i]).tobytes()).digest(),
                                      dtype=np.uint32).tolist()]))) for i, n in enumerate(src_len)]


def top_of(values: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's ``k`` best values and ids, best first, ties to the lower id (as ONNX TopK).

    A row's k-th best value is found by partition, and only the ids at or above it are sorted (a
    stable sort of the whole row cost a beam-5 Whisper step over 51,865 ids more than the model);
    a row with fewer than ``k`` ordered values (NaN) is sorted whole, as before."""
    rows, width = values.shape
    negated = -values
    if k >= width:
        ids = np.argsort(negated, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(values, ids, axis=1), ids
    kth = np.partition(negated, k - 1, axis=1)[:, k - 1]
    ids = np.empty((rows, k), dtype=np.intp)
    for row in range(rows):
        candidates = np.flatnonzero(negated[row] <= kth[row])  # ascending ids: the stable sort keeps ties so
        if len(candidates) < k:
            ids[row] = np.argsort(negated[row], kind="stable")[:k]
        else:
            ids[row] = candidates[np.argsort(negated[row, candidates], kind="stable")[:k]]
    return np.take_along_axis(values, ids, axis=1), ids


def renormalise(out: np.ndarray) -> None:
    """Each row, in place, as log-probs over the ids its options left (log-softmax of what is finite):
    openai-whisper takes the log-softmax of the logits after its filters, so its average log-prob reads
    the filtered distribution. A row's ranking is unchanged; a row with nothing left stays."""
    with np.errstate(invalid="ignore", divide="ignore"):
        top = out.max(axis=1, keepdims=True)
        top = np.where(np.isfinite(top), top, np.float32(0.0))
        norm = top + np.log(np.exp(out - top).sum(axis=1, keepdims=True, dtype=np.float64)).astype(np.float32)
    out -= np.where(np.isfinite(norm), norm, np.float32(0.0))


def source_ngrams(src: np.ndarray, src_len: np.ndarray, n: int,
                  vocab_size: int) -> list[dict[tuple[int, ...], list[int]]]:
    """Per sentence, each (n-1)-gram of its source ids (``prefix + ids + suffix``, not the padding)
    mapped to the ids that follow it there, those a target id too (a model with a vocabulary of
    its own per side); none when ``n`` is 0. Features cannot be n-grams."""
    if n <= 0:
        return []
    if not np.issubdtype(np.asarray(src).dtype, np.integer):
        raise ValueError("encoder_no_repeat_ngram_size needs a source of token ids, not features")
    found = []
    for row, length in zip(np.asarray(src), np.asarray(src_len), strict=True):
        ids = row[: int(length)].tolist()
        table: dict[tuple[int, ...], list[int]] = {}
        for i in range(len(ids) - n + 1):
            if ids[i + n - 1] < vocab_size:
                table.setdefault(tuple(ids[i: i + n - 1]), []).append(ids[i + n - 1])
        found.append(table)
    return found


class StepOptions:
    """The options of one search over one batch. It follows each row's generated tokens from the
    ``tokens`` and ``reorder`` fed to every step, so greedy and beam search need no change but
    calling ``bind(run)`` instead of ``run.step_top``."""

    def __init__(self, config: SearchConfig, src: np.ndarray, src_len: np.ndarray, eos_id: int,
                 vocab_size: int, unk_id: int | None) -> None:
        self.config = config
        self.eos = eos_id
        self.batch = len(src_len)
        self.limits = sentence_limits(config, src_len)
        self.max_len = int(self.limits.max())
        prefixes = prefixes_of(config)
        if len(prefixes) not in (0, 1, self.batch):
            raise ValueError(f"{len(prefixes)} prefixes for a batch of {self.batch} sentences")
        self.prefixes = prefixes * self.batch if len(prefixes) == 1 else prefixes
        if any(eos_id in p for p in self.prefixes):
            raise ValueError("a prefix cannot hold the EOS token")
        if config.forced_bos >= vocab_size:
            raise ValueError(f"forced_bos {config.forced_bos} is outside the vocabulary (0..{vocab_size - 1})")
        banned = set(config.suppress_tokens) | ({unk_id} if config.disable_unk and unk_id is not None else set())
        if any(not 0 <= i < vocab_size for i in banned | {i for w in config.bad_words_ids for i in w}):
            raise ValueError(f"a suppressed or bad-word id is outside the vocabulary (0..{vocab_size - 1})")
        self.suppressed = np.array(sorted(banned), dtype=np.int64)
        self.begin_suppressed = np.array(sorted(set(config.begin_suppress_tokens)), dtype=np.int64)
        if any(not 0 <= i < vocab_size for i in self.begin_suppressed.tolist()):
            raise ValueError(f"a begin-suppressed id is outside the vocabulary (0..{vocab_size - 1})")
        self.single_bad = np.array(sorted({w[0] for w in config.bad_words_ids if len(w) == 1}), dtype=np.int64)
        self.long_bad = [w for w in config.bad_words_ids if len(w) > 1]
        self.sampling = config.sampling_topk != 1
        self.renormalise = window_options_on(config) and config.beam_size == 1
        if config.timestamps and not 0 < config.timestamp_begin < vocab_size:
            raise ValueError(f"timestamp_begin {config.timestamp_begin} is outside the vocabulary "
                             f"(1..{vocab_size - 1})")
        self.generators = sentence_seeds(config.seed, src, src_len) if self.sampling else []
        self.source_ngrams = source_ngrams(src, src_len, config.encoder_no_repeat_ngram_size, vocab_size)
        self.first_fed = np.zeros(self.batch, dtype=np.int64)
        # the vocabulary shortlist: each sentence's own allowed ids (its prefix's among them)
        self.allowed = None if config.vmap is None else config.vmap.mask(src, src_len, self.prefixes)
        self._allowed_by_rows: dict[int, np.ndarray] = {}
        self.history = np.zeros((0, 0), dtype=np.int64)
        self.t = 0

    def _allowed_rows(self, rows: int) -> np.ndarray:
        """The shortlist repeated over each sentence's rows (1 or beam of them), made once per row count
        rather than gathered again every step."""
        if rows not in self._allowed_by_rows:
            self._allowed_by_rows[rows] = self.allowed[np.arange(rows) // (rows // self.batch)]
        return self._allowed_by_rows[rows]

    def bind(self, run: DecodeRun) -> StepTop:
        def step_top(tokens: np.ndarray, reorder: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
            log_probs = run.step(tokens, reorder)
            if self.allowed is not None:  # first, so every option reads the shortlist's log-probs
                log_probs = restrict(log_probs, self._allowed_rows(len(tokens)))
            return self.rank(self.process(log_probs, tokens, reorder), k)

        return step_top

    def process(self, log_probs: np.ndarray, tokens: np.ndarray, reorder: np.ndarray) -> np.ndarray:
        """The step's log-probs with every option applied (a new array); advances the history."""
        t, rows = self.t, len(tokens)
        if t == 0:
            self.history = np.zeros((rows, 0), dtype=np.int64)
            self.first_fed[np.arange(rows) // (rows // self.batch)] = tokens
        else:
            self.history = np.concatenate([self.history[reorder], tokens[:, None].astype(np.int64)], axis=1)
        self.t += 1
        return self.edit(log_probs, self.history, t)

    def edits_between(self, first: int, last: int) -> bool:
        """Whether ``edit`` may change a log-prob at any step from ``first`` to ``last`` (inclusive), for
        a sentence alone (a batch of one): False lets speculative greedy rank such a pass in the graph,
        without the vocabulary-wide copy. An option that edits every step answers True; a forced BOS
        or EOS, a prefix, ``min_len`` and the first token's bans answer for their own steps."""
        config = self.config
        if (config.repetition_penalty != 1.0 or config.no_repeat_ngram_size > 0 or self.source_ngrams or self.long_bad
                or len(self.suppressed) or len(self.single_bad) or config.timestamps or self.renormalise
                or self.allowed is not None or self.sampling):
            return True
        until = config.min_len - 1  # the last step a step-bounded option edits
        if len(self.begin_suppressed) or config.forced_bos >= 0:
            until = max(until, 0)
        if self.prefixes:
            until = max(until, max(len(p) for p in self.prefixes) - 1)
        if first <= until:
            return True
        return bool(config.forced_eos and ((self.limits - 1 >= first) & (self.limits - 1 <= last)).any())

    def positions_top(self, log_probs: np.ndarray, generated: list[int], drafts: list[int], first: int,
                      k: int) -> tuple[np.ndarray, np.ndarray]:
        """A k-position pass of speculative greedy over one sentence (a batch of one): ``log_probs``
        (positions, V), position j being step ``len(generated) + j`` after ``generated`` and the
        first j ``drafts``, each edited by ``edit`` as plain greedy's step there is (``first``: the
        token the search fed first), then ranked: each position's ``k`` best (positions, k)."""
        self.first_fed[:] = first
        if self.allowed is not None:
            log_probs = restrict(log_probs, np.broadcast_to(self.allowed[0], log_probs.shape))
        fed = np.array([*generated, *drafts], dtype=np.int64)
        start = len(generated)
        return self.rank(np.concatenate([self.edit(log_probs[j:j + 1], fed[None, : start + j], start + j)
                                         for j in range(len(log_probs))]), k)

    def edit(self, log_probs: np.ndarray, history: np.ndarray, t: int) -> np.ndarray:
        """Step ``t``'s log-probs (rows, V) with every option applied (a new array), each row after
        the generated tokens ``history`` (rows, t) holds: a function of its arguments and the
        sentences' own settings only, so a k-position pass edits each position as a step would."""
        config = self.config
        rows = len(log_probs)
        sentence = np.arange(rows) // (rows // self.batch)
        out = np.array(log_probs, dtype=np.float32)
        if config.repetition_penalty != 1.0 and t > 0:
            seen = np.take_along_axis(out, history, axis=1)  # log-probs are negative: *penalty lowers them
            np.put_along_axis(out, history, seen * np.float32(config.repetition_penalty), axis=1)
        if config.no_repeat_ngram_size > 0:
            self._ban_ngrams(out, history, config.no_repeat_ngram_size)
        if self.source_ngrams:
            self._ban_source_ngrams(out, history, sentence, config.encoder_no_repeat_ngram_size)
        if self.long_bad:
            for words in self.long_bad:
                n = len(words) - 1
                if t >= n:
                    hit = (history[:, t - n:] == np.array(words[:-1])).all(axis=1)
                    out[hit, words[-1]] = -np.inf
        at_begin = (self.begin_suppressed,) if t == 0 else ()  # the first generated token only
        for banned in (self.suppressed, self.single_bad, *at_begin):
            if len(banned):
                out[:, banned] = -np.inf
        if t < config.min_len:
            out[:, self.eos] = -np.inf
        if config.timestamps:  # after every other rule, as generate's processor comes last
            self._timestamp_rules(out, history, t)
        if self.renormalise:  # greedy and sampled fallback attempts: log-probs of the
            renormalise(out)  # filtered distribution, as openai-whisper's (beam search keeps generate's ranking)
        forced = np.full(rows, -1, dtype=np.int64)
        if self.prefixes:
            for row in range(rows):
                p = self.prefixes[sentence[row]]
                if t < len(p):
                    forced[row] = p[t]
        from_prefix = forced >= 0
        if config.forced_bos >= 0 and t == 0:
            forced[~from_prefix] = config.forced_bos
        if config.forced_eos:
            forced[(self.limits[sentence] - 1 == t) & (forced < 0)] = self.eos
        where = np.nonzero(forced >= 0)[0]
        if len(where):
            # every other token is impossible; a prefix token keeps the model's own log-prob (as
            # CTranslate2's target_prefix), a forced BOS or EOS scores 0 (as generate's processors)
            model = np.asarray(log_probs, dtype=np.float32)[where, forced[where]]
            out[where] = -np.inf
            out[where, forced[where]] = np.where(from_prefix[where], model, np.float32(0.0))
        return out

    def _timestamp_rules(self, out: np.ndarray, history: np.ndarray, t: int) -> None:
        """Whisper's timestamp grammar (transformers' ``WhisperTimeStampLogitsProcessor``): ids from
        ``timestamp_begin`` on are timestamps, the id before it (no-timestamps) never comes; they come
        in pairs (after a lone one only a timestamp or EOS and above, after a pair only text) and never
        decrease (a pair's end may not be repeated); the first token is one, at most
        ``max_initial_timestamp``; and where the timestamps' summed probability beats every single
        text token's, only a timestamp may come."""
        begin, config = self.config.timestamp_begin, self.config
        rows, length = history.shape
        out[:, begin - 1] = -np.inf
        if length:
            last = history[:, -1] >= begin
            penultimate = history[:, -2] >= begin if length > 1 else np.ones(rows, dtype=bool)
            out[last & penultimate, begin:] = -np.inf
            out[last & ~penultimate, : self.eos] = -np.inf
            stamps = history >= begin
            latest = history[np.arange(rows), length - 1 - np.argmax(stamps[:, ::-1], axis=1)]
            floor = np.where(stamps.any(axis=1), np.where(last & ~penultimate, latest, latest + 1), begin)
            ids = np.arange(out.shape[1])
            out[(ids >= begin) & (ids < floor[:, None])] = -np.inf
        if t == 0:
            out[:, :begin] = -np.inf
            if config.max_initial_timestamp >= 0:
                out[:, begin + config.max_initial_timestamp + 1:] = -np.inf
        with np.errstate(invalid="ignore", divide="ignore"):
            top = out.max(axis=1, keepdims=True)
            top = np.where(np.isfinite(top), top, np.float32(0.0))
            log_probs = out - (top + np.log(np.exp(out - top).sum(axis=1, keepdims=True)))
            stamp_top = log_probs[:, begin:].max(axis=1, keepdims=True)
            stamp_top = np.where(np.isfinite(stamp_top), stamp_top, np.float32(0.0))
            stamp_mass = stamp_top[:, 0] + np.log(np.exp(log_probs[:, begin:] - stamp_top).sum(axis=1))
            out[stamp_mass > log_probs[:, :begin].max(axis=1), :begin] = -np.inf

    @staticmethod
    def _ban_ngrams(out: np.ndarray, history: np.ndarray, n: int) -> None:
        """No row may repeat an n-gram of its own generated tokens (the start token excluded)."""
        length = history.shape[1]
        if length < n - 1 or length == 0:
            return
        for row in range(history.shape[0]):
            seq = history[row].tolist()
            tail = tuple(seq[length - n + 1:]) if n > 1 else ()
            banned = [seq[i + n - 1] for i in range(length - n + 1) if tuple(seq[i:i + n - 1]) == tail]
            if banned:
                out[row, banned] = -np.inf

    def _ban_source_ngrams(self, out: np.ndarray, history: np.ndarray, sentence: np.ndarray, n: int) -> None:
        """No row may complete an n-gram of its sentence's source ids. The row's sequence starts
        with the token fed at step 0 (the decoder start), as ``generate``'s ``input_ids`` do."""
        for row in range(history.shape[0]):
            seq = [int(self.first_fed[sentence[row]]), *history[row].tolist()]
            if len(seq) < n - 1:
                continue
            banned = self.source_ngrams[sentence[row]].get(tuple(seq[len(seq) - n + 1:]) if n > 1 else ())
            if banned:
                out[row, banned] = -np.inf

    def rank(self, out: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if not self.sampling:
            return top_of(out, k)
        values, ids = top_of(out, max(k, 1))
        picked = self.sample(out)
        ids[:, 0] = picked
        values[:, 0] = out[np.arange(len(out)), picked]
        return values, ids

    def sample(self, out: np.ndarray) -> np.ndarray:
        """One token per row from ``softmax(log_probs / temperature)`` over its top-k, then
        top-p, candidates; one uniform draw per sentence per step, from the sentence's own seed."""
        config = self.config
        rows, vocab = out.shape
        order = np.argsort(-out, axis=1, kind="stable")
        if config.sampling_topk > 0:
            order = order[:, : min(config.sampling_topk, vocab)]
        scaled = np.take_along_axis(out, order, axis=1).astype(np.float64) / config.sampling_temperature
        scaled -= scaled[:, :1]
        probs = np.exp(scaled)
        probs /= probs.sum(axis=1, keepdims=True)
        if config.sampling_topp < 1.0:  # keep the smallest head whose mass reaches p (at least one)
            before = np.cumsum(probs, axis=1) - probs
            probs = np.where(before < config.sampling_topp, probs, 0.0)
            probs /= probs.sum(axis=1, keepdims=True)
        per_sentence = rows // self.batch
        draws = np.repeat([g.random() for g in self.generators], per_sentence)
        cumulative = np.cumsum(probs, axis=1)
        # the first column whose cumulative mass reaches the draw: never a zero-probability one
        column = np.minimum((cumulative < draws[:, None] * cumulative[:, -1:]).sum(axis=1), order.shape[1] - 1)
        return order[np.arange(rows), column]
