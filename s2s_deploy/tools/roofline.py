"""How far a decoding speed is from this machine's limit (``bench --roofline``).

A decoder step reads every weight of its matrix products once, whatever the row count, and
does ``2 * weights`` flops per row. So a step can be no faster than the slower of two times:
the weights' bytes at the bandwidth a weights-sized matrix-vector product reaches here, and the
step's flops at the throughput a matrix product of the step's shape reaches here. Both are
measured with ONNX Runtime itself, at the run's thread count, on random weights of the
export's precision; nothing is taken from a data sheet. A ``Gather`` (an embedding lookup)
reads one row per token and is left out: it is not what bounds a step.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MATRIX_OPS = frozenset({"MatMul", "Gemm", "MatMulInteger", "Conv", "GRU", "LSTM", "RNN"})
"""ONNX op types whose weight initializers are read in full by every step."""

_ITEM_BYTES = {TensorProto.FLOAT: 4, TensorProto.FLOAT16: 2, TensorProto.BFLOAT16: 2, TensorProto.INT8: 1,
               TensorProto.UINT8: 1, TensorProto.DOUBLE: 8}


@dataclass(frozen=True)
class StepWeights:
    """The weights a decoder step reads in full: their count, bytes, and widest dimension pair."""

    parameters: int
    bytes: int
    integer: bool
    """True when the largest matrices are int8 (a quantised export): timed with int8 kernels."""
    inner: int
    outer: int
    """The largest matrix's (K, N): the shape used to time the step's matrix products."""

    @property
    def flops_per_row(self) -> int:
        return 2 * self.parameters


@dataclass(frozen=True)
class MachineLimits:
    threads: int
    bandwidth_gb_s: float
    """Bytes per second of a weights-sized matrix-vector product, in GB/s."""
    gemm_gflop_s: dict[int, float]
    """Flops per second of a (rows x K) by (K x N) product, by row count, in GFLOP/s."""


@dataclass(frozen=True)
class RooflineCell:
    model: str
    system: str
    beam: int
    batch: int
    tokens_per_s: float
    bound_tokens_per_s: float
    bound_by: str

    @property
    def share(self) -> float:
        return self.tokens_per_s / self.bound_tokens_per_s


def _subgraphs(graph: onnx.GraphProto) -> Iterable[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _subgraphs(attribute.g)
            for sub in attribute.graphs:
                yield from _subgraphs(sub)


def step_weights(decoder: Path) -> StepWeights:
    """Count the initializers that feed matrix ops, directly or through a cast or dequantisation."""
    model = onnx.load(str(decoder), load_external_data=False)
    initializers = {i.name: i for g in _subgraphs(model.graph) for i in g.initializer}
    feeds: dict[str, list[onnx.NodeProto]] = {}
    for graph in _subgraphs(model.graph):
        for node in graph.node:
            for name in node.input:
                feeds.setdefault(name, []).append(node)
    pass_through = {"Cast", "DequantizeLinear", "Transpose", "Reshape", "Identity"}

    def reaches_matrix_op(name: str, depth: int = 0) -> bool:
        for node in feeds.get(name, ()):
            if node.op_type in MATRIX_OPS:
                return True
            if node.op_type in pass_through and depth < 3 and any(reaches_matrix_op(o, depth + 1) for o in node.output):
                return True
        return False

    parameters = size = 0
    largest: tuple[int, int, int, bool] = (0, 1, 1, False)
    for name, tensor in initializers.items():
        count = int(np.prod(tensor.dims)) if tensor.dims else 1
        if count < 2 or not reaches_matrix_op(name):
            continue
        parameters += count
        size += count * _ITEM_BYTES.get(tensor.data_type, 4)
        if count > largest[0] and len(tensor.dims) >= 2:
            largest = (count, int(tensor.dims[-2]), int(tensor.dims[-1]), _ITEM_BYTES.get(tensor.data_type) == 1)
    if not parameters:
        raise ValueError(f"{decoder} has no matrix-op weights to bound a step with")
    return StepWeights(parameters, size, largest[3], largest[1], largest[2])


def _matmul_session(rows: int, inner: int, outer: int, integer: bool, threads: int):
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    if integer:
        weight = numpy_helper.from_array(rng.integers(-127, 127, (inner, outer), dtype=np.int8), "w")
        nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
                 helper.make_node("MatMulInteger", ["xq", "w", "xz"], ["y"])]
        output_type = TensorProto.INT32
    else:
        weight = numpy_helper.from_array(rng.standard_normal((inner, outer), dtype=np.float32) * 0.01, "w")
        nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
        output_type = TensorProto.FLOAT
    graph = helper.make_graph(nodes, "roofline", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, inner])],
                              [helper.make_tensor_value_info("y", output_type, [rows, outer])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session, np.random.default_rng(1).standard_normal((rows, inner), dtype=np.float32)


def _seconds_per_call(rows: int, inner: int, outer: int, integer: bool, threads: int, budget_s: float) -> float:
    """The fastest of repeated calls: a limit is what the machine can do, not what it did while busy."""
    session, x = _matmul_session(rows, inner, outer, integer, threads)
    for _ in range(3):
        session.run(None, {"x": x})
    times = []
    deadline = time.perf_counter() + budget_s
    while len(times) < 10 or (time.perf_counter() < deadline and len(times) < 200):
        started = time.perf_counter()
        session.run(None, {"x": x})
        times.append(time.perf_counter() - started)
    return min(times)


def measure_limits(weights: StepWeights, rows: Sequence[int], threads: int, budget_s: float = 1.0) -> MachineLimits:
    """Time a matrix-vector product holding as many weight bytes as the step, then the step's
    largest matrix at each row count. The weights are spread over a square-ish (K, N) so the
    product is one kernel call, as the step's largest matrices are."""
    item = 1 if weights.integer else 4
    elements = max(weights.bytes // item, 1)
    inner = min(weights.inner, elements)
    outer = max(elements // inner, 1)
    gemv = _seconds_per_call(1, inner, outer, weights.integer, threads, budget_s)
    bandwidth = inner * outer * item / gemv / 1e9
    gemm = {}
    for r in sorted(set(rows)):
        seconds = _seconds_per_call(r, weights.inner, weights.outer, weights.integer, threads, budget_s)
        gemm[r] = 2 * r * weights.inner * weights.outer / seconds / 1e9
    return MachineLimits(threads, bandwidth, gemm)


def bound(weights: StepWeights, limits: MachineLimits, batch: int, beam: int) -> tuple[float, str]:
    """Tokens/s no step loop can beat here: a step of ``batch * beam`` rows yields ``batch`` tokens."""
    rows = batch * beam
    memory_s = weights.bytes / (limits.bandwidth_gb_s * 1e9)
    compute_s = rows * weights.flops_per_row / (limits.gemm_gflop_s[rows] * 1e9)
    step_s, which = (memory_s, "memory") if memory_s >= compute_s else (compute_s, "compute")
    return batch / step_s, which


def roofline_cells(rows: Sequence, decoders: dict[str, Path], threads: int) -> tuple[list[RooflineCell], dict]:
    """Bound every ONNX Runtime CPU row of a benchmark (objects with model, system, beam, batch
    and tokens_per_s); returns the cells and, per model, the measured limits."""
    cells, limits_by_model = [], {}
    for model, decoder in decoders.items():
        mine = [r for r in rows if r.model == model and r.system.startswith("onnxruntime") and "cuda" not in r.system]
        if not mine:
            continue
        weights = step_weights(decoder)
        limits = measure_limits(weights, [r.batch * r.beam for r in mine], threads)
        limits_by_model[model] = (weights, limits)
        for r in mine:
            tokens_bound, which = bound(weights, limits, r.batch, r.beam)
            cells.append(RooflineCell(model, r.system, r.beam, r.batch, r.tokens_per_s, tokens_bound, which))
    return cells, limits_by_model


def markdown(cells: Sequence[RooflineCell], limits_by_model: dict) -> str:
    lines = ["", "Roofline (this machine, measured now; see docs/performance.md for the method):", ""]
    for model, (weights, limits) in limits_by_model.items():
        gemm = ", ".join(f"{r} rows {g:.0f}" for r, g in limits.gemm_gflop_s.items())
        lines.append(f"- {model}: a step reads {weights.bytes / 1e6:.1f} MB of {'int8' if weights.integer else 'fp32'} "
                     f"matrix weights ({weights.parameters / 1e6:.2f}M parameters); weights-sized GEMV "
                     f"{limits.bandwidth_gb_s:.1f} GB/s; GEMM GFLOP/s at {gemm} ({limits.threads} threads)")
    lines += ["", "| model | system | beam | batch | tokens/s | bound tokens/s | bound by | % of bound |",
              "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {c.model} | {c.system} | {c.beam} | {c.batch} | {c.tokens_per_s:.1f} | {c.bound_tokens_per_s:.1f} "
              f"| {c.bound_by} | {100 * c.share:.0f}% |" for c in cells]
    return "\n".join(lines)
