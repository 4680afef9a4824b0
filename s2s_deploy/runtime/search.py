"""Greedy and beam search over any Backend. Imports numpy only.

``min_len`` forbids EOS before that many tokens (benchmarks force a fixed output length).

Scores follow the seeds: a hypothesis of L tokens (its EOS included when it has one) scores
``log P / L**alpha``. Beam search keeps K live beams per sentence; an EOS candidate ranked
within the top K of a step becomes a finished hypothesis. A sentence stops (Hugging Face's
default, ``early_stopping=False``) once it holds K finished hypotheses and the K-th best of
them scores at least the best live beam's ``log P / (t+1)**alpha``; or at ``max_len``, where
its live beams are finished as they stand. ``early_stopping`` True stops it once it holds K;
"never" judges the best live beam at ``max_len`` instead of ``t+1`` when ``alpha`` > 0 (as
``generate``). The rule never reads n-best, so the 1-best is the
same for every n-best; every finished hypothesis is kept and ranked, so the answer is never
worse than one it held (docs/manifest.md has the algorithm as pseudo-code, docs/parity.md
the measurements behind the choice).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.format.decoding import OPEN_SLOT
from s2s_deploy.runtime.backend import Backend, DecodeRun
from s2s_deploy.runtime.decoding import SearchConfig, prefixes_of, window_options_on
from s2s_deploy.runtime.options import StepOptions, options_on, top_of
from s2s_deploy.runtime.speculative import Accepting, Feeding, decode_sentence, drift_bound, refusal

NON_FINITE = "the decoder returned NaN log-probs: the model's weights or graph are broken (re-export it)"


class NonFiniteError(S2SError):
    """The model, not the input, is at fault: no hypothesis can be ranked."""



@dataclass(frozen=True)
class Hypothesis:
    tokens: tuple[int, ...]
    token_log_probs: tuple[float, ...]
    score: float
    finished: bool
    prompt: tuple[int, ...] = ()
    """The decoder prompt its sentence was fed, an open slot filled with the language chosen there."""
    no_speech_prob: float | None = None
    """The probability of ``no_speech_token`` right after the start token (openai-whisper's
    ``no_speech_prob``), where the temperature fallback asked for it; else None."""

    @property
    def log_prob(self) -> float:
        return float(sum(self.token_log_probs))


def _stops_by_step(limits: np.ndarray | None) -> dict[int, np.ndarray]:
    """Sentences whose own limit ends the search after step t, by t; the loop looks up one key per step."""
    if limits is None:
        return {}
    return {int(limit) - 1: np.nonzero(limits == limit)[0] for limit in np.unique(limits)}


def normalised(log_prob: float | np.ndarray, length: int | np.ndarray, alpha: float) -> float | np.ndarray:
    """``log_prob / length**alpha``; ``+ 0.0`` makes a beam's negated zero cost 0.0, never -0.0."""
    return log_prob / np.power(length, alpha) + 0.0


class SearchEngine(Protocol):
    """Anything that turns a padded batch into n-best lists: the step loop below over any
    Backend, or a fused generate.onnx (runtime/ort/generate.py)."""

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
    if config.prompt and OPEN_SLOT in config.decoder_prompt:
        return _detected_first(backend, src, src_len, config)
    if config.beam_size == 1:
        return [[h] for h in greedy(backend, src, src_len, config)]
    return beam_search(backend, src, src_len, config)


def _detected_first(backend: Backend, src: np.ndarray, src_len: np.ndarray,
                    config: SearchConfig) -> list[list[Hypothesis]]:
    """A decoder prompt's open slot chosen without the ``prompt``'s earlier text, as Whisper's
    ``detect_language`` reads the start token alone: one pass up to the slot (its own encoder run),
    then the search once per chosen prompt."""
    slot, batch = config.decoder_prompt.index(OPEN_SLOT), len(src)
    with backend.start(src, src_len) as started:
        probe = PromptedRun(started, backend.decoder_start_id, config.decoder_prompt[: slot + 1], backend.language_ids)
        probe.step_top(np.full(batch, backend.decoder_start_id, dtype=np.int64), np.arange(batch, dtype=np.int64), 1)
        prompts = [chosen + config.decoder_prompt[slot + 1:] for chosen in probe.prompts(batch)]
    found: list[list[Hypothesis]] = [[] for _ in range(batch)]
    for prompt in dict.fromkeys(prompts):
        rows = np.array([i for i, p in enumerate(prompts) if p == prompt])
        for row, hyps in zip(rows.tolist(), search(backend, src[rows], src_len[rows],
                                                   replace(config, decoder_prompt=prompt)), strict=True):
            found[row] = hyps
    return found


def step_options(backend: Backend, src: np.ndarray, src_len: np.ndarray, config: SearchConfig) -> StepOptions | None:
    """The options hook: None (the in-graph TopK path, untouched) unless an option is on."""
    if not options_on(config):
        return None
    return StepOptions(config, src, src_len, backend.eos_id, backend.vocab_size, backend.unk_id)


class PromptedRun(DecodeRun):
    """A run whose first step is preceded by the decoder prompt (``decoder_prompt``): the start
    token and every prompt token but the last are fed with their outputs dropped, and the first
    step the search asks for is fed the last prompt token. So the prompt is neither scored, nor
    counted in ``max_len``, nor output, as ``generate`` treats Whisper's
    ``<|startoftranscript|> <|en|> <|transcribe|> <|notimestamps|>``; the search's own loop is unchanged.
    ``context`` (``prompt_start`` and a ``prompt``'s ids) goes before the start token the same way,
    as ``generate`` puts ``prompt_ids`` before ``<|startoftranscript|>``.

    An open slot (-1) is, per row, the token of ``languages`` with the best log-prob after the
    tokens before it (the first of equal ones, ascending ids), with no option applied: Whisper's
    ``detect_language``. ``fed`` holds each row's prompt once the first step ran.

    ``no_speech`` (an id, -1: none): each row's probability of that id in the output right after the
    start token (the model's own softmax, no option applied), kept in ``no_speech_probs``: openai-whisper
    reads its no-speech probability there (``probs_at_sot``), after any earlier text.

    All of that happens at the first step: the run then hands ``step`` and ``step_top`` to the run it
    wraps, so a later step costs what an unprompted one does (the searches take ``step_top`` again
    after step 0; a kept bound method still works, one check slower)."""

    def __init__(self, run: DecodeRun, start_id: int, prompt: tuple[int, ...], languages: tuple[int, ...],
                 context: tuple[int, ...] = (), no_speech: int = -1) -> None:
        if OPEN_SLOT in prompt and not languages:
            raise S2SError(f"the decoder prompt holds {OPEN_SLOT} (the language the model scores best), but the "
                           "backend knows no language tokens")
        if OPEN_SLOT in prompt and context:  # search() chooses it first, without the context
            raise S2SError("a decoder prompt's open slot after a prompt: choose the language first")
        self.run, self.start, self.prompt, self.context = run, start_id, prompt, context
        self.languages = np.asarray(sorted(languages), dtype=np.int64)
        self.fed: np.ndarray | None = None  # (rows, prompt tokens)
        self.no_speech = no_speech
        self.no_speech_probs: np.ndarray | None = None  # (rows,)

    def _keep_no_speech(self, log_probs: np.ndarray) -> None:
        self.no_speech_probs = np.exp(np.asarray(log_probs[:, self.no_speech], dtype=np.float64))

    def _feed_prompt(self, rows: int) -> np.ndarray:
        """Feeds the context, the start token and the prompt's tokens but the last (each row's); the
        column the first step is fed (the last prompt token, or the start token without a prompt)."""
        identity = np.arange(rows, dtype=np.int64)
        for token in self.context:
            self.run.step_top(np.full(rows, token, dtype=np.int64), identity, 1)
        columns = [np.full(rows, token, dtype=np.int64) for token in (self.start, *self.prompt)]
        for position, token in enumerate(self.prompt):  # feeds the column before each prompt token
            if token == OPEN_SLOT or (position == 0 and self.no_speech >= 0):  # the log-probs are read
                log_probs = self.run.step(columns[position], identity)
                if position == 0 and self.no_speech >= 0:
                    self._keep_no_speech(log_probs)
                if token == OPEN_SLOT:  # chosen by the log-probs after the column before it
                    columns[position + 1] = self.languages[np.argmax(log_probs[:, self.languages], axis=1)]
            else:
                self.run.step_top(columns[position], identity, 1)
        self.fed = np.stack(columns[1:], axis=1) if self.prompt else np.empty((rows, 0), dtype=np.int64)
        self.step, self.step_top = self.run.step, self.run.step_top  # type: ignore[method-assign]
        return columns[-1]

    def prompts(self, sentences: int) -> list[tuple[int, ...]]:
        """Each sentence's fed prompt (its rows are alike: a sentence's beams start identical)."""
        if self.fed is None:
            return [self.prompt] * sentences
        per = len(self.fed) // sentences
        return [tuple(self.fed[i * per].tolist()) for i in range(sentences)]

    def _at_start(self) -> bool:
        """Whether the first step is fed the start token itself (no decoder prompt) and its no-speech
        probability is to be read there."""
        return self.no_speech >= 0 and not self.prompt

    def sentence_no_speech(self, sentences: int) -> list[float | None]:
        """Each sentence's no-speech probability (its rows are alike there), None where not read."""
        if self.no_speech_probs is None:
            return [None] * sentences
        per = len(self.no_speech_probs) // sentences
        return [float(self.no_speech_probs[i * per]) for i in range(sentences)]

    def step(self, tokens: np.ndarray, reorder: np.ndarray) -> np.ndarray:
        """The first step (later ones go to the wrapped run's own, even through this method kept)."""
        if self.fed is not None:
            return self.run.step(tokens, reorder)
        log_probs = self.run.step(self._feed_prompt(len(tokens)), reorder)
        if self._at_start():
            self._keep_no_speech(log_probs)
        return log_probs

    def step_top(self, tokens: np.ndarray, reorder: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The first step (later ones go to the wrapped run's own, even through this method kept)."""
        if self.fed is not None:
            return self.run.step_top(tokens, reorder, k)
        if self._at_start():
            return top_of(np.asarray(self.step(tokens, reorder), dtype=np.float32), k)
        return self.run.step_top(self._feed_prompt(len(tokens)), reorder, k)

    def attention(self) -> np.ndarray | None:
        return self.run.attention()

    def close(self) -> None:
        self.run.close()


def _prompt_feeds(config: SearchConfig) -> tuple[tuple[int, ...], int]:
    """What goes before the start token (a ``prompt``'s context: ``prompt_start`` and its ids) and the
    no-speech token whose probability is read after the start token (-1: none)."""
    # The no-speech probability is read wherever the export names the token and a decoder prompt is fed
    # (each result reports it; reading it while a prompt token is fed changes no choice), or the fallback asks.
    reads = window_options_on(config) or bool(config.decoder_prompt)
    no_speech = config.no_speech_token if config.no_speech_token >= 0 and reads else -1
    return ((config.prompt_start, *config.prompt) if config.prompt else ()), no_speech


def prompted(run: DecodeRun, backend: Backend, config: SearchConfig) -> DecodeRun:
    """``run`` itself without a prompt, a decoder prompt or a no-speech probability to read (the
    common case costs nothing), else a ``PromptedRun``."""
    context, no_speech = _prompt_feeds(config)
    if not config.decoder_prompt and not context and no_speech < 0:
        return run
    return PromptedRun(run, backend.decoder_start_id, tuple(config.decoder_prompt), backend.language_ids, context,
                       no_speech)


def with_prompts(found: list[list[Hypothesis]], run: DecodeRun) -> list[list[Hypothesis]]:
    """Hypotheses carrying the prompt their sentence was fed and its no-speech probability
    (unchanged without a ``PromptedRun``)."""
    if not isinstance(run, PromptedRun):
        return found
    sentences = len(found)
    return [[replace(h, prompt=prompt, no_speech_prob=no_speech) for h in hyps]
            for hyps, prompt, no_speech in zip(found, run.prompts(sentences), run.sentence_no_speech(sentences),
                                               strict=True)]


def speculative_greedy(backend: Backend, src: np.ndarray, src_len: np.ndarray, config: SearchConfig,
                       counts: Accepting | None = None) -> list[Hypothesis]:
    """``greedy``'s tokens by draft-and-verify (runtime/speculative.py), each sentence alone, with
    greedy's own log-prob options (``StepOptions``, per position) and prompts (fed first); a
    sentence that meets a near-tie is decoded again by ``greedy``. ``counts``: the acceptance."""
    problem = refusal(config)
    if problem is not None:
        raise S2SError(problem)
    if not backend.multi_step:
        raise S2SError("this export has no k-position decoder step (decoder_multi.onnx): speculative decoding "
                       "needs an fp32 export made with `export --multi-step`")
    counts = counts if counts is not None else Accepting()
    # a repetition penalty multiplies a seen token's log-prob, and so its drift
    margin = 2 * drift_bound(backend.multi_step_drift) * max(1.0, config.repetition_penalty)
    limits = config.sentence_limits(src_len)
    context, no_speech = _prompt_feeds(config)
    prefill = (*context, backend.decoder_start_id, *config.decoder_prompt)
    prefixes = prefixes_of(config)
    found = []
    for i in range(len(src)):
        limit = int(limits[i]) if limits is not None else config.max_len
        row_src, row_len = src[i:i + 1], src_len[i:i + 1]
        own = replace(config, speculative=0, prefix=prefixes[i] if len(prefixes) > 1 else config.prefix)
        edits = step_options(backend, row_src, row_len, own)
        feeding = Feeding(prefill, backend.decoder_start_id, len(context) if no_speech >= 0 else -1, no_speech,
                          own.min_len, edits)
        mapping = backend.source_in_target
        source = mapping[src[i, : int(src_len[i])]].tolist() if mapping is not None else []
        picked = decode_sentence(backend, row_src, row_len, source, limit, config.speculative, margin, counts, feeding)
        if picked is None:  # a near-tie: plain greedy decides the sentence
            counts.redone += 1
            found.append(greedy(backend, row_src, row_len, own)[0])
            continue
        lps = picked.log_probs
        if not np.all(np.isfinite(lps)):
            raise NonFiniteError(NON_FINITE)
        n = len(picked.tokens)
        body = tuple(picked.tokens[: n - 1] if picked.finished else picked.tokens)
        found.append(Hypothesis(body, tuple(lps), float(normalised(sum(lps), n, config.alpha)), picked.finished,
                                tuple(config.decoder_prompt), picked.no_speech_prob))
    return found


def greedy(backend: Backend, src: np.ndarray, src_len: np.ndarray, config: SearchConfig) -> list[Hypothesis]:
    """One hypothesis per sentence; each carries the prompt it was fed."""
    if config.speculative:
        return speculative_greedy(backend, src, src_len, config)
    batch, eos = src.shape[0], backend.eos_id
    rows = np.arange(batch)
    reorder = rows.astype(np.int64)
    tokens = np.full(batch, backend.decoder_start_id, dtype=np.int64)
    options = step_options(backend, src, src_len, config)
    # with step options on, their processor forbids EOS before min_len itself, and lets a forced EOS through
    min_len = config.min_len if options is None else 0
    limits = config.sentence_limits(src_len)
    max_len = config.max_len if limits is None else int(limits.max())
    picked = np.zeros((batch, max_len), dtype=np.int64)
    picked_lp = np.zeros((batch, max_len), dtype=np.float64)
    done = np.zeros(batch, dtype=bool)
    stops = _stops_by_step(limits)
    cut = np.zeros(batch, dtype=bool)
    steps = max_len
    with backend.start(src, src_len) as started:
        run = prompted(started, backend, config)
        step_top = run.step_top if options is None else options.bind(run)
        for t in range(steps):
            if t == 1 and options is None:  # a PromptedRun fed its prompt at step 0: the backend's own from here
                step_top = run.step_top
            if t < min_len:  # EOS may rank first: take the runner-up there
                values, ids = step_top(tokens, reorder, 2)
                column = (ids[:, 0] == eos).astype(np.intp)
                tokens, picked_lp[:, t] = ids[rows, column], values[rows, column]
            else:
                values, ids = step_top(tokens, reorder, 1)
                tokens, picked_lp[:, t] = ids[:, 0], values[:, 0]
            picked[:, t] = tokens
            ended = eos in tokens.tolist()  # cheaper than a numpy test in the common step, that ends nothing
            if ended:
                done |= tokens == eos
            stopping = stops.get(t)
            if stopping is not None:  # these sentences reached their own limit without an EOS
                cut[stopping[~done[stopping]]] = True
                done[stopping] = True
                ended = True
            if ended and done.all():
                steps = t + 1
                break
    if np.isnan(picked_lp[:, :steps]).any():
        raise NonFiniteError(NON_FINITE)
    is_eos = picked[:, :steps] == eos
    length = np.where(cut, limits if limits is not None else steps, np.where(done, is_eos.argmax(axis=1) + 1, steps))
    results = []
    for i in range(batch):
        n, finished = int(length[i]), bool(done[i] and not cut[i])
        lps = tuple(picked_lp[i, :n].tolist())
        body = tuple(picked[i, : n - 1 if finished else n].tolist())
        results.append(Hypothesis(body, lps, float(normalised(sum(lps), n, config.alpha)), finished))
    return [hyps[0] for hyps in with_prompts([[h] for h in results], run)]


@dataclass(frozen=True)
class _Ending:
    """Where a hypothesis ends: its score, the step it was last extended at, the row it holds
    there, and (for one that finished) the log-prob of its EOS."""

    score: float
    last_step: int
    row: int
    eos_log_prob: float | None


class _Trail:
    """Per-step parent rows, tokens and log-probs: hypotheses are spelled out only at the end,
    for the n-best, instead of copying every live history at every step."""

    def __init__(self) -> None:
        self.steps: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (parents, tokens, log_probs)

    def hypothesis(self, ending: _Ending) -> Hypothesis:
        tokens, lps, row = [], [], ending.row
        for step in range(ending.last_step, -1, -1):
            parents, step_tokens, step_lps = self.steps[step]
            tokens.append(int(step_tokens[row]))
            lps.append(float(step_lps[row]))
            row = int(parents[row])
        tokens.reverse()
        lps.reverse()
        if ending.eos_log_prob is not None:
            lps.append(ending.eos_log_prob)
        return Hypothesis(tuple(tokens), tuple(lps), ending.score, ending.eos_log_prob is not None)


def _end_live_beams(endings: list[list[_Ending]], costs: np.ndarray, sentences: np.ndarray, k: int, step: int,
                    alpha: float) -> None:
    for i in sentences.tolist():
        for row in range(i * k, (i + 1) * k):
            if np.isfinite(costs[row]):
                endings[i].append(_Ending(float(normalised(-costs[row], step + 1, alpha)), step, row, None))


def beam_search(
    backend: Backend, src: np.ndarray, src_len: np.ndarray, config: SearchConfig
) -> list[list[Hypothesis]]:
    batch, k, eos = src.shape[0], config.beam_size, backend.eos_id
    if k >= backend.vocab_size:
        raise S2SError(f"beam size {k} must be smaller than the vocabulary ({backend.vocab_size})")
    rows = batch * k
    row_base = (np.arange(batch) * k)[:, None]
    # costs are negated scores, so one ascending stable sort ranks best first, ties to the lower beam, then id
    costs = np.empty(rows)
    # The K beams of a sentence start identical, so the first step runs one row per sentence (as
    # CTranslate2 does) and the next step's reorder tiles its K best into the beams. Whatever the
    # batch's size: a step's rows then hold the same sentences' rows in any batch, so a sentence's
    # scores do not depend on how many share it (a threshold of 8 sentences moved fp32 scores
    # in the last bits; docs/parity.md). Not after a decoder prompt: a backend takes its own first
    # step, a prompt token, as the narrow one.
    narrow = k > 1 and not config.decoder_prompt and not config.prompt
    tokens = np.full(batch if narrow else rows, backend.decoder_start_id, dtype=np.int64)
    reorder = np.arange(len(tokens), dtype=np.int64)
    if not narrow:
        costs.fill(np.inf)
        costs[row_base.ravel()] = 0.0  # only the first of a sentence's K identical rows may extend
    trail = _Trail()
    endings: list[list[_Ending]] = [[] for _ in range(batch)]
    finished_count = np.zeros(batch, dtype=np.int64)
    kth_best = np.full(batch, -np.inf)  # the K-th best finished score, once K have finished
    any_full = False
    active = np.ones(batch, dtype=bool)
    width = min(2 * k, backend.vocab_size)
    sentence = np.arange(batch)[:, None]
    chosen = np.empty(rows, dtype=np.intp)  # the chosen candidates' flat positions, K per sentence
    chosen_by_sentence = chosen.reshape(batch, k)
    options = step_options(backend, src, src_len, config)
    min_len = config.min_len if options is None else 0  # as in greedy: the processor applies it then
    limits = config.sentence_limits(src_len)
    stops = _stops_by_step(limits)
    never = config.early_stopping == "never" and config.alpha > 0
    ceiling = (np.full(batch, config.max_len) if limits is None else limits) if never else None

    def judged_at(t: int) -> int | np.ndarray:
        """The length a live beam's score is judged at: its own, or ("never") its sentence's limit."""
        return t + 1 if ceiling is None else ceiling

    with backend.start(src, src_len, expand=k) as started:
        run = prompted(started, backend, config)
        step_top = run.step_top if options is None else options.bind(run)
        for t in range(config.max_len if limits is None else int(limits.max())):
            if t == 1 and options is None:  # a PromptedRun fed its prompt at step 0: the backend's own from here
                step_top = run.step_top
            # The best 2K of K*V candidates lie among each row's own best 2K: the graph ranks those.
            # Each numpy call costs microseconds here, the model's weights having just evicted
            # numpy from the caches: the common step makes a dozen, into buffers made once.
            masked = t < min_len
            if t == 0 or t == min_len or (narrow and t == 1):  # one more per row while EOS is forbidden
                first_narrow = t == 0 and narrow
                fed = 1 if first_narrow else k  # rows per sentence
                per_row = min(width + masked, backend.vocab_size)
                grid = np.empty((batch * fed, per_row))
                candidates = grid.reshape(batch, fed * per_row)
                offsets = sentence * (fed * per_row)
                column = np.zeros((batch, 1)) if first_narrow else costs.reshape(rows, 1)
            values, ids = step_top(tokens, reorder, per_row)
            if masked:
                values = np.where(ids == eos, np.float32(-np.inf), values)
            np.subtract(column, values, out=grid)
            ranked = candidates.argsort(axis=1, kind="stable")
            if batch == 1:  # ranks within the one sentence are already flat positions
                flat = ranked[0, :k]
            else:
                flat = chosen
                np.add(ranked[:, :k], offsets, out=chosen_by_sentence)
            tokens = ids.take(flat)
            if eos in tokens.tolist():  # only an EOS within the top K finishes, or displaces a live beam
                top = ranked[:, : 2 * k] + offsets
                top_costs, top_ids, top_lps = candidates.take(top), ids.take(top), values.take(top)
                origin = top // per_row  # the row each candidate extends
                is_eos = (top_ids == eos) & np.isfinite(top_costs)
                for i, j in zip(*np.nonzero(is_eos[:, :k] & active[:, None]), strict=True):
                    score = float(normalised(-top_costs[i, j], t + 1, config.alpha))
                    endings[i].append(_Ending(score, t - 1, int(origin[i, j]), float(top_lps[i, j])))
                    finished_count[i] += 1
                    if finished_count[i] >= k:
                        kth_best[i] = sorted((e.score for e in endings[i]), reverse=True)[k - 1]
                        any_full = True
                keep = np.argsort(is_eos, axis=1, kind="stable")[:, :k]  # first K non-EOS candidates, in rank order
                top_costs, origin, top_ids, top_lps = (a[sentence, keep] for a in (top_costs, origin, top_ids, top_lps))
                costs[:] = top_costs.ravel()
                reorder, tokens, lps = origin.ravel(), top_ids.ravel(), top_lps.ravel()
            else:
                candidates.take(flat, out=costs, mode="clip")  # "clip": no buffering, and flat is in range
                lps, reorder = values.take(flat), flat // per_row
            trail.steps.append((reorder, tokens, lps))
            if any_full:  # K finished: stop once no live beam's score at its length beats the K-th best
                if config.early_stopping is True:
                    active &= finished_count < k
                else:
                    best_live = normalised(-costs.reshape(batch, k).min(axis=1), judged_at(t), config.alpha)
                    active &= ~(kth_best >= best_live)
                if not active.any():
                    break
            stopping = stops.get(t)
            if stopping is not None:  # these sentences reached their own limit: live beams end as they stand
                _end_live_beams(endings, costs, stopping[active[stopping]], k, t, config.alpha)
                active[stopping] = False
                if not active.any():
                    break
    if np.isnan(costs).any():
        raise NonFiniteError(NON_FINITE)
    # still searching at max_len: live beams end as they stand
    _end_live_beams(endings, costs, np.nonzero(active)[0], k, len(trail.steps) - 1, config.alpha)
    if not all(endings):
        raise NonFiniteError(NON_FINITE)
    return with_prompts([[trail.hypothesis(e) for e in sorted(ends, key=lambda e: -e.score)[: config.n_best]]
                         for ends in endings], run)
