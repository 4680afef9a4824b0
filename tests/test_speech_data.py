"""The speech demo's data: held-out voices stay out of training, and a shard reads back exactly
what the front end computes. Synthesis needs espeak-ng, which only these tests and the data
maker use; without it they skip."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest

from s2s_deploy.errors import S2SError
from s2s_deploy.frontends import WhisperLogMel

speech_data = pytest.importorskip("s2s_deploy.train.speech_data", reason="the built-in tasks need the eval extra")
needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")


def test_the_test_split_is_read_only_by_held_out_voices_and_speeds() -> None:
    plan = speech_data.SpeechPlan()
    for name in ("accents", "variants", "speeds"):
        assert not set(getattr(plan.train, name)) & set(getattr(plan.test, name)), name
        assert plan.held_out()[name] == sorted(getattr(plan.test, name))
    pairs = [speech_data.Pair(f"{n} days", f"{n} jours") for n in range(3000)]
    test = speech_data.plan_split(pairs, "test", plan, seed=0)
    assert {u.accent for u in test} == set(plan.test.accents) and {u.speed for u in test} == set(plan.test.speeds)
    assert {u.variant for u in speech_data.plan_split(pairs, "valid", plan, 0)} == set(plan.train.variants)
    assert speech_data.plan_split(pairs, "test", plan, seed=0) == test != speech_data.plan_split(pairs, "test", plan, 1)


def test_trailing_padding_frames_are_dropped_and_restored() -> None:
    frontend = WhisperLogMel(chunk_length=1)
    features = frontend(np.sin(np.arange(4000) / 5.0).astype(np.float32))  # a quarter of the window
    kept, floor = speech_data.trimmed(features)
    assert 25 <= kept.shape[1] < 30 and floor == features.min()
    assert (features[:, kept.shape[1] :] == floor).all()


@needs_espeak
def test_a_small_dataset_reads_back_what_the_front_end_computes(tmp_path: Path) -> None:
    config = speech_data.SpeechDataConfig(
        sizes={"train": 3, "valid": 1, "test": 2}, shard_size=2, frontend=WhisperLogMel(chunk_length=8)
    )
    lines: list[str] = []
    metadata = speech_data.make_speech_data(tmp_path, config, report=lines.append)
    assert [len(metadata["splits"][s]["shards"]) for s in ("train", "valid", "test")] == [2, 1, 1]
    assert metadata["held_out_for_test"]["speeds"] == [140, 185] and len(lines) == 4
    shards = speech_data.read_split(tmp_path, "train")
    assert [len(shard) for shard in shards] == [2, 1]
    for shard in [*shards, *speech_data.read_split(tmp_path, "test")]:
        for index in range(len(shard)):
            utterance = shard.utterance(index)
            expected = config.frontend(speech_data.synthesise(utterance, 16000))
            np.testing.assert_array_equal(shard.features(index), expected)
    written = {path: path.stat().st_mtime_ns for path in tmp_path.glob("*.npz")}
    assert speech_data.make_speech_data(tmp_path, config, report=lines.append) == metadata and len(lines) == 4
    assert {path: path.stat().st_mtime_ns for path in tmp_path.glob("*.npz")} == written
    with pytest.raises(S2SError, match="made with other settings"):
        speech_data.make_speech_data(tmp_path, dataclasses.replace(config, seed=1))


@needs_espeak
def test_a_voice_espeak_ng_lacks_is_refused() -> None:
    plan = speech_data.SpeechPlan(test=speech_data.Voices(accents=("en-xx",), variants=("m4",), speeds=(140,)))
    with pytest.raises(S2SError, match="espeak-ng has no voice en-xx"):
        speech_data.check_voices(plan)
