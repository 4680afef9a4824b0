"""bench --roofline: which weights a step reads, and the bound they give."""

from __future__ import annotations

import numpy as np
import onnx
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from s2s_deploy.cli import main
from s2s_deploy.tools import roofline


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


def test_bench_prints_each_cell_as_a_share_of_its_bound(exports) -> None:
    _, manifest = exports.get("gru")
    result = CliRunner().invoke(main, ["bench", str(manifest.directory), "--systems", "onnxruntime-cpu",
                                       "--beams", "1", "--batches", "1", "--sentences", "2", "--reps", "1",
                                       "--warmup", "0", "--threads", "1", "--roofline"])
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if line.startswith(f"| {manifest.directory.name} |")
            and line.endswith("% |")]
    assert len(rows) == 1
    share = float(rows[0].split("|")[-2].strip().rstrip("%"))
    assert share > 0
