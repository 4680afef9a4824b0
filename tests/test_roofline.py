"""bench --roofline: which weights a step reads, and the bound they give."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from s2s_deploy.bench import roofline
from s2s_deploy.cli import main


def tiny_decoder(path, inner: int = 8, outer: int = 12, vocab: int = 30) -> None:
    """An embedding Gather (not counted), a MatMul through a Transpose (counted) and a bias Add (not a matrix op)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((vocab, inner)).astype(np.float32), "embedding"),
             numpy_helper.from_array(rng.standard_normal((outer, inner)).astype(np.float32), "w_t"),
             numpy_helper.from_array(np.zeros(outer, np.float32), "bias")]
    nodes = [helper.make_node("Gather", ["embedding", "ids"], ["x"]),
             helper.make_node("Transpose", ["w_t"], ["w"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "w"], ["y"]),
             helper.make_node("Add", ["y", "bias"], ["out"])]
    graph = helper.make_graph(nodes, "d", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["B"])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["B", outer])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_step_weights_count_matrix_weights_only(tmp_path) -> None:
    tiny_decoder(tmp_path / "decoder.onnx")
    weights = roofline.step_weights(tmp_path / "decoder.onnx")
    assert weights.parameters == 8 * 12
    assert weights.bytes == 4 * 8 * 12
    assert not weights.integer
    assert weights.flops_per_row == 2 * 8 * 12
    # the Transpose turns the stored (12, 8) into the product's (K, N) = (8, 12)
    assert weights.matrices == ((8, 12, False),)


def test_matrix_shapes_follow_how_the_product_reads_the_weight(tmp_path) -> None:
    """A Gemm with transB reads its (N, K) weight as (K, N); an LSTM's (dirs, 4H, I) is an I by 4H product."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((6, 4)).astype(np.float32), "w_gemm"),
             numpy_helper.from_array(rng.standard_normal((1, 12, 6)).astype(np.float32), "w_lstm"),
             numpy_helper.from_array(rng.standard_normal((1, 12, 3)).astype(np.float32), "r_lstm")]
    nodes = [helper.make_node("Gemm", ["x", "w_gemm"], ["g"], transB=1),
             helper.make_node("Unsqueeze", ["g", "axis"], ["seq"]),
             helper.make_node("LSTM", ["seq", "w_lstm", "r_lstm"], ["y"], hidden_size=3)]
    inits.append(numpy_helper.from_array(np.array([0], np.int64), "axis"))
    graph = helper.make_graph(nodes, "d", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "d.onnx"))
    weights = roofline.step_weights(tmp_path / "d.onnx")
    assert sorted(weights.matrices) == [(3, 12, False), (4, 6, False), (6, 12, False)]
    assert (weights.inner, weights.outer) == (6, 12)  # the largest matrix, as its product reads it


def test_bound_takes_the_slower_of_memory_and_compute() -> None:
    weights = roofline.StepWeights(parameters=1_000_000, bytes=4_000_000, integer=False, inner=1000, outer=1000)
    limits = roofline.MachineLimits(threads=2, bandwidth_gb_s=4.0, gemm_gflop_s={1: 2.0, 64: 100.0})
    # one row: memory 1 ms, compute 1 ms at 2 GFLOP/s -> either way 1000 tokens/s
    tokens, _ = roofline.bound(weights, limits, batch=1, beam=1)
    assert abs(tokens - 1000) < 1e-6
    # 64 rows: memory 1 ms, compute 128 MFLOP at 100 GFLOP/s = 1.28 ms -> compute-bound, 64 / 1.28 ms
    tokens, which = roofline.bound(weights, limits, batch=16, beam=4)
    assert which == "compute" and abs(tokens - 16 / 1.28e-3) < 1e-3


def test_measured_limits_are_positive(tmp_path) -> None:
    tiny_decoder(tmp_path / "decoder.onnx", inner=64, outer=64)
    weights = roofline.step_weights(tmp_path / "decoder.onnx")
    limits = roofline.measure_limits(weights, [1, 4], threads=1, budget_s=0.05)
    assert limits.bandwidth_gb_s > 0 and set(limits.gemm_gflop_s) == {1, 4}
    assert all(g > 0 for g in limits.gemm_gflop_s.values())
    assert set(limits.products_ms) == {1, 4} and all(ms > 0 for ms in limits.products_ms.values())


def test_int8_products_time_the_integer_kernels(tmp_path) -> None:
    times = roofline.products_ms([(64, 32, True), (32, 64, True), (64, 16, False)], [1, 3], threads=1, budget_s=0.05)
    assert set(times) == {1, 3} and all(ms > 0 for ms in times.values())


def test_cell_shares_compare_one_step_with_its_bound() -> None:
    cell = roofline.RooflineCell("m", "onnxruntime-cpu", 1, 1, tokens_per_s=100.0, bound_tokens_per_s=250.0,
                                 bound_by="memory", bound_step_ms=4.0, products_ms=5.0, step_ms=8.0)
    assert cell.share == 0.4 and cell.products_share == 0.8 and cell.step_share == 0.5
    unknown = roofline.RooflineCell("m", "onnxruntime-generate", 1, 1, 100.0, 250.0, "memory", 4.0)
    assert unknown.products_share is None and unknown.step_share is None


def _two_minutes() -> tuple[roofline.StepWeights, list[roofline.MachineLimits], roofline.SameMinute]:
    """A 4 MB step timed after two passes, the machine's bandwidth halving between them: a bound of
    1 ms (products 1.25 ms) after the first pass, 2 ms (2.5 ms) after the second."""
    from types import SimpleNamespace

    weights = roofline.StepWeights(parameters=1_000_000, bytes=4_000_000, integer=False, inner=1000, outer=1000)
    limits = [roofline.MachineLimits(2, bandwidth_gb_s=4.0, gemm_gflop_s={1: 100.0}, products_ms={1: 1.25}),
              roofline.MachineLimits(2, bandwidth_gb_s=2.0, gemm_gflop_s={1: 100.0}, products_ms={1: 2.5})]
    timed = roofline.SameMinute({}, threads=2)
    timed.timers["m"] = SimpleNamespace(weights=weights)
    timed.limits["m", "onnxruntime-cpu", 1, 1] = list(limits)
    return weights, limits, timed


def test_each_pass_is_held_against_the_limits_timed_after_it(tmp_path) -> None:
    """The machine's bandwidth halves between two passes and so does the speed: both passes are at
    the same share of their own minute's bound, which a bound timed once would hide."""
    from types import SimpleNamespace

    weights, limits, timed = _two_minutes()
    row = SimpleNamespace(model="m", system="onnxruntime-cpu", beam=1, batch=1, tokens_per_s=600.0,
                          passes=(800.0, 400.0), step_ms=1.875, pass_step_ms=(1.25, 2.5))
    (cell,), by_model = roofline.roofline_cells([row], timed)
    # bounds: 1000 tokens/s (1 ms) after the first pass, 500 (2 ms) after the second
    assert cell.shares == (0.8, 0.8) and cell.share == 0.8
    assert cell.step_shares == (0.8, 0.8) and cell.step_share == 0.8
    assert cell.bound_tokens_per_s == 750.0 and cell.bound_by == "memory"
    assert by_model["m"] == (weights, limits)
    # held against the median bound instead, the passes would read 107% and 53%
    assert "80% [80–80%]" in roofline.markdown([cell], by_model)


def test_bench_prints_each_cell_as_a_share_of_its_bound(exports, tmp_path) -> None:
    _, manifest = exports.get("gru")
    result = CliRunner().invoke(main, ["bench", str(manifest.directory), "--systems", "onnxruntime-cpu",
                                       "--beams", "1", "--batches", "1", "--sentences", "2", "--reps", "2",
                                       "--warmup", "0", "--threads", "1", "--roofline",
                                       "--json", str(tmp_path / "bench.json")])
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if line.startswith(f"| {manifest.directory.name} |")
            and line.endswith("%] |")]  # the share, then its range over the passes
    assert len(rows) == 1
    *_, products, step, share = (cell.strip() for cell in rows[0].split("|")[1:-1])
    share = share.split()[0]
    assert all(value.endswith("%") and float(value.rstrip("%")) > 0 for value in (products, step, share))
    cell = json.loads((tmp_path / "bench.json").read_text())["roofline"][0]
    assert cell["step_ms"] > 0 and cell["products_ms"] > 0 and cell["bound_step_ms"] > 0
    assert len(cell["shares"]) == 2 and len(cell["step_shares"]) == 2  # one per pass
    assert len(cell["budgets"]) == 2 and all(0 < c < 1.5 for c in cell["ceilings"])
    for budget in cell["budgets"]:  # the parts add up to the measured time per token
        assert budget["measured"] == pytest.approx(budget["step"] + budget["encoder"] + budget["loop"])
        assert budget["encoder"] > 0 and budget["loop"] > 0
    assert "| measured | bound | kernels | graph | encoder | loop | ceiling |" in result.stdout
    assert min(cell["shares"]) <= cell["share"] <= max(cell["shares"])


def test_each_pass_splits_its_time_per_token_from_the_bound_up() -> None:
    """Per token: measured = bound + kernels + graph + encoder + loop, each pass against its own
    minute's limits; the ceiling is what a step of its products alone would have reached."""
    from types import SimpleNamespace

    from s2s_deploy.bench.runner import PassTime

    _, _, timed = _two_minutes()
    # 100 steps for 100 tokens; the second pass takes twice as long in every part, on a machine half as fast
    times = (PassTime(seconds=0.15625, runtime_seconds=0.14, step_seconds=0.125, steps=100, tokens=100),
             PassTime(seconds=0.3125, runtime_seconds=0.28, step_seconds=0.25, steps=100, tokens=100))
    row = SimpleNamespace(model="m", system="onnxruntime-cpu", beam=1, batch=1, tokens_per_s=480.0,
                          passes=(640.0, 320.0), step_ms=1.875, pass_step_ms=(1.25, 2.5), pass_times=times)
    (cell,), by_model = roofline.roofline_cells([row], timed)
    first, second = cell.budgets
    assert (first.measured, first.bound, first.kernels, first.graph) == pytest.approx((1.5625, 1.0, 0.25, 0.0))
    assert (first.encoder, first.loop) == pytest.approx((0.15, 0.1625))
    assert (second.measured, second.bound, second.encoder, second.loop) == pytest.approx((3.125, 2.0, 0.3, 0.325))
    assert first.ceiling == pytest.approx(1.0 / (1.25 + 0.15 + 0.1625)) == pytest.approx(second.ceiling)
    assert cell.shares == (0.64, 0.64)
    assert "| m | onnxruntime-cpu | 1 | 1 | 2.344 | 1.500 | 0.375 | 0.000 | 0.225 | 0.244 | 64% |" in \
        roofline.markdown([cell], by_model)


def test_a_decoder_with_nothing_to_bound_fails_in_one_line_before_the_benchmark(tmp_path) -> None:
    from s2s_deploy.errors import S2SError

    inits = [numpy_helper.from_array(np.ones((30, 8), np.float32), "embedding")]
    nodes = [helper.make_node("Gather", ["embedding", "ids"], ["out"])]
    graph = helper.make_graph(nodes, "d", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["B"])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["B", 8])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "d.onnx"))
    with pytest.raises(S2SError, match="no matrix-op weights"):
        roofline.SameMinute({"m": tmp_path / "d.onnx"}, threads=1)
