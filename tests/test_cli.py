"""Bad input gets one line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from s2s_deploy.architecture.registry import REGISTRY
from s2s_deploy.cli import main


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def assert_one_line_error(code: int, stderr: str, fragment: str) -> None:
    assert code == 1
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ") and fragment in lines[0]
    assert "Traceback" not in stderr


def test_list_shows_every_builtin() -> None:
    code, out, _ = run("list")
    assert code == 0
    for name in ("transformer", "gru", "lstm", "bahdanau", "rnnsearch", "convs2s"):
        assert name in out


def test_unknown_arch() -> None:
    code, _, err = run("export", "--arch", "nope", "--out", "unused")
    assert_one_line_error(code, err, "known: " + ", ".join(sorted(e.plugin.name for e in REGISTRY.entries())))


def test_missing_export_folder(tmp_path: Path) -> None:
    code, _, err = run("translate", str(tmp_path / "absent"), "hello")
    assert_one_line_error(code, err, "export folder not found")


def test_corrupt_manifest(exports, tmp_path: Path) -> None:
    _, manifest = exports.get("gru")
    broken = tmp_path / "broken"
    shutil.copytree(manifest.directory, broken)
    (broken / "manifest.json").write_text("{not json")
    code, _, err = run("translate", str(broken), "hello")
    assert_one_line_error(code, err, "not valid JSON")
    raw = manifest.to_dict()
    del raw["graphs"]
    (broken / "manifest.json").write_text(json.dumps(raw))
    code, _, err = run("parity", str(broken))
    assert_one_line_error(code, err, "incomplete or corrupt")


def test_tampered_graph_is_refused(exports, tmp_path: Path) -> None:
    _, manifest = exports.get("gru")
    copy = tmp_path / "copy"
    shutil.copytree(manifest.directory, copy)
    with open(copy / "decoder.onnx", "ab") as handle:
        handle.write(b"junk")
    code, _, err = run("translate", str(copy), "hello")
    assert_one_line_error(code, err, "does not match the sha256")


def test_empty_input(exports, tmp_path: Path) -> None:
    _, manifest = exports.get("gru")
    code, _, err = run("translate", str(manifest.directory))
    assert_one_line_error(code, err, "nothing to translate")
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    for source, lines in ((blank, 2), (empty, 0)):  # as with --output: one output line per input line, exit 0
        code, out, err = run("translate", str(manifest.directory), "--input", str(source))
        assert code == 0 and out == "\n" * lines, err
        code, _, err = run("translate", str(manifest.directory), "--input", str(source), "--output",
                           str(tmp_path / "out.txt"))
        assert code == 0 and (tmp_path / "out.txt").read_text() == "\n" * lines, err
    code, _, err = run("translate", str(manifest.directory), "  ")
    assert_one_line_error(code, err, "input 1 is empty")


def test_missing_and_corrupt_checkpoint(tmp_path: Path) -> None:
    code, _, err = run("export", "--arch", "gru", "--checkpoint", str(tmp_path / "x.safetensors"),
                       "--out", str(tmp_path / "out"))
    assert_one_line_error(code, err, "checkpoint not found")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00" * 64)
    code, _, err = run("export", "--arch", "gru", "--checkpoint", str(junk), "--out", str(tmp_path / "out"))
    assert_one_line_error(code, err, "not a readable safetensors checkpoint")
    assert not (tmp_path / "out").exists()


def test_mismatched_checkpoint(exports, tmp_path: Path) -> None:
    _, manifest = exports.get("gru")
    code, _, err = run("export", "--arch", "lstm", "--checkpoint", str(manifest.directory / "checkpoint.safetensors"),
                       "--out", str(tmp_path / "out"))
    assert_one_line_error(code, err, "checkpoint is for architecture 'gru', not 'lstm'")
    assert not (tmp_path / "out").exists()


def test_existing_output_needs_force(exports) -> None:
    _, manifest = exports.get("gru")
    before = (manifest.directory / "manifest.json").read_bytes()
    code, _, err = run("export", "--arch", "gru", "--out", str(manifest.directory), "--opset", "17")
    assert_one_line_error(code, err, "already exists and holds another export (opset 18, not 17); pass --force")
    assert (manifest.directory / "manifest.json").read_bytes() == before


def test_translate_and_parity_succeed(exports) -> None:
    _, manifest = exports.get("gru")
    code, out, err = run("translate", str(manifest.directory), manifest.samples[0], manifest.samples[1])
    assert code == 0, err
    assert len(out.splitlines()) == 2
    assert err == ""  # a CPU-only run prints no device notice (tests/test_extras.py covers --verbose)
    code, out, err = run("parity", str(manifest.directory), "--beam", "2", "--max-len", "20")
    assert code == 0, out + err
    assert out.strip().endswith("parity: PASS")


@pytest.mark.parametrize("args", [["export", "--arch", "nope"], ["translate", "/nonexistent/dir", "x"]])
def test_console_script_prints_no_traceback(args: list[str]) -> None:
    """The installed entry point, not only the click test runner."""
    result = subprocess.run([sys.executable, "-m", "s2s_deploy", *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("medium", ["audio", "image"])
def test_a_media_command_offers_timed_options_only_for_a_timed_medium(medium: str) -> None:
    from s2s_deploy.frontends.media import MEDIA

    row = MEDIA[medium]
    shown = CliRunner().invoke(main, [row.command, "--help"]).output
    assert ("--timestamps" in shown) == row.timed and (".srt" in shown) == row.timed
    assert "--beam" in shown and "--output" in shown


def test_every_front_end_reads_a_medium_whose_synthetic_inputs_it_featurises() -> None:
    from s2s_deploy.frontends import _BY_KIND
    from s2s_deploy.frontends.media import medium_of

    for kind in _BY_KIND.values():
        frontend = kind()
        inputs = medium_of(frontend).synthetic(frontend)
        assert len(inputs) == 16
        for item in inputs.values():
            features = frontend(item)
            assert features.size and bool((features == features).all())
