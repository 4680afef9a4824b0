"""The benchmark measures every requested cell; its figures are never asserted (they are wall-clock)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from s2s_deploy.bench.runner import BenchSettings, beam_costs, markdown_table, run_benchmark
from s2s_deploy.cli import main


def test_every_cell_is_measured_and_ratios_refer_to_pytorch(exports) -> None:
    _, manifest = exports.get("gru")
    settings = BenchSettings(beams=(1, 2), batches=(1, 2), sentences=4, reps=1, warmup=0, threads=1, max_len=20,
                             systems=("pytorch", "onnxruntime-cpu", "onnxruntime-cuda"))
    result = run_benchmark([manifest.directory], settings)
    cells = {(r.system, r.beam, r.batch) for r in result.rows}
    assert cells == {(s, b, n) for s in ("pytorch", "onnxruntime-cpu") for b in (1, 2) for n in (1, 2)}
    for row in result.rows:
        assert row.tokens > 0 and row.tokens_per_s > 0 and row.p95_ms >= row.p50_ms
        assert 0 <= row.engine_overhead < 1
        if row.system == "pytorch":
            assert row.ratio_to_pytorch == pytest.approx(1.0)
        assert (row.step_ms is not None and row.step_ms > 0) == (row.system == "onnxruntime-cpu")
    if "CUDAExecutionProvider" not in __import__("onnxruntime").get_available_providers() or result.skipped:
        assert any("cuda" in key for key in result.skipped)
    costs = beam_costs(result.rows)
    assert {(c.system, c.beam) for c in costs} == {("pytorch", 2), ("onnxruntime-cpu", 2)}
    assert all(c.ratio > 0 for c in costs)
    assert markdown_table(result).count("\n| ") == len(result.rows) + len(costs) + 1


def test_cli_rejects_unknown_systems_and_writes_json(exports, tmp_path: Path) -> None:
    _, manifest = exports.get("gru")
    runner = CliRunner()
    bad = runner.invoke(main, ["bench", str(manifest.directory), "--systems", "tensorflow"])
    assert bad.exit_code == 1 and "known: pytorch" in bad.stderr
    out = tmp_path / "bench.json"
    ok = runner.invoke(main, ["bench", str(manifest.directory), "--systems", "onnxruntime-cpu", "--beams", "1",
                              "--batches", "2", "--sentences", "2", "--reps", "1", "--warmup", "0",
                              "--json", str(out), "--plot", str(tmp_path / "bench.png")])
    assert ok.exit_code == 0, ok.output
    data = json.loads(out.read_text())
    assert data["machine"]["logical_cpus"] >= 1 and len(data["rows"]) == 1
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_backend_times_its_steps_and_its_sessions_spin_only_while_running(exports) -> None:
    from s2s_deploy.runtime.ort.backend import OrtBackend
    from s2s_deploy.runtime.search import SearchConfig, search
    from s2s_deploy.runtime.translator import encode_batch

    _, manifest = exports.get("gru")
    backend = OrtBackend(manifest, device="cpu", threads=2)
    # both sessions' workers spin within a run and stop when it returns, leaving the cores to the
    # other session and the search loop
    for session in (backend.encoder, backend.decoder):
        options = session.get_session_options()
        assert options.get_session_config_entry("session.force_spinning_stop") == "1"
        with pytest.raises(RuntimeError):  # no such entry: ONNX Runtime's default, spinning allowed
            options.get_session_config_entry("session.intra_op.allow_spinning")
    quiet = OrtBackend(manifest, device="cpu", threads=2, spin=False)  # serve's: never spin
    for session in (quiet.encoder, quiet.decoder):
        assert session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"
    search(backend, *encode_batch(manifest.samples[:2], manifest.src_vocab), SearchConfig(1, 1, 7, min_len=7))
    assert backend.steps_run == 7
    assert 0 < backend.step_seconds < backend.runtime_seconds


def test_a_failing_pass_hook_stops_the_worker_and_reaches_the_caller(exports) -> None:
    """The worker waits for the parent after each pass; if the parent's hook fails, the worker
    must end (not hang on the pipe) and the caller get the hook's own error."""
    _, manifest = exports.get("gru")
    settings = BenchSettings(beams=(1,), batches=(1,), sentences=2, reps=2, warmup=0, threads=1, max_len=10,
                             systems=("onnxruntime-cpu",))
    seen = []

    def hook(export_dir: Path, system: str, beam: int, batch: int) -> None:
        seen.append((export_dir.name, system, beam, batch))
        raise RuntimeError("limits could not be timed")

    with pytest.raises(RuntimeError, match="limits could not be timed"):
        run_benchmark([manifest.directory], settings, after_pass=hook)
    assert seen == [(manifest.directory.name, "onnxruntime-cpu", 1, 1)]

