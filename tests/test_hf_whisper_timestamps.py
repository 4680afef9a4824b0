"""Whisper timestamps and long-form audio against ``generate(return_timestamps=True)``.

The tiny random Whisper of tests/test_hf_whisper.py (whose helpers build this one), with 51 more
ids after ``<|notimestamps|>`` (127): the timestamps ``<|0.00|>`` .. ``<|1.00|>`` of its one-second
window. Random weights rarely emit timestamps, as a trained model does at a segment's end: so each
timestamp's output row is moved along the mean decoder state by a share of a typical best logit
(``lean``), the way a trained model's rows lean toward the states that end segments; the tests
assert that timestamps, pairs and mid-window seeks actually occur. Clips of 0.3-1.4 s (one window)
and 1.2-3.5 s (two to four windows) decode token-identically to ``generate``, greedy and beam 4,
the long ones as one batch with the ``attention_mask`` transformers requires.
"""

from __future__ import annotations

import json
import shutil
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from test_hf_whisper import (
    EN,
    EOS,
    FR,
    MAX_NEW,
    NO_TIMESTAMPS,
    PREV,
    RATE,
    TRANSCRIBE,
    clips,
    lean,
    one_second_extractor,
    save_folder,
    whisper_config,
)
from test_hf_whisper import SPECIAL_TOKENS as PLAIN_SPECIAL_TOKENS

from s2s_deploy.cli import main

transformers = pytest.importorskip("transformers")

BEGIN = NO_TIMESTAMPS + 1
STAMPS = 51  # 0.00 .. 1.00 s
VOCAB = BEGIN + STAMPS
SPECIAL_TOKENS = {**PLAIN_SPECIAL_TOKENS, **{BEGIN + i: f"<|{i * 0.02:.2f}|>" for i in range(STAMPS)}}
MAX_INITIAL = 10


def save_timestamp_whisper(hf_dir: Path, strength: float, keep: float) -> tuple[Any, list[np.ndarray]]:
    """The tiny timestamped Whisper saved into ``hf_dir`` (weights, feature extractor, generation config
    and tokenizer), EOS and its timestamp rows leaned on 20 short clips, the timestamps' by ``strength``
    with ``keep`` of each row kept; its feature extractor and those clips."""
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(whisper_config(VOCAB)).eval()
    extractor = one_second_extractor()
    short = clips(20, 0.3, 1.4, seed=0)
    features = torch.from_numpy(np.stack([extractor(a, sampling_rate=RATE)["input_features"][0] for a in short]))
    lean(model, features, [EOS], 0.85, keep=0.5)
    lean(model, features, list(range(BEGIN, VOCAB)), strength, keep=keep)
    model.generation_config.max_initial_timestamp_index = MAX_INITIAL
    save_folder(hf_dir, model, extractor, VOCAB, SPECIAL_TOKENS)
    return extractor, short


@pytest.fixture(scope="module")
def whisper(tmp_path_factory: pytest.TempPathFactory, hf_exports: Any) -> Any:
    from s2s_deploy.runtime.transcriber import Transcriber

    root = tmp_path_factory.mktemp("whisper-ts")
    hf_dir = root / "hf"
    extractor, short = save_timestamp_whisper(hf_dir, 0.55, keep=0.5)
    detect_dir = root / "detect-hf"
    shutil.copytree(hf_dir, detect_dir)
    raw = json.loads((detect_dir / "generation_config.json").read_text())
    raw.update(language=None, task=None)  # generate detects the language, once per clip
    (detect_dir / "generation_config.json").write_text(json.dumps(raw))
    out, detect_out = hf_exports.get(hf_dir), hf_exports.get(detect_dir)
    loaded = transformers.WhisperForConditionalGeneration.from_pretrained(hf_dir, local_files_only=True).eval()
    detecting = transformers.WhisperForConditionalGeneration.from_pretrained(detect_dir, local_files_only=True).eval()
    transcriber = Transcriber(out, device="cpu")
    long = clips(6, 1.2, 3.5, seed=1)
    yield {"hf_dir": hf_dir, "out": out, "model": loaded, "transcriber": transcriber, "extractor": extractor,
           "short": [transcriber.features(a, whole=True) for a in short],
           "long": [transcriber.features(a, whole=True) for a in long], "long_audio": long, "short_audio": short,
           "detecting": detecting, "detector": Transcriber(detect_out, device="cpu")}


def generated(model: Any, features: list[np.ndarray], beams: int, timestamps: bool | None = True,
              **settings: Any) -> list[tuple[int, ...]]:
    """``generate(return_timestamps=timestamps)``'s tokens per clip (EOS-padded: cut at the first EOS);
    clips of several lengths go as one zero-padded batch with their ``attention_mask``."""
    frames = max(f.shape[-1] for f in features)
    batch = np.zeros((len(features), features[0].shape[0], frames), dtype=np.float32)
    mask = np.zeros((len(features), frames), dtype=np.int64)
    for i, f in enumerate(features):
        batch[i, :, : f.shape[-1]], mask[i, : f.shape[-1]] = f, 1
    with torch.no_grad():
        out = model.generate(input_features=torch.from_numpy(batch), attention_mask=torch.from_numpy(mask),
                             num_beams=beams, max_new_tokens=MAX_NEW, return_timestamps=timestamps, **settings)
    return [tuple(row[: row.index(EOS)] if EOS in row else row) for row in out.tolist()]


def timed(whisper: dict[str, Any], features: list[np.ndarray], beams: int, reader: str = "transcriber",
          **options: Any) -> list[Any]:
    transcriber = whisper[reader]
    config = transcriber.translator.search_config(beams, 1, MAX_NEW, timestamps=True, **options)
    return transcriber.timed(features, config)


def test_manifest_holds_the_timestamp_rules(whisper: dict[str, Any]) -> None:
    from s2s_deploy.format.manifest import FORMAT, load_manifest

    manifest = load_manifest(whisper["out"])
    assert manifest.format == FORMAT
    search = manifest.search
    assert search["timestamp_begin"] == BEGIN and search["max_initial_timestamp"] == MAX_INITIAL
    assert search["time_precision"] == 0.02 and search["timestamp_frames"] == 2
    assert not search.get("timestamps")
    config = whisper["transcriber"].translator.search_config(timestamps=True)
    assert config.decoder_prompt == (FR, TRANSCRIBE)  # <|notimestamps|> dropped, as generate drops it


@pytest.mark.parametrize("beams", [1, 4])
def test_timestamps_match_generate(whisper: dict[str, Any], beams: int) -> None:
    features = whisper["short"]
    ours = [s.tokens for s in timed(whisper, features, beams)]
    theirs = generated(whisper["model"], features, beams)
    assert ours == theirs
    stamps = [[t for t in row if t >= BEGIN] for row in theirs]
    assert all(row and row[0] >= BEGIN for row in theirs)  # the first token is a timestamp
    assert sum(len(s) >= 2 for s in stamps) > len(theirs) // 2  # segments are timed, not just begun
    assert all(t - BEGIN <= MAX_INITIAL for t in (row[0] for row in theirs))
    assert any(any(a >= BEGIN <= b for a, b in pairwise(row)) for row in theirs)  # pairs occur


@pytest.mark.parametrize("beams", [1, 4])
def test_long_form_matches_generate(whisper: dict[str, Any], beams: int) -> None:
    features = whisper["long"]
    assert all(f.shape[-1] > 100 for f in features)
    sought = timed(whisper, features, beams)
    theirs = generated(whisper["model"], features, beams)
    assert [s.tokens for s in sought] == theirs
    assert all(s.pieces[-1].end > 1.0 for s in sought)  # past the first window
    assert len({len(s.scores) for s in sought}) > 1  # clips take different numbers of windows
    one = generated(whisper["model"], features[:1], beams)  # a clip alone: generate's batch-of-one path
    assert [s.tokens for s in timed(whisper, features[:1], beams)] == one == theirs[:1]


@pytest.mark.parametrize("beams", [1, 4])
def test_long_form_detects_the_language_once(whisper: dict[str, Any], beams: int) -> None:
    """A prompt with an open language slot: chosen on a clip's first window and kept for the rest,
    as ``generate`` detects it once per clip; both languages occur."""
    features = whisper["long"] + whisper["short"][:6]
    sought = timed(whisper, features, beams, reader="detector")
    assert [s.tokens for s in sought] == generated(whisper["detecting"], features, beams)
    assert {s.prompt for s in sought} == {(EN,), (FR,)}


def test_segments_match_generate(whisper: dict[str, Any]) -> None:
    """Segment times as ``generate(return_segments=True)`` gives them, for short and long clips."""
    model, features = whisper["model"], whisper["long"][:3] + whisper["short"][:3]
    sought = timed(whisper, features, 1)
    for ours, clip in zip(sought, features, strict=True):
        with torch.no_grad():
            out = model.generate(input_features=torch.from_numpy(clip[None]), max_new_tokens=MAX_NEW,
                                 return_timestamps=True, return_segments=True)
        segments = out["segments"][0]
        assert [(p.start, p.end) for p in ours.pieces] == [(float(s["start"]), float(s["end"])) for s in segments]
        assert [p.tokens for p in ours.pieces] == [tuple(s["tokens"].tolist()) for s in segments]


def test_whole_front_end_agrees_with_the_extractor_uncut(whisper: dict[str, Any]) -> None:
    audio = whisper["long_audio"][0]
    theirs = whisper["extractor"](audio, sampling_rate=RATE, truncation=False, padding="longest")["input_features"][0]
    ours = whisper["transcriber"].features(audio, whole=True)
    assert ours.shape == theirs.shape == (80, len(audio) // 160)
    np.testing.assert_allclose(ours, theirs, atol=2e-3)


@pytest.mark.parametrize("suffix", [".srt", ".vtt", ".json"])
def test_transcribe_writes_timed_segments(whisper: dict[str, Any], tmp_path: Path, suffix: str) -> None:
    import soundfile

    from s2s_deploy.cli.media import clock

    path = tmp_path / "clip.wav"
    soundfile.write(path, whisper["long_audio"][1], RATE)
    out = tmp_path / f"out{suffix}"
    result = CliRunner().invoke(main, ["transcribe", str(whisper["out"]), str(path), "--quiet", "--timestamps",
                                       "--output", str(out)])
    assert result.exit_code == 0, result.output
    [want] = whisper["transcriber"]([str(path)], timestamps=True)
    assert want.segments and want.text
    if suffix == ".json":  # and on the terminal: one line per segment
        shown = CliRunner().invoke(main, ["transcribe", str(whisper["out"]), str(path), "--quiet", "--timestamps"])
        assert shown.exit_code == 0 and len(shown.stdout.splitlines()) == len(want.segments), shown.output
        first = want.segments[0]
        assert shown.stdout.startswith(f"[{clock(first.start, '.')} --> {clock(first.end, '.')}] {first.text}\n")
    written = out.read_text()
    if suffix == ".json":
        [row] = json.loads(written)
        assert row["segments"] == [{"start": s.start, "end": s.end, "text": s.text} for s in want.segments]
    else:
        assert written.startswith("WEBVTT\n\n" if suffix == ".vtt" else "1\n")
        assert all(s.text in written for s in want.segments if s.text)
        assert written.count(" --> ") == len(want.segments)


def test_timestamps_are_refused_where_they_do_not_apply(whisper: dict[str, Any], tmp_path: Path) -> None:
    import soundfile

    path = tmp_path / "clip.wav"
    soundfile.write(path, whisper["long_audio"][0], RATE)
    export = str(whisper["out"])
    result = CliRunner().invoke(main, ["transcribe", export, str(path), "--output", str(tmp_path / "a.srt")])
    assert result.exit_code == 1 and result.output == (
        "error: --output a.srt writes timed segments: pass --timestamps (or --word-timestamps)\n")
    result = CliRunner().invoke(main, ["transcribe", export, str(path), "--timestamps", "--n-best", "2", "--beam", "2"])
    assert result.exit_code == 1 and "n_best" in result.output and len(result.output.splitlines()) == 1



def test_serve_transcribe_returns_segments(whisper: dict[str, Any], tmp_path: Path) -> None:
    """``/transcribe?timestamps=true`` answers as ``Transcriber(..., timestamps=True)``, segments included."""
    import soundfile
    from starlette.testclient import TestClient

    from s2s_deploy.serve.app import BatchLimits, ServeConfig, create_app

    path = tmp_path / "clip.wav"
    soundfile.write(path, whisper["long_audio"][2], RATE)
    [want] = whisper["transcriber"]([str(path)], timestamps=True)
    app = create_app(ServeConfig(str(whisper["out"]), BatchLimits(window_ms=1), threads=1))
    with TestClient(app) as http:
        response = http.post("/transcribe", params={"timestamps": "true"}, content=path.read_bytes())
        assert response.status_code == 200, response.text
        [got] = response.json()["transcriptions"]
        assert got["text"] == want.text and got["language"] == "fr"
        assert got["segments"] == [{"start": s.start, "end": s.end, "text": s.text} for s in want.segments]
        refused = http.post("/transcribe", params={"timestamps": "yes"}, content=path.read_bytes())
        assert refused.status_code == 400 and "'timestamps' must be true or false" in refused.text


def test_openai_endpoint_times_segments_and_translates(whisper: dict[str, Any], tmp_path: Path) -> None:
    """``/v1/audio/transcriptions`` on an export with timestamp tokens: verbose_json, srt and vtt carry the
    segments ``Transcriber(..., timestamps=True)`` times, json the plain transcription; ``language`` is
    the export's language code and ``/v1/audio/translations`` its ``translate`` task."""
    import soundfile
    from starlette.testclient import TestClient

    from s2s_deploy.format.subtitles import subtitles
    from s2s_deploy.serve.app import BatchLimits, ServeConfig, create_app

    path = tmp_path / "clip.wav"
    soundfile.write(path, whisper["long_audio"][2], RATE)
    transcriber = whisper["transcriber"]
    [timed_one] = transcriber([str(path)], timestamps=True)
    [plain] = transcriber([str(path)])
    [english] = transcriber([str(path)], target_lang="en")
    [translated] = transcriber([str(path)], task="translate")
    app = create_app(ServeConfig(str(whisper["out"]), BatchLimits(window_ms=1), threads=1))

    def ask(endpoint: str = "transcriptions", **fields: str) -> Any:
        response = http.post(f"/v1/audio/{endpoint}", files={"file": ("clip.wav", path.read_bytes())},
                             data={"model": "whisper-1", **fields})
        assert response.status_code == 200, response.text
        return response

    with TestClient(app) as http:
        verbose = ask(response_format="verbose_json").json()
        assert verbose["text"] == timed_one.text and verbose["language"] == "fr" and verbose["task"] == "transcribe"
        assert [(s["id"], s["start"], s["end"], s["text"]) for s in verbose["segments"]] == [
            (i, s.start, s.end, s.text) for i, s in enumerate(timed_one.segments)]
        assert len(timed_one.segments) > 1
        for fmt in ("srt", "vtt"):
            assert ask(response_format=fmt).text == subtitles(timed_one.segments, f".{fmt}")
        assert ask().json() == {"text": plain.text}
        assert ask(language="en").json() == {"text": english.text}
        assert ask("translations").json() == {"text": translated.text}



@pytest.mark.parametrize("beams", [1, 4])
def test_prompt_with_timestamps_matches_generate(whisper: dict[str, Any], beams: int) -> None:
    """``generate(prompt_ids=..., return_timestamps=True)`` feeds the prompt before every window."""
    import torch

    features = whisper["long"] + whisper["short"][:6]
    ours = [s.tokens for s in timed(whisper, features, beams, prompt="w12 w40 w77")]
    theirs = generated(whisper["model"], features, beams, prompt_ids=torch.tensor([PREV, 12, 40, 77]))
    assert ours == theirs and theirs != generated(whisper["model"], features, beams)


@pytest.mark.parametrize("beams", [1, 4])
def test_long_clips_without_timestamps_match_generate(whisper: dict[str, Any], beams: int) -> None:
    """``generate`` on long-form input without ``return_timestamps`` turns timestamps on to seek through
    it: so does ``Transcriber`` without ``timestamps``, for such clips alone, and returns their text only.
    A clip within the window decodes as usual, whatever its batchmates."""
    transcriber, features = whisper["transcriber"], whisper["long"]
    theirs = generated(whisper["model"], features, beams, timestamps=None)
    config = transcriber.translator.search_config(beams, 1, MAX_NEW)
    sought = transcriber.long_form(features, config, ["clip"] * len(features))
    assert [s.tokens for s in sought] == theirs and all(len(s.scores) > 1 for s in sought)  # not cut to a window
    vocab = transcriber.manifest.tgt_vocab
    found = transcriber(whisper["long_audio"] + [whisper["short_audio"][0]], beam=beams, max_len=MAX_NEW)
    assert [t.text for t in found[:-1]] == [vocab.decode(row) for row in theirs]
    assert all(not t.segments and t.language == "fr" for t in found)
    assert found[-1].text == transcriber(whisper["short_audio"][0], beam=beams, max_len=MAX_NEW)[0].text
