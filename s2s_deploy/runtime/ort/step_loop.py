"""The decoder step loop: every input and output in buffers kept across batches, written in place.

Why, on both devices: nothing is allocated or rebound per step, and a binding made once per
(rows, memory shapes, position, outputs) is reused by every later batch of that shape. On CPU
that made the identical Marian-base 3.5-10% faster than rebinding each step (benchmarks/NOTES.md).
On CUDA it is what makes a step replayable as a CUDA graph, and it is required there: a host
array bound once is copied to the GPU at bind time, so writing it later changes nothing.

CUDA graphs: at batch 1 a GPU step is bound by the host launching ~200 kernels, about 6 µs
each against ~50 µs of arithmetic. ONNX Runtime's CUDA provider can capture a run as a graph
and replay it with one launch, provided every input and output keeps the address and shape it
had at capture. A growing cache changes shape every step, so each key above gets a graph id of
its own, and the addresses are made to repeat from batch to batch:

* every state lives in two flat buffers; step t reads a view of one and writes the one-longer
  view of the other;
* memory is copied into buffers kept per memory shape (once per sentence where the decoder takes
  it so, ``memory_per_sentence``: beams then neither copy it K times nor read it K times a step);
* tokens, position and reorder are small tensors written in place before each step;
* the requested outputs land in buffers kept per (rows, outputs): host arrays on CPU, read in
  place; on CUDA the session's own allocations, copied out after each run.

ONNX Runtime captures a graph id within its first run (after warm-up runs of its own) and
replays it from then on, so everything is bound before that run. Never captured: a batch's
first step, which binds the encoder's own state, and a step whose outputs have a shape not
seen yet, which lets the session allocate them (those buffers are kept for the captures).
A step that fails while being captured (a third-party decoder may hold an op that cannot be)
makes the backend drop capture for a fresh uncaptured session; the batch then replays its steps
so far on it and goes on, so the caller sees the same result, only slower.

Beam search's narrow first step (one row per sentence, as the K beams of a sentence start
identical) runs uncaptured on the encoder's own untiled memory and state and writes its state
for one row per sentence; the next step binds that past as it is, with a graph of its own, and
its reorder tiles the beams from it inside the decoder, as a step's reorder always does.

The k-position step (``decoder_multi``, speculative greedy) runs on the same state buffers: a
call reads the past as the last call left it and writes past + k positions into the other
buffer, less the ``rollback`` positions the search rejected, which the graph drops while it copies
the cache (it copies it anyway to append). So a rollback moves no byte of the cache. Such calls
are never captured (their shapes change with every acceptance) and a run does either kind of
step, not both. On CUDA this path is written to the same rules as the captured one (device
buffers, host-side shape inputs on the host) but has not run on a GPU.

Threads: all of the above is one ``FixedSteps``, and a batch checks one out of ``StepLoops`` for
as long as it runs, so two batches never share a buffer or a binding. A single thread gets the same
set back batch after batch; N threads decoding at once hold N sets, all on one session (its ``run``
is thread-safe). While capturing CUDA graphs, a step (writing its inputs, running, reading its
outputs) and a batch's start (encoder, buffers) hold one lock: ONNX Runtime does not support
CUDA graphs on a session run from two threads at once, and a capture in global mode fails when
another thread allocates or copies meanwhile. The search's own Python between steps still runs
in parallel.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnxruntime as ort

from s2s_deploy.errors import S2SError
from s2s_deploy.format.manifest import Manifest
from s2s_deploy.format.names import ROLLBACK, TOP_K, TOP_OUTPUTS
from s2s_deploy.runtime.backend import DecodeRun
from s2s_deploy.runtime.ort import denormals

CAPTURE_FAILURES = (ort.capi.onnxruntime_pybind11_state.Fail, ort.capi.onnxruntime_pybind11_state.EPFail,
                    ort.capi.onnxruntime_pybind11_state.RuntimeException)
GRAPH_ID_KEY = "gpu_graph_id"
NO_CAPTURE = -1
FIRST_CAPACITY = 64
"""Positions the state buffers hold at first; doubled (and the graphs on them dropped) when outgrown."""
KEPT_MEMORY_SHAPES = 64
KEPT_MEMORY_BYTES = 256 << 20
"""Memory buffer sets kept per backend, by count and by size; the least recently used goes first,
with its graphs (the newest always stays)."""
KEPT_ROW_COUNTS = 4
"""Row counts whose state buffers are kept; the least recently used goes first, with its graphs."""
KEPT_MULTI_BINDINGS = 64
"""k-position step bindings kept per step loop, one per (rows, positions, k, memory buffers)."""
KEPT_IDLE_LOOPS = 8
"""Idle step loops (buffer sets) a backend keeps for the next batches; more threads than this
decoding at once still each get their own, and the extra ones are dropped when their batch ends."""


@dataclass(frozen=True)
class StepLayout:
    """What the step loop needs from the manifest, read once per backend, not once per batch."""

    accepted: frozenset[str]
    state_inputs: tuple[str, ...]
    state_outputs: tuple[str, ...]

    @classmethod
    def of(cls, manifest: Manifest) -> StepLayout:
        return cls(
            accepted=frozenset(manifest.decoder.inputs),
            state_inputs=tuple(s.decoder_input for s in manifest.state),
            state_outputs=tuple(s.decoder_output for s in manifest.state),
        )


class StepLoops:
    """The decoder session and the step loops on it, one checked out by each batch while it runs.

    ``uncaptured`` makes a decoder session without CUDA graphs, for ``stop_capturing``;
    ``on_step`` hears each step's start time (the backend's counters)."""

    def __init__(self, manifest: Manifest, device: str, session: ort.InferenceSession, capture: bool,
                 uncaptured: Callable[[], ort.InferenceSession], on_step: Callable[[float], None],
                 multi: Callable[[], ort.InferenceSession] | None = None) -> None:
        self.manifest = manifest
        self.device = device
        self.layout = StepLayout.of(manifest)
        self.session = session
        self.capture = capture
        self.capture_failure: str | None = None
        """Why capture stopped while steps ran, once it has."""
        self.on_step = on_step
        self.ids = itertools.count()
        """Graph, buffer and memory ids, unique across the loops: graph ids name captures in one session."""
        self.device_lock = threading.RLock()
        """Held by a step, and a batch's start, while capturing (reentrant: a failed capture
        replays the batch's steps from within a step)."""
        self._uncaptured = uncaptured
        self._idle: list[FixedSteps] = []
        self._lock = threading.Lock()
        self._make_multi = multi
        self._multi: tuple[ort.InferenceSession, frozenset[str], frozenset[str]] | None = None

    def multi(self) -> tuple[ort.InferenceSession, frozenset[str], frozenset[str]]:
        """The k-position decoder's session (made on first use: only speculative greedy needs
        it), the inputs it reads on the host and those it takes at all."""
        if self._make_multi is None:
            raise S2SError(f"{self.manifest.directory} has no k-position decoder step (decoder_multi.onnx): "
                           "re-export it with `export --multi-step` (fp32; a plugin that declares multi_step)")
        with self._lock:
            if self._multi is None:
                session = self._make_multi()
                self._multi = (session, _host_inputs(session), frozenset(i.name for i in session.get_inputs()))
            return self._multi

    def guard(self) -> contextlib.AbstractContextManager[Any]:
        """The device lock while capturing; nothing otherwise (a CPU step takes no lock)."""
        return self.device_lock if self.capture else contextlib.nullcontext()

    def check_out(self) -> FixedSteps:
        """A step loop for one batch: the one the last batch gave back (warm buffers), or a new one."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return FixedSteps(self)

    def check_in(self, steps: FixedSteps) -> None:
        with self._lock:
            if steps.session is self.session and len(self._idle) < KEPT_IDLE_LOOPS:
                self._idle.append(steps)

    def stop_capturing(self, reason: str) -> FixedSteps:
        """A decoder step failed while being captured: a fresh session without CUDA graphs (the
        failed one's stream may still be capturing), the uncaptured loop from here on, and a loop
        on it for the batch that failed. Batches still running on the old session stop capturing
        at their next failed step."""
        with self._lock:
            if self.capture:
                self.session = self._uncaptured()
                self.capture = False
                self.capture_failure = reason
                self._idle.clear()
        return self.check_out()


@dataclass
class _Graph:
    """One graph id: its binding stays as it was at capture, so a replay only runs."""

    graph_id: int
    run_options: ort.RunOptions | None
    """None where nothing is captured: a graph id costs a parse per run."""
    binding: ort.IOBinding


@dataclass(frozen=True)
class _Outputs:
    """The requested outputs' buffers, by requested outputs: on CPU host arrays the session
    writes into and the search reads in place; on CUDA the session's own device allocations
    (a capture writes into them), copied out after each run."""

    values: list[ort.OrtValue]
    host: list[np.ndarray] | None

    def read(self) -> list[np.ndarray]:
        return list(self.host) if self.host is not None else [value.numpy() for value in self.values]


@dataclass
class _Rows:
    """What a row count keeps across batches: the two flat buffers per state, the small device
    inputs, and the output buffers by requested outputs."""

    rows: int
    capacity: int
    generation: int
    states: list[tuple[ort.OrtValue, ort.OrtValue]]
    small: dict[str, ort.OrtValue]
    small_host: dict[str, np.ndarray]
    """On CPU, the arrays behind ``small``: written with numpy, read in place by the session."""
    outputs: dict[tuple[Any, ...], _Outputs] = field(default_factory=dict)

    def write(self, name: str, values: np.ndarray | int) -> None:
        host = self.small_host.get(name)
        if host is not None:
            host[...] = values
        else:
            self.small[name].update_inplace(np.ascontiguousarray(values, dtype=np.int64))


@dataclass(frozen=True)
class _MultiBinding:
    """A k-position step's binding: the small inputs written in place (host arrays on CPU), the
    top-k outputs read in place on CPU and copied out on CUDA; with ``full``, the log-probs too
    (allocated by the session, each call's own)."""

    session: ort.InferenceSession
    binding: ort.IOBinding
    host: dict[str, np.ndarray]
    small: dict[str, ort.OrtValue]
    top_k: ort.OrtValue
    values: list[ort.OrtValue]
    outputs: list[np.ndarray] | None

    def write(self, tokens: np.ndarray, step: int, rollback: int) -> None:
        for name, value in (("tokens", tokens), ("step", step), (ROLLBACK, rollback)):
            if self.host:
                self.host[name][...] = value
            else:
                self.small[name].update_inplace(np.ascontiguousarray(value, dtype=np.int64))

    def read(self) -> tuple[np.ndarray, np.ndarray]:
        if self.outputs is not None:
            return self.outputs[0], self.outputs[1]
        return self.values[0].numpy(), self.values[1].numpy()

    def read_log_probs(self) -> np.ndarray:
        """The log-probs (rows, positions, V) of the call just run, where bound (``full``)."""
        return self.binding.get_outputs()[len(TOP_OUTPUTS)].numpy()


class FixedSteps:
    """One step loop: buffers and graph ids, kept across the batches that check it out in turn."""

    def __init__(self, loops: StepLoops) -> None:
        self.loops = loops
        self.session = loops.session
        self.device = loops.device
        self.manifest = loops.manifest
        self.layout = loops.layout
        self.capture = loops.capture
        self.grows = any(s.grow_axis is not None for s in self.manifest.state)
        self.limit = (self.manifest.max_target_length or 0) + 1
        self._ids = loops.ids
        self._rows: dict[int, _Rows] = {}
        self._memory: dict[tuple[Any, ...], tuple[int, dict[str, ort.OrtValue], int]] = {}
        self._graphs: dict[tuple[Any, ...], _Graph] = {}
        self._uncaptured = _run_options(NO_CAPTURE) if self.capture else None
        self.uncaptured_options = self._uncaptured
        """Run options that never capture (None where nothing is captured)."""
        self._top_k: dict[int, ort.OrtValue] = {}
        self._multi: dict[tuple[int, ...], _MultiBinding] = {}
        self._host_small = _host_inputs(self.session)
        self.run = denormals.flushing(self.session.run_with_iobinding)

    def capture_failed(self, graph_id: int) -> bool:
        """Whether a failed run is a capture failing: a captured graph id's run, or any run on a
        session another batch has already found it cannot capture."""
        return self.capture and (graph_id != NO_CAPTURE or not self.loops.capture)

    def value(self, shape: Sequence[int], dtype: np.dtype, on_host: bool = False) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype, "cpu" if on_host else self.device, 0)

    def rows(self, rows: int, positions: int, sizes_at: Callable[[int], list[int]]) -> _Rows:
        """The buffers for ``rows`` with room for ``positions`` steps of every growing state;
        ``sizes_at(capacity)`` gives each state's element count at a capacity."""
        kept = self._rows.pop(rows, None)
        capacity = FIRST_CAPACITY if kept is None else kept.capacity
        while capacity < positions:
            capacity *= 2
        if self.limit > 1:
            capacity = min(capacity, max(self.limit, positions))
        sizes = sizes_at(capacity)
        if kept is not None and kept.capacity >= positions and all(
                n <= first.shape()[0] for n, (first, _) in zip(sizes, kept.states, strict=True)):
            self._rows[rows] = kept  # now the most recently used
            return kept
        if kept is not None:
            self._drop(lambda key: key[0] == rows)
        states = [(self.value([n], np.dtype(s.dtype)), self.value([n], np.dtype(s.dtype)))
                  for n, s in zip(sizes, self.manifest.state, strict=True)]
        shapes = (("tokens", (rows,)), ("reorder", (rows,)), ("step", ()))
        if self.device == "cpu":
            small_host = {name: np.zeros(shape, dtype=np.int64) for name, shape in shapes}
            small = {name: ort.OrtValue.ortvalue_from_numpy(array) for name, array in small_host.items()}
        else:  # a host array bound to a CUDA session is copied at bind time: written in place instead
            small_host = {}
            small = {name: self.value(shape, np.dtype(np.int64), on_host=name in self._host_small)
                     for name, shape in shapes}
        made = _Rows(rows, capacity, next(self._ids), states, small, small_host)
        self._rows[rows] = made
        while len(self._rows) > KEPT_ROW_COUNTS:
            self._forget_rows(next(iter(self._rows)))
        return made

    def _forget_rows(self, rows: int) -> None:
        del self._rows[rows]
        self._drop(lambda key: key[0] == rows)
        for key in [key for key in self._memory if key[0] == rows]:
            del self._memory[key]

    def memory(self, rows: int, encoded: dict[str, np.ndarray]) -> tuple[int, dict[str, ort.OrtValue]]:
        """Buffers holding this batch's memory, one set per (rows, shapes), refilled in place, and
        that set's id (keys use it: a small int hashes faster each step than the shapes)."""
        key = (rows, *((name, array.shape, array.dtype.str) for name, array in encoded.items()))
        found = self._memory.pop(key, None)
        if found is None:
            found = (next(self._ids), {name: self.value(array.shape, array.dtype) for name, array in encoded.items()},
                     sum(array.nbytes for array in encoded.values()))
        self._memory[key] = found
        while len(self._memory) > 1 and (len(self._memory) > KEPT_MEMORY_SHAPES or
                                         sum(entry[2] for entry in self._memory.values()) > KEPT_MEMORY_BYTES):
            oldest, _, _ = self._memory.pop(next(iter(self._memory)))
            self._drop(lambda graph_key, gone=oldest: graph_key[2] == gone)
            self._multi = {key: bound for key, bound in self._multi.items() if key[3] != oldest}
            for kept in self._rows.values():
                kept.outputs = {out: values for out, values in kept.outputs.items() if out[2] != oldest}
        memory_id, buffers, _ = found
        for name, array in encoded.items():
            buffers[name].update_inplace(np.ascontiguousarray(array))
        return memory_id, buffers

    def kept_outputs(self, produced: Sequence[ort.OrtValue], arrays: Sequence[np.ndarray]) -> _Outputs:
        if self.device == "cpu":
            host = [np.empty_like(array) for array in arrays]
            return _Outputs([ort.OrtValue.ortvalue_from_numpy(array) for array in host], host)
        return _Outputs(list(produced), None)

    def put(self, name: str, array: np.ndarray) -> ort.OrtValue:
        """A one-off input where the session reads it: on the device, or on the host for the
        inputs a device kernel reads there."""
        device = "cpu" if name in self._host_small else self.device
        # ascontiguousarray makes a 0-d array (the step) 1-d: the graph declares it 0-d
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array).reshape(array.shape), device, 0)

    def top_k(self, k: int) -> ort.OrtValue:
        if k not in self._top_k:
            self._top_k[k] = ort.OrtValue.ortvalue_from_numpy(np.array([k], dtype=np.int64))
        return self._top_k[k]

    def multi_binding(self, rows: int, positions: int, k: int, memory_id: int,
                      memory: dict[str, ort.OrtValue], full: bool = False) -> _MultiBinding:
        """The k-position step's binding for (rows, positions, k, memory buffers, ``full``: the
        log-probs too), made once: its memory, small inputs and outputs stay bound; the caller
        binds the state."""
        key = (rows, positions, k, memory_id, full)
        found = self._multi.get(key)
        if found is not None:
            return found
        session, on_host, accepted = self.loops.multi()
        io = session.io_binding()
        for name, value in memory.items():
            if name in accepted:
                io.bind_ortvalue_input(name, value)
        shapes = {"tokens": (rows, positions), "step": (), ROLLBACK: ()}
        host = {name: np.zeros(shape, dtype=np.int64) for name, shape in shapes.items()}
        top_k = np.array([k], dtype=np.int64)
        if self.device == "cpu":
            small = {name: ort.OrtValue.ortvalue_from_numpy(array) for name, array in host.items()}
            outputs = [np.empty((rows, positions, k), dtype=dtype) for dtype in (np.float32, np.int64)]
            values = [ort.OrtValue.ortvalue_from_numpy(array) for array in outputs]
        else:  # written in place on the device (or on the host where the session reads it there)
            small = {name: self.value(shape, np.dtype(np.int64), on_host=name in on_host)
                     for name, shape in shapes.items()}
            outputs = []
            values = [self.value((rows, positions, k), np.dtype(dtype)) for dtype in (np.float32, np.int64)]
        kept_top_k = ort.OrtValue.ortvalue_from_numpy(top_k, "cpu" if TOP_K in on_host else self.device, 0)
        for name, value in (*small.items(), (TOP_K, kept_top_k)):
            io.bind_ortvalue_input(name, value)
        for name, value in zip(TOP_OUTPUTS, values, strict=True):
            io.bind_ortvalue_output(name, value)
        if full:
            io.bind_output("log_probs", self.device)
        made = _MultiBinding(session, io, host if self.device == "cpu" else {}, small, kept_top_k, values,
                             outputs or None)
        if len(self._multi) >= KEPT_MULTI_BINDINGS:
            del self._multi[next(iter(self._multi))]
        self._multi[key] = made
        return made

    def graph(self, key: tuple[Any, ...]) -> tuple[_Graph, bool]:
        """The graph for ``key`` and whether it is new (its binding still to be made)."""
        found = self._graphs.get(key)
        if found is not None:
            return found, False
        graph_id = next(self._ids) if self.capture else NO_CAPTURE
        made = _Graph(graph_id, _run_options(graph_id) if self.capture else None, self.session.io_binding())
        self._graphs[key] = made
        return made, True

    def uncaptured(self) -> _Graph:
        """A binding for one run that is never captured."""
        return _Graph(NO_CAPTURE, self._uncaptured, self.session.io_binding())

    def _drop(self, doomed: Callable[[tuple[Any, ...]], bool]) -> None:
        """Forget graphs whose buffers are going away; ids are never reused, so a stale capture
        can never be replayed, and the session frees the graph where it can."""
        release = getattr(self.session, "release_captured_graph", None)
        for key in [key for key in self._graphs if doomed(key)]:
            graph = self._graphs.pop(key)
            if release is not None and graph.graph_id != NO_CAPTURE:
                with contextlib.suppress(RuntimeError, ort.capi.onnxruntime_pybind11_state.Fail):
                    release(graph.graph_id)


def _run_options(graph_id: int) -> ort.RunOptions:
    options = ort.RunOptions()
    options.add_run_config_entry(GRAPH_ID_KEY, str(graph_id))
    return options


def _host_inputs(session: ort.InferenceSession) -> frozenset[str]:
    """Inputs the session reads from host memory (shape-like inputs of device kernels): those
    are bound on the host, the rest on the device, so no copy enters a capture."""
    infos = getattr(session, "get_input_memory_infos", None)
    names = [i.name for i in session.get_inputs()]
    if infos is None:
        return frozenset({TOP_K})
    try:
        return frozenset(name for name, info in zip(names, infos(), strict=True) if info.name.lower().startswith("cpu"))
    except (RuntimeError, ValueError, ort.capi.onnxruntime_pybind11_state.Fail):
        return frozenset({TOP_K})


def _shape_at(shape: Sequence[int], axis: int | None, length: int) -> tuple[int, ...]:
    """``shape`` with ``length`` along ``axis`` (unchanged where there is no such axis)."""
    if axis is None:
        return tuple(shape)
    return tuple(length if i == axis else d for i, d in enumerate(shape))


def _initial_states(manifest: Manifest, encoded: dict[str, np.ndarray], rows: int, expand: int) -> list[np.ndarray]:
    """Each state before the first step: the encoder's output (each row ``expand`` times) or zeros."""
    return [(np.repeat(encoded[s.encoder_output], expand, axis=s.batch_axis) if expand > 1
             else encoded[s.encoder_output]) if s.init == "encoder"
            else np.zeros(s.zeros_shape(rows), dtype=s.dtype)
            for s in manifest.state]


class FixedRun(DecodeRun):
    """A batch decoded through a ``FixedSteps`` it holds until ``close``; see the module docstring."""

    def __init__(self, steps: FixedSteps, encoded: dict[str, np.ndarray], sentences: int, expand: int,
                 keep_attention: bool) -> None:
        self._begin(steps, encoded, sentences, expand, keep_attention)

    def _begin(self, steps: FixedSteps, encoded: dict[str, np.ndarray], sentences: int, expand: int,
               keep_attention: bool) -> None:
        manifest = steps.manifest
        self.steps = steps
        self.closed = False
        self.expand = expand
        self.sentences = sentences
        self.rows = rows = sentences * expand
        self.encoded = encoded if expand > 1 or steps.capture else {}
        """Kept for a narrow first step, which reads the untiled memory and state, and while
        capturing, to start again uncaptured."""
        self.history: list[tuple[np.ndarray, np.ndarray, tuple[str, ...], int]] | None = [] if steps.capture else None
        """While capturing, every step's inputs so far: replayed if a capture fails."""
        self.keep_attention = keep_attention
        repeat = expand > 1 and not manifest.memory_per_sentence
        memory = {m.name: np.repeat(encoded[m.name], expand, axis=m.batch_axis) if repeat else encoded[m.name]
                  for m in manifest.memory}
        self.memory_id, self.memory = steps.memory(rows, memory)
        self.initial = _initial_states(manifest, encoded, rows, expand)
        self.start_lengths = [None if s.grow_axis is None else int(array.shape[s.grow_axis])
                              for s, array in zip(manifest.state, self.initial, strict=True)]
        self.longest_start = max((n for n in self.start_lengths if n is not None), default=0)
        self.buffers = steps.rows(rows, self._positions(1), self._sizes)
        self.t = 0
        self.filled = 0
        """Positions the k-position steps have left in the state (each call adds k, less its rollback)."""
        self._multi_layout: tuple[_Rows, list[Any]] | None = None
        self._last_reorder: np.ndarray | None = None
        self.widen_next = False
        self._steady: list[tuple[tuple[str, ...], int, _Graph, _Outputs] | None] = [None, None]
        self._attention: np.ndarray | None = None

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.memory = {}
            self.steps.loops.check_in(self.steps)

    def _positions(self, t: int) -> int:
        """The longest growing state after ``t`` steps."""
        return self.longest_start + t

    def _sizes(self, capacity: int) -> list[int]:
        return [int(np.prod(array.shape if start is None else _shape_at(array.shape, s.grow_axis, capacity)))
                for s, array, start in zip(self.steps.manifest.state, self.initial, self.start_lengths, strict=True)]

    def _shapes(self, t: int, rows: int | None = None) -> list[tuple[int, ...]]:
        """Each state's shape before step ``t``, with ``rows`` rows where given (a narrow step's)."""
        shapes = []
        for s, array, start in zip(self.steps.manifest.state, self.initial, self.start_lengths, strict=True):
            shape = tuple(array.shape) if start is None else _shape_at(array.shape, s.grow_axis, start + t)
            shapes.append(shape if rows is None else _shape_at(shape, s.batch_axis, rows))
        return shapes

    def _run(self, tokens: np.ndarray, reorder: np.ndarray, names: tuple[str, ...],
             top_k: int) -> list[np.ndarray]:
        if self.history is not None:
            self.history.append((np.array(tokens), np.array(reorder), names, top_k))
        steady = self._steady[self.t & 1]
        if steady is not None and steady[0] is names and steady[1] == top_k and len(tokens) == self.rows:
            return self._run_steady(tokens, reorder, steady[2], steady[3])
        if self.keep_attention:
            names = (*names, "attention")
        if len(tokens) != self.rows:
            try:
                return self._finish(self._run_narrow(tokens, reorder, names, top_k))
            except CAPTURE_FAILURES as exc:
                if not self.steps.capture_failed(NO_CAPTURE):
                    raise
                return self._start_again_uncaptured(str(exc).strip().splitlines()[0])
        steps, buffers, t = self.steps, self.buffers, self.t
        widen, self.widen_next = self.widen_next, False  # this step's past has one row per sentence
        if steps.grows and self._positions(t + 1) > buffers.capacity:
            self._move(steps.rows(self.rows, self._positions(t + 1), self._sizes))
            buffers = self.buffers
        # a widening step's binding reads the past with one row per sentence: batches of equal rows but
        # other sentence counts (3 x beam 4, 6 x beam 2) must not share it
        past_rows = self.sentences if widen else None
        key = (self.rows, buffers.generation, self.memory_id, t if steps.grows else t & 1, names, top_k, past_rows)
        accepted, write = steps.layout.accepted, buffers.write
        write("tokens", tokens)
        if "reorder" in accepted and (widen or reorder is not self._last_reorder):
            write("reorder", reorder)
            self._last_reorder = None if widen else reorder
        if "step" in accepted:
            write("step", t)
        started = time.perf_counter()
        out_key = (names, top_k, self.memory_id)
        fixed = buffers.outputs.get(out_key)
        if t == 0 or fixed is None:
            # uncaptured: the first step binds the encoder's state, and outputs of a new shape are
            # first allocated by the session itself, then kept as the buffers later captures write
            graph, initial = steps.uncaptured(), self._initial_values() if t == 0 else None
            self._bind(graph, t, names, top_k, None, initial, self.sentences if widen else None)
            try:
                steps.run(graph.binding, graph.run_options)
            except CAPTURE_FAILURES as exc:
                if not steps.capture_failed(graph.graph_id):
                    raise
                return self._start_again_uncaptured(str(exc).strip().splitlines()[0])
            produced = graph.binding.get_outputs()[: len(names)]
            head = [value.numpy() for value in produced]
            if fixed is None:
                buffers.outputs[out_key] = steps.kept_outputs(produced, head)
        else:
            # ONNX Runtime captures within a graph id's first run: everything is bound before it
            graph, new = steps.graph(key)
            if new:
                self._bind(graph, t, names, top_k, fixed, None, past_rows)
            try:
                steps.run(graph.binding, graph.run_options)
            except CAPTURE_FAILURES as exc:
                if not steps.capture_failed(graph.graph_id):
                    raise
                return self._start_again_uncaptured(str(exc).strip().splitlines()[0])
            head = fixed.read()
            if not (steps.grows or widen or self.keep_attention):
                self._steady[t & 1] = (names, top_k, graph, fixed)
        steps.loops.on_step(started)
        return self._finish(head)

    def _start_again_uncaptured(self, reason: str) -> list[np.ndarray]:
        """Capture stops; this batch starts over on an uncaptured loop and replays its steps so
        far, the last of which is the one that failed."""
        history = self.history or []
        steps = self.steps.loops.stop_capturing(reason)
        self._begin(steps, self.encoded, self.sentences, self.expand, self.keep_attention)
        head: list[np.ndarray] = []
        for tokens, reorder, names, top_k in history:
            head = self._run(tokens, reorder, names, top_k)
        return head

    def _finish(self, head: list[np.ndarray]) -> list[np.ndarray]:
        if self.keep_attention:
            self._attention = head.pop()
        self.t += 1
        return head

    def _run_narrow(self, tokens: np.ndarray, reorder: np.ndarray, names: tuple[str, ...],
                    top_k: int) -> list[np.ndarray]:
        """A first step on one row per sentence: uncaptured, on the untiled memory and state; its
        state lands in the buffers the next step reads, one row per sentence."""
        steps, layout = self.steps, self.steps.layout
        graph = steps.uncaptured()
        io = graph.binding
        inputs = {m.name: self.encoded[m.name] for m in steps.manifest.memory}
        inputs.update(tokens=tokens, reorder=reorder, step=np.zeros((), dtype=np.int64))
        inputs = {name: array for name, array in inputs.items() if name in layout.accepted}
        inputs.update(zip(layout.state_inputs, _initial_states(steps.manifest, self.encoded, self.sentences, 1),
                          strict=True))
        bound = {name: steps.put(name, array) for name, array in inputs.items()}  # alive until the run ends
        for name, value in bound.items():
            io.bind_ortvalue_input(name, value)
        io.bind_ortvalue_input(TOP_K, steps.top_k(top_k))
        for name in names:
            io.bind_output(name, steps.device)
        self._bind_state_outputs(io, 0, self.sentences)
        started = time.perf_counter()
        steps.run(io, graph.run_options)
        head = [value.numpy() for value in io.get_outputs()[: len(names)]]
        steps.loops.on_step(started)
        self.widen_next = True
        return head

    def _run_steady(self, tokens: np.ndarray, reorder: np.ndarray, graph: _Graph, fixed: _Outputs) -> list[np.ndarray]:
        """A fixed-shape state alternates between the same two bindings: once both are made, a
        step writes the small inputs and runs (the small recurrent models' steps are ~50 µs)."""
        buffers, accepted = self.buffers, self.steps.layout.accepted
        buffers.write("tokens", tokens)
        if "reorder" in accepted and reorder is not self._last_reorder:
            buffers.write("reorder", reorder)
            self._last_reorder = reorder
        if "step" in accepted:
            buffers.write("step", self.t)
        started = time.perf_counter()
        try:
            self.steps.run(graph.binding, graph.run_options)
        except CAPTURE_FAILURES as exc:  # were a capture to come on a later run of its graph id
            if not self.steps.capture_failed(graph.graph_id):
                raise
            return self._start_again_uncaptured(str(exc).strip().splitlines()[0])
        head = fixed.read()
        self.steps.loops.on_step(started)
        self.t += 1
        return head

    def _initial_values(self) -> list[ort.OrtValue]:
        return [self.steps.put(name, array) for name, array in zip(self.steps.layout.state_inputs, self.initial,
                                                                    strict=True)]

    def _bind(self, graph: _Graph, t: int, names: tuple[str, ...], top_k: int, outputs: _Outputs | None,
              state_inputs: list[ort.OrtValue] | None = None, past_rows: int | None = None) -> None:
        steps, buffers, layout = self.steps, self.buffers, self.steps.layout
        io = graph.binding
        for name, value in self.memory.items():
            if name in layout.accepted:
                io.bind_ortvalue_input(name, value)
        for name, value in buffers.small.items():
            if name in layout.accepted:
                io.bind_ortvalue_input(name, value)
        io.bind_ortvalue_input(TOP_K, steps.top_k(top_k))
        if state_inputs is not None:
            for name, value in zip(layout.state_inputs, state_inputs, strict=True):
                io.bind_ortvalue_input(name, value)
        else:
            for name, shape, (first, second), state in zip(layout.state_inputs, self._shapes(t, past_rows),
                                                           buffers.states, steps.manifest.state, strict=True):
                source = (first, second)[t & 1]
                io.bind_input(name, source.device_name(), 0, np.dtype(state.dtype), list(shape), source.data_ptr())
        for i, name in enumerate(names):
            if outputs is None:
                io.bind_output(name, steps.device)
            else:
                io.bind_ortvalue_output(name, outputs.values[i])
        self._bind_state_outputs(io, t)

    def _bind_state_outputs(self, io: ort.IOBinding, t: int, rows: int | None = None) -> None:
        """Step ``t`` writes each state into the buffer that step ``t + 1`` reads."""
        steps = self.steps
        for name, shape, (first, second), state in zip(steps.layout.state_outputs, self._shapes(t + 1, rows),
                                                       self.buffers.states, steps.manifest.state, strict=True):
            target = (second, first)[t & 1]
            io.bind_output(name, target.device_name(), 0, np.dtype(state.dtype), list(shape), target.data_ptr())

    def _state_views(self) -> list[tuple[str, str, str, np.dtype, list[int], int | None, int, tuple[int, int]]]:
        """What binding a state's view needs, per state, worked out once per buffers: its names,
        device, dtype, shape (its growing axis set per call), that axis, its start length and the
        two buffers' addresses."""
        steps = self.steps
        return [(in_name, out_name, first.device_name(), np.dtype(state.dtype), list(array.shape),
                 None if start is None else state.grow_axis, start or 0, (first.data_ptr(), second.data_ptr()))
                for in_name, out_name, (first, second), state, array, start in zip(
                    steps.layout.state_inputs, steps.layout.state_outputs, self.buffers.states, steps.manifest.state,
                    self.initial, self.start_lengths, strict=True)]

    def _move(self, bigger: _Rows, positions: int | None = None) -> None:
        """The state outgrew its buffers: copy what the next step reads (``positions`` of it, by
        default one per step so far) into the new ones."""
        side = self.t & 1
        shapes = self._shapes(self.t if positions is None else positions)
        for old, new, shape in zip(self.buffers.states, bigger.states, shapes, strict=True):
            current = old[side].numpy()[: int(np.prod(shape))]
            staged = np.zeros(new[side].shape(), dtype=current.dtype)
            staged[: current.size] = current
            new[side].update_inplace(staged)
        self.buffers = bigger
        self._last_reorder = None  # the new buffers' reorder is unwritten

    def step(self, tokens: np.ndarray, reorder: np.ndarray) -> np.ndarray:
        if self.steps.capture:
            with self.steps.loops.device_lock:
                return self._run(tokens, reorder, ("log_probs",), 1)[0]
        return self._run(tokens, reorder, ("log_probs",), 1)[0]

    def step_top(self, tokens: np.ndarray, reorder: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if self.steps.capture:
            with self.steps.loops.device_lock:
                values, ids = self._run(tokens, reorder, TOP_OUTPUTS, k)
        else:
            values, ids = self._run(tokens, reorder, TOP_OUTPUTS, k)
        return values, ids

    def attention(self) -> np.ndarray | None:
        return self._attention

    def steps_top(self, tokens: np.ndarray, rollback: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        with self.steps.loops.guard():
            return self._run_multi(tokens, rollback, k).read()

    def steps_log_probs(self, tokens: np.ndarray, rollback: int) -> np.ndarray:
        with self.steps.loops.guard():
            return self._run_multi(tokens, rollback, 1, full=True).read_log_probs()

    def _run_multi(self, tokens: np.ndarray, rollback: int, k: int, full: bool = False) -> _MultiBinding:
        """One k-position step (module docstring): reads ``filled`` positions, drops ``rollback``
        of them, writes ``filled - rollback + k`` into the other buffer. Never captured; the
        binding and the small inputs and outputs are kept per (positions, k, ``full``), only the
        state's views are bound again each call (their lengths change). Returns the binding, its
        outputs to read (``full``: the log-probs, rows x positions x V, too)."""
        steps = self.steps
        if self.expand != 1 or self.keep_attention:
            raise S2SError("the k-position step decodes one row per sentence, without attention")
        if self.t and self.filled == 0:
            raise S2SError("a run mixes one-position and k-position steps")
        if not 0 <= rollback <= self.filled:
            raise S2SError(f"rollback {rollback} outside the {self.filled} positions held")
        positions = tokens.shape[1]
        past, kept = self.filled, self.filled - rollback
        after = kept + positions
        if steps.grows and self._positions(after) > self.buffers.capacity:
            self._move(steps.rows(self.rows, self._positions(after), self._sizes), past)
        bound = steps.multi_binding(self.rows, positions, k, self.memory_id, self.memory, full)
        bound.write(tokens, kept, rollback)
        io = bound.binding
        side = self.t & 1
        if self._multi_layout is None or self._multi_layout[0] is not self.buffers:
            self._multi_layout = (self.buffers, self._state_views())
        if self.t == 0:
            initial = self._initial_values()  # alive until the run ends
            for name, value in zip(steps.layout.state_inputs, initial, strict=True):
                io.bind_ortvalue_input(name, value)
        for in_name, out_name, device, dtype, shape, axis, start, pointers in self._multi_layout[1]:
            if self.t:
                if axis is not None:
                    shape[axis] = start + past
                io.bind_input(in_name, device, 0, dtype, shape, pointers[side])
            if axis is not None:
                shape[axis] = start + after
            io.bind_output(out_name, device, 0, dtype, shape, pointers[1 - side])
        started = time.perf_counter()
        denormals.call_flushed(bound.session.run_with_iobinding, io, steps.uncaptured_options)
        steps.loops.on_step(started)
        self.t += 1
        self.filled = after
        return bound
