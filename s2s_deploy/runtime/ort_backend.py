"""ONNX Runtime backend. Chooses CUDA only when a session really runs on it, quietly."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from s2s_deploy.errors import S2SError
from s2s_deploy.runtime.backend import Backend, DecodeRun
from s2s_deploy.runtime.manifest import Manifest
from s2s_deploy.runtime.names import TOP_K, TOP_OUTPUTS

DEVICES = ("auto", "cpu", "cuda")
CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"


@dataclass(frozen=True)
class SessionChoice:
    provider: str
    reason: str

    def notice(self) -> str:
        return f"onnxruntime {ort.__version__}: running on {self.provider}{f' ({self.reason})' if self.reason else ''}"


def default_threads() -> int:
    """One intra-op thread per available core; inter-op parallelism only adds contention here."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def session_options(threads: int | None = None, spin: bool = True) -> ort.SessionOptions:
    """``spin=False`` for a session that runs once per batch: its idle intra-op workers would
    otherwise spin-wait on cores the step decoder needs (measured: the int8 ``base`` step loop
    ran greedy at 300 instead of 495 tok/s on 2 cores while the encoder's worker spun)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or default_threads()
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
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


def _create(path: str | Path, device: str, threads: int | None,
            spin: bool = True) -> tuple[ort.InferenceSession, SessionChoice]:
    if device not in DEVICES:
        raise S2SError(f"unknown device {device!r}; known: {', '.join(DEVICES)}")
    ort.set_default_logger_severity(3)
    options = session_options(threads, spin)
    try:
        if device in ("auto", "cuda") and CUDA in ort.get_available_providers():
            with quiet_stderr():
                session = ort.InferenceSession(str(path), options, providers=[CUDA, CPU])
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


class OrtBackend(Backend):
    name = "onnxruntime"

    def __init__(self, manifest: Manifest, device: str = "auto", threads: int | None = None,
                 graph_format: str = "onnx") -> None:
        self.manifest = manifest
        self.encoder, self.choice = _create(manifest.graph_path(manifest.encoder, graph_format), device, threads,
                                            spin=False)
        self.device = "cuda" if self.choice.provider == CUDA else "cpu"
        self.decoder, _ = _create(manifest.graph_path(manifest.decoder, graph_format), self.device, threads)
        self.decoder_start_id = manifest.decoder_start_id
        self.eos_id = manifest.eos_id
        self.vocab_size = len(manifest.tgt_vocab)

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "provider": self.choice.provider, "onnxruntime": ort.__version__}

    def start(self, src: np.ndarray, src_len: np.ndarray, expand: int = 1, keep_attention: bool = False) -> DecodeRun:
        manifest = self.manifest
        names = list(manifest.encoder.outputs)
        started = time.perf_counter()
        encoded = dict(zip(names, self.encoder.run(names, {"src": src, "src_len": src_len}), strict=True))
        self.runtime_seconds += time.perf_counter() - started
        rows = src.shape[0] * expand

        def tiled(array: np.ndarray, axis: int) -> ort.OrtValue:
            if expand > 1:
                array = np.repeat(array, expand, axis=axis)
            return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), self.device, 0)

        memory = {m.name: tiled(encoded[m.name], m.batch_axis) for m in manifest.memory}
        state = []
        for s in manifest.state:
            if s.init == "encoder":
                state.append(tiled(encoded[s.encoder_output], s.batch_axis))
            else:
                zeros = np.zeros(s.zeros_shape(rows), dtype=s.dtype)
                state.append(ort.OrtValue.ortvalue_from_numpy(zeros, self.device, 0))
        if keep_attention and not manifest.has_attention_output:
            raise S2SError(f"{manifest.directory} was exported without --with-attention")
        return _OrtRun(self, memory, state, keep_attention)


class _OrtRun(DecodeRun):
    """Decodes through one IOBinding: memory is bound once per batch, the state outputs of a step
    are bound as the next step's inputs where they lie (host or GPU), and only the small
    outputs a caller asks for are copied out. ``run_with_ort_values`` costs ~40 µs more per
    call (Python-side checks of every value), a quarter of a small model's step."""

    def __init__(self, backend: OrtBackend, memory: dict[str, ort.OrtValue], state: list[ort.OrtValue],
                 keep_attention: bool) -> None:
        manifest = backend.manifest
        self.backend = backend
        self.session = backend.decoder
        self.device = backend.device
        accepted = set(manifest.decoder.inputs)
        self.binding = self.session.io_binding()
        for name, value in memory.items():
            if name in accepted:
                self.binding.bind_ortvalue_input(name, value)
        self.feeds_step = "step" in accepted
        self.state = state
        self.state_inputs = [s.decoder_input for s in manifest.state]
        self.state_outputs = [s.decoder_output for s in manifest.state]
        self.keep_attention = keep_attention
        self.position = 0
        self._attention: np.ndarray | None = None
        self._top_k: dict[int, ort.OrtValue] = {}
        self._bound_reorder: np.ndarray | None = None

    def _run(self, tokens: np.ndarray, reorder: np.ndarray, wanted: tuple[str, ...],
             top_k: int | None = None) -> list[np.ndarray]:
        """Everything from the first bind to the copied-out results is a call into ONNX Runtime,
        and is timed as runtime; the engine's own work is preparing the small host arrays."""
        tokens = np.ascontiguousarray(tokens, dtype=np.int64)
        new_reorder = reorder is not self._bound_reorder  # greedy passes one identity throughout
        if new_reorder:
            self._bound_reorder = np.ascontiguousarray(reorder, dtype=np.int64)
        position = np.array(self.position, dtype=np.int64) if self.feeds_step else None
        if top_k is not None and top_k not in self._top_k:  # an input with a default binds only as an OrtValue
            self._top_k[top_k] = ort.OrtValue.ortvalue_from_numpy(np.array([top_k], dtype=np.int64))
        binding = self.binding
        started = time.perf_counter()
        binding.bind_cpu_input("tokens", tokens)
        if new_reorder:
            binding.bind_cpu_input("reorder", self._bound_reorder)
        if self.feeds_step:
            binding.bind_cpu_input("step", position)
        if top_k is not None:
            binding.bind_ortvalue_input(TOP_K, self._top_k[top_k])
        for name, value in zip(self.state_inputs, self.state, strict=True):
            binding.bind_ortvalue_input(name, value)
        binding.clear_binding_outputs()  # unallocated outputs: the cache grows every step
        for name in wanted:
            binding.bind_output(name, "cpu")
        for name in self.state_outputs:
            binding.bind_output(name, self.device)
        if self.keep_attention:
            binding.bind_output("attention", "cpu")
        self.session.run_with_iobinding(binding)
        outputs = binding.get_outputs()
        head = [outputs[i].numpy() for i in range(len(wanted))]
        self.backend.runtime_seconds += time.perf_counter() - started
        n_state = len(self.state_outputs)
        self.state = [outputs[i] for i in range(len(wanted), len(wanted) + n_state)]
        if self.keep_attention:
            self._attention = outputs[len(wanted) + n_state].numpy()
        self.position += 1
        return head

    def step(self, tokens: np.ndarray, reorder: np.ndarray) -> np.ndarray:
        return self._run(tokens, reorder, ("log_probs",))[0]

    def step_top(self, tokens: np.ndarray, reorder: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        values, ids = self._run(tokens, reorder, TOP_OUTPUTS, k)
        return values, ids

    def attention(self) -> np.ndarray | None:
        return self._attention
