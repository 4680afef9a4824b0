"""How far a decoding speed is from this machine's limit (``bench --roofline``).

A decoder step reads every weight of its matrix products once, whatever the row count, and
does ``2 * weights`` flops per row. So a step can be no faster than the slower of two times:
the weights' bytes at the bandwidth a weights-sized matrix-vector product reaches here, and the
step's flops at the throughput a matrix product of the step's shape reaches here. Both are
measured with ONNX Runtime itself, at the run's thread count, on random weights of the
export's precision; nothing is taken from a data sheet. A ``Gather`` (an embedding lookup)
reads one row per token and is left out: it is not what bounds a step.

A third time tells the kernels apart from the graph around them: the step's own matrix
products, each weight at its shape and none of the other ops, timed as one ONNX Runtime graph
(random weights again). A step cannot beat it without faster kernels, whatever its graph.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
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
    matrices: tuple[tuple[int, int, bool], ...] = ()
    """Every matrix as (K, N, int8): the reduction and output sizes of its product."""

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
    products_ms: dict[int, float] = field(default_factory=dict)
    """The step's matrix products alone, one graph, by row count, in ms."""


@dataclass(frozen=True)
class RooflineCell:
    model: str
    system: str
    beam: int
    batch: int
    tokens_per_s: float
    bound_tokens_per_s: float
    bound_by: str
    bound_step_ms: float
    products_ms: float | None = None
    """The step's matrix products alone (``MachineLimits.products_ms``) at this cell's rows."""
    step_ms: float | None = None
    """The measured mean decoder step, where the backend times its steps."""

    @property
    def share(self) -> float:
        return self.tokens_per_s / self.bound_tokens_per_s

    @property
    def products_share(self) -> float | None:
        """How close the kernels alone come to the bound: the part no graph change can win back."""
        return self.bound_step_ms / self.products_ms if self.products_ms else None

    @property
    def step_share(self) -> float | None:
        return self.bound_step_ms / self.step_ms if self.step_ms else None


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

    def matrix_use(name: str, flipped: bool = False, depth: int = 0) -> tuple[str, bool] | None:
        """The matrix op a weight reaches, and whether a Transpose or ``transB`` turned it on the way."""
        for node in feeds.get(name, ()):
            if node.op_type in MATRIX_OPS:
                trans_b = any(a.name == "transB" and a.i for a in node.attribute)
                return node.op_type, flipped ^ trans_b
            if node.op_type in pass_through and depth < 3:
                for output in node.output:
                    use = matrix_use(output, flipped ^ (node.op_type == "Transpose"), depth + 1)
                    if use is not None:
                        return use
        return None

    parameters = size = 0
    largest: tuple[int, int, int, bool] = (0, 1, 1, False)
    matrices = []
    for name, tensor in initializers.items():
        count = int(np.prod(tensor.dims)) if tensor.dims else 1
        use = matrix_use(name) if count >= 2 else None
        if use is None:
            continue
        parameters += count
        size += count * _ITEM_BYTES.get(tensor.data_type, 4)
        if len(tensor.dims) >= 2:
            integer = _ITEM_BYTES.get(tensor.data_type) == 1
            inner, outer = _product_shape(use[0], use[1], [int(d) for d in tensor.dims])
            matrices.append((inner, outer, integer))
            if count > largest[0]:
                largest = (count, inner, outer, integer)
    if not parameters:
        raise ValueError(f"{decoder} has no matrix-op weights to bound a step with")
    return StepWeights(parameters, size, largest[3], largest[1], largest[2], tuple(matrices))


def _product_shape(op_type: str, flipped: bool, dims: list[int]) -> tuple[int, int]:
    """(K, N) of the product that reads a weight: a convolution's or recurrent cell's weight is
    taken as the matrix product that reads the same values."""
    if op_type == "Conv":
        return int(np.prod(dims[1:])), dims[0]
    if op_type in ("GRU", "LSTM", "RNN"):
        return dims[-1], int(np.prod(dims[:-1]))
    rows, columns = int(np.prod(dims[:-1])), dims[-1]
    return (columns, rows) if flipped else (rows, columns)


def _products_session(matrices: Sequence[tuple[int, int, bool]], threads: int):
    """One graph holding every matrix product of a step side by side, with a dynamic row count.
    An int8 product gets uint8 codes ready-made: what is timed is the kernels, not quantisation.
    The session options are the step decoder's own. Returns the session and each input's (name, K, int8)."""
    import onnxruntime as ort

    from s2s_deploy.runtime.ort_backend import session_options

    rng = np.random.default_rng(0)
    nodes, weights, outputs, inputs = [], [], [], {}
    for index, (inner, outer, integer) in enumerate(matrices):
        x = f"x{inner}{'q' if integer else ''}"
        inputs[x] = (inner, integer)
        w, y = f"w{index}", f"y{index}"
        if integer:
            weights += [numpy_helper.from_array(rng.integers(-127, 127, (inner, outer), dtype=np.int8), w),
                        numpy_helper.from_array(np.array(128, np.uint8), f"z{index}")]
            nodes.append(helper.make_node("MatMulInteger", [x, w, f"z{index}"], [y]))
        else:
            weights.append(numpy_helper.from_array(rng.standard_normal((inner, outer), dtype=np.float32) * 0.01, w))
            nodes.append(helper.make_node("MatMul", [x, w], [y]))
        outputs.append(helper.make_tensor_value_info(y, TensorProto.INT32 if integer else TensorProto.FLOAT,
                                                     ["rows", outer]))
    declared = [helper.make_tensor_value_info(x, TensorProto.UINT8 if integer else TensorProto.FLOAT, ["rows", inner])
                for x, (inner, integer) in inputs.items()]
    graph = helper.make_graph(nodes, "step-products", declared, outputs, weights)
    session = ort.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                                   .SerializeToString(), session_options(threads), providers=["CPUExecutionProvider"])
    return session, [(x, inner, integer) for x, (inner, integer) in inputs.items()]


def _fastest(call, budget_s: float) -> float:
    """The fastest of repeated calls: a limit is what the machine can do, not what it did while busy."""
    for _ in range(3):
        call()
    times = []
    deadline = time.perf_counter() + budget_s
    while len(times) < 10 or (time.perf_counter() < deadline and len(times) < 200):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return min(times)


def products_ms(matrices: Sequence[tuple[int, int, bool]], rows: Sequence[int], threads: int,
                budget_s: float = 1.0) -> dict[int, float]:
    """Matrix products side by side in one graph, by row count: for a step's own matrices, the
    fastest a step can be on these kernels."""
    session, inputs = _products_session(matrices, threads)
    rng = np.random.default_rng(1)
    times = {}
    for r in sorted(set(rows)):
        feeds = {name: rng.integers(0, 256, (r, inner), dtype=np.uint8) if integer
                 else rng.standard_normal((r, inner), dtype=np.float32) for name, inner, integer in inputs}
        times[r] = 1000 * _fastest(lambda feeds=feeds: session.run(None, feeds), budget_s)
    return times


def measure_limits(weights: StepWeights, rows: Sequence[int], threads: int, budget_s: float = 1.0) -> MachineLimits:
    """Time a matrix-vector product holding as many weight bytes as the step, then the step's
    largest matrix at each row count, then all of the step's matrix products together. The
    weights-sized product spreads the bytes over a square-ish (K, N) so it is one kernel call,
    as the step's largest matrices are."""
    item = 1 if weights.integer else 4
    elements = max(weights.bytes // item, 1)
    inner = min(weights.inner, elements)
    outer = max(elements // inner, 1)
    gemv_ms = products_ms([(inner, outer, weights.integer)], [1], threads, budget_s)[1]
    bandwidth = inner * outer * item / gemv_ms / 1e6
    largest_ms = products_ms([(weights.inner, weights.outer, weights.integer)], rows, threads, budget_s)
    gemm = {r: 2 * r * weights.inner * weights.outer / ms / 1e6 for r, ms in largest_ms.items()}
    step_ms = products_ms(weights.matrices, rows, threads, budget_s) if weights.matrices else {}
    return MachineLimits(threads, bandwidth, gemm, step_ms)


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
            cells.append(RooflineCell(model, r.system, r.beam, r.batch, r.tokens_per_s, tokens_bound, which,
                                      bound_step_ms=1000 * r.batch / tokens_bound,
                                      products_ms=limits.products_ms.get(r.batch * r.beam),
                                      step_ms=getattr(r, "step_ms", None)))
    return cells, limits_by_model


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def markdown(cells: Sequence[RooflineCell], limits_by_model: dict) -> str:
    lines = ["", "Roofline (this machine, measured now; see docs/performance.md for the method):", ""]
    for model, (weights, limits) in limits_by_model.items():
        gemm = ", ".join(f"{r} rows {g:.0f}" for r, g in limits.gemm_gflop_s.items())
        lines.append(f"- {model}: a step reads {weights.bytes / 1e6:.1f} MB of {'int8' if weights.integer else 'fp32'} "
                     f"matrix weights ({weights.parameters / 1e6:.2f}M parameters); weights-sized GEMV "
                     f"{limits.bandwidth_gb_s:.1f} GB/s; GEMM GFLOP/s at {gemm} ({limits.threads} threads)")
    lines += ["", "Per decoder step: the bound; the step's matrix products alone, as this ONNX Runtime runs them; "
              "the measured step (mean, inside the runtime). Tokens/s also pays for the encoder and the search.", "",
              "| model | system | beam | batch | tokens/s | bound tokens/s | bound by | bound ms | products ms "
              "| step ms | products, % of bound | step, % of bound | % of bound |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {c.model} | {c.system} | {c.beam} | {c.batch} | {c.tokens_per_s:.1f} | {c.bound_tokens_per_s:.1f} "
              f"| {c.bound_by} | {c.bound_step_ms:.2f} | {_ms(c.products_ms)} | {_ms(c.step_ms)} "
              f"| {_percent(c.products_share)} | {_percent(c.step_share)} | {100 * c.share:.0f}% |" for c in cells]
    return "\n".join(lines)
