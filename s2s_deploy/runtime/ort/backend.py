"""ONNX Runtime backend. Chooses CUDA only when a session really runs on it, quietly."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import platform
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from s2s_deploy.errors import S2SError
from s2s_deploy.format.manifest import Manifest
from s2s_deploy.runtime.backend import Backend, DecodeRun
from s2s_deploy.runtime.ort import denormals
from s2s_deploy.runtime.ort.step_loop import FixedRun, StepLoops
from s2s_deploy.runtime.speculative import source_in_target

DEVICES = ("auto", "cpu", "cuda")
CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
CUDA_GRAPH_ENV = "S2S_DEPLOY_CUDA_GRAPH"


@dataclass(frozen=True)
class SessionChoice:
    provider: str
    reason: str

    def notice(self) -> str:
        return f"onnxruntime {ort.__version__}: running on {self.provider}{f' ({self.reason})' if self.reason else ''}"


def default_threads() -> int:
    """One intra-op thread per available core; inter-op parallelism only adds contention here."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


X86_64 = ("x86_64", "amd64", "x64")
VNNI_FLAGS = ("avx512_vnni", "avx_vnni")
PRECISE_INT8_KEY = "session.x64quantprecision"


def saturating_cpu(machine: str, cpuinfo: str | None) -> bool:
    """Whether ONNX Runtime's uint8 x int8 products may saturate on this CPU: x86-64 without VNNI
    adds pairs of products in 16 bits (``vpmaddubsw``), so an int8 export's integer sums, and so
    its scores, are not the exact ones (docs/parity.md, "int8 on CPUs without VNNI"). ``cpuinfo``:
    Linux's /proc/cpuinfo; an x86-64 CPU whose flags cannot be read counts as saturating (exact
    but slower beats fast but wrong)."""
    if machine.lower() not in X86_64:
        return False
    flags = next((line.split(":", 1)[1].split() for line in (cpuinfo or "").splitlines()
                  if line.startswith("flags")), None)
    return flags is None or not any(flag in flags for flag in VNNI_FLAGS)


@functools.cache
def int8_products_saturate() -> bool:
    """``saturating_cpu`` for this machine, read once."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            cpuinfo: str | None = info.read()
    except OSError:
        cpuinfo = None
    return saturating_cpu(platform.machine(), cpuinfo)


def session_options(threads: int | None = None, spin: bool = True,
                    spin_between_runs: bool = True) -> ort.SessionOptions:
    """``spin_between_runs=False`` keeps the workers spinning inside a run but stops them when it
    returns: left spinning, one session's idle workers take the cores the next one needs
    (measured on 2 cores: the int8 ``base`` step loop ran greedy at 300 instead of 495 tok/s while
    the encoder's worker spun, and the encoder between step loops took 11.5 instead of 8 ms while
    the decoder's did; benchmarks/NOTES.md). ``spin=False`` never spins, for a process that needs
    its cores between runs (``serve``)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or default_threads()
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    if int8_products_saturate():  # exact uint8 x uint8 products instead: int8 bits are promised (docs/parity.md)
        options.add_session_config_entry(PRECISE_INT8_KEY, "1")
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    elif not spin_between_runs:
        options.add_session_config_entry("session.force_spinning_stop", "1")
    return options


@contextlib.contextmanager
def quiet_native_output(fds: tuple[int, ...] = (1, 2)) -> Iterator[None]:
    """ONNX Runtime's C++ logger reports a missing CUDA library before any Python setting
    applies, and a provider may print a banner on stdout (TensorRT's, five lines, from
    onnxruntime-gpu on a machine without it), which would land in a command's output; hide both
    at the file-descriptor level while probing. ``fds=(2,)``: stderr only (the TorchScript exporter's
    shape-inference chatter), so what torch prints on stdout when it fails is kept for ``--debug``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in fds}
    try:
        with open(os.devnull, "wb") as devnull:
            for fd in saved:
                os.dup2(devnull.fileno(), fd)
            yield
    finally:
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)


def create_session(
    path: str | Path, device: str = "auto", threads: int | None = None, spin: bool = True
) -> ort.InferenceSession:
    return _create(path, device, threads, spin)[0]


STEP_DISABLED_OPTIMIZERS = ("MatMulScaleFusion",)
"""Left out of a decoder step's CPU session: the fusion folds the attention scale into a
``FusedMatMul``, which multiplies one query row by a memory of keys 2-3.5x slower than ``Mul``
then ``MatMul`` do (q (8, 1, 64) x K (8, 64, 1500), 2 threads: 263 against 123 us at 1 row,
8.2 against 2.3 ms at 8; benchmarks/NOTES.md, session 19)."""


def _create(path: str | Path, device: str, threads: int | None, spin: bool = True,
            spin_between_runs: bool = True, cuda_graph: bool = False,
            step: bool = False) -> tuple[ort.InferenceSession, SessionChoice]:
    if device not in DEVICES:
        raise S2SError(f"unknown device {device!r}; known: {', '.join(DEVICES)}")
    ort.set_default_logger_severity(3)
    options = session_options(threads, spin, spin_between_runs)
    if step:  # a step's log-softmax over a wide vocabulary is 5x slower on denormals (runtime/ort/denormals.py)
        denormals.flush_in(options)
    try:
        with denormals.caller_kept():
            return _session(path, device, options, cuda_graph, step)
    except (ort.capi.onnxruntime_pybind11_state.Fail, ort.capi.onnxruntime_pybind11_state.InvalidGraph,
            ort.capi.onnxruntime_pybind11_state.InvalidProtobuf, ort.capi.onnxruntime_pybind11_state.NoSuchFile) as exc:
        raise S2SError(f"onnxruntime cannot load {path}: {str(exc).splitlines()[0]}") from exc


def _session(path: str | Path, device: str, options: ort.SessionOptions, cuda_graph: bool,
             step: bool) -> tuple[ort.InferenceSession, SessionChoice]:
    if device in ("auto", "cuda") and CUDA in ort.get_available_providers():
        with quiet_native_output():
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
    disabled = list(STEP_DISABLED_OPTIMIZERS) if step else []
    return (ort.InferenceSession(str(path), options, providers=[CPU], disabled_optimizers=disabled),
            SessionChoice(CPU, reason))


def output_batch_axes(manifest: Manifest) -> dict[str, int]:
    """The batch axis of each encoder output (modeling/graphs.py: every memory, then each state the
    encoder starts)."""
    axes = {m.name: m.batch_axis for m in manifest.memory}
    axes.update((s.encoder_output, s.batch_axis) for s in manifest.state if s.encoder_output is not None)
    return axes


def encode_rows(encoder: ort.InferenceSession, names: list[str], src: np.ndarray, src_len: np.ndarray,
                axes: dict[str, int]) -> dict[str, np.ndarray]:
    """``encoder``'s outputs for a batch, each row run on its own and the rows joined along each
    output's batch axis: a row's encoding is then the one it has alone, whatever its batchmates.
    Why (docs/parity.md, "The batch"): ONNX Runtime's CPU convolution (MLAS) gives a batch of one row
    to its threads in slices of the output positions and a larger batch one whole row per thread,
    and the K-blocking of its sums follows the slice's width, so a row's bits depend on whether it
    is alone (an audio stem's ``Conv``: the tiny test Whisper's first by 4.8e-6 at 2 threads, Whisper-base's
    second by 5.7e-6 at 16). Whisper-base's encoder costs the same one row at a time (docs/performance.md)."""
    if src.shape[0] == 1:
        return dict(zip(names, encoder.run(names, {"src": src, "src_len": src_len}), strict=True))
    rows = [encoder.run(names, {"src": src[i: i + 1], "src_len": src_len[i: i + 1]}) for i in range(src.shape[0])]
    return {name: np.concatenate([row[j] for row in rows], axis=axes[name]) for j, name in enumerate(names)}


class OrtBackend(Backend):
    """Steps run through ``runtime/ort/step_loop.py``: every input and output in buffers kept across
    batches and written in place, which is also what lets CUDA replay them as captured graphs."""

    name = "onnxruntime"

    def __init__(self, manifest: Manifest, device: str = "auto", threads: int | None = None,
                 graph_format: str = "onnx", spin: bool = True, cuda_graph: bool | None = None) -> None:
        """``cuda_graph``: on CUDA, replay each decoder step as a captured CUDA graph; None reads
        ``S2S_DEPLOY_CUDA_GRAPH`` (on unless ``0``). A decoder that cannot be captured, at session
        creation or when a step runs (``StepLoops.stop_capturing``), falls back to the uncaptured loop,
        and the device notice says so. Safe to share between threads: each batch decodes on a step
        loop of its own (``StepLoops``); the counters below may miss a step or two then."""
        self.manifest = manifest
        # Its workers spin within a run as the decoder's do: woken op by op instead, a 20-token
        # sentence's encoder took 7.85 instead of 6.7 ms on 2 cores (benchmarks/NOTES.md, session 13)
        self.encoder, choice = _create(manifest.graph_path(manifest.encoder, graph_format), device, threads,
                                       spin, spin_between_runs=False)
        self.device = "cuda" if choice.provider == CUDA else "cpu"
        self.rows_apart = output_batch_axes(manifest) if self.device == "cpu" and manifest.encoder_input.is_features \
            else None
        """Where a batch is encoded one row at a time (``encode_rows``), each output's batch axis: a features
        encoder on the CPU (token encoders are exact batched, at canonical widths; docs/parity.md)."""
        if cuda_graph is None:
            cuda_graph = os.environ.get(CUDA_GRAPH_ENV, "1") != "0"
        capture = cuda_graph and self.device == "cuda"
        self._decoder_settings = (manifest.graph_path(manifest.decoder, graph_format), threads, spin)
        try:
            decoder = self._decoder_session(capture)
            graphs = "decoder steps replayed as CUDA graphs" if capture else "CUDA graphs off"
        except S2SError as exc:
            if not capture:
                raise
            capture = False
            decoder = self._decoder_session(cuda_graph=False)
            graphs = f"CUDA graphs off: {exc}"
        self._choice = dataclasses.replace(choice, reason=graphs) if self.device == "cuda" else choice
        self.decoder_start_id = manifest.decoder_start_id
        self.eos_id = manifest.eos_id
        self.vocab_size = len(manifest.tgt_vocab)
        self.unk_id = manifest.tgt_vocab.unk_id
        self.language_ids = tuple(sorted(manifest.tgt_vocab.languages))
        multi = manifest.decoder_multi
        self.multi_step = multi is not None and graph_format == "onnx"
        self.multi_step_drift = manifest.multi_step_max_abs_diff
        self._multi_path = manifest.graph_path(multi) if multi is not None else manifest.directory
        if self.multi_step and not manifest.encoder_input.is_features:
            self.source_in_target = source_in_target(manifest.src_vocab, manifest.tgt_vocab)
        self.loops = StepLoops(manifest, self.device, decoder, capture,
                               uncaptured=lambda: self._decoder_session(cuda_graph=False), on_step=self.count_step,
                               multi=self._multi_session if self.multi_step else None)

    @property
    def decoder(self) -> ort.InferenceSession:
        return self.loops.session

    @property
    def cuda_graph(self) -> bool:
        return self.loops.capture

    @property
    def choice(self) -> SessionChoice:
        """Where the sessions run; on CUDA, whether steps are captured, and why not once a step
        failed to capture (the loops then run on a fresh uncaptured session)."""
        failure = self.loops.capture_failure
        if failure is None:
            return self._choice
        return dataclasses.replace(self._choice, reason=f"CUDA graphs off: a step failed to capture: {failure}")

    def _decoder_session(self, cuda_graph: bool) -> ort.InferenceSession:
        """The decoder's workers spin within a step and stop when it returns."""
        path, threads, spin = self._decoder_settings
        return _create(path, self.device, threads, spin, spin_between_runs=False, cuda_graph=cuda_graph, step=True)[0]

    def _multi_session(self) -> ort.InferenceSession:
        """The k-position decoder step, never captured (its shapes change with each acceptance)."""
        _, threads, spin = self._decoder_settings
        return _create(self._multi_path, self.device, threads, spin, spin_between_runs=False, step=True)[0]

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
        if keep_attention and not manifest.has_attention_output:
            raise S2SError(f"{manifest.directory} was exported without --with-attention")
        with self.loops.guard():
            started = time.perf_counter()
            encoded = (encode_rows(self.encoder, names, src, src_len, self.rows_apart) if self.rows_apart is not None
                       else dict(zip(names, self.encoder.run(names, {"src": src, "src_len": src_len}), strict=True)))
            self.runtime_seconds += time.perf_counter() - started
            return FixedRun(self.loops.check_out(), encoded, src.shape[0], expand, keep_attention)
