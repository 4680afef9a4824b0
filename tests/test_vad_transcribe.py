"""``transcribe --vad``: only speech decoded, windows as faster-whisper's batched pipeline makes them,
segment times in the original audio.

The tiny timestamped Whisper of tests/test_hf_whisper_timestamps.py (a one-second window, so
speech is split into many windows) exported once, on tests/test_vad.py's espeak-ng clip (three
sentences between inserted silences, noise throughout). Checked: no segment lies in an inserted
silence (each falls within a VAD span and within 0.2 s of the known speech); the result equals
decoding each window's audio alone and mapping its times by hand; clips batched together equal
each alone; a clip without speech is empty; the CLI writes the same segments and refuses bad
options in one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from test_hf_whisper_timestamps import save_timestamp_whisper
from test_vad import RATE, speech_clip

from s2s_deploy.cli import main
from s2s_deploy.frontends.vad import VadOptions, speech_spans, speech_windows

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow
TIGHT = VadOptions(speech_pad_ms=0)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, hf_exports: Any) -> dict[str, Any]:
    soundfile = pytest.importorskip("soundfile")
    from s2s_deploy.runtime.transcriber import Transcriber

    root = tmp_path_factory.mktemp("vad-whisper")
    save_timestamp_whisper(root / "hf", 0.55, keep=0.5)
    out = hf_exports.get(root / "hf")
    audio, known = speech_clip(root)
    soundfile.write(root / "clip.wav", audio, RATE, subtype="FLOAT")
    return {"out": out, "audio": audio, "known": known, "wav": root / "clip.wav", "root": root,
            "transcriber": Transcriber(out, device="cpu")}


def test_no_segment_in_the_silences(setup: dict[str, Any]) -> None:
    transcriber, audio, known = setup["transcriber"], setup["audio"], setup["known"]
    [found] = transcriber(audio, vad=TIGHT, timestamps=True)
    spans = speech_spans(audio, RATE, TIGHT, 1.0)
    assert len(found.segments) >= len(known) and found.text
    for segment in found.segments:
        assert segment.start <= segment.end
        assert any(a / RATE - 1e-6 <= segment.start and segment.end <= b / RATE + 1e-6 for a, b in spans), segment
        assert any(a / RATE - 0.2 <= segment.start and segment.end <= b / RATE + 0.2 for a, b in known), segment
    for a, b in known:  # every sentence was heard
        assert any(s.end > a / RATE and s.start < b / RATE for s in found.segments)


@pytest.mark.parametrize("options", [VadOptions(), TIGHT])
def test_windows_decode_as_each_alone(setup: dict[str, Any], options: VadOptions) -> None:
    transcriber, audio = setup["transcriber"], setup["audio"]
    windows = speech_windows(speech_spans(audio, RATE, options, 1.0), RATE, 1.0)
    assert len(windows) > 3
    alone = [transcriber(w.audio(audio), timestamps=True)[0] for w in windows]
    expected = [(w.original(min(s.start, w.duration)), w.original(min(s.end, w.duration), end=True), s.text)
                for w, d in zip(windows, alone, strict=True) for s in d.segments]
    [found] = transcriber(audio, vad=options, timestamps=True, batch_size=5)
    assert [(s.start, s.end, s.text) for s in found.segments] == expected
    assert found.text == " ".join(t for d in alone if (t := d.text.strip()))
    assert found.score == pytest.approx(float(np.mean([d.score for d in alone])))
    [untimed] = transcriber(audio, vad=options)
    plain = [transcriber(w.audio(audio))[0].text.strip() for w in windows]
    assert untimed.text == " ".join(t for t in plain if t) and not untimed.segments


def test_clips_batched_together_equal_each_alone(setup: dict[str, Any]) -> None:
    transcriber, audio = setup["transcriber"], setup["audio"]
    noise = np.random.default_rng(3).normal(0, 0.004, 3 * RATE).astype(np.float32)
    clips = [audio, noise, audio[RATE * 4:], audio[: RATE * 8]]
    together = transcriber(clips, vad=True, timestamps=True, batch_size=3)
    alone = [transcriber(clip, vad=True, timestamps=True)[0] for clip in clips]
    assert [(d.text, d.segments) for d in together] == [(d.text, d.segments) for d in alone]
    assert together[1].text == "" and together[1].segments == () and together[1].score == 0.0
    assert all(d.text for i, d in enumerate(together) if i != 1)


def test_cli_writes_the_segments(setup: dict[str, Any]) -> None:
    out, wav, root = setup["out"], setup["wav"], setup["root"]
    target = root / "found.json"
    result = CliRunner().invoke(main, ["transcribe", str(out), str(wav), "--vad", "--vad-speech-pad-ms", "0",
                                       "--timestamps", "--output", str(target), "--quiet"])
    assert result.exit_code == 0, result.output
    [row] = json.loads(target.read_text())
    [found] = setup["transcriber"](str(wav), vad=TIGHT, timestamps=True)
    assert row["text"] == found.text
    assert [(s["start"], s["end"], s["text"]) for s in row["segments"]] == [
        (s.start, s.end, s.text) for s in found.segments]


@pytest.mark.parametrize(("args", "message"), [
    (["--vad-threshold", "0.6"], "--vad-threshold: pass --vad too"),
    (["--vad", "--vad-threshold", "2"], "vad threshold must lie between 0 and 1"),
    (["--vad", "--vad-model", "missing.onnx"], "vad model not found"),
    (["--vad", "--n-best", "2", "--beam", "2"], "n_best must be 1"),
])
def test_cli_refuses_bad_vad_options_in_one_line(setup: dict[str, Any], args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["transcribe", str(setup["out"]), str(setup["wav"]), "--quiet", *args])
    assert result.exit_code != 0
    assert message in result.output and len(result.output.strip().splitlines()) == 1, result.output


def test_an_empty_window_list_is_refused_nowhere(setup: dict[str, Any], tmp_path: Path) -> None:
    """Digital silence: no speech, so nothing is decoded, and the result says so."""
    [found] = setup["transcriber"](np.zeros(2 * RATE, dtype=np.float32), vad=True, timestamps=True)
    assert (found.text, found.segments, found.hypotheses) == ("", (), (("", 0.0),))
