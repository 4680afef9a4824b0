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

``bench --roofline`` times all three after every pass (``SameMinute``) and holds each pass
against its own minute's bound: on a shared VM the bandwidth moves within a minute.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from s2s_deploy.errors import S2SError

if TYPE_CHECKING:
    from s2s_deploy.bench.runner import PassTime

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
class TokenBudget:
    """One pass's milliseconds per generated token, from the bound up to what was measured:
    ``measured = bound + kernels + graph + encoder + loop``."""

    measured: float
    bound: float
    products: float
    """The step's matrix products alone, timed right after the pass."""
    step: float
    encoder: float
    """Runtime time outside the decoder steps: the encoder."""
    loop: float
    """Time outside the runtime: the search and its bookkeeping."""

    @property
    def kernels(self) -> float:
        """What ONNX Runtime's kernels cost above the bound: no graph change wins it back."""
        return self.products - self.bound

    @property
    def graph(self) -> float:
        """What the step's other nodes cost: the part a leaner graph could win back."""
        return self.step - self.products

    @property
    def ceiling(self) -> float:
        """The share of the bound a step of its products alone would reach, with this encoder and loop."""
        return self.bound / (self.products + self.encoder + self.loop)


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
    shares: tuple[float, ...] = ()
    """Each pass's tokens/s over the bound timed right after that pass."""
    step_shares: tuple[float, ...] = ()
    """Each pass's bound step time over its measured step time."""
    budgets: tuple[TokenBudget, ...] = ()
    """Each pass's time per token, split, where the backend times its steps and encoder apart."""

    @property
    def share(self) -> float:
        return statistics.median(self.shares) if self.shares else self.tokens_per_s / self.bound_tokens_per_s

    @property
    def products_share(self) -> float | None:
        """How close the kernels alone come to the bound: the part no graph change can win back."""
        return self.bound_step_ms / self.products_ms if self.products_ms else None

    @property
    def step_share(self) -> float | None:
        if self.step_shares:
            return statistics.median(self.step_shares)
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
        raise S2SError(f"{decoder} has no matrix-op weights to bound a step with")
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
    The session options are the step decoder's own: its workers spin within a run and stop when it
    returns, leaving the cores to the pass that follows. Returns the session and each input's (name, K, int8)."""
    import onnxruntime as ort

    from s2s_deploy.runtime.ort.backend import session_options

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
                                   .SerializeToString(), session_options(threads, spin_between_runs=False),
                                   providers=["CPUExecutionProvider"])
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


class ProductsGraph:
    """A products graph, built once and timed as often as asked, with its inputs per row count."""

    def __init__(self, matrices: Sequence[tuple[int, int, bool]], threads: int) -> None:
        self.session, self.inputs = _products_session(matrices, threads)
        self.feeds: dict[int, dict[str, np.ndarray]] = {}

    def run(self, rows: int) -> None:
        """One call at ``rows`` rows (random inputs, made once per row count)."""
        if rows not in self.feeds:
            rng = np.random.default_rng(rows)
            self.feeds[rows] = {name: rng.integers(0, 256, (rows, inner), dtype=np.uint8) if integer
                                else rng.standard_normal((rows, inner), dtype=np.float32)
                                for name, inner, integer in self.inputs}
        self.session.run(None, self.feeds[rows])

    def ms(self, rows: int, budget_s: float) -> float:
        return 1000 * _fastest(lambda: self.run(rows), budget_s)


def products_ms(matrices: Sequence[tuple[int, int, bool]], rows: Sequence[int], threads: int,
                budget_s: float = 1.0) -> dict[int, float]:
    """Matrix products side by side in one graph, by row count: for a step's own matrices, the
    fastest a step can be on these kernels."""
    products = ProductsGraph(matrices, threads)
    return {r: products.ms(r, budget_s) for r in sorted(set(rows))}


class LimitTimer:
    """The limits of one step's weights, with the timing graphs built once, so they can be timed
    again after every benchmark pass: this machine's bandwidth moved by a third within minutes
    (docs/performance.md), so a bound timed at another minute than the pass says little about it."""

    def __init__(self, weights: StepWeights, threads: int) -> None:
        self.weights, self.threads = weights, threads
        item = 1 if weights.integer else 4
        elements = max(weights.bytes // item, 1)
        inner = min(weights.inner, elements)
        self.gemv_shape = (inner, max(elements // inner, 1))
        self.gemv_bytes = self.gemv_shape[0] * self.gemv_shape[1] * item
        self._graphs: dict[str, ProductsGraph] = {}

    def _graph(self, kind: str) -> ProductsGraph:
        if kind not in self._graphs:
            w = self.weights
            matrices = {"gemv": [(*self.gemv_shape, w.integer)], "largest": [(w.inner, w.outer, w.integer)],
                        "step": list(w.matrices)}[kind]
            self._graphs[kind] = ProductsGraph(matrices, self.threads)
        return self._graphs[kind]

    def measure(self, rows: Sequence[int], budget_s: float = 1.0) -> MachineLimits:
        """Time a matrix-vector product holding as many weight bytes as the step, then the step's
        largest matrix at each row count, then all of the step's matrix products together. The
        weights-sized product spreads the bytes over a square-ish (K, N) so it is one kernel call,
        as the step's largest matrices are."""
        w, counts = self.weights, sorted(set(rows))
        bandwidth = self.gemv_bytes / self._graph("gemv").ms(1, budget_s) / 1e6
        gemm = {r: 2 * r * w.inner * w.outer / self._graph("largest").ms(r, budget_s) / 1e6 for r in counts}
        step_ms = {r: self._graph("step").ms(r, budget_s) for r in counts} if w.matrices else {}
        return MachineLimits(self.threads, bandwidth, gemm, step_ms)


def measure_limits(weights: StepWeights, rows: Sequence[int], threads: int, budget_s: float = 1.0) -> MachineLimits:
    return LimitTimer(weights, threads).measure(rows, budget_s)


def bound(weights: StepWeights, limits: MachineLimits, batch: int, beam: int) -> tuple[float, str]:
    """Tokens/s no step loop can beat here: a step of ``batch * beam`` rows yields ``batch`` tokens."""
    rows = batch * beam
    memory_s = weights.bytes / (limits.bandwidth_gb_s * 1e9)
    compute_s = rows * weights.flops_per_row / (limits.gemm_gflop_s[rows] * 1e9)
    step_s, which = (memory_s, "memory") if memory_s >= compute_s else (compute_s, "compute")
    return batch / step_s, which


def _ort_errors() -> tuple[type[Exception], ...]:
    import onnxruntime as ort

    state = ort.capi.onnxruntime_pybind11_state
    return state.Fail, state.RuntimeException, state.InvalidArgument, state.NotImplemented, state.EPFail



def bounded(system: str) -> bool:
    """The systems a roofline applies to: ONNX Runtime on the CPU, whose limits are timed here."""
    return system.startswith("onnxruntime") and "cuda" not in system


class SameMinute:
    """``run_benchmark``'s ``after_pass``: times each ONNX Runtime CPU cell's limits after every
    pass of it, while the worker waits, so each pass is held against the machine of its minute."""

    def __init__(self, decoders: dict[str, Path], threads: int, budget_s: float = 0.3) -> None:
        """Reads each decoder's weights now, so a decoder with nothing to bound fails before the benchmark."""
        self.budget_s = budget_s
        self.timers = {model: LimitTimer(step_weights(path), threads) for model, path in decoders.items()}
        self.limits: dict[tuple[str, str, int, int], list[MachineLimits]] = defaultdict(list)

    def after_pass(self, export_dir: Path, system: str, beam: int, batch: int) -> None:
        if not bounded(system):
            return
        model = export_dir.name
        try:
            limits = self.timers[model].measure([beam * batch], self.budget_s)
        except (MemoryError, *_ort_errors()) as exc:  # e.g. no memory for the weights-sized timing graph
            raise S2SError(f"bench --roofline: timing this machine's limits for {model} failed: "
                           f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}") from exc
        self.limits[model, system, beam, batch].append(limits)


def roofline_cells(rows: Sequence, timed: SameMinute) -> tuple[list[RooflineCell], dict]:
    """Bound every benchmark row whose passes had their limits timed (objects with model, system,
    beam, batch, tokens_per_s, passes, step_ms, pass_step_ms and optionally pass_times: see
    ``bench.BenchRow``); returns the cells and, per model, the step's weights and every limit timed for it."""
    cells, by_model = [], {}
    for r in rows:
        limits = timed.limits.get((r.model, r.system, r.beam, r.batch))
        if not limits:
            continue
        weights = timed.timers[r.model].weights
        bounds = [bound(weights, one, r.batch, r.beam) for one in limits]
        bound_ms = [1000 * r.batch / tokens for tokens, _ in bounds]
        products = [one.products_ms[r.batch * r.beam] for one in limits if r.batch * r.beam in one.products_ms]
        times = getattr(r, "pass_times", ())
        budgets = ()
        if len(times) == len(limits) == len(products):
            budgets = tuple(_budget(t, b, p) for t, b, p in zip(times, bound_ms, products, strict=True))
        cells.append(RooflineCell(
            r.model, r.system, r.beam, r.batch, r.tokens_per_s,
            bound_tokens_per_s=statistics.median(tokens for tokens, _ in bounds),
            bound_by=Counter(which for _, which in bounds).most_common(1)[0][0],
            bound_step_ms=statistics.median(bound_ms),
            products_ms=statistics.median(products) if products else None,
            step_ms=r.step_ms,
            shares=tuple(p / tokens for p, (tokens, _) in zip(r.passes, bounds, strict=True)),
            step_shares=tuple(b / s for b, s in zip(bound_ms, r.pass_step_ms, strict=True)) if r.pass_step_ms else (),
            budgets=budgets,
        ))
        by_model.setdefault(r.model, (weights, []))[1].extend(limits)
    return cells, by_model


def _budget(times: PassTime, bound_step_ms: float, products_step_ms: float) -> TokenBudget:
    """A pass's ``PassTime`` per token; a step serves ``tokens / steps`` tokens."""
    per_token = 1000 / times.tokens
    steps_per_token = times.steps / times.tokens
    return TokenBudget(measured=times.seconds * per_token, bound=bound_step_ms * steps_per_token,
                       products=products_step_ms * steps_per_token, step=times.step_seconds * per_token,
                       encoder=(times.runtime_seconds - times.step_seconds) * per_token,
                       loop=(times.seconds - times.runtime_seconds) * per_token)


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def _spread(values: Sequence[float], digits: int = 1) -> str:
    """The median and, when there are several, the range: ``32.1 [29.8–33.0]``."""
    mid = f"{statistics.median(values):.{digits}f}"
    return mid if len(values) < 2 else f"{mid} [{min(values):.{digits}f}–{max(values):.{digits}f}]"


def markdown(cells: Sequence[RooflineCell], by_model: dict) -> str:
    lines = ["", "Roofline (this machine's limits, timed after every pass; docs/performance.md has the method):", ""]
    for model, (weights, limits) in by_model.items():
        rows = sorted({r for one in limits for r in one.gemm_gflop_s})
        gemm = ", ".join(f"{r} rows {_spread([one.gemm_gflop_s[r] for one in limits if r in one.gemm_gflop_s], 0)}"
                         for r in rows)
        lines.append(f"- {model}: a step reads {weights.bytes / 1e6:.1f} MB of {'int8' if weights.integer else 'fp32'} "
                     f"matrix weights ({weights.parameters / 1e6:.2f}M parameters); weights-sized GEMV "
                     f"{_spread([one.bandwidth_gb_s for one in limits])} GB/s; GEMM GFLOP/s at {gemm} "
                     f"({limits[0].threads} threads; median [range] of {len(limits)} timings)")
    lines += ["", "Per decoder step: the bound; the step's matrix products alone, as this ONNX Runtime runs them; "
              "the measured step (mean, inside the runtime). Shares are medians over the passes, each pass held "
              "against the limits timed right after it; % of bound gives their range. Tokens/s also pays for the "
              "encoder and the search.", "",
              "| model | system | beam | batch | tokens/s | bound tokens/s | bound by | bound ms | products ms "
              "| step ms | products, % of bound | step, % of bound | % of bound |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        share = f"{100 * c.share:.0f}%"
        if len(c.shares) > 1:
            share += f" [{100 * min(c.shares):.0f}–{100 * max(c.shares):.0f}%]"
        lines.append(f"| {c.model} | {c.system} | {c.beam} | {c.batch} | {c.tokens_per_s:.1f} "
                     f"| {c.bound_tokens_per_s:.1f} | {c.bound_by} | {c.bound_step_ms:.2f} | {_ms(c.products_ms)} "
                     f"| {_ms(c.step_ms)} | {_percent(c.products_share)} | {_percent(c.step_share)} | {share} |")
    budgeted = [c for c in cells if c.budgets]
    if budgeted:
        lines += ["", "Per generated token, in ms (medians over the passes): measured = bound + kernels (the "
                  "products alone, above the bound) + graph (the step's other nodes) + encoder + loop (outside "
                  "the runtime). Ceiling: the share of the bound a step of its products alone would reach, with "
                  "this encoder and loop.", "",
                  "| model | system | beam | batch | measured | bound | kernels | graph | encoder | loop | ceiling |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for c in budgeted:
            parts = [statistics.median(getattr(b, name) for b in c.budgets)
                     for name in ("measured", "bound", "kernels", "graph", "encoder", "loop")]
            lines.append(f"| {c.model} | {c.system} | {c.beam} | {c.batch} | "
                         + " | ".join(f"{value:.3f}" for value in parts)
                         + f" | {_percent(statistics.median(b.ceiling for b in c.budgets))} |")
    return "\n".join(lines)
