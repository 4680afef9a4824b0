"""The bundled speech model's new data: natural phrasings of the task's values, non-speech clips whose
transcript is empty, effects on training speech, and fine-tuning on phrasings the start never saw.
No espeak-ng and no export here: seconds."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import numpy as np
import pytest

from s2s_deploy.errors import S2SError

natural = pytest.importorskip("s2s_deploy.train.natural", reason="the built-in tasks need the eval extra")
pytest.importorskip("babel")
pytest.importorskip("num2words")
from s2s_deploy.train import speech_data  # noqa: E402
from s2s_deploy.train.tasks import Pair, generate_pairs  # noqa: E402

FRENCH_WEEKDAYS = ("lundi", "mardi", "mercredi", "jeudi", "vendredi", "samedi", "dimanche")


def test_years_are_said_as_people_say_them() -> None:
    rng = random.Random(0)
    assert {natural.year_words(1984, rng) for _ in range(50)} == {"nineteen eighty-four"}
    assert {natural.year_words(2000, rng) for _ in range(20)} == {"two thousand"}
    assert {natural.year_words(1905, rng) for _ in range(50)} == {"nineteen oh five", "nineteen hundred and five"}
    said_2021 = {natural.year_words(2021, rng) for _ in range(80)}
    assert "twenty twenty-one" in said_2021 and said_2021 <= {
        "twenty twenty-one", "two thousand and twenty-one", "two thousand twenty-one"}
    assert {natural.year_words(2005, rng) for _ in range(50)} == {"two thousand and five", "two thousand five"}


def test_natural_phrasings_keep_the_tasks_targets_and_differ_from_its_sources() -> None:
    """Same seed, same pairs; distinct sources; none from ``exclude``; a weekday said gives the weekday
    written; every target is one the task's own French writes (checked by its characters and forms)."""
    generated = generate_pairs("en-fr", 3000, 0)
    exclude = frozenset(p.source for p in generated)
    pairs = natural.natural_pairs("en-fr", 600, 0, exclude=exclude)
    assert pairs == natural.natural_pairs("en-fr", 600, 0, exclude=exclude)
    assert len({p.source for p in pairs}) == 600 and not exclude & {p.source for p in pairs}
    task_chars = {ch for p in generated for ch in p.target}
    assert {ch for p in pairs for ch in p.target} <= task_chars
    for pair in pairs:
        said_weekday = pair.source.split(",")[0].split(" ")[0] in natural.WEEKDAYS
        assert said_weekday == pair.target.startswith(FRENCH_WEEKDAYS), pair
    sources = " ".join(p.source for p in pairs)
    for spoken in (" of ", " the ", "teen ", " oh ", "a hundred", "a week"):
        assert spoken in sources, spoken


@pytest.mark.parametrize("kind", speech_data.NONSPEECH)
def test_every_nonspeech_kind_is_a_bounded_clip_drawn_from_its_seed(kind: str) -> None:
    clip = speech_data.nonspeech(kind, 7, 16000, 8.0)
    assert clip.dtype == np.float32 and np.isfinite(clip).all() and np.abs(clip).max() <= 1.0
    assert 0.5 * 16000 <= len(clip) <= 8 * 16000
    np.testing.assert_array_equal(clip, speech_data.nonspeech(kind, 7, 16000, 8.0))
    assert not np.array_equal(clip, speech_data.nonspeech(kind, 8, 16000, 8.0)) or kind == "silence"


def test_effects_keep_speech_in_range_and_change_it() -> None:
    rng = np.random.default_rng(0)
    speech = (np.sin(np.arange(16000) / 7) * 0.5 + rng.standard_normal(16000) * 0.01).astype(np.float32)
    for effect in speech_data.EFFECTS:
        out = speech_data.apply_effect(speech, effect, 3, 16000)
        assert out.shape == speech.shape and out.dtype == np.float32 and np.abs(out).max() <= 1.0
        assert not np.allclose(out, speech), effect
    with pytest.raises(S2SError, match="unknown effect"):
        speech_data.apply_effect(speech, "chorus", 3, 16000)


def test_added_clips_leave_each_splits_speech_and_the_held_out_splits_as_they_were() -> None:
    """The speech of a split keeps its voices whatever is added; held-out splits get no effects; the
    non-speech clips have empty targets and are mixed through the training split."""
    pairs = [Pair(f"{n} days", f"{n} jours") for n in range(200)]
    plan = speech_data.SpeechPlan()
    augment = speech_data.Augment(speech=0.5, nonspeech={"train": 40, "nonspeech": 12})
    for split in ("train", "test", "natural"):
        plain = speech_data.plan_split(pairs, split, plan, 0)
        added = speech_data.plan_split(pairs, split, plan, 0, augment)
        speech = [u for u in added if u.source]
        assert sorted((u.source, u.voice, u.speed, u.pitch) for u in speech) == sorted(
            (u.source, u.voice, u.speed, u.pitch) for u in plain)
        effects = {u.effect for u in speech}
        assert effects == ({""} if split in speech_data.HELD_OUT_SPLITS else {"", *speech_data.EFFECTS})
    train = speech_data.plan_split(pairs, "train", plan, 0, augment)
    silent = [i for i, u in enumerate(train) if not u.source]
    assert len(silent) == 40 and all(train[i].target == "" for i in silent) and silent[-1] - silent[0] > 100
    held = speech_data.plan_split([], "nonspeech", plan, 0, augment)
    assert len(held) == 12 and {u.variant for u in held} == set(speech_data.NONSPEECH)


def test_a_fine_tune_keeps_the_starts_vocabularies_and_refuses_a_target_it_cannot_write() -> None:
    pytest.importorskip("torch")
    from s2s_deploy.train.speech import _vocabularies_of

    start = Path(__file__).resolve().parents[1] / "plugins" / "checkpoints" / "speech.safetensors"
    src, tgt = _vocabularies_of(start, ["3 mars 2021", ""])
    assert "é" in tgt.tokens and "," in src.tokens
    with pytest.raises(S2SError, match="'Sß', which its target vocabulary lacks"):
        _vocabularies_of(start, ["3 mars 2021", "Straße"])


def test_a_joined_clip_keeps_the_sentences_that_fit_its_window_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two or three sentences read in turn with pauses between; those past the window are left out of
    the audio and the target alike, so a target never names what the clip does not hold."""
    from s2s_deploy.frontends import WhisperLogMel

    seconds = {"one": 3.0, "two": 2.5, "three": 4.0}
    monkeypatch.setattr(speech_data, "synthesise", lambda u, rate: np.full(int(seconds[u.source] * rate), 0.1,
                                                                               dtype=np.float32))
    frontend = WhisperLogMel(chunk_length=8)
    utterance = speech_data.Utterance(speech_data.JOIN.join(seconds), speech_data.JOIN.join(["un", "deux", "trois"]),
                                      "en-us", "m1", 175, 50)
    audio, held = speech_data.render(utterance, frontend)
    assert (held.source, held.target) == ("one | two", "un deux")
    gap = len(audio) - int(5.5 * 16000)
    assert 0.2 * 16000 <= gap <= 0.8 * 16000 and not audio[48000:48000 + gap].any()
    again, _ = speech_data.render(utterance, frontend)
    np.testing.assert_array_equal(audio, again)
    alone = speech_data.Utterance("three", "trois", "en-us", "m1", 175, 50)
    assert speech_data.render(alone, frontend)[1] == alone


def test_a_run_scores_every_held_out_split_and_records_each(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """After training, the kept checkpoint is scored on test, natural and nonspeech (whichever the
    dataset has), each logged and recorded in its info; non-speech is reported as the empty share."""
    pytest.importorskip("torch")
    from s2s_deploy.modeling.checkpoint import load_checkpoint
    from s2s_deploy.train.speech import train_speech
    from s2s_deploy.train.trainer import TrainConfig
    from s2s_deploy_plugins.speech import PLUGIN

    tiny = PLUGIN.preset("tiny")
    frontend = tiny.frontend
    monkeypatch.setattr(speech_data, "synthesise", lambda u, rate: np.random.default_rng(
        len(u.source)).standard_normal(rate // 2).astype(np.float32) * 0.1)
    metadata = {"task": "en-fr", "seed": 0, "frontend": frontend.to_json(), "splits": {}}
    plan = speech_data.SpeechPlan()
    augment = speech_data.Augment(nonspeech={"train": 2, "nonspeech": 3})
    for split, sources in {"train": ["one day", "two days"], "valid": ["four days"], "test": ["five days"],
                           "natural": ["a day"], "nonspeech": []}.items():
        pairs = [Pair(s, s.replace("days", "jours").replace("day", "jour")) for s in sources]
        utterances = speech_data.plan_split(pairs, split, plan, 0, augment)
        shard = speech_data.write_shard(tmp_path / f"{split}-00000.npz", utterances, frontend)
        metadata["splits"][split] = {"count": len(utterances), "shards": [shard]}
    (tmp_path / "metadata.json").write_text(json.dumps(metadata))
    lines: list[str] = []
    cfg = TrainConfig(epochs=1, batch_size=2, lr=1e-3, warmup_steps=1, seed=0, threads=1)
    train_speech(PLUGIN, tiny, tmp_path, cfg, tmp_path / "a.safetensors", log=lines.append)
    info = load_checkpoint(tmp_path / "a.safetensors").info
    assert info["test"]["count"] == 1 and info["test_natural"]["count"] == 1
    assert info["test_nonspeech"]["count"] == 3
    assert any(line.startswith("nonspeech (held-out voices") and "empty transcript on" in line for line in lines)
    assert any(line.startswith("natural (held-out voices") for line in lines)


def test_an_offset_clip_starts_into_its_window_and_never_pushes_speech_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Augment.offset``: a share of training speech gets a leading silence (``Utterance.delay``), cut to
    what the window leaves; held-out splits are never delayed, and the speech of a split is the same
    whatever share is delayed (its own stream)."""
    from s2s_deploy.frontends import WhisperLogMel

    seconds = {"short": 2.0, "long": 7.0, "one": 1.5, "two": 1.5}
    monkeypatch.setattr(speech_data, "synthesise", lambda u, rate: np.full(int(seconds[u.source] * rate), 0.1,
                                                                               dtype=np.float32))
    frontend = WhisperLogMel(chunk_length=8)
    short = speech_data.Utterance("short", "court", "en-us", "m1", 175, 50, delay=2.5)
    audio, held = speech_data.render(short, frontend)
    assert held == short and len(audio) == int(4.5 * 16000)
    assert not audio[:40000].any() and (audio[40000:] == np.float32(0.1)).all()
    audio, held = speech_data.render(dataclasses.replace(short, source="long", delay=3.0), frontend)
    assert held.delay == 1.0 and len(audio) == frontend.n_samples and not audio[:16000].any() and audio[16000]
    joined = speech_data.Utterance(speech_data.JOIN.join(["one", "two"]), speech_data.JOIN.join(["un", "deux"]),
                                   "en-us", "m1", 175, 50, delay=1.0)
    audio, held = speech_data.render(joined, frontend)
    assert held.target == "un deux" and held.delay == 1.0 and not audio[:16000].any() and audio[16000]
    pairs = [Pair(f"{n} days", f"{n} jours") for n in range(400)]
    plan = speech_data.SpeechPlan()
    plain_train = speech_data.plan_split(pairs, "train", plan, 0)
    later = speech_data.plan_split(pairs, "train", plan, 0, speech_data.Augment(offset=0.3))
    delays = [u.delay for u in later]
    assert 0.2 < sum(d > 0 for d in delays) / len(delays) < 0.4
    assert all(speech_data.OFFSET_SECONDS[0] <= d <= speech_data.OFFSET_SECONDS[1] for d in delays if d)
    assert [dataclasses.replace(u, delay=0.0) for u in later] == plain_train
    held_out = speech_data.plan_split(pairs, "natural", plan, 0, speech_data.Augment(offset=1.0))
    assert not any(u.delay for u in held_out)
