"""Honest output (issue 48): every audio result reports its confidence (mean log-prob per token, the
no-speech probability where the model has one), ``transcribe`` flags or suppresses a doubtful text
under faster-whisper's thresholds (runtime/fallback.py's rule), and a long file read window by window
as the front end makes them decodes as the whole clip's features do."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from s2s_deploy.cli import main
from s2s_deploy.runtime.decoding import LOG_PROB_THRESHOLD, NO_SPEECH_THRESHOLD, SearchConfig
from s2s_deploy.runtime.fallback import Attempt, Confidence, is_silence, silent
from s2s_deploy.runtime.search import Hypothesis

soundfile = pytest.importorskip("soundfile")

CLIPS = sorted(str(p) for p in (Path(__file__).parent / "data").glob("speech_*hz.flac"))


def hypothesis(log_probs: tuple[float, ...], no_speech: float | None = None) -> Hypothesis:
    """A hypothesis of ``len(log_probs) - 1`` tokens and an EOS (search's hypotheses exclude the EOS)."""
    return Hypothesis(tuple(range(len(log_probs) - 1)), log_probs, sum(log_probs), True, no_speech_prob=no_speech)


def test_confidence_is_the_mean_log_prob_per_token_over_every_window() -> None:
    windows = [hypothesis((-0.5, -0.25, -0.25)), hypothesis((-3.0,), 0.25), hypothesis((-1.0, -1.0), 0.75)]
    confidence = Confidence.of(windows)
    assert confidence.count == 3 + 1 + 2
    assert confidence.avg_log_prob == pytest.approx(-6.0 / 6)
    assert confidence.no_speech_prob == pytest.approx(0.5)
    assert Confidence.of(windows[:1]) + Confidence.of(windows[1:]) == confidence
    assert Confidence.of([hypothesis((-0.1,))]).no_speech_prob is None
    assert Confidence(0.0, 0).avg_log_prob == 0.0


@pytest.mark.parametrize(("log_probs", "no_speech", "doubt"), [
    ((-0.1, -0.2), None, None),
    ((-0.1, -0.2), 0.9, None),  # sure of its words: speech, whatever the no-speech token says
    ((-2.0, -2.0), None, "low confidence (mean log-prob -2.00 per token, under -1)"),
    ((-2.0, -2.0), 0.5, "low confidence"),
    ((-2.0, -2.0), 0.9, "no speech (no-speech probability 0.90 over 0.6)"),
])
def test_doubt_follows_faster_whisper_s_thresholds(log_probs: tuple[float, ...], no_speech: float | None,
                                                   doubt: str | None) -> None:
    confidence = Confidence.of([hypothesis(log_probs, no_speech)])
    found = confidence.doubt()
    assert (found is None) == (doubt is None) and (doubt is None or found.startswith(doubt)), found
    # the rule a window is skipped by in the temperature fallback is the same one
    config = SearchConfig(log_prob_threshold=LOG_PROB_THRESHOLD, no_speech_threshold=NO_SPEECH_THRESHOLD,
                          no_speech_token=7)
    attempt = Attempt(0.0, hypothesis(log_probs, no_speech), confidence.avg_log_prob, 1.0)
    assert is_silence(attempt, config) == silent(confidence.avg_log_prob, no_speech, -1.0, 0.6)
    assert is_silence(attempt, config) == (found is not None and found.startswith("no speech"))


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from s2s_deploy.architecture.registry import get_plugin
    from s2s_deploy.export.exporter import export_model
    from s2s_deploy.export.sources import load_source

    plugin = get_plugin("speech")
    work = tmp_path_factory.mktemp("speech")
    source = load_source(plugin, None, "tiny", work)
    out = work / "export"
    export_model(plugin, source.model, source.config, source.src_vocab, source.tgt_vocab, out,
                 checkpoint_path=source.checkpoint_path, source=source.description, samples=source.samples)
    return out


def long_clip(path: Path, seconds: float, rate: int = 22050) -> np.ndarray:
    rng = np.random.default_rng(5)
    t = np.arange(int(seconds * rate)) / rate
    audio = 0.3 * np.sin(2 * np.pi * (200 + 50 * np.sin(t / 4)) * t) + 0.02 * rng.standard_normal(len(t))
    soundfile.write(str(path), audio.astype(np.float32), rate, format="FLAC")
    return audio


@pytest.mark.slow
def test_results_carry_their_confidence_and_a_long_file_decodes_as_its_whole_features(speech: Path,
                                                                                      tmp_path: Path) -> None:
    from s2s_deploy.frontends import load_audio
    from s2s_deploy.frontends.frames import StreamedFeatures
    from s2s_deploy.runtime import Transcriber

    transcriber = Transcriber(speech, device="cpu", threads=1)
    [short] = transcriber(CLIPS[0], max_len=8)
    config = transcriber.translator.search_config(max_len=8)
    windows: list = []
    transcriber.decode([transcriber.features(CLIPS[0], whole=True)], config, windows=windows)
    [read] = windows  # the tiny export's window is shorter than the clip: several windows
    expected = sum(w.best.log_prob for w in read) / sum(len(w.best.tokens) + 1 for w in read)
    assert short.avg_log_prob == pytest.approx(expected) and short.avg_log_prob < 0
    assert short.no_speech_prob is None  # the speech model has no no-speech token
    path = tmp_path / "long.flac"
    long_clip(path, 75.0)
    assert isinstance(transcriber.features(str(path), whole=True), StreamedFeatures)
    [streamed] = transcriber(str(path), max_len=8)
    [whole] = transcriber(load_audio(path, transcriber.sampling_rate), max_len=8)
    assert (streamed.text, streamed.score, streamed.confidence) == (whole.text, whole.score, whole.confidence)
    assert streamed.confidence is not None and streamed.confidence.count > 0


@pytest.mark.slow
def test_transcribe_flags_or_suppresses_a_doubtful_text(speech: Path, tmp_path: Path) -> None:
    """The tiny export's random weights are unsure of every token: under -1 per token, so doubted."""
    out = tmp_path / "out.json"
    result = CliRunner().invoke(main, ["transcribe", str(speech), *CLIPS[:2], "--max-len", "6", "--quiet",
                                       "--output", str(out)])
    assert result.exit_code == 0, result.stderr
    rows = json.loads(out.read_text())
    assert [r["file"] for r in rows] == CLIPS[:2]
    for row in rows:
        assert row["avg_log_prob"] < LOG_PROB_THRESHOLD and row["no_speech_prob"] is None
        assert row["doubt"].startswith("low confidence")
    warnings = result.stderr.strip().splitlines()
    assert warnings == [f"warning: {r['file']}: {r['doubt']}: the text may be wrong" for r in rows]
    result = CliRunner().invoke(main, ["transcribe", str(speech), *CLIPS[:2], "--max-len", "6", "--quiet",
                                       "--doubtful", "suppress"])
    assert result.exit_code == 0 and result.stdout == "\n\n", result.stdout  # one line per file, kept
    assert all(line.endswith("is left empty (--doubtful suppress)") for line in result.stderr.strip().splitlines())
    loose = CliRunner().invoke(main, ["transcribe", str(speech), CLIPS[0], "--max-len", "6", "--quiet",
                                      "--log-prob-threshold", "-1000", "--output", str(out)])
    assert loose.exit_code == 0 and json.loads(out.read_text())[0]["doubt"] is None, loose.stderr


@pytest.mark.slow
def test_serve_reports_confidence(speech: Path) -> None:
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from s2s_deploy.serve.app import ServeConfig, create_app
    from s2s_deploy.serve.batcher import BatchLimits

    with TestClient(create_app(ServeConfig(str(speech), BatchLimits(), threads=1))) as http:
        response = http.post("/transcribe", content=Path(CLIPS[0]).read_bytes(), params={"max_len": 6})
    [row] = response.json()["transcriptions"]
    assert row["avg_log_prob"] < 0 and row["no_speech_prob"] is None and row["doubt"].startswith("low confidence")


def test_a_doubtful_result_is_flagged_or_emptied(capsys: pytest.CaptureFixture[str]) -> None:
    from s2s_deploy.cli.media import _judged
    from s2s_deploy.runtime.features import Decoded, Segment

    sure = Decoded("a.flac", "bonjour", -0.1, (("bonjour", -0.1),), confidence=Confidence(-0.4, 4))
    unsure = Decoded("b.flac", "bonjour", -0.1, (("bonjour", -0.1),), segments=(Segment(0.0, 1.0, "bonjour"),),
                     confidence=Confidence(-8.0, 4))
    assert _judged(sure, None, suppress=True) is sure and capsys.readouterr().err == ""
    assert _judged(unsure, None, suppress=False) is unsure
    assert capsys.readouterr().err == ("warning: b.flac: low confidence (mean log-prob -2.00 per token, under -1): "
                                       "the text may be wrong\n")
    emptied = _judged(unsure, None, suppress=True)
    assert (emptied.text, emptied.hypotheses, emptied.segments) == ("", (("", -0.1),), ())
    assert capsys.readouterr().err.endswith("the text is left empty (--doubtful suppress)\n")
    loose = SearchConfig(log_prob_threshold=-3.0)
    assert unsure.doubt(loose) is None and unsure.row(loose)["doubt"] is None
    assert unsure.row()["avg_log_prob"] == -2.0 and unsure.row()["doubt"].startswith("low confidence")
