"""ONNX Runtime backend. Chooses CUDA only when a session really runs on it, quietly."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from s2s_deploy.runtime.backend import Backend, DecodeRun
from s2s_deploy.runtime.cuda_graph import GraphRun, GraphSteps
from s2s_deploy.runtime.errors import S2SError
from s2s_deploy.runtime.manifest import Manifest
from s2s_deploy.runtime.names import TOP_K, TOP_OUTPUTS

DEVICES = ("auto", "cpu", "cuda")
CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
CUDA_GRAPH_ENV = "S2S_DEPLOY_CUDA_GRAPH"
_StepInputs = tuple[dict[str, ort.OrtValue], list[ort.OrtValue]]  # memory by name, then the first state


@dataclass(frozen=True)
class SessionChoice:
    provider: str
    reason: str

    def notice(self) -> str:
        return f"onnxruntime {ort.__version__}: running on {self.provider}{f' ({self.reason})' if self.reason else ''}"


def default_threads() -> int:
    """One intra-op thread per available core; inter-op parallelism only adds contention here."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def session_options(threads: int | None = None, spin: bool = True,
                    spin_between_runs: bool = True) -> ort.SessionOptions:
    """``spin=False`` for a session that runs once per batch: its idle intra-op workers would
    otherwise spin-wait on cores the step decoder needs (measured: the int8 ``base`` step loop
    ran greedy at 300 instead of 495 tok/s on 2 cores while the encoder's worker spun).
    ``spin_between_runs=False`` keeps the workers spinning inside a run but stops them when it
    returns, so the next batch's encoder and the search loop get the cores (measured on the
    2-core machine: the encoder of a 15-25 token sentence between step loops took 8 instead of
    11.5 ms; docs/performance.md)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or default_threads()
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    elif not spin_between_runs:
        options.add_session_config_entry("session.force_spinning_stop", "1")
    return options


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """ONNX Runtime's C++ logger reports a missing CUDA library before any Python setting
    applies; hide that wall of text at the file-descriptor level while probing."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def create_session(
    path: str | Path, device: str = "auto", threads: int | None = None, spin: bool = True
) -> ort.InferenceSession:
    return _create(path, device, threads, spin)[0]


def _create(path: str | Path, device: str, threads: int | None, spin: bool = True,
            spin_between_runs: bool = True, cuda_graph: bool = False) -> tuple[ort.InferenceSession, SessionChoice]:
    if device not in DEVICES:
        raise S2SError(f"unknown device {device!r}; known: {', '.join(DEVICES)}")
    ort.set_default_logger_severity(3)
    options = session_options(threads, spin, spin_between_runs)
    try:
        if device in ("auto", "cuda") and CUDA in ort.get_available_providers():
            with quiet_stderr():
                # TF32 matrix products moved beam scores by 1e-3 against the CPU; fp32 means fp32
                cuda = (CUDA, {"use_tf32": "0", **({"enable_cuda_graph": "1"} if cuda_graph else {})})
                session = ort.InferenceSession(str(path), options, providers=[cuda, CPU])
            if session.get_providers()[0] == CUDA:
                return session, SessionChoice(CUDA, "")
            reason = "CUDA provider is installed but could not start: CUDA libraries or GPU missing"
        elif device == "cpu":
            reason = "requested"
        else:
            reason = "this onnxruntime build has no CUDA provider"
        if device == "cuda":
            raise S2SError(f"--device cuda: {reason}")
        return ort.InferenceSession(str(path), options, providers=[CPU]), SessionChoice(CPU, reason)
    except (ort.capi.onnxruntime_pybind11_state.Fail, ort.capi.onnxruntime_pybind11_state.InvalidGraph,
            ort.capi.onnxruntime_pybind11_state.InvalidProtobuf, ort.capi.onnxruntime_pybind11_state.NoSuchFile) as exc:
        raise S2SError(f"onnxruntime cannot load {path}: {str(exc).splitlines()[0]}") from exc


@dataclass(frozen=True)
class _StepLayout:
    """What the step loop needs from the manifest, read once per backend, not once per batch."""

    accepted: frozenset[str]
    feeds_step: bool
    state_inputs: tuple[str, ...]
    state_outputs: tuple[str, ...]
    fixed_dtypes: tuple[np.dtype | None, ...]  # None: a growing cache, left where ONNX Runtime puts it

    @classmethod
    def of(cls, manifest: Manifest) -> _StepLayout:
        return cls(
            accepted=frozenset(manifest.decoder.inputs),
            feeds_step="step" in manifest.decoder.inputs,
            state_inputs=tuple(s.decoder_input for s in manifest.state),
            state_outputs=tuple(s.decoder_output for s in manifest.state),
            fixed_dtypes=tuple(None if s.grow_axis is not None else np.dtype(s.dtype) for s in manifest.state),
        )

    @property
    def all_fixed(self) -> bool:
        return None not in self.fixed_dtypes


class OrtBackend(Backend):
    name = "onnxruntime"
    idle_kept = 4
    """Row counts whose step buffers are kept for reuse after their run ends."""

    def __init__(self, manifest: Manifest, device: str = "auto", threads: int | None = None,
                 graph_format: str = "onnx", spin: bool = True, cuda_graph: bool | None = None,
                 fixed_addresses: bool = False) -> None:
        """``cuda_graph``: on CUDA, replay each decoder step as a captured CUDA graph
        (``runtime/cuda_graph.py``); None reads ``S2S_DEPLOY_CUDA_GRAPH`` (on unless ``0``). A decoder
        that cannot be captured falls back to the uncaptured loop, and the device notice says so.
        ``fixed_addresses``: run that fixed-buffer loop on CPU too, uncaptured (how CI tests it)."""
        self.manifest = manifest
        self.encoder, choice = _create(manifest.graph_path(manifest.encoder, graph_format), device, threads,
                                       spin=False)
        self.device = "cuda" if choice.provider == CUDA else "cpu"
        if cuda_graph is None:
            cuda_graph = os.environ.get(CUDA_GRAPH_ENV, "1") != "0"
        self.cuda_graph = cuda_graph and self.device == "cuda"
        decoder_path = manifest.graph_path(manifest.decoder, graph_format)
        try:
            self.decoder, _ = _create(decoder_path, self.device, threads, spin, spin_between_runs=False,
                                      cuda_graph=self.cuda_graph)
            graphs = "decoder steps replayed as CUDA graphs" if self.cuda_graph else "CUDA graphs off"
        except S2SError as exc:
            if not self.cuda_graph:
                raise
            self.cuda_graph = False
            self.decoder, _ = _create(decoder_path, self.device, threads, spin, spin_between_runs=False)
            graphs = f"CUDA graphs off: {exc}"
        self.choice = dataclasses.replace(choice, reason=graphs) if self.device == "cuda" else choice
        self.decoder_start_id = manifest.decoder_start_id
        self.eos_id = manifest.eos_id
        self.vocab_size = len(manifest.tgt_vocab)
        self.unk_id = manifest.tgt_vocab.unk_id
        self.layout = _StepLayout.of(manifest)
        self._idle: dict[int, _StepBuffers] = {}
        # On CUDA every step goes through fixed device buffers written in place: a host array
        # bound once is copied to the device at bind time, so writing it later changes nothing.
        self.graph_steps = (GraphSteps(self, capture=self.cuda_graph)
                            if fixed_addresses or self.device == "cuda" else None)

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "provider": self.choice.provider, "onnxruntime": ort.__version__}

    def count_step(self, started: float) -> None:
        elapsed = time.perf_counter() - started
        self.runtime_seconds += elapsed
        self.step_seconds += elapsed
        self.steps_run += 1

    def start(self, src: np.ndarray, src_len: np.ndarray, expand: int = 1, keep_attention: bool = False) -> DecodeRun:
        manifest = self.manifest
        names = list(manifest.encoder.outputs)
        started = time.perf_counter()
        encoded = dict(zip(names, self.encoder.run(names, {"src": src, "src_len": src_len}), strict=True))
        self.runtime_seconds += time.perf_counter() - started
        if keep_attention and not manifest.has_attention_output:
            raise S2SError(f"{manifest.directory} was exported without --with-attention")
        sentences = src.shape[0]
        if self.graph_steps is not None:
            return GraphRun(self.graph_steps, encoded, sentences, expand, keep_attention)
        rows = sentences * expand

        def on_device(array: np.ndarray, times: int, axis: int) -> ort.OrtValue:
            if times > 1:
                array = np.repeat(array, times, axis=axis)
            return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), self.device, 0)

        def inputs(times: int) -> _StepInputs:
            memory = {m.name: on_device(encoded[m.name], times, m.batch_axis) for m in manifest.memory}
            state = [on_device(encoded[s.encoder_output], times, s.batch_axis) if s.init == "encoder" else
                     on_device(np.zeros(s.zeros_shape(sentences * times), dtype=s.dtype), 1, 0)
                     for s in manifest.state]
            return memory, state

        buffers = self._idle.pop(rows, None) or _StepBuffers(self.decoder, rows)
        return _OrtRun(self, buffers, *inputs(expand), functools.partial(inputs, 1) if expand > 1 else None,
                       keep_attention)

    def release(self, buffers: _StepBuffers) -> None:
        """Keep an ended run's buffers for the next batch of as many rows, and only a few sizes."""
        buffers.unbind(self.layout)
        self._idle.pop(buffers.rows, None)
        self._idle[buffers.rows] = buffers
        while len(self._idle) > self.idle_kept:
            del self._idle[next(iter(self._idle))]


class _Binding:
    """An IOBinding that remembers what each name is bound to, so binding the same OrtValue
    again is skipped: each bind costs a few microseconds of Python."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self.io = session.io_binding()
        self.inputs: dict[str, ort.OrtValue] = {}
        self.outputs: dict[str, ort.OrtValue | None] = {}
        self.outputs_key: tuple[tuple[str, ...], int | None] | None = None

    def input(self, name: str, value: ort.OrtValue) -> None:
        if self.inputs.get(name) is not value:
            self.io.bind_ortvalue_input(name, value)
            self.inputs[name] = value

    def output(self, name: str, value: ort.OrtValue | None, device: str) -> None:
        """``None`` lets ONNX Runtime allocate the output on ``device``: it is bound anew each run."""
        if value is None:
            self.io.bind_output(name, device)
        elif self.outputs.get(name) is not value:
            self.io.bind_ortvalue_output(name, value)
        self.outputs[name] = value

    def clear_outputs(self) -> None:
        self.io.clear_binding_outputs()
        self.outputs = {}
        self.outputs_key = None

    def clear_inputs(self) -> None:
        self.io.clear_binding_inputs()
        self.inputs = {}


class _StepBuffers:
    """Everything a run of ``rows`` rows binds that does not depend on the batch's content:
    two IOBindings, the host inputs they read in place, the host arrays the small outputs
    land in, and two device buffers per fixed-shape state. Made once, reused by later runs
    of the same size: building them cost a run about as much as four steps of a small model."""

    def __init__(self, session: ort.InferenceSession, rows: int) -> None:
        self.rows = rows
        self.bindings = (_Binding(session), _Binding(session))
        self.tokens = np.zeros(rows, dtype=np.int64)
        self.reorder = np.arange(rows, dtype=np.int64)
        self.position = np.zeros((), dtype=np.int64)
        self.host_inputs = {name: ort.OrtValue.ortvalue_from_numpy(array)  # shares the array's memory
                            for name, array in (("tokens", self.tokens), ("reorder", self.reorder),
                                                ("step", self.position))}
        self.state_pair: tuple[list[ort.OrtValue | None], ...] | None = None
        self.state_shapes: list[list[int]] = []
        self.top_k: dict[int, ort.OrtValue] = {}
        self.host_outputs: dict[tuple[tuple[str, ...], int | None], list[tuple[np.ndarray, ort.OrtValue]]] = {}

    def top_k_value(self, k: int) -> ort.OrtValue:
        """``top_k`` binds as an OrtValue: one per k, kept."""
        if k not in self.top_k:
            self.top_k[k] = ort.OrtValue.ortvalue_from_numpy(np.array([k], dtype=np.int64))
        return self.top_k[k]

    def bind_host_inputs(self, accepted: frozenset[str]) -> None:
        for binding in self.bindings:
            for name, value in self.host_inputs.items():
                if name in accepted:
                    binding.input(name, value)

    def state_buffers(self, layout: _StepLayout, state: list[ort.OrtValue],
                      device: str) -> tuple[list[ort.OrtValue | None], ...]:
        """Two device buffers per fixed-shape state, allocated again only if the shape changed."""
        shapes = [value.shape() for value in state]
        if self.state_pair is None or shapes != self.state_shapes:
            self.state_shapes = shapes
            self.state_pair = tuple(
                [None if dtype is None else ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, device, 0)
                 for dtype, shape in zip(layout.fixed_dtypes, shapes, strict=True)] for _ in range(2))
        return self.state_pair

    def unbind(self, layout: _StepLayout) -> None:
        """Let go of the ended run's memory and state, which may be large; a growing cache is
        also held as an output. Host outputs and fixed-state buffers stay bound."""
        for binding in self.bindings:
            binding.clear_inputs()
            if not layout.all_fixed:
                binding.clear_outputs()


class _OrtRun(DecodeRun):
    """Decodes through two IOBindings used in turn, each staying bound from step to step:
    the Python side of rebinding every input and output each step cost about a sixth of a
    small recurrent model's step. Memory is bound once per batch. Tokens, reorder and step
    are host arrays that both bindings read in place. The small outputs a caller asks for
    are written into host arrays once a first step has shown their shape. A state that never
    grows alternates between two device buffers, one binding writing where the other reads;
    a growing cache is bound by device and left where ONNX Runtime allocated it."""

    def __init__(self, backend: OrtBackend, buffers: _StepBuffers, memory: dict[str, ort.OrtValue],
                 state: list[ort.OrtValue], narrow: Callable[[], _StepInputs] | None,
                 keep_attention: bool) -> None:
        self.backend = backend
        self.session = backend.decoder
        self.device = backend.device
        self.layout = layout = backend.layout
        self.buffers = buffers
        buffers.bind_host_inputs(layout.accepted)
        for binding in buffers.bindings:
            for name, value in memory.items():
                if name in layout.accepted:
                    binding.input(name, value)
        self.state = state
        # the first step's input may be the encoder's own array: never write into it
        self.spare, self.second = buffers.state_buffers(layout, state, self.device)
        self.narrow = narrow
        self.first_wide = 0  # 1 once a narrow first step ran: the bindings' turns start there
        self.keep_attention = keep_attention
        self.steps = 0
        self._attention: np.ndarray | None = None
        self._last_reorder: np.ndarray | None = None
        self._closed = False
        self._steady: tuple[tuple[str, ...], int | None, tuple[np.ndarray, ...]] | None = None

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.backend.release(self.buffers)

    def _run(self, tokens: np.ndarray, reorder: np.ndarray, wanted: tuple[str, ...],
             top_k: int | None = None) -> Sequence[np.ndarray]:
        """From the first bind to the copied-out results is a call into ONNX Runtime, timed as
        runtime; the engine's own work is writing the small host inputs."""
        buffers, layout = self.buffers, self.layout
        if self.narrow is not None and len(tokens) != buffers.rows:
            return self._run_narrow(self.narrow, tokens, reorder, wanted, top_k)
        buffers.tokens[:] = tokens
        if reorder is not self._last_reorder:  # greedy passes one identity throughout
            buffers.reorder[:] = reorder
            self._last_reorder = reorder
        if layout.feeds_step:
            buffers.position[()] = self.steps
        steady = self._steady
        if steady is not None and steady[0] is wanted and steady[1] == top_k:
            # both bindings already hold this step's inputs and outputs: the fixed-shape state
            # alternates between the same two buffers, so only the run itself is left to do
            started = time.perf_counter()
            self.session.run_with_iobinding(buffers.bindings[self.steps & 1].io)
            self.backend.count_step(started)
            self.state, self.spare = self.spare, self.state
            self.steps += 1
            return steady[2]
        names = (*wanted, "attention") if self.keep_attention else wanted
        key = (names, top_k)
        host = buffers.host_outputs.get(key)
        binding = buffers.bindings[self.steps & 1]
        started = time.perf_counter()
        if top_k is not None:
            binding.input(TOP_K, buffers.top_k_value(top_k))
        for name, value in zip(layout.state_inputs, self.state, strict=True):
            binding.input(name, value)
        if key != binding.outputs_key:
            binding.clear_outputs()  # keeps the order: asked-for outputs, then the state
            for i, name in enumerate(names):
                binding.output(name, None if host is None else host[i][1], "cpu")
            binding.outputs_key = key if host is not None else None
        for name, spare in zip(layout.state_outputs, self.spare, strict=True):
            binding.output(name, spare, self.device)
        self.session.run_with_iobinding(binding.io)
        produced = binding.io.get_outputs() if host is None or not layout.all_fixed else None
        if host is None:
            head = [produced[i].numpy() for i in range(len(names))]
            buffers.host_outputs[key] = [(array, ort.OrtValue.ortvalue_from_numpy(array))
                                         for array in (np.empty_like(h) for h in head)]
        else:
            head = [array for array, _ in host]
        self.backend.count_step(started)
        previous, self.state = self.state, [
            produced[len(names) + i] if spare is None else spare for i, spare in enumerate(self.spare)]
        self.spare = self.second if self.steps == self.first_wide else [
            None if spare is None else old for spare, old in zip(self.spare, previous, strict=True)]
        if self.keep_attention:
            self._attention = head.pop()
        self.narrow = None  # only a first step may be narrow
        self.steps += 1
        if (layout.all_fixed and not self.keep_attention and self.steps >= self.first_wide + 3
                and all(b.outputs_key == key for b in buffers.bindings)):
            self._steady = (wanted, top_k, tuple(head))
        return head

    def _run_narrow(self, narrow: Callable[[], _StepInputs],
                    tokens: np.ndarray, reorder: np.ndarray, wanted: tuple[str, ...],
                    top_k: int | None) -> Sequence[np.ndarray]:
        """A first step fed one row per sentence, on the untiled memory, through a binding of its
        own. Its state stays where ONNX Runtime put it; the next step's reorder, K rows per
        sentence, gathers from it inside the graph, which is how the beams are tiled."""
        memory, state = narrow()
        layout, buffers = self.layout, self.buffers
        names = (*wanted, "attention") if self.keep_attention else wanted
        binding = _Binding(self.session)
        for name, value in memory.items():
            if name in layout.accepted:
                binding.input(name, value)
        buffers.position[()] = 0
        host = {"tokens": np.ascontiguousarray(tokens, dtype=np.int64),
                "reorder": np.ascontiguousarray(reorder, dtype=np.int64), "step": buffers.position}
        started = time.perf_counter()
        for name, array in host.items():
            if name in layout.accepted:
                binding.io.bind_cpu_input(name, array)
        if top_k is not None:
            binding.input(TOP_K, buffers.top_k_value(top_k))
        for name, value in zip(layout.state_inputs, state, strict=True):
            binding.input(name, value)
        for name in names:
            binding.io.bind_output(name, "cpu")
        for name in layout.state_outputs:
            binding.io.bind_output(name, self.device)
        self.session.run_with_iobinding(binding.io)
        produced = binding.io.get_outputs()
        head = [produced[i].numpy() for i in range(len(names))]
        self.backend.count_step(started)
        self.state = list(produced[len(names):])
        if self.keep_attention:
            self._attention = head.pop()
        self.narrow = None
        self.steps = self.first_wide = 1
        return head

    def step(self, tokens: np.ndarray, reorder: np.ndarray) -> np.ndarray:
        return self._run(tokens, reorder, ("log_probs",), 1)[0]  # top_k is a required input

    def step_top(self, tokens: np.ndarray, reorder: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        values, ids = self._run(tokens, reorder, TOP_OUTPUTS, k)
        return values, ids

    def attention(self) -> np.ndarray | None:
        return self._attention
