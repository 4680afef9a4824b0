"""A maximum length relative to the source (max_len_a * n + max_len_b): per sentence, on every engine."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from s2s_deploy.modeling.torch_backend import torch_backend_for
from s2s_deploy.runtime.decoding import resolve
from s2s_deploy.runtime.ort.backend import OrtBackend
from s2s_deploy.runtime.ort.generate import GraphEngine
from s2s_deploy.runtime.search import SearchConfig, search
from s2s_deploy.runtime.translator import Translator, encode_batch
from s2s_deploy.transforms.fuse import add_to_manifest, fuse_generate

TIGHT = {"max_len_a": 0.25, "max_len_b": 2}


def test_limits_follow_the_source_length_and_stay_within_bounds() -> None:
    config = SearchConfig(max_len=20, min_len=3, max_len_a=0.5, max_len_b=1)
    assert config.sentence_limits(np.array([1, 4, 10, 100])).tolist() == [3, 3, 6, 20]
    assert SearchConfig(max_len=20).sentence_limits(np.array([5])) is None
    with pytest.raises(ValueError):
        SearchConfig(max_len_a=float("nan"))


@pytest.mark.parametrize("arch", ["gru", "transformer"])
@pytest.mark.parametrize("beam", [1, 3])
def test_each_sentence_stops_at_its_own_limit_whatever_its_batchmates(exports, arch: str, beam: int) -> None:
    _, manifest = exports.get(arch)
    texts = list(manifest.samples[:6])
    config = SearchConfig(beam_size=beam, n_best=1, max_len=60, **TIGHT)
    src, src_len = encode_batch(texts, manifest.src_vocab)
    limits = config.sentence_limits(src_len)
    assert len(set(limits.tolist())) > 1  # the batch mixes limits
    for backend in (OrtBackend(manifest, device="cpu"), torch_backend_for(manifest)):
        together = search(backend, src, src_len, config)
        for i, text in enumerate(texts):
            one_src, one_len = encode_batch([text], manifest.src_vocab)
            alone = search(backend, one_src, one_len, replace(config, max_len=int(limits[i]), max_len_a=0, max_len_b=0))
            assert together[i][0].tokens == alone[0][0].tokens
            assert abs(together[i][0].score - alone[0][0].score) < 1e-6
            assert len(together[i][0].token_log_probs) <= limits[i]
        assert any(not hyps[0].finished for hyps in together)  # the limit really cut some sentence


def test_generate_onnx_applies_the_same_limits(exports, tmp_path) -> None:
    import shutil

    _, manifest = exports.get("gru")
    folder = tmp_path / "gru"
    shutil.copytree(manifest.directory, folder)
    from s2s_deploy.format.manifest import load_manifest

    copy = load_manifest(folder)
    add_to_manifest(copy, fuse_generate(copy, folder / "generate.onnx"), beam=True)
    copy = load_manifest(folder)
    texts = list(copy.samples[:6])
    src, src_len = encode_batch(texts, copy.src_vocab)
    for beam in (1, 3):
        config = SearchConfig(beam_size=beam, max_len=60, **TIGHT)
        loop = search(OrtBackend(copy, device="cpu"), src, src_len, config)
        fused = GraphEngine(copy, device="cpu").search(src, src_len, config)
        assert [h[0].tokens for h in loop] == [h[0].tokens for h in fused]


def test_the_export_default_applies_unless_overridden(exports, tmp_path) -> None:
    import json
    import shutil

    _, manifest = exports.get("gru")
    folder = tmp_path / "gru"
    shutil.copytree(manifest.directory, folder)
    raw = json.loads((folder / "manifest.json").read_text())
    raw["search"].update(TIGHT)
    (folder / "manifest.json").write_text(json.dumps(raw))
    translator = Translator(folder, device="cpu")
    assert (translator.search_config().max_len_a, translator.search_config().max_len_b) == (0.25, 2)
    assert translator.search_config(max_len_a=0, max_len_b=0).sentence_limits(np.array([5])) is None
    text = manifest.samples[0]
    n = encode_batch([text], manifest.src_vocab)[1][0]
    assert len(translator([text])[0].hypotheses[0][0]) <= int(np.ceil(0.25 * n + 2))
    assert resolve(manifest).max_len_a == manifest.search.get("max_len_a", 0.0)
