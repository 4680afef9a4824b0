"""What a newcomer meets with files in, text out (issue 48, frictions): a batch with bad files, a
directory, n-best over several files, ``--verbose`` after the subcommand, ``--max-duration``,
uploads to ``serve`` that are multipart or lie in their header, progress from ``evaluate``, and
native libraries that print into stdout."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from s2s_deploy.architecture.registry import get_plugin
from s2s_deploy.cli import main
from s2s_deploy.export.exporter import export_model
from s2s_deploy.export.sources import load_source

soundfile = pytest.importorskip("soundfile")

CLIPS = sorted(str(p) for p in (Path(__file__).parent / "data").glob("speech_*hz.flac"))


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> Path:
    plugin = get_plugin("speech")
    work = tmp_path_factory.mktemp("speech")
    source = load_source(plugin, None, "tiny", work)
    out = work / "export"
    export_model(plugin, source.model, source.config, source.src_vocab, source.tgt_vocab, out,
                 checkpoint_path=source.checkpoint_path, source=source.description, samples=source.samples)
    return out


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def doubtless(err: str) -> str:
    """stderr without the doubt warnings that a tiny export's random weights earn on every text
    (tests/test_honest_output.py)."""
    return "".join(line for line in err.splitlines(keepends=True) if ": low confidence (mean log-prob" not in line)


def wav_header(frames: int, rate: int, body: bytes) -> bytes:
    """A 16-bit mono PCM WAV whose header says ``frames`` at ``rate`` and holds ``body``."""
    size = 2 * frames
    return (b"RIFF" + struct.pack("<I", 36 + size) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, 2 * rate,
            2, 16) + b"data" + struct.pack("<I", size) + body)


def test_a_batch_names_each_bad_file_prints_the_good_ones_and_fails_at_the_end(speech: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"RIFF but not audio")
    code, out, err = run("transcribe", str(speech), CLIPS[0], str(tmp_path / "missing.wav"), str(tmp_path),
                         str(broken), CLIPS[1], "--max-len", "8", "--quiet")
    alone = [run("transcribe", str(speech), clip, "--max-len", "8", "--quiet")[1] for clip in CLIPS[:2]]
    assert code == 1
    assert out == "".join(alone)  # the good files, in order, as each prints alone
    assert doubtless(err).splitlines() == [
        f"error: audio file not found: {tmp_path / 'missing.wav'}",
        f"error: {tmp_path} is a directory, not an audio file",
        f"error: cannot read audio {broken}: Format not recognised.",
        "error: 3 of 5 audio files could not be read (each named above)",
    ]
    code, out, err = run("transcribe", str(speech), str(tmp_path))  # alone: the one line
    assert (code, out, err) == (1, "", f"error: {tmp_path} is a directory, not an audio file\n")


def test_n_best_over_several_files_names_each_line_s_file(speech: Path, tmp_path: Path) -> None:
    clips = []
    for i, clip in enumerate(CLIPS[:2]):  # within the tiny model's one-second window: n-best needs one
        samples, rate = soundfile.read(clip, dtype="float32")
        clips.append(str(tmp_path / f"short{i}.wav"))
        soundfile.write(clips[-1], samples[: rate * 3 // 4], rate)
    code, out, err = run("transcribe", str(speech), *clips, "--beam", "3", "--n-best", "2", "--max-len", "8",
                         "--quiet")
    assert code == 0, err
    assert [line.split("\t")[0] for line in out.splitlines()] == [clips[0], clips[0], clips[1], clips[1]]
    _, single, _ = run("transcribe", str(speech), clips[0], "--beam", "3", "--n-best", "2", "--max-len", "8",
                       "--quiet")
    assert single.splitlines() == [line.split("\t", 1)[1] for line in out.splitlines()[:2]]


def test_verbose_and_debug_are_accepted_after_the_subcommand(speech: Path) -> None:
    code, out, err = run("transcribe", str(speech), CLIPS[0], "--max-len", "8", "--verbose")
    assert code == 0 and "CPUExecutionProvider" in err and "CPUExecutionProvider" not in out
    assert run("--verbose", "transcribe", str(speech), CLIPS[0], "--max-len", "8") == (code, out, err)
    code, _, err = run("transcribe", str(speech), "missing.wav", "--debug")
    assert code == 1 and "Traceback" in err
    assert err.strip().splitlines()[-1] == "error: audio file not found: missing.wav"


def test_max_duration_is_judged_from_the_header(speech: Path, tmp_path: Path) -> None:
    claims = tmp_path / "claims.wav"  # 4 KB whose header says 16 kHz and an hour: libsndfile reads what is there
    claims.write_bytes(wav_header(16000 * 3600, 16000, bytes(4000)))
    lengthy = tmp_path / "lengthy.wav"
    soundfile.write(str(lengthy), np.zeros(16000 * 12, dtype=np.float32), 16000)
    code, out, err = run("transcribe", str(speech), str(lengthy), "--max-duration", "10")
    assert (code, out) == (1, "") and err == f"error: audio {lengthy}: 12.0 s of audio is over the limit of 10 s\n"
    assert run("transcribe", str(speech), str(lengthy), "--max-duration", "12", "--max-len", "4")[0] == 0
    code, out, err = run("transcribe", str(speech), str(claims), "--max-len", "4", "--quiet")
    assert code == 0 and out.count("\n") == 1
    assert doubtless(err) == (f"warning: audio {claims} is truncated: its header promises 115200000 bytes of audio, "
                              f"the file holds 4000; reading what it holds\n")


def test_serve_refuses_by_the_header_reads_multipart_and_shows_no_repr(speech: Path, tmp_path: Path) -> None:
    pytest.importorskip("starlette")
    pytest.importorskip("httpx")
    from starlette.testclient import TestClient

    from s2s_deploy.serve.app import ServeConfig, create_app
    from s2s_deploy.serve.batcher import BatchLimits

    clip = Path(CLIPS[0]).read_bytes()
    app = create_app(ServeConfig(str(speech), BatchLimits(), threads=1, max_duration=60))
    with TestClient(app) as http:
        plain = http.post("/transcribe", content=clip, params={"max_len": 8})
        assert plain.status_code == 200, plain.text
        form = http.post("/transcribe", files={"file": ("clip.flac", clip, "audio/flac")}, params={"max_len": 8})
        assert form.status_code == 200 and form.json() == plain.json()
        cases = [
            (wav_header(2000, 1, bytes(4000)), 400, "a sampling rate of 1 Hz is outside the plausible 1000-384000 Hz"),
            (wav_header(20000, 1, bytes(40000)), 400, "a sampling rate of 1 Hz is outside"),
            (wav_header(16000 * 61, 16000, bytes(16000 * 61 * 2)), 413, "61.0 s of audio is over the limit of 60 s"),
            (b"not audio at all", 400, "cannot read audio from the upload: Format not recognised."),
        ]
        for body, status, message in cases:
            response = http.post("/transcribe", content=body)
            assert response.status_code == status and message in response.json()["error"], response.text
            assert "<_io" not in response.text and "object at 0x" not in response.text
        response = http.post("/transcribe", files={"audio": ("clip.flac", clip)})
        assert response.status_code == 400
        assert response.json()["error"] == ("a multipart upload must hold the audio in a field named 'file' "
                                            "(curl -F file=@clip.flac), or send the file's bytes as the body "
                                            "(curl --data-binary @clip.flac)")
        assert http.get("/metadata").json()["limits"]["max_duration"] == 60


def test_an_image_over_the_pixel_budget_is_one_line_and_costs_no_memory(tmp_path: Path) -> None:
    """A 12000x12000 PNG (440 KB) is refused from its header: no Pillow warning, and the process
    never holds its 432 MB of pixels."""
    image_module = pytest.importorskip("PIL.Image")
    big = tmp_path / "big.png"
    image_module.new("L", (12000, 12000), 255).save(big)
    code = ("import re, warnings\nwarnings.simplefilter('error')\n"
            "from s2s_deploy.frontends.image import load_image\nfrom s2s_deploy.errors import S2SError\n"
            f"try:\n    load_image({str(big)!r})\nexcept S2SError as exc:\n    print(exc)\n"
            "status = __import__('pathlib').Path('/proc/self/status').read_text()\n"
            "print(int(re.search(r'VmHWM:\\s+(\\d+)', status)[1]) // 1024)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    message, peak_mb = done.stdout.splitlines()
    assert message == (f"image {big} is 12000x12000 pixels, over the budget of 67108864 (144 > 67 megapixels): "
                       "scale it down")
    assert done.stderr == "" and int(peak_mb) < 200


def test_native_banners_stay_out_of_stdout(capfd: pytest.CaptureFixture[str]) -> None:
    from s2s_deploy.runtime.ort.backend import quiet_native_output

    with quiet_native_output():
        os.write(1, b"TensorRT banner\n")
        os.write(2, b"libcublasLt.so missing\n")
    os.write(1, b"after\n")
    assert capfd.readouterr() == ("after\n", "")


def test_evaluate_shows_progress_off_a_terminal(exports) -> None:
    gru = exports.get("gru")[1].directory
    code, out, err = run("evaluate", str(gru), "--split", "test", "--limit", "3", "--backends", "onnxruntime")
    assert code == 0 and out.startswith("| split |")
    assert "test onnxruntime greedy" in err and "3/3" in err and " sentences" in err


def test_train_state_files_are_ignored_by_git() -> None:
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    from s2s_deploy.train.trainer import train_state_path

    for checkpoint in ("transformer.safetensors", "runs/gru-en-fr.safetensors"):
        done = subprocess.run(["git", "check-ignore", "-q", str(train_state_path(checkpoint))], cwd=root)
        assert done.returncode == 0, checkpoint
