"""The beam stopping rule (Hugging Face's early_stopping=False, docs/manifest.md): the 1-best
never depends on n-best, in the step loop and in generate.onnx alike."""

from __future__ import annotations

import itertools

import pytest

from s2s_deploy.runtime.ort.backend import OrtBackend
from s2s_deploy.runtime.search import SearchConfig, search
from s2s_deploy.runtime.translator import encode_batch

HARD = ["twenty-three thousand four hundred and five", "2064", "1 2 3 4 5 6", "zzzz qqq", "March"]


@pytest.mark.parametrize("arch", ["transformer", "gru"])
@pytest.mark.parametrize(("alpha", "max_len"), [(0.75, 40), (1.0, 12), (0.0, 40)])
def test_one_best_is_the_same_for_every_n_best(exports, arch: str, alpha: float, max_len: int) -> None:
    _, manifest = exports.get(arch)
    backend = OrtBackend(manifest, device="cpu")
    src, src_len = encode_batch([*manifest.samples[:8], *HARD], manifest.src_vocab, manifest.max_source_length)
    lists = {n: search(backend, src, src_len, SearchConfig(4, n, max_len, alpha)) for n in (1, 2, 3, 4)}
    for n in (2, 3, 4):
        assert [h[0] for h in lists[n]] == [h[0] for h in lists[1]]
        assert all(len(h) == n for h in lists[n])
        assert all(a.score >= b.score for h in lists[n] for a, b in itertools.pairwise(h))  # best first

