"""Property-based fuzzing of what users and export folders hand us: manifest fields, translate
options, input files and file-system faults. In every case: no traceback, either success or a
non-zero exit with one error line, and no partial or destroyed output, no input touched.

Bounded for CI (2 cores, under 3 minutes): one export for the whole session, in-process
CliRunner, 100 examples per property, short inputs and --max-len.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from s2s_deploy.cli import main
from s2s_deploy.jobs import files

FUZZ = settings(max_examples=100, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def assert_clean(result: Result, allowed: tuple[int, ...] = (0, 1)) -> None:
    """Success, or one error line last on stderr; never an exception escaping the CLI."""
    assert result.exit_code in allowed or result.exit_code == 2, (result.exit_code, result.stderr)
    if result.exception is not None:
        assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.stderr
    if result.exit_code == 1:
        lines = result.stderr.strip().splitlines()
        assert lines and lines[-1].startswith("error: ") and len(lines) <= 2, result.stderr
        assert sum(line.startswith("error: ") for line in lines) == 1
    if result.exit_code == 2:  # click's usage errors: "Usage: ..." then "Error: ..."
        assert "Error: " in result.stderr


@pytest.fixture(scope="module")
def gru(exports) -> Path:
    return exports.get("gru")[1].directory


# --- manifest fields ------------------------------------------------------------------------------

JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["../../../etc/passwd", "/etc/passwd", "encoder.onnx", "decoder.onnx", "batch", ""]),
)
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)), max_leaves=12)


def key_paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into the manifest, short vocabularies and samples aside (their items are alike)."""
    paths = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            paths += key_paths(value, (*prefix, key))
    elif isinstance(node, list) and prefix[-1:] not in (("tokens",), ("samples",)):
        for index, value in enumerate(node[:3]):
            paths += key_paths(value, (*prefix, index))
    return paths


@pytest.fixture(scope="module")
def fuzz_folder(gru: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fuzz") / "export"
    shutil.copytree(gru, folder)
    return folder


def mutate(raw: dict, path: tuple, value: Any, delete: bool) -> dict:
    raw = json.loads(json.dumps(raw))
    node = raw
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return raw


@FUZZ
@given(data=st.data())
def test_fuzzed_manifest_field(fuzz_folder: Path, gru: Path, data: st.DataObject) -> None:
    raw = json.loads((gru / "manifest.json").read_text())
    path = data.draw(st.sampled_from(key_paths(raw)), label="key")
    delete = data.draw(st.booleans(), label="delete")
    value = None if delete else data.draw(JSON_VALUES, label="value")
    edited = mutate(raw, path, value, delete)
    (fuzz_folder / "manifest.json").write_text(json.dumps(edited), encoding="utf-8")
    graphs = {name: (fuzz_folder / name).read_bytes() for name in ("encoder.onnx", "decoder.onnx")}
    result = invoke("translate", str(fuzz_folder), "March 3", "--max-len", "8", "--threads", "1")
    assert_clean(result)
    assert all((fuzz_folder / name).read_bytes() == body for name, body in graphs.items())


# --- translate options ------------------------------------------------------------------------------

NUMBERS = st.sampled_from(["0", "1", "2", "4", "-1", "41", "42", "1000000000000", "nan", "inf", "-inf", "1e309",
                           "0.5", "abc", "", " 3"])
OPTIONS = {"--beam": NUMBERS, "--n-best": NUMBERS, "--alpha": NUMBERS, "--max-len": NUMBERS, "--batch-size": NUMBERS,
           "--engine": st.sampled_from(["loop", "graph", "x"]), "--device": st.sampled_from(["cpu", "tpu"]),
           "--on-long": st.sampled_from(["skip", "boom"]), "--chunk-lines": NUMBERS, "--threads": NUMBERS}
FLAGS = ["--scores", "--resume", "--quiet"]


@FUZZ
@given(options=st.dictionaries(st.sampled_from(sorted(OPTIONS)), st.just(None), max_size=4), data=st.data(),
       flags=st.lists(st.sampled_from(FLAGS), max_size=2, unique=True),
       texts=st.lists(st.text(min_size=0, max_size=12), max_size=3))
def test_fuzzed_translate_options(gru: Path, options: dict, data: st.DataObject, flags: list[str],
                                  texts: list[str]) -> None:
    args = ["translate", str(gru), *texts, *flags]
    for name in options:
        args += [name, data.draw(OPTIONS[name], label=name)]
    if "--max-len" not in options:
        args += ["--max-len", "8"]
    if "--threads" not in options:
        args += ["--threads", "1"]
    result = invoke(*args)
    assert_clean(result)


# --- input files ------------------------------------------------------------------------------------------

PIECES = st.sampled_from(["March 3", "1999", "", " ", "\n", "\r\n", "\u2028", "\x0c", "\ufeff", "\x00", "\t",
                          "é", "日本", "\U0001f600", "\r"])
RAW_BYTES = st.sampled_from([b"\xff", b"\xc3", b"\xe2\x80", b"\xef\xbb\xbf"])


@st.composite
def input_files(draw: st.DrawFn) -> bytes:
    parts = draw(st.lists(st.one_of(PIECES.map(lambda s: s.encode()), RAW_BYTES), max_size=14))
    return b"".join(parts)


@FUZZ
@given(body=input_files(), replace=st.booleans(), existing=st.booleans())
def test_fuzzed_input_file(gru: Path, tmp_path_factory: pytest.TempPathFactory, body: bytes, replace: bool,
                           existing: bool) -> None:
    folder = tmp_path_factory.mktemp("input")
    source, output = folder / "in.txt", folder / "out.txt"
    source.write_bytes(body)
    if existing:
        output.write_bytes(b"an earlier result\n")
    before = output.read_bytes() if existing else None
    extra = ["--errors", "replace"] if replace else []
    result = invoke("translate", str(gru), "--input", str(source), "--output", str(output), "--quiet",
                    "--max-len", "8", "--threads", "1", *extra)
    assert_clean(result)
    assert source.read_bytes() == body
    leftovers = sorted(p.name for p in folder.iterdir() if p.name not in ("in.txt", "out.txt"))
    assert leftovers == []
    if result.exit_code == 0:
        written = output.read_bytes()
        expected_lines = body.count(b"\n") + (bool(body) and not body.endswith(b"\n"))
        assert written.count(b"\n") == expected_lines
        shown = invoke("translate", str(gru), "--input", str(source), "--max-len", "8", "--threads", "1")
        assert_clean(shown)
        if shown.exit_code == 0:  # the same lines, blank lines included, with and without --output
            assert shown.stdout.encode() == written
    else:
        assert (output.read_bytes() if output.exists() else None) == before


# --- file-system faults ---------------------------------------------------------------------------------------

FAULTS = st.sampled_from([errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EIO, errno.EDQUOT])
WHERE = st.sampled_from(["fsync", "replace", "open", "sidecar"])


@FUZZ
@given(err=FAULTS, where=WHERE, lines=st.integers(min_value=1, max_value=6), chunk=st.integers(1, 4),
       existing=st.booleans())
def test_fuzzed_file_system_fault(gru: Path, tmp_path_factory: pytest.TempPathFactory, err: int, where: str,
                                  lines: int, chunk: int, existing: bool) -> None:
    folder = tmp_path_factory.mktemp("fault")
    source, output = folder / "in.txt", folder / "out.txt"
    body = "".join(f"March {i + 1}\n" for i in range(lines)).encode()
    source.write_bytes(body)
    if existing:
        output.write_bytes(b"an earlier result\n")
    before = output.read_bytes() if existing else None

    def fail(*args: Any, **kwargs: Any) -> None:
        raise OSError(err, os.strerror(err), str(output))

    with pytest.MonkeyPatch.context() as patch:
        if where == "fsync":
            patch.setattr(files.os, "fsync", fail)
        elif where == "replace":
            patch.setattr(files.os, "replace", fail)
        elif where == "open":
            patch.setattr(files.os, "open", fail)
        else:  # the resume sidecar, written through format/files.py's atomic write
            patch.setattr(files, "write_atomically", fail)
        result = invoke("translate", str(gru), "--input", str(source), "--output", str(output), "--quiet",
                        "--max-len", "8", "--threads", "1", "--chunk-lines", str(chunk))
    assert_clean(result, allowed=(1,))
    assert os.strerror(err) in result.stderr
    assert source.read_bytes() == body
    assert (output.read_bytes() if output.exists() else None) == before  # never partial, never destroyed
    part = Path(f"{output}.part")
    if part.exists():  # only a resumable one, whose sidecar says how much of it is good
        sidecar = json.loads(Path(f"{output}.part.json").read_text())
        assert part.stat().st_size >= sidecar["output_bytes"]
        assert math.isfinite(sidecar["counts"]["lines"])
