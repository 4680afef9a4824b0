"""Speed of the same search on PyTorch eager and ONNX Runtime, on the same inputs.

Each (model, system) runs in its own spawned process, so peak memory is that system's own.
Figures are wall-clock: they belong in docs/performance.md, never in a unit test's assertion.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import platform
import resource
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from s2s_deploy.errors import S2SError

SYSTEMS = ("pytorch", "onnxruntime-cpu", "onnxruntime-generate", "pytorch-cuda", "onnxruntime-cuda",
           "onnxruntime-generate-cuda", "onnxruntime-cuda-graph")


def on_cuda(system: str) -> bool:
    """``onnxruntime-cuda-graph``: the step loop replaying captured CUDA graphs (runtime/ort/step_loop.py),
    which ``translate`` does on CUDA by default; ``onnxruntime-cuda`` is the same loop uncaptured."""
    return "cuda" in system.split("-")


@dataclass(frozen=True)
class BenchSettings:
    beams: tuple[int, ...] = (1, 4)
    batches: tuple[int, ...] = (1, 16, 64)
    sentences: int = 64
    reps: int = 3
    warmup: int = 1
    threads: int = 2
    fixed_length: int | None = None
    max_len: int = 128
    systems: tuple[str, ...] = ("pytorch", "onnxruntime-cpu", "onnxruntime-generate", "onnxruntime-cuda")


@dataclass(frozen=True)
class PassTime:
    """Where one timed pass spent its wall-clock seconds: inside the runtime's calls, and of that
    in decoder steps (the rest there is the encoder); outside them is the search loop."""

    seconds: float
    runtime_seconds: float
    step_seconds: float
    steps: int
    tokens: int

    @property
    def step_ms(self) -> float:
        """The pass's mean decoder step."""
        return 1000 * self.step_seconds / self.steps


@dataclass(frozen=True)
class BenchRow:
    model: str
    system: str
    beam: int
    batch: int
    tokens_per_s: float
    tokens_per_s_min: float
    tokens_per_s_max: float
    p50_ms: float
    p95_ms: float
    engine_overhead: float
    peak_rss_mb: float
    tokens: int
    ratio_to_pytorch: float | None = None
    precision: str = "fp32"  # a quantised export's kind; its PyTorch baseline is still the fp32 checkpoint
    step_ms: float | None = None
    """Mean time of one decoder step inside the runtime, where the backend times steps apart."""
    passes: tuple[float, ...] = ()
    """Tokens/s of each timed pass, in order."""
    pass_times: tuple[PassTime, ...] = ()
    """Each timed pass's split, where the backend times steps apart."""

    @property
    def pass_step_ms(self) -> tuple[float, ...]:
        """Each timed pass's mean decoder step, where the backend times steps apart."""
        return tuple(t.step_ms for t in self.pass_times)


@dataclass(frozen=True)
class BenchResult:
    rows: tuple[BenchRow, ...]
    skipped: dict[str, str] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)


def machine_description() -> dict[str, Any]:
    import onnxruntime

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "logical_cpus": multiprocessing.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "onnxruntime": onnxruntime.__version__,
            "date": time.strftime("%Y-%m-%d")}


def source_batches(export_dir: Path, sentences: int) -> list[str]:
    from s2s_deploy.format.manifest import load_manifest

    samples = list(load_manifest(export_dir).samples)
    if not samples:
        raise S2SError(f"{export_dir} stores no sample inputs to benchmark with")
    return [samples[i % len(samples)] for i in range(sentences)]


def synthetic_export(spec: str, vocab_size: int, workdir: Path) -> Path:
    """Export ``ARCH:PRESET`` with seeded random weights and a word vocabulary of ``vocab_size``."""
    import torch

    from s2s_deploy.architecture.registry import get_plugin
    from s2s_deploy.export.exporter import export_model
    from s2s_deploy.format.vocab import SPECIALS, Vocabulary
    from s2s_deploy.modeling.checkpoint import save_checkpoint

    arch, _, preset = spec.partition(":")
    plugin = get_plugin(arch)
    preset = preset or plugin.default_preset
    config = plugin.preset(preset)
    vocab = Vocabulary((*SPECIALS, *(f"w{i}" for i in range(len(SPECIALS), vocab_size))), "word")
    torch.manual_seed(0)
    model = plugin.build(config, len(vocab), len(vocab)).eval()
    generator = np.random.default_rng(20261122)
    samples = [" ".join(f"w{i}" for i in generator.integers(len(SPECIALS), vocab_size, generator.integers(14, 25)))
               for _ in range(32)]
    checkpoint = save_checkpoint(workdir / f"{arch}-{preset}.safetensors", plugin, config, model, vocab, vocab)
    out = workdir / f"{arch}-{preset}"
    export_model(plugin, model, config, vocab, vocab, out, checkpoint_path=checkpoint,
                 source=f"seeded random {spec}, vocab {vocab_size}", samples=samples, force=True)
    from s2s_deploy.format.manifest import load_manifest
    from s2s_deploy.transforms.fuse import add_to_manifest, fuse_generate

    add_to_manifest(load_manifest(out), fuse_generate(load_manifest(out), out / "generate.onnx"), beam=True)
    return out


PassHook = Callable[[Path, str, int, int], None]
"""Called in the parent after each timed pass of a cell, with (export_dir, system, beam, batch),
while the worker waits: ``bench --roofline`` times the machine's limits there, in the same minute
as the pass and without sharing the cores with it."""


def run_benchmark(export_dirs: Sequence[Path], settings: BenchSettings,
                  after_pass: PassHook | None = None) -> BenchResult:
    rows: list[BenchRow] = []
    skipped: dict[str, str] = {}
    context = multiprocessing.get_context("spawn")
    for export_dir in export_dirs:
        for system in settings.systems:
            outcome = _run_worker(context, export_dir, system, settings, after_pass)
            if isinstance(outcome, str):
                skipped[f"{export_dir.name}/{system}"] = outcome
            else:
                rows.extend(outcome)
    return BenchResult(tuple(_with_ratios(rows)), skipped, machine_description())


def _run_worker(context: Any, export_dir: Path, system: str, settings: BenchSettings,
                after_pass: PassHook | None) -> list[BenchRow] | str:
    """One (model, system) in a spawned process of its own, so its peak memory is its own."""
    ours, theirs = context.Pipe()
    worker = context.Process(target=_worker, args=(theirs, str(export_dir), system, settings, after_pass is not None),
                             daemon=True)
    worker.start()
    theirs.close()
    try:
        while True:
            try:
                kind, payload = ours.recv()
            except EOFError:
                worker.join()
                raise S2SError(f"bench: the process measuring {export_dir.name}/{system} ended without a result "
                               f"(exit code {worker.exitcode})") from None
            if kind == "pass":
                if after_pass is not None:
                    after_pass(export_dir, system, *payload)
                ours.send("go")
            elif kind == "failed":
                raise S2SError(f"bench {export_dir.name}/{system}: {payload}")
            else:
                return payload
    finally:
        ours.close()
        worker.join()


def _worker(conn: Any, export_dir: str, system: str, settings: BenchSettings, report_passes: bool) -> None:
    def passed(beam: int, batch: int) -> None:
        conn.send(("pass", (beam, batch)))
        conn.recv()

    try:
        outcome: tuple[str, Any] = ("done", _measure_system(export_dir, system, settings,
                                                            passed if report_passes else None))
    except Exception as exc:  # the parent reports it in one line
        outcome = ("failed", f"{type(exc).__name__}: {exc}")
    with contextlib.suppress(OSError):  # the parent stopped listening: it has its own error to report
        conn.send(outcome)
    conn.close()


def effective_batches(settings: BenchSettings) -> tuple[int, ...]:
    """The batch sizes a pass really runs: none is larger than the sentences there are."""
    return tuple(dict.fromkeys(min(batch, settings.sentences) for batch in settings.batches))


def _with_ratios(rows: list[BenchRow]) -> list[BenchRow]:
    baseline = {(r.model, r.beam, r.batch, on_cuda(r.system)): r.tokens_per_s
                for r in rows if r.system.startswith("pytorch")}
    out = []
    for r in rows:
        base = baseline.get((r.model, r.beam, r.batch, on_cuda(r.system)))
        out.append(replace(r, ratio_to_pytorch=r.tokens_per_s / base if base else None))
    return out


def _engine(export_dir: Path, system: str, threads: int):
    """(manifest, search engine, the object whose ``runtime_seconds`` counts runtime time)."""
    from s2s_deploy.format.manifest import load_manifest
    from s2s_deploy.runtime.search import StepLoop

    manifest = load_manifest(export_dir)
    device = "cuda" if on_cuda(system) else "cpu"
    if system.startswith("onnxruntime-generate"):
        from s2s_deploy.runtime.ort.generate import GraphEngine

        engine = GraphEngine(manifest, device=device, threads=threads)
        return manifest, engine, engine
    if system.startswith("pytorch"):
        import torch

        from s2s_deploy.modeling.torch_backend import torch_backend_for

        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)
        if device == "cuda" and not torch.cuda.is_available():
            raise S2SError("torch has no CUDA device here")
        backend = torch_backend_for(manifest, device=device)
        return manifest, StepLoop(backend), backend
    from s2s_deploy.runtime.ort.backend import OrtBackend

    # onnxruntime-cuda: the step loop uncaptured; onnxruntime-cuda-graph: as translate runs it on CUDA
    backend = OrtBackend(manifest, device=device, threads=threads, cuda_graph=system.endswith("-graph"))
    return manifest, StepLoop(backend), backend


def _measure_system(export_dir: str, system: str, settings: BenchSettings,
                    passed: Callable[[int, int], None] | None = None) -> list[BenchRow] | str:
    from s2s_deploy.runtime.decoding import plain
    from s2s_deploy.runtime.translator import encode_batch

    try:
        manifest, engine, timer = _engine(Path(export_dir), system, settings.threads)
    except S2SError as exc:
        return str(exc)
    texts = source_batches(Path(export_dir), settings.sentences)
    precision = manifest.quantization.kind if manifest.quantization else "fp32"
    rows = []
    for beam in settings.beams:
        max_len = settings.fixed_length or settings.max_len
        config = plain(beam, max_len, min_len=settings.fixed_length or 0)
        for batch in effective_batches(settings):
            chunks = [encode_batch(texts[i : i + batch], manifest.src_vocab) for i in range(0, len(texts), batch)]
            passes, latencies, overheads, pass_times, tokens = [], [], [], [], 0
            for rep in range(settings.warmup + settings.reps):
                timer.runtime_seconds = timer.step_seconds = 0.0
                timer.steps_run = 0
                started = time.perf_counter()
                count = 0
                for src, src_len in chunks:
                    t0 = time.perf_counter()
                    results = engine.search(src, src_len, config)
                    elapsed = time.perf_counter() - t0
                    count += sum(len(h[0].token_log_probs) for h in results)
                    if rep >= settings.warmup:
                        latencies.extend([elapsed * 1000] * src.shape[0])
                total = time.perf_counter() - started
                if rep >= settings.warmup:
                    passes.append(count / total)
                    overheads.append(1 - timer.runtime_seconds / total)
                    if timer.steps_run:
                        pass_times.append(PassTime(total, timer.runtime_seconds, timer.step_seconds,
                                                   timer.steps_run, count))
                    tokens = count
                    if passed is not None:
                        passed(beam, batch)
            rows.append(BenchRow(
                model=Path(export_dir).name, system=system, beam=beam, batch=batch,
                tokens_per_s=statistics.median(passes), tokens_per_s_min=min(passes),
                tokens_per_s_max=max(passes), p50_ms=float(np.percentile(latencies, 50)),
                p95_ms=float(np.percentile(latencies, 95)), engine_overhead=statistics.median(overheads),
                peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, tokens=tokens,
                precision="fp32" if system.startswith("pytorch") else precision,
                step_ms=statistics.median(t.step_ms for t in pass_times) if pass_times else None,
                passes=tuple(passes), pass_times=tuple(pass_times),
            ))
    return rows


@dataclass(frozen=True)
class BeamCost:
    """What beam K on one sentence costs against greedy on K sentences at once: both decode K
    rows per step, so a ratio near 1 says reordering the beams is nearly free."""

    model: str
    system: str
    beam: int
    ratio: float


def beam_costs(rows: Sequence[BenchRow]) -> list[BeamCost]:
    """Per-call time of beam K at batch 1 over per-call time of greedy at batch K, on the same
    sentences; a pass's time is its tokens over its tokens/s."""
    greedy = {(r.model, r.system, r.batch): r for r in rows if r.beam == 1}
    costs = []
    for r in rows:
        g = greedy.get((r.model, r.system, r.beam))
        if r.beam > 1 and r.batch == 1 and g is not None:
            ratio = (r.tokens / r.tokens_per_s) / (r.beam * g.tokens / g.tokens_per_s)
            costs.append(BeamCost(r.model, r.system, r.beam, ratio))
    return costs


def markdown_table(result: BenchResult) -> str:
    lines = [
        "| model | system | beam | batch | tokens/s [min–max] | p50 ms | p95 ms | engine overhead "
        "| peak RSS MB | × PyTorch fp32 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result.rows:
        ratio = f"{r.ratio_to_pytorch:.2f}" if r.ratio_to_pytorch is not None else "–"
        if r.ratio_to_pytorch is not None and r.precision != "fp32":
            ratio += f" ({r.precision} vs fp32 PyTorch)"
        lines.append(
            f"| {r.model} | {r.system} | {r.beam} | {r.batch} | **{r.tokens_per_s:.1f}** "
            f"[{r.tokens_per_s_min:.1f}–{r.tokens_per_s_max:.1f}] | {r.p50_ms:.1f} | {r.p95_ms:.1f} | "
            f"{100 * r.engine_overhead:.1f}% | {r.peak_rss_mb:.0f} | {ratio} |"
        )
    lines.append("\n× PyTorch fp32: tokens/s over PyTorch eager running the fp32 checkpoint of the same folder, "
                 "at the same beam, batch and device")
    costs = beam_costs(result.rows)
    if costs:
        lines += ["", "| model | system | beam K at batch 1 ÷ greedy at batch K (per call) |", "|---|---|---|"]
        lines += [f"| {c.model} | {c.system} | {c.ratio:.2f} (beam {c.beam}) |" for c in costs]
    for key, reason in result.skipped.items():
        lines.append(f"\nskipped {key}: {reason}")
    return "\n".join(lines)


def chart_rows(rows: Sequence[BenchRow]) -> list[dict[str, Any]]:
    """Rows for plot.plot_benchmark: one bar group per model and search setting."""
    return [{"system": r.system, "setting": f"{r.model}\nbeam {r.beam}, batch {r.batch}",
             "tokens_per_s": r.tokens_per_s} for r in rows]


def chart_title(result: BenchResult, settings: BenchSettings) -> str:
    """What the bars measured: the settings that change them, and the machine."""
    length = f"exactly {settings.fixed_length}" if settings.fixed_length else f"up to {settings.max_len}"
    return (f"tokens/s, median of {settings.reps} passes over {settings.sentences} sentences, {length} tokens each, "
            f"{settings.threads} threads\n{result.machine.get('cpu', '')}, {result.machine.get('date', '')}")


def scratch_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="s2s-bench-"))
