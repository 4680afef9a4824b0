"""``parity --reference HF_DIR --timestamps``: the timestamped decoding of an export (tokens and timed
segments, clips longer than the window sought through) against ``generate(return_timestamps=True)``.

The tiny random Whisper of tests/test_hf_whisper_timestamps.py (51 timestamp ids after
``<|notimestamps|>``, a one-second window), its timestamp rows leaned less (a third of a typical best
logit, a fifth of each row kept): enough that the timestamp rules' summed-probability test makes them
come and cut segments, too little for one to win where no timestamp rule applies. That matters to the
ordinary, untimed rows of ``parity``: transformers 5.24's ``generate`` without ``return_timestamps``
still seeks at any timestamp pair it reads, and loops without end on a pair at ``<|0.00|>``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test_hf_whisper_timestamps import save_timestamp_whisper

from s2s_deploy.cli import main

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("whisper-parity-ts")
    hf_dir, out = root / "hf", root / "out"
    save_timestamp_whisper(hf_dir, 0.35, keep=0.2)
    result = CliRunner().invoke(main, ["export", "--hf", str(hf_dir), "--out", str(out)])
    assert result.exit_code == 0, result.output
    yield {"hf_dir": hf_dir, "out": out}


def edited(folders: dict[str, Any], tmp_path: Path, **search: Any) -> Path:
    """A copy of the export whose manifest's search block is changed (None: removed)."""
    copy = tmp_path / "export"
    shutil.copytree(folders["out"], copy)
    path = copy / "manifest.json"
    manifest = json.loads(path.read_text())
    for key, value in search.items():
        if value is None:
            manifest["search"].pop(key)
        else:
            manifest["search"][key] = value
    path.write_text(json.dumps(manifest))
    return copy


def test_parity_reference_checks_timestamps(folders: dict[str, Any]) -> None:
    """Greedy and beam 4 agree with ``generate(return_timestamps=True)`` on every clip, tokens and
    segments; the synthetic inputs hold clips longer than the window, and timestamps cut segments."""
    result = CliRunner().invoke(main, ["parity", str(folders["out"]), "--reference", str(folders["hf_dir"]),
                                       "--timestamps", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{"):])
    assert report["passed"]
    assert [row["mode"] for row in report["timestamps"]] == ["greedy timestamps", "beam4 timestamps"]
    for row in report["timestamps"]:
        assert row["identical"] == row["tokens_identical"] == row["segments_identical"] == row["inputs"] == 20
        assert row["longer_than_window"] >= 4 and row["segments"] > row["inputs"]
    assert all(s["agreement"] == 1.0 for s in report["searches"])  # the untimed rows still run


def test_parity_timestamps_without_reference_and_by_default(folders: dict[str, Any], tmp_path: Path) -> None:
    """Without ``--reference`` the PyTorch original is the reference; an export whose search block turns
    timestamps on is checked with them without asking."""
    export = edited(folders, tmp_path, timestamps=True)
    result = CliRunner().invoke(main, ["parity", str(export)])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "timestamps" in line]
    assert len(lines) == 2 and all(line.endswith(" ok") and "segments identical 20/20" in line for line in lines)
    assert result.output.rstrip().endswith("parity: PASS")


@pytest.mark.parametrize(("change", "tokens_agree"), [
    ({"time_precision": 0.04}, True),  # every time doubled, the tokens and seeks unchanged
    ({"timestamp_frames": 1}, False),  # each window seeks twice as far
])
def test_parity_timestamps_fail_a_broken_export(folders: dict[str, Any], tmp_path: Path,
                                                change: dict[str, Any], tokens_agree: bool) -> None:
    export = edited(folders, tmp_path, **change)
    result = CliRunner().invoke(main, ["parity", str(export), "--reference", str(folders["hf_dir"]), "--timestamps"])
    assert result.exit_code == 1, result.output
    assert result.output.rstrip().endswith("parity: FAIL")
    lines = [line for line in result.output.splitlines() if line.startswith(("greedy timestamps", "beam4 timestamps"))]
    assert len(lines) == 2 and all(line.endswith(" FAIL") for line in lines), result.output
    assert ("tokens identical 20/20" in lines[0]) == tokens_agree
    assert "  'synthetic" in result.output  # the mismatches are shown, segment by segment
    untimed = [line for line in result.output.splitlines() if line.startswith(("greedy   tokens", "beam4    tokens"))]
    assert len(untimed) == 2 and all(line.endswith(" ok") for line in untimed)  # timestamps alone differ


def test_parity_timestamps_refused_without_timestamp_tokens(folders: dict[str, Any], tmp_path: Path) -> None:
    export = edited(folders, tmp_path, timestamp_begin=None)
    result = CliRunner().invoke(main, ["parity", str(export), "--reference", str(folders["hf_dir"]), "--timestamps"])
    assert result.exit_code == 1
    assert result.output == ("error: timestamps: this export has no timestamp tokens (its search block sets no "
                             "timestamp_begin)\n")
