"""Shared fixtures: one export per architecture per test session (exports cost seconds)."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import pytest
import torch
from filelock import FileLock

from s2s_deploy.architecture.registry import REGISTRY, get_plugin
from s2s_deploy.export.exporter import export_model
from s2s_deploy.export.sources import ModelSource, load_source
from s2s_deploy.format.manifest import Manifest, load_manifest

ONE_TORCH_THREAD = 1
"""Every test's PyTorch runs on one thread: the models here are tiny, so a second thread only
synchronises, and beside ONNX Runtime's own thread pool (or another job) on a 2-core machine it
makes each small matmul 10-20x slower (the transformer's option searches: 1.9 s on one thread,
23-43 s on two, measured)."""

torch.set_num_threads(ONE_TORCH_THREAD)  # before any fixture: exports and models built at setup too


EXPORT_WORKERS = 2
"""Exports a session's tests name run this many at a time in worker processes, as
tests/test_hf_families.py's do: an export is mostly the dynamo trace, single-threaded Python."""


def export_arch(arch: str, root: Path) -> ModelSource:
    """``arch``'s bundled checkpoint (seeded random weights where none is bundled) exported into
    ``root/arch`` with the attention output where the architecture has one."""
    plugin = get_plugin(arch)
    source = load_source(plugin, None, workdir=root)
    export_model(plugin, source.model, source.config, source.src_vocab, source.tgt_vocab, root / arch,
                 checkpoint_path=source.checkpoint_path, source=source.description, samples=source.samples,
                 training=source.info, with_attention=plugin.has_attention)
    return source


def export_in_worker(arch: str, root: Path) -> None:
    """``export_arch`` in a worker process, which keeps only the folder it writes."""
    export_arch(arch, root)


def in_xdist_worker() -> bool:
    """Whether this session is one of ``pytest -n N``'s workers, which share ``shared_root``."""
    return "PYTEST_XDIST_WORKER" in os.environ


def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder every ``pytest -n N`` worker of this run sees (the session's own without workers)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if in_xdist_worker() else base


def made_once(folder: Path, make: Callable[[Path], object]) -> Path:
    """``make(folder)`` done by the first worker of the run that asks, under a lock, while any other
    that asks waits for it; a ``.done`` file beside ``folder`` marks it complete."""
    done = folder.with_name(folder.name + ".done")
    with FileLock(f"{folder}.lock"):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            make(folder)
            done.touch()
    return folder


class ExportCache:
    """One export per architecture per run. Alone, a session exports the architectures its tests name
    as their ``arch`` parameter (``prefetch``, two or more) ahead in a pool of ``EXPORT_WORKERS``
    processes, in the order the tests first need them; any other when first asked for. Under
    ``pytest -n N`` the workers are the parallelism: each architecture is exported by the first worker
    that asks, into ``root`` (shared), and loaded by the others."""

    def __init__(self, root: Path, own: Path, prefetch: list[str]) -> None:
        self.root, self.own = root, own
        self._done: dict[str, tuple[ModelSource, Manifest]] = {}
        self._pending: dict[str, Future[None]] = {}
        self._pool: ProcessPoolExecutor | None = None
        if len(prefetch) > 1 and not in_xdist_worker():
            self._pool = ProcessPoolExecutor(EXPORT_WORKERS, mp_context=multiprocessing.get_context("spawn"))
            self._pending = {arch: self._pool.submit(export_in_worker, arch, root) for arch in prefetch}

    def get(self, arch: str) -> tuple[ModelSource, Manifest]:
        if arch not in self._done:
            future = self._pending.pop(arch, None)
            if future is not None and not future.cancel():  # started or done in a worker: wait for it
                future.result()
            elif future is None and in_xdist_worker():
                made_once(self.root / arch, lambda out: export_in_worker(arch, out.parent))
            else:
                self._done[arch] = (export_arch(arch, self.root), load_manifest(self.root / arch))
                return self._done[arch]
            source = load_source(get_plugin(arch), None, workdir=self.own)  # the model another process exported
            self._done[arch] = (source, load_manifest(self.root / arch))
        return self._done[arch]

    def close(self) -> None:
        """Stop the workers, dropping exports no test asked for."""
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)


FAST_ARCHS = frozenset({"gru", "transformer"})
"""The bundled exports the fast tier decodes: one recurrent, one Transformer (each exported once)."""

SLOW_MODULES = frozenset({
    "test_hf", "test_hf_families", "test_hf_speech_to_text", "test_hf_vision", "test_hf_whisper",
    "test_hf_whisper_parity_timestamps", "test_hf_whisper_timestamps", "test_hf_whisper_tokenizer",
    "test_train", "test_speech_data", "test_distributed", "test_web", "test_manifest_client", "test_first_hour",
    "test_runtime_torch_free", "test_cuda_graph", "test_bench", "test_threads", "test_attention", "test_export_options",
})
"""Modules whose every test is in the full tier only: Hugging Face families against ``generate``,
training, Ray, Node and Chromium clients, fresh virtual environments, benchmarks, threads, attention
maps and optimised or .ort exports."""

SLOW_FIXTURES = frozenset({"speech"})
"""Module fixtures that export a model outside ``FAST_ARCHS`` (test_speech_source's speech export)."""


def slow(item: pytest.Item) -> bool:
    """The full tier's own tests (``pytest -m slow``); the rest is the fast tier (``pytest -m "not slow"``):
    a test is slow if its module is in ``SLOW_MODULES``, it is marked ``slow``, it uses one of
    ``SLOW_FIXTURES``, or it decodes an architecture's export (its ``arch`` parameter) other than
    ``FAST_ARCHS``."""
    if item.module.__name__ in SLOW_MODULES or item.get_closest_marker("slow"):
        return True
    if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    arch = item.callspec.params.get("arch") if hasattr(item, "callspec") else None
    return arch is not None and arch not in FAST_ARCHS


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the full tier's tests before ``-m`` selects: see ``slow``."""
    for item in items:
        if slow(item):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """A test that changes PyTorch's thread count (training, benchmarks) leaves one thread behind it."""
    yield
    torch.set_num_threads(ONE_TORCH_THREAD)


@pytest.fixture(autouse=True)
def registry_unchanged():
    """A test that registers a plugin (``--plugin FILE``) must not leak it into the next test."""
    with REGISTRY.scoped():
        yield


def named_archs(items: list[pytest.Item]) -> list[str]:
    """The registered architectures that tests using ``exports`` take as their ``arch`` parameter,
    in the order the tests run."""
    registered = {entry.plugin.name for entry in REGISTRY.entries()}
    named = [item.callspec.params.get("arch") for item in items
             if "exports" in getattr(item, "fixturenames", ()) and hasattr(item, "callspec")]
    return [arch for arch in dict.fromkeys(named) if arch in registered]


@pytest.fixture(scope="session")
def exports(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[ExportCache]:
    root = shared_root(tmp_path_factory) / "exports"
    root.mkdir(exist_ok=True)
    cache = ExportCache(root, tmp_path_factory.mktemp("sources"), named_archs(request.session.items))
    yield cache
    cache.close()


class HFExports:
    """``export --hf`` once per folder content and options per run: modules that build the same tiny
    model (the timestamped Whisper of three modules, say) share one export, which none may change
    in place (copy it first). Keyed by every file's name and bytes, so a changed folder exports anew."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def get(self, hf_dir: Path, *options: str) -> Path:
        from click.testing import CliRunner

        from s2s_deploy.cli import main

        digest = hashlib.sha256(repr(options).encode())
        for path in sorted(p for p in hf_dir.rglob("*") if p.is_file()):
            digest.update(str(path.relative_to(hf_dir)).encode() + b"\0" + path.read_bytes())

        def export(out: Path) -> None:
            result = CliRunner().invoke(main, ["export", "--hf", str(hf_dir), "--out", str(out), *options])
            assert result.exit_code == 0, result.output

        return made_once(self.root / digest.hexdigest()[:20], export)


@pytest.fixture(scope="session")
def hf_exports(tmp_path_factory: pytest.TempPathFactory) -> HFExports:
    root = shared_root(tmp_path_factory) / "hf-exports"
    root.mkdir(exist_ok=True)
    return HFExports(root)

