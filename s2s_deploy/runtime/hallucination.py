"""``hallucination_silence_threshold``: faster-whisper 1.2.1's word timing and its skip of the silence
before a possible hallucination, in the seek loop (runtime/timestamps.py), window by window.

With the option on, each decoded window is read as faster-whisper's ``generate_segments`` reads it with
``word_timestamps=True``: its tokens cut into segments (``_split_segments_by_timestamps``); its text
tokens aligned (runtime/align.py, CTranslate2's ``align``) and grouped into words
(``split_to_word_tokens``: at spaces and punctuation, or at whole characters for zh, ja, th, lo, my and
yue), a word's probability the mean of its tokens'; words longer than twice the median (at most 0.7 s)
clipped at sentence ends, punctuation merged into the neighbouring word, the first words after a pause
clipped, and the segment times replaced by their first and last words' (``add_word_timestamps``); the
next window starts at the last word's end unless the window ends in a lone timestamp. Then the rule
(docs/decoding.md): a word's anomaly score is 1 if its probability is under 0.15, plus
``15 * (0.133 - duration)`` if shorter than 0.133 s, plus ``duration - 2`` if longer than 2 s; a
segment is an anomaly when the score of its first 8 words (punctuation left out) is at least 3 or
within 0.01 of their count. A window whose first worded segment is an anomaly more than the threshold
after the window's start is decoded again from that segment's start; an anomaly with silence (more
than the threshold, or the input's or the window's first 2 s) before it and silence, another anomaly
or the window's last 2 s after it is dropped with the segments after it, and the next window starts
at it (at least 1 s on). Imports numpy only.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from s2s_deploy.format.vocab import Vocabulary
from s2s_deploy.runtime.align import align
from s2s_deploy.runtime.backend import Backend
from s2s_deploy.runtime.decoding import SearchConfig

PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
"""faster-whisper's ``prepend_punctuations`` and ``append_punctuations`` defaults."""
PUNCTUATION = "\"'“¿([{-\"'.。,，!！?？:：”)]}、"
"""The characters ``generate_segments`` leaves out of a segment's anomaly score."""
SENTENCE_END_MARKS = ".。!！?？"
UNICODE_LANGUAGES = {"zh", "ja", "th", "lo", "my", "yue"}
"""Languages whose words are split at whole characters, not spaces."""


@dataclass(frozen=True)
class TimedWord:
    """One word as faster-whisper times it: seconds from the input's start, and its probability."""

    start: float
    end: float
    word: str
    probability: float


@dataclass(frozen=True)
class Kept:
    """A window's outcome under the rule: its segments (start, end, tokens, words), where the next window
    starts, and whether the window was dropped whole (decoded again from a later start)."""

    segments: tuple[tuple[float, float, tuple[int, ...], tuple[TimedWord, ...]], ...]
    seek: int
    again: bool


class WordTiming:
    """faster-whisper's word timing and silence skip for ``count`` inputs (each keeps its last speech end)."""

    def __init__(self, backend: Backend, vocab: Vocabulary, config: SearchConfig, count: int) -> None:
        self.backend, self.vocab, self.config = backend, vocab, config
        self.threshold = config.hallucination_silence_threshold
        self.last_speech = [0.0] * count
        self.frames_per_second = config.timestamp_frames / config.time_precision

    def window(self, i: int, features: np.ndarray, prompt: Sequence[int], tokens: Sequence[int], seek: int,
               frames: int, window: int, content: int) -> Kept:
        """Input ``i``'s window at ``seek`` (``frames`` of audio of the ``window`` its ``features`` hold;
        ``content``: the input's frames), decoded as ``tokens`` after the decoder ``prompt``."""
        per_frame = 1 / self.frames_per_second
        time_offset = seek * per_frame
        window_end_time = float((seek + window) * per_frame)
        segment_duration = frames * per_frame
        content_duration = float(content * per_frame)
        previous_seek = seek
        segments, seek, single_ending = self.split(list(tokens), time_offset, frames, segment_duration, seek)
        language = next((self.vocab.code_of(t) for t in prompt if t in self.vocab.languages), "")
        sot_sequence = [self.backend.decoder_start_id, *(t for t in prompt if t != self.config.timestamp_begin - 1)]
        self.add_word_timestamps(segments, features, sot_sequence, frames, language, self.last_speech[i])
        if not single_ending:
            last_word_end = get_end(segments)
            if last_word_end is not None and last_word_end > time_offset:
                seek = round(last_word_end * self.frames_per_second)
        threshold = self.threshold
        first_segment = next_words_segment(segments)
        if first_segment is not None and is_segment_anomaly(first_segment):
            gap = first_segment["start"] - time_offset
            if gap > threshold:
                return Kept((), previous_seek + round(gap * self.frames_per_second), True)
        hal_last_end = self.last_speech[i]
        for si in range(len(segments)):
            segment = segments[si]
            if not segment["words"]:
                continue
            if is_segment_anomaly(segment):
                next_segment = next_words_segment(segments[si + 1:])
                hal_next_start = next_segment["words"][0]["start"] if next_segment is not None else (
                    time_offset + segment_duration)
                silence_before = (segment["start"] - hal_last_end > threshold or segment["start"] < threshold
                                  or segment["start"] - time_offset < 2.0)
                silence_after = (hal_next_start - segment["end"] > threshold or is_segment_anomaly(next_segment)
                                 or window_end_time - segment["end"] < 2.0)
                if silence_before and silence_after:
                    seek = round(max(time_offset + 1, segment["start"]) * self.frames_per_second)
                    if content_duration - segment["end"] < threshold:
                        seek = content
                    segments[si:] = []
                    break
            hal_last_end = segment["end"]
        last_word_end = get_end(segments)
        if last_word_end is not None:
            self.last_speech[i] = last_word_end
        return Kept(tuple((float(s["start"]), float(s["end"]), tuple(s["tokens"]),
                           tuple(TimedWord(float(w["start"]), float(w["end"]), w["word"], float(w["probability"]))
                                 for w in s["words"]))
                          for s in segments), seek, False)

    def split(self, tokens: list[int], time_offset: float, segment_size: int, segment_duration: float,
              seek: int) -> tuple[list[dict[str, Any]], int, bool]:
        """``_split_segments_by_timestamps``: the window's segments, the next seek, and whether it ends in a
        lone timestamp."""
        begin, precision, stride = self.config.timestamp_begin, self.config.time_precision, self.config.timestamp_frames
        stamp = begin >= 1
        single_ending = stamp and len(tokens) >= 2 and tokens[-2] < begin <= tokens[-1]
        consecutive = [i for i in range(len(tokens)) if stamp and i > 0 and tokens[i] >= begin
                       and tokens[i - 1] >= begin]
        segments = []
        if consecutive:
            slices = list(consecutive)
            if single_ending:
                slices.append(len(tokens))
            last_slice = 0
            for current_slice in slices:
                sliced = tokens[last_slice:current_slice]
                segments.append({"seek": seek, "start": time_offset + (sliced[0] - begin) * precision,
                                 "end": time_offset + (sliced[-1] - begin) * precision, "tokens": sliced})
                last_slice = current_slice
            seek += segment_size if single_ending else (tokens[last_slice - 1] - begin) * stride
        else:
            duration = segment_duration
            stamps = [t for t in tokens if stamp and t >= begin]
            if stamps and stamps[-1] != begin:
                duration = (stamps[-1] - begin) * precision
            segments.append({"seek": seek, "start": time_offset, "end": time_offset + duration, "tokens": tokens})
            seek += segment_size
        return segments, seek, single_ending

    def add_word_timestamps(self, segments: list[dict[str, Any]], features: np.ndarray, sot_sequence: list[int],
                            num_frames: int, language: str, last_speech_timestamp: float) -> None:
        """faster-whisper's ``add_word_timestamps`` for one window's segments (words set on each, times moved)."""
        eot = self.vocab.eos_id
        per_segment = [[t for t in s["tokens"] if t < eot] for s in segments]
        text_tokens = [t for tokens in per_segment for t in tokens]
        alignment = self.find_alignment(features, sot_sequence, text_tokens, num_frames, language)
        durations = np.array([w["end"] - w["start"] for w in alignment])
        durations = durations[durations.nonzero()]
        median_duration = min(0.7, float(np.median(durations) if len(durations) > 0 else 0.0))
        max_duration = median_duration * 2
        if len(durations) > 0:  # words at sentence boundaries no longer than twice the median
            for i in range(1, len(alignment)):
                if alignment[i]["end"] - alignment[i]["start"] > max_duration:
                    if alignment[i]["word"] in SENTENCE_END_MARKS:
                        alignment[i]["end"] = alignment[i]["start"] + max_duration
                    elif alignment[i - 1]["word"] in SENTENCE_END_MARKS:
                        alignment[i]["start"] = alignment[i]["end"] - max_duration
        merge_punctuations(alignment, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS)
        word_index = 0
        time_offset = segments[0]["seek"] / self.frames_per_second
        for subsegment, tokens in zip(segments, per_segment, strict=True):
            saved_tokens = 0
            words = []
            while word_index < len(alignment) and saved_tokens < len(tokens):
                timing = alignment[word_index]
                if timing["word"]:
                    words.append({"word": timing["word"], "start": round(time_offset + timing["start"], 2),
                                  "end": round(time_offset + timing["end"], 2), "probability": timing["probability"]})
                saved_tokens += len(timing["tokens"])
                word_index += 1
            if words:
                if words[0]["end"] - last_speech_timestamp > median_duration * 4 and (
                        words[0]["end"] - words[0]["start"] > max_duration
                        or (len(words) > 1 and words[1]["end"] - words[0]["start"] > max_duration * 2)):
                    if len(words) > 1 and words[1]["end"] - words[1]["start"] > max_duration:
                        boundary = max(words[1]["end"] / 2, words[1]["end"] - max_duration)
                        words[0]["end"] = words[1]["start"] = boundary
                    words[0]["start"] = max(0, words[0]["end"] - max_duration)
                if subsegment["start"] < words[0]["end"] and subsegment["start"] - 0.5 > words[0]["start"]:
                    words[0]["start"] = max(0, min(words[0]["end"] - median_duration, subsegment["start"]))
                else:
                    subsegment["start"] = words[0]["start"]
                if subsegment["end"] > words[-1]["start"] and subsegment["end"] + 0.5 < words[-1]["end"]:
                    words[-1]["end"] = max(words[-1]["start"] + median_duration, subsegment["end"])
                else:
                    subsegment["end"] = words[-1]["end"]
                last_speech_timestamp = subsegment["end"]
            subsegment["words"] = words

    def find_alignment(self, features: np.ndarray, sot_sequence: list[int], text_tokens: list[int],
                       num_frames: int, language: str) -> list[dict[str, Any]]:
        """faster-whisper's ``find_alignment``: the words of ``text_tokens`` with their times (seconds from
        the window's start), tokens and probabilities."""
        if not text_tokens:
            return []
        found = align(self.backend, features[None], sot_sequence, [text_tokens], num_frames,
                      self.config.timestamp_begin - 1)[0]
        words, word_tokens = self.split_to_word_tokens([*text_tokens, self.vocab.eos_id], language)
        if len(word_tokens) <= 1:
            return []
        boundaries = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
        text_indices = np.array([pair[0] for pair in found.alignments])
        time_indices = np.array([pair[1] for pair in found.alignments])
        jumps = np.pad(np.diff(text_indices), (1, 0), constant_values=1).astype(bool)
        jump_times = time_indices[jumps] / (1 / self.config.time_precision)
        probs = found.text_token_probs
        return [{"word": word, "tokens": tokens, "start": start, "end": end, "probability": probability}
                for word, tokens, start, end, probability in zip(
                    words, word_tokens, jump_times[boundaries[:-1]], jump_times[boundaries[1:]],
                    [np.mean(probs[i:j]) for i, j in pairwise(boundaries)],
                    strict=False)]

    def decode(self, tokens: list[int]) -> str:
        """faster-whisper's ``decode_with_timestamps`` of text tokens (special ids decode to nothing)."""
        return self.vocab.decode(tokens)

    def split_to_word_tokens(self, tokens: list[int], language: str) -> tuple[list[str], list[list[int]]]:
        """faster-whisper's ``split_to_word_tokens``."""
        subwords, subword_tokens = self.split_on_unicode(tokens)
        if language in UNICODE_LANGUAGES:
            return subwords, subword_tokens
        words: list[str] = []
        word_tokens: list[list[int]] = []
        for subword, pieces in zip(subwords, subword_tokens, strict=True):
            special = pieces[0] >= self.vocab.eos_id
            with_space = subword.startswith(" ")
            punctuation = subword.strip() in string.punctuation
            if special or with_space or punctuation or len(words) == 0:
                words.append(subword)
                word_tokens.append(pieces)
            else:
                words[-1] = words[-1] + subword
                word_tokens[-1].extend(pieces)
        return words, word_tokens

    def split_on_unicode(self, tokens: list[int]) -> tuple[list[str], list[list[int]]]:
        """faster-whisper's ``split_tokens_on_unicode``: a word ends where its tokens decode whole."""
        decoded_full = self.decode(tokens)
        replacement = "\ufffd"
        words: list[str] = []
        word_tokens: list[list[int]] = []
        current: list[int] = []
        unicode_offset = 0
        for token in tokens:
            current.append(token)
            decoded = self.decode(current)
            index = decoded.find(replacement)
            position = index + unicode_offset if index >= 0 else None
            if position is None or (position < len(decoded_full) and decoded_full[position] == replacement):
                words.append(decoded)
                word_tokens.append(current)
                current = []
                unicode_offset += len(decoded)
        return words, word_tokens


def merge_punctuations(alignment: list[dict[str, Any]], prepended: str, appended: str) -> None:
    """faster-whisper's ``merge_punctuations``: opening marks join the next word, closing ones the last."""
    i, j = len(alignment) - 2, len(alignment) - 1
    while i >= 0:
        previous, following = alignment[i], alignment[j]
        if previous["word"].startswith(" ") and previous["word"].strip() in prepended:
            following["word"] = previous["word"] + following["word"]
            following["tokens"] = previous["tokens"] + following["tokens"]
            previous["word"], previous["tokens"] = "", []
        else:
            j = i
        i -= 1
    i, j = 0, 1
    while j < len(alignment):
        previous, following = alignment[i], alignment[j]
        if not previous["word"].endswith(" ") and following["word"] in appended:
            previous["word"] = previous["word"] + following["word"]
            previous["tokens"] = previous["tokens"] + following["tokens"]
            following["word"], following["tokens"] = "", []
        else:
            i = j
        j += 1


def get_end(segments: list[dict[str, Any]]) -> float | None:
    """The last word's end, else the last segment's end, else None (faster-whisper's ``get_end``)."""
    return next((w["end"] for s in reversed(segments) for w in reversed(s["words"])),
                segments[-1]["end"] if segments else None)


def word_anomaly_score(word: dict[str, Any]) -> float:
    """How unlike speech a word is: improbable, very short or very long."""
    probability = word.get("probability", 0.0)
    duration = word["end"] - word["start"]
    score = 0.0
    if probability < 0.15:
        score += 1.0
    if duration < 0.133:
        score += (0.133 - duration) * 15
    if duration > 2.0:
        score += duration - 2.0
    return score


def is_segment_anomaly(segment: dict[str, Any] | None) -> bool:
    """Whether a segment's first 8 words (punctuation left out) look hallucinated."""
    if segment is None or not segment["words"]:
        return False
    words = [w for w in segment["words"] if w["word"] not in PUNCTUATION][:8]
    score = sum(word_anomaly_score(w) for w in words)
    return score >= 3 or score + 0.01 >= len(words)


def next_words_segment(segments: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first segment that has words."""
    return next((s for s in segments if s["words"]), None)
