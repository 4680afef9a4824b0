"""Whisper-style transcription as faster-whisper and openai-whisper run it, window by window, stated
by the search options alone (docs/decoding.md, "Temperature fallback"). Imports numpy only.

Each window is decoded at ``temperature[0]``; while a threshold fails it is decoded again at the next
temperature (0: the search as configured; above 0: ``best_of`` samples, the best-scored kept). A
window fails when its text compresses by more than ``compression_ratio_threshold`` (zlib, as
``get_compression_ratio``) or its average log-prob (the tokens' log-probs, EOS included, over the
tokens plus one) is below ``log_prob_threshold``, unless its no-speech probability exceeds
``no_speech_threshold`` while its log-prob is that low (silence). When every temperature fails, the
attempt of best average log-prob among those under the compression threshold (else among all) is
kept, with the last temperature. A window whose kept attempt's no-speech probability exceeds
``no_speech_threshold`` and whose log-prob does not clear ``log_prob_threshold`` is skipped whole.
With ``condition_on_previous_text`` each window is fed, as its prompt, the tokens of the input's earlier
segments (those with text and a duration), from the ``initial_prompt`` on, at most half the position
table; a window kept at a temperature above ``prompt_reset_on_temperature`` (or every window, with the
option off) starts the text afresh. These are faster-whisper 1.2.1's ``generate_with_fallback`` and
``generate_segments`` rules; tests/test_fallback.py replays our windows through them.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from s2s_deploy.runtime.decoding import LOG_PROB_THRESHOLD, NO_SPEECH_THRESHOLD, SearchConfig
from s2s_deploy.runtime.search import Hypothesis

if TYPE_CHECKING:
    from s2s_deploy.format.vocab import Vocabulary

Search = Callable[[np.ndarray, np.ndarray, SearchConfig], list[list[Hypothesis]]]


def compression_ratio(text: str) -> float:
    """The UTF-8 bytes of ``text`` over their zlib-compressed bytes (default level), as both
    faster-whisper's ``get_compression_ratio`` and openai-whisper's ``compression_ratio``."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data))


def average_log_prob(hypothesis: Hypothesis) -> float:
    """The tokens' log-probs (the EOS's included) over the tokens plus one, as openai-whisper's
    ``avg_logprob`` (``sum_logprobs / (len(tokens) + 1)``)."""
    return float(sum(hypothesis.token_log_probs)) / (len(hypothesis.tokens) + 1)


@dataclass(frozen=True)
class Attempt:
    """One decode of one window at one temperature, with what the thresholds read."""

    temperature: float
    hypothesis: Hypothesis
    avg_log_prob: float
    compression_ratio: float

    @property
    def no_speech_prob(self) -> float | None:
        return self.hypothesis.no_speech_prob


@dataclass(frozen=True)
class Outcome:
    """A window's result: the attempt kept, every attempt in order, the temperature it ended at (the
    last one tried when all failed, as faster-whisper reports it) and whether it is skipped as silence."""

    kept: Attempt
    attempts: tuple[Attempt, ...]
    temperature: float
    skipped: bool

    @property
    def hypothesis(self) -> Hypothesis:
        return self.kept.hypothesis


def needs_fallback(attempt: Attempt, config: SearchConfig) -> bool:
    """Whether ``attempt`` fails a threshold and is not silence (``generate_with_fallback``'s rule)."""
    ratio = config.compression_ratio_threshold
    failed = ratio is not None and attempt.compression_ratio > ratio  # too repetitive
    low = config.log_prob_threshold is not None and attempt.avg_log_prob < config.log_prob_threshold
    if low:
        failed = True
    no_speech = attempt.no_speech_prob
    if (config.no_speech_threshold is not None and no_speech is not None and no_speech > config.no_speech_threshold
            and low):
        failed = False  # silence: no temperature will find speech
    return failed


def is_silence(attempt: Attempt, config: SearchConfig) -> bool:
    """Whether the kept attempt's window is skipped: its no-speech probability is above the threshold
    and its log-prob does not clear ``log_prob_threshold`` (``generate_segments``' rule)."""
    return silent(attempt.avg_log_prob, attempt.no_speech_prob, config.log_prob_threshold, config.no_speech_threshold)


def silent(avg_log_prob: float, no_speech_prob: float | None, log_prob_threshold: float | None,
           no_speech_threshold: float | None) -> bool:
    """faster-whisper's silence rule: a no-speech probability above ``no_speech_threshold`` and an
    average log-prob that does not clear ``log_prob_threshold`` (a window skipped, a file doubted)."""
    if no_speech_threshold is None or no_speech_prob is None or no_speech_prob <= no_speech_threshold:
        return False
    return not (log_prob_threshold is not None and avg_log_prob > log_prob_threshold)


@dataclass(frozen=True)
class Confidence:
    """How sure the model was of one input's text, as openai-whisper measures a window: the log-probs of
    the tokens of each decoded window's best hypothesis, EOS included (``log_prob``), over its tokens
    plus one (``count``), summed over the windows; and each window's no-speech probability, where the
    export names a no-speech token (Whisper's ``<|nospeech|>``)."""

    log_prob: float
    count: int
    no_speech_probs: tuple[float, ...] = ()

    @classmethod
    def of(cls, hypotheses: Sequence[Hypothesis]) -> Confidence:
        """The confidence of an input decoded as these windows' best hypotheses."""
        return cls(sum(h.log_prob for h in hypotheses), sum(len(h.tokens) + 1 for h in hypotheses),
                   tuple(h.no_speech_prob for h in hypotheses if h.no_speech_prob is not None))

    def __add__(self, other: Confidence) -> Confidence:
        return Confidence(self.log_prob + other.log_prob, self.count + other.count,
                          self.no_speech_probs + other.no_speech_probs)

    @property
    def avg_log_prob(self) -> float:
        """The mean log-prob per token (``average_log_prob`` over the whole input); 0.0 for no window."""
        return self.log_prob / self.count if self.count else 0.0

    @property
    def no_speech_prob(self) -> float | None:
        """The windows' mean no-speech probability; None where the export has no no-speech token."""
        return float(np.mean(self.no_speech_probs)) if self.no_speech_probs else None

    def doubt(self, log_prob_threshold: float = LOG_PROB_THRESHOLD,
              no_speech_threshold: float = NO_SPEECH_THRESHOLD) -> str | None:
        """Why the text is doubtful, in a few words, or None: ``no speech`` by ``silent``'s rule, else ``low
        confidence`` where the mean log-prob per token is below ``log_prob_threshold`` (faster-whisper's
        defaults: -1 and 0.6)."""
        if silent(self.avg_log_prob, self.no_speech_prob, log_prob_threshold, no_speech_threshold):
            return f"no speech (no-speech probability {self.no_speech_prob:.2f} over {no_speech_threshold:g})"
        if self.avg_log_prob < log_prob_threshold:
            return f"low confidence (mean log-prob {self.avg_log_prob:.2f} per token, under {log_prob_threshold:g})"
        return None


def sampling_seed(seed: int, temperature_index: int, candidate: int) -> int:
    """The seed of candidate ``candidate`` at the schedule's ``temperature_index``-th temperature: one
    stream per (seed, temperature, candidate), combined per window with its features (options.py)."""
    return int(np.random.SeedSequence([seed, temperature_index, candidate]).generate_state(1)[0])


class Windows:
    """The window decoder of runtime/timestamps.py's seek loop when a fallback option is on: decodes
    windows with the fallback and carries each input's earlier text (``condition_on_previous_text``)."""

    def __init__(self, search: Search, vocab: Vocabulary, limit: int | None, config: SearchConfig, count: int) -> None:
        self.search, self.vocab, self.limit, self.config = search, vocab, limit, config
        self.tokens: list[list[int]] = [list(config.initial_prompt) for _ in range(count)]
        self.since = [0] * count  # faster-whisper's prompt_reset_since, per input

    def context(self, i: int) -> tuple[int, ...]:
        """The earlier text fed to input ``i``'s next window (its last half-table's worth)."""
        previous = self.tokens[i][self.since[i]:]
        room = (self.limit or 448) // 2 - 1  # openai-whisper's n_text_ctx // 2 - 1 (223 for 448 positions)
        return tuple(previous[-room:]) if room > 0 else ()

    def decode(self, src: np.ndarray, src_len: np.ndarray, config: SearchConfig,
               context: tuple[int, ...]) -> list[Outcome]:
        """Each window's outcome; windows that fail a threshold go again, together, at the next temperature."""
        config = self.window_config(config, context)
        temperatures = config.temperature or (0.0,)
        attempts: list[list[Attempt]] = [[] for _ in range(len(src))]
        pending = list(range(len(src)))
        for index, temperature in enumerate(temperatures):
            found = self.attempt(src[pending], src_len[pending], config, index, temperature)
            still = []
            for row, attempt in zip(pending, found, strict=True):
                attempts[row].append(attempt)
                if needs_fallback(attempt, config):
                    still.append(row)
            pending = still
            if not pending:
                break
        outcomes = []
        for row, tried in enumerate(attempts):
            if row in pending:  # every temperature failed: the best log-prob, under the compression threshold if any
                threshold = config.compression_ratio_threshold
                below = [a for a in tried if threshold is not None and a.compression_ratio <= threshold]
                kept = max(below or tried, key=lambda a: a.avg_log_prob)
                temperature = tried[-1].temperature
            else:
                kept, temperature = tried[-1], tried[-1].temperature
            outcomes.append(Outcome(kept, tuple(tried), temperature, is_silence(kept, config)))
        return outcomes

    def window_config(self, config: SearchConfig, context: tuple[int, ...]) -> SearchConfig:
        """``config`` for a window fed ``context`` as its earlier text: ``max_len`` within the positions
        left after it, as resolve counts a prompt's (the carrying itself is this object's)."""
        config = replace(config, initial_prompt=(), prompt=context, condition_on_previous_text=False)
        if context and self.limit is not None:
            room = self.limit - (1 + len(context)) - len(config.decoder_prompt) - 1
            config = replace(config, max_len=max(1, min(config.max_len, room)), min_len=0)
        return config

    def attempt(self, src: np.ndarray, src_len: np.ndarray, config: SearchConfig, index: int,
                 temperature: float) -> list[Attempt]:
        """One decode of every window at ``temperature``: the configured search at 0, else ``best_of``
        draws from the whole vocabulary at that temperature, each window keeping its best-scored."""
        if temperature <= 0:
            best = [hyps[0] for hyps in self.search(src, src_len, config)]
        else:
            best: list[Hypothesis] = []
            for candidate in range(config.best_of):
                sampled = replace(config, beam_size=1, n_best=1, sampling_topk=0, sampling_topp=1.0,
                                  sampling_temperature=temperature,
                                  seed=sampling_seed(config.seed, index, candidate))
                found = [hyps[0] for hyps in self.search(src, src_len, sampled)]
                best = found if not best else [h if h.score > b.score else b for h, b in zip(found, best, strict=True)]
        return [Attempt(temperature, h, average_log_prob(h), compression_ratio(self.text(h.tokens))) for h in best]

    def text(self, tokens: Sequence[int]) -> str:
        """A window's text as the thresholds read it: its hidden ids (timestamps) dropped, the rest
        detokenised together and stripped, as ``tokenizer.decode(tokens).strip()`` in both peers."""
        hidden = set(self.vocab.hidden)
        return self.vocab.decode([token for token in tokens if token not in hidden]).strip()

    def update(self, i: int, pieces: Sequence[tuple[float, float, tuple[int, ...]]], outcome: Outcome) -> None:
        """Input ``i``'s window kept ``pieces`` (start, end, tokens): their tokens join its earlier
        text where a piece has text and a duration (faster-whisper yields no other; a piece ending in
        two timestamps, ``generate``'s last, loses the second, as faster-whisper cuts it), and the text
        starts afresh after it unless carried at a temperature up to ``prompt_reset_on_temperature``."""
        begin = self.config.timestamp_begin if self.config.timestamps else -1
        for start, end, tokens in pieces:
            if begin > 0 and len(tokens) > 1 and min(tokens[-2:]) >= begin:
                tokens = tokens[:-1]  # generate keeps a window's last pair whole; their segment ends at its first
            if start != end and self.vocab.decode(tokens).strip():
                self.tokens[i] += tokens
        if not self.config.condition_on_previous_text or outcome.temperature > self.config.prompt_reset_on_temperature:
            self.since[i] = len(self.tokens[i])
