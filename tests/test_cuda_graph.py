"""The CUDA step loop decodes as the CPU one, and captured CUDA graphs as the CUDA step loop.
Needs onnxruntime-gpu and a GPU:
skipped, with the reason, elsewhere (CI has none). The capture-free bookkeeping is tested on
CPU for every plugin in test_plugins.py."""

from __future__ import annotations

import numpy as np
import pytest
from test_plugins import ARCH_CASES

from s2s_deploy.errors import S2SError
from s2s_deploy.format.manifest import Manifest
from s2s_deploy.runtime.ort.backend import OrtBackend
from s2s_deploy.runtime.search import SearchConfig, search
from s2s_deploy.runtime.translator import encode_batch

CASES = [arch for arch, _ in ARCH_CASES]


def _cuda(manifest: Manifest, cuda_graph: bool) -> OrtBackend:
    try:
        return OrtBackend(manifest, device="cuda", cuda_graph=cuda_graph)
    except S2SError as exc:
        pytest.skip(f"no CUDA for ONNX Runtime here: {exc}")


@pytest.mark.parametrize("arch", CASES)
def test_captured_steps_decode_as_the_cuda_step_loop(exports, arch: str) -> None:
    _, manifest = exports.get(arch)
    plain, captured = _cuda(manifest, False), _cuda(manifest, True)
    texts = sorted(manifest.samples, key=len)
    # each batch three times: its graph ids are captured, then replayed
    batches = [texts[:1]] * 3 + [texts[-2:]] * 3 + [(texts * 8)[:8]] * 3
    for config in (SearchConfig(1, 1, 40), SearchConfig(4, 2, 40)):
        for batch in batches:
            src, src_len = encode_batch(list(batch), manifest.src_vocab)
            expected, got = search(plain, src, src_len, config), search(captured, src, src_len, config)
            for want, have in zip(expected, got, strict=True):
                assert [h.tokens for h in have] == [h.tokens for h in want]
                np.testing.assert_allclose([h.score for h in have], [h.score for h in want], atol=1e-4)


@pytest.mark.parametrize("arch", CASES)
def test_cuda_step_loop_decodes_as_cpu(exports, arch: str) -> None:
    """Guards the bug where host inputs bound once were copied to the GPU at bind time, so every
    step after the first decoded the first step's tokens again."""
    _, manifest = exports.get(arch)
    cpu, cuda = OrtBackend(manifest, device="cpu"), _cuda(manifest, False)
    src, src_len = encode_batch(list(manifest.samples), manifest.src_vocab)
    for config in (SearchConfig(1, 1, 40), SearchConfig(4, 2, 40)):
        expected, got = search(cpu, src, src_len, config), search(cuda, src, src_len, config)
        for want, have in zip(expected, got, strict=True):
            assert [h.tokens for h in have] == [h.tokens for h in want]
            np.testing.assert_allclose([h.score for h in have], [h.score for h in want], atol=1e-4)
