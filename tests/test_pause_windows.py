"""Long audio for an export without timestamp tokens is read in windows that end at pauses
(runtime/pauses.py), not at fixed offsets: no model here, features of made-up speech."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from s2s_deploy.errors import S2SError
from s2s_deploy.frontends import WhisperLogMel
from s2s_deploy.runtime.decoding import plain
from s2s_deploy.runtime.pauses import SEARCH, pause_windows
from s2s_deploy.runtime.search import Hypothesis
from s2s_deploy.runtime.timestamps import seek_windows

RATE, HOP, WINDOW = 16000, 160, 800


def talk(seconds: float, seed: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """``seconds`` of word-like bursts (voiced harmonics with a noisy onset, 0.25-0.9 s) separated by
    pauses of 0.12-0.5 s under faint noise, and the pauses as (first, last) frames."""
    rng = np.random.default_rng(seed)
    audio = [rng.standard_normal(int(0.3 * RATE)) * 1e-4]
    pauses, at = [], len(audio[0])
    while at < seconds * RATE:
        n = int(RATE * rng.uniform(0.25, 0.9))
        t = np.arange(n) / RATE
        pitch = rng.uniform(90, 250)
        word = sum(np.sin(2 * np.pi * k * pitch * t) / k for k in range(1, 12)) * np.hanning(n) ** 0.3 * 0.3
        word[: n // 8] += rng.standard_normal(n // 8) * 0.05
        gap = rng.standard_normal(int(RATE * rng.uniform(0.12, 0.5))) * 1e-4
        audio += [word, gap]
        pauses.append(((at + n) // HOP + 1, (at + n + len(gap)) // HOP - 1))
        at += n + len(gap)
    return np.concatenate(audio).astype(np.float32), pauses


def test_a_long_clip_is_cut_in_its_pauses_never_in_a_word() -> None:
    audio, pauses = talk(75, 0)
    features = WhisperLogMel(chunk_length=8).whole(audio)
    ends = pause_windows(features, WINDOW)
    assert ends[-1] == features.shape[-1] and len(ends) >= 10
    starts = [0, *ends[:-1]]
    for start, end in zip(starts, ends, strict=True):
        assert end - start <= WINDOW
    for start, end in zip(starts[:-1], ends[:-1], strict=True):
        assert end - start >= WINDOW * (1 - SEARCH)
        assert any(first <= end <= last for first, last in pauses), f"cut at frame {end}, inside a word"
    in_words = [k * WINDOW for k in range(1, len(ends)) if not any(a <= k * WINDOW <= b for a, b in pauses)]
    assert in_words, "fixed 8-s offsets would have missed every word: the clip does not test the rule"


def test_a_clip_within_one_window_is_one_window() -> None:
    audio, _ = talk(5, 1)
    features = WhisperLogMel(chunk_length=8).whole(audio)
    assert pause_windows(features, WINDOW) == [features.shape[-1]]


def test_the_search_reads_the_windows_it_is_given_padded_with_the_inputs_silence() -> None:
    """seek_windows with ``ends``: each window holds exactly its frames, the rest is the input's lowest
    value, and the text of every window comes back in order; with timestamps it is refused."""
    audio, _ = talk(30, 2)
    features = WhisperLogMel(chunk_length=8).whole(audio)
    ends = pause_windows(features, WINDOW)
    seen: list[np.ndarray] = []

    def search(src: np.ndarray, src_len: np.ndarray, config: object) -> list[list[Hypothesis]]:
        seen.extend(src)
        return [[Hypothesis((len(seen),), (0.0,), 0.0, True)] for _ in src]

    config = plain(1, 8)
    (sought,) = seek_windows([features], WINDOW, search, config, ends=[ends])
    assert sought.tokens == tuple(range(1, len(ends) + 1))
    for batch, start, end in zip(seen, [0, *ends[:-1]], ends, strict=True):
        np.testing.assert_array_equal(batch[..., : end - start], features[..., start:end])
        assert (batch[..., end - start:] == features.min()).all()
    with pytest.raises(S2SError, match="without timestamps"):
        seek_windows([features], WINDOW, search, dataclasses.replace(config, timestamps=True), ends=[ends])


@pytest.mark.parametrize("piece", [1, 137, 5000])
def test_streamed_features_are_cut_where_the_whole_clip_is(piece: int) -> None:
    """A long file's features made window by window (frontends/frames.py) give the same cuts as the
    whole array: the search reads only the frames near each window's end, in order."""
    from s2s_deploy.frontends.frames import StreamedFeatures

    audio, _ = talk(40, 3)
    features = WhisperLogMel(chunk_length=8).whole(audio)
    streamed = StreamedFeatures(lambda: (features[..., i:i + piece] for i in range(0, features.shape[-1], piece)),
                                features.shape)
    assert pause_windows(streamed, WINDOW) == pause_windows(features, WINDOW)
