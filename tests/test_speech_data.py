"""The speech demo's data and training: held-out voices stay out of training, a shard reads back exactly
what the front end computes, a run can start from a checkpoint. Synthesis needs espeak-ng, which only
the tests that say so and the data maker use; without it they skip."""

from __future__ import annotations

import dataclasses
import json
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


def test_a_speech_run_starts_from_a_checkpoints_weights_and_refuses_one_that_does_not_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``train_speech(init=...)`` (``train --init``): the run begins at the checkpoint's weights (with a
    vanishing learning rate it ends there) and records where it began; ``every_epoch`` keeps each
    epoch's weights beside the best; weights of another shape, and
    ``--init`` on a text task, are refused in one line."""
    torch = pytest.importorskip("torch")
    from click.testing import CliRunner

    from s2s_deploy.cli import main
    from s2s_deploy.format.files import sha256_of
    from s2s_deploy.modeling.checkpoint import load_checkpoint
    from s2s_deploy.train.speech import train_speech
    from s2s_deploy.train.trainer import TrainConfig
    from s2s_deploy_plugins.speech import PLUGIN

    tiny = PLUGIN.preset("tiny")
    frontend = tiny.frontend
    monkeypatch.setattr(speech_data, "synthesise", lambda utterance, rate: np.random.default_rng(
        len(utterance.source)).standard_normal(rate // 2).astype(np.float32) * 0.1)
    splits = {"train": ["one day", "two days", "three days"], "valid": ["four days", "five days"]}
    metadata = {"task": "en-fr", "seed": 0, "frontend": frontend.to_json(), "splits": {}}
    for split, sources in splits.items():
        utterances = [speech_data.Utterance(s, s.replace("day", "jour"), "en-us", "m1", 175, 50) for s in sources]
        shard = speech_data.write_shard(tmp_path / f"{split}-00000.npz", utterances, frontend)
        metadata["splits"][split] = {"count": len(sources), "shards": [shard]}
    (tmp_path / "metadata.json").write_text(json.dumps(metadata))
    cfg = TrainConfig(epochs=1, batch_size=2, lr=1e-3, warmup_steps=1, seed=0, threads=1)
    first = train_speech(PLUGIN, tiny, tmp_path, dataclasses.replace(cfg, epochs=2), tmp_path / "a.safetensors",
                         every_epoch=True, log=lambda line: None)
    kept = {epoch: load_checkpoint(tmp_path / f"a-epoch{epoch}.safetensors") for epoch in (1, 2)}
    assert [kept[epoch].info["epoch"] for epoch in (1, 2)] == [1, 2]
    assert any(not torch.equal(kept[1].tensors[name], kept[2].tensors[name]) for name in kept[1].tensors)
    best = load_checkpoint(first.checkpoint)
    for name, tensor in kept[first.best_epoch].tensors.items():
        assert torch.equal(best.tensors[name], tensor)
    still = dataclasses.replace(cfg, lr=1e-12, seed=1)
    train_speech(PLUGIN, tiny, tmp_path, still, tmp_path / "b.safetensors", init=first.checkpoint,
                 log=lambda line: None)
    a, b = load_checkpoint(first.checkpoint), load_checkpoint(tmp_path / "b.safetensors")
    assert b.info["initialised_from"]["sha256"] == sha256_of(first.checkpoint)
    assert a.tensors.keys() == b.tensors.keys()
    for name, tensor in a.tensors.items():
        torch.testing.assert_close(b.tensors[name], tensor, rtol=0, atol=1e-6)
    wider = dataclasses.replace(tiny, d_model=48)
    with pytest.raises(S2SError, match="its weights do not fit this config"):
        train_speech(PLUGIN, wider, tmp_path, cfg, tmp_path / "c.safetensors", init=first.checkpoint)
    result = CliRunner().invoke(main, ["train", "--arch", "transformer", "--init", str(first.checkpoint)])
    assert result.exit_code == 1 and result.output.count("\n") == 1 and "--init" in result.output, result.output
