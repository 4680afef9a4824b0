"""Shared fixtures: one export per architecture per test session (exports cost seconds)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from s2s_deploy.architecture.registry import get_plugin
from s2s_deploy.export.exporter import export_model
from s2s_deploy.export.sources import ModelSource, load_source
from s2s_deploy.format.manifest import Manifest, load_manifest


class ExportCache:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._done: dict[str, tuple[ModelSource, Manifest]] = {}

    def get(self, arch: str) -> tuple[ModelSource, Manifest]:
        if arch not in self._done:
            plugin = get_plugin(arch)
            source = load_source(plugin, None, workdir=self.root)
            out = self.root / arch
            export_model(plugin, source.model, source.config, source.src_vocab, source.tgt_vocab, out,
                         checkpoint_path=source.checkpoint_path, source=source.description, samples=source.samples,
            training=source.info,
                         with_attention=plugin.has_attention)
            self._done[arch] = (source, load_manifest(out))
        return self._done[arch]


ONE_TORCH_THREAD = 1
"""Every test's PyTorch runs on one thread: the models here are tiny, so a second thread only
synchronises, and beside ONNX Runtime's own thread pool (or another job) on a 2-core machine it
makes each small matmul 10-20x slower (the transformer's option searches: 1.9 s on one thread,
23-43 s on two, measured)."""

torch.set_num_threads(ONE_TORCH_THREAD)  # before any fixture: exports and models built at setup too


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """A test that changes PyTorch's thread count (training, benchmarks) leaves one thread behind it."""
    yield
    torch.set_num_threads(ONE_TORCH_THREAD)


@pytest.fixture(autouse=True)
def registry_unchanged():
    """A test that registers a plugin (``--plugin FILE``) must not leak it into the next test."""
    from s2s_deploy.architecture.registry import REGISTRY

    before = dict(REGISTRY._plugins), REGISTRY._entry_points_loaded
    yield
    REGISTRY._plugins.clear()
    REGISTRY._plugins.update(before[0])
    REGISTRY._entry_points_loaded = before[1]


@pytest.fixture(scope="session")
def exports(tmp_path_factory: pytest.TempPathFactory) -> ExportCache:
    return ExportCache(tmp_path_factory.mktemp("exports"))
