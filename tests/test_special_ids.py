"""Special ids at any position, end to end: a bundled model whose vocabulary is permuted so that
EOS is id 0 and pad the last id (Marian's layout), with no BOS, decodes exactly like the original."""

from __future__ import annotations

import pytest
import torch

from s2s_deploy.architecture.registry import get_plugin
from s2s_deploy.export.exporter import export_model
from s2s_deploy.export.sources import bundled_checkpoint
from s2s_deploy.format.manifest import FORMAT, load_manifest
from s2s_deploy.format.vocab import Vocabulary
from s2s_deploy.modeling.checkpoint import build_model, load_checkpoint, save_checkpoint
from s2s_deploy.modeling.torch_backend import torch_backend_for
from s2s_deploy.runtime.ort.backend import OrtBackend
from s2s_deploy.runtime.translator import Translator
from s2s_deploy.verify.parity import check_parity

# which tensors hold one row per token, for the two plugins permuted here
ROWS = {
    "transformer": {"src": ("src_embedding.weight",), "tgt": ("tgt_embedding.weight", "output.bias")},
    "gru": {"src": ("src_embedding.weight",), "tgt": ("tgt_embedding.weight", "output.weight", "output.bias")},
}


def marian_order(size: int) -> list[int]:
    """Old id at each new position: eos, unk, the first half, bos, the rest, pad."""
    middle = list(range(4, size))
    half = len(middle) // 2
    return [2, 3, *middle[:half], 1, *middle[half:], 0]


def permuted(vocab: Vocabulary, order: list[int], keep_bos: bool) -> Vocabulary:
    new = {old: new for new, old in enumerate(order)}
    return Vocabulary(tuple(vocab.tokens[i] for i in order), vocab.level, pad_id=new[0],
                      bos_id=new[1] if keep_bos else None, eos_id=new[2], unk_id=new[3],
                      decoder_start_id=new[vocab.decoder_start_id])


@pytest.fixture(scope="module", params=[pytest.param("transformer", marks=pytest.mark.slow), "gru"])
def pair(request, exports, tmp_path_factory):
    """(original manifest, permuted manifest, target order) for one bundled model."""
    arch = request.param
    plugin = get_plugin(arch)
    _, original = exports.get(arch)
    loaded = load_checkpoint(bundled_checkpoint(plugin))
    src_order, tgt_order = marian_order(len(loaded.src_vocab)), marian_order(len(loaded.tgt_vocab))
    tensors = dict(loaded.tensors)
    for side, order in (("src", src_order), ("tgt", tgt_order)):
        for name in ROWS[arch][side]:
            tensors[name] = tensors[name][torch.tensor(order)]
    model = build_model(loaded, plugin)
    model.load_state_dict(tensors, strict=False)
    src_vocab = permuted(loaded.src_vocab, src_order, keep_bos=True)
    tgt_vocab = permuted(loaded.tgt_vocab, tgt_order, keep_bos=False)
    work = tmp_path_factory.mktemp(f"permuted-{arch}")
    path = save_checkpoint(work / "m.safetensors", plugin, loaded.config, model, src_vocab, tgt_vocab)
    out = work / "export"
    export_model(plugin, model, loaded.config, src_vocab, tgt_vocab, out, checkpoint_path=path,
                 source="permuted bundled checkpoint", samples=original.samples[:8])
    return original, load_manifest(out), tgt_order


def test_special_ids_are_recorded(pair) -> None:
    _, manifest, tgt_order = pair
    size = len(tgt_order)
    assert manifest.to_dict()["format"] == FORMAT  # every export writes the current format
    assert manifest.to_dict()["special_tokens"] == {"pad": size - 1, "bos": None, "eos": 0, "unk": 1,
                                              "decoder_start": tgt_order.index(1)}
    assert (manifest.eos_id, manifest.tgt_vocab.pad_id, manifest.tgt_vocab.bos_id) == (0, size - 1, None)
    assert load_checkpoint(manifest.directory / "checkpoint.safetensors").tgt_vocab == manifest.tgt_vocab


@pytest.mark.parametrize("beam", [1, 4])
def test_permuted_model_translates_like_the_original(pair, beam: int) -> None:
    original, manifest, _ = pair
    texts = list(original.samples[:8])
    want = Translator(original.directory, device="cpu")(texts, beam=beam, n_best=min(beam, 2))
    got = Translator(manifest.directory, device="cpu")(texts, beam=beam, n_best=min(beam, 2))
    assert [w.hypotheses[0][0] for w in want] == [g.hypotheses[0][0] for g in got]
    assert [len(w.hypotheses) for w in want] == [len(g.hypotheses) for g in got]
    for w, g in zip(want, got, strict=True):
        assert g.score == pytest.approx(w.score, abs=1e-4)
    assert any(w.text for w in want), "the bundled model translates: EOS must be found at its new id"


def test_permuted_export_passes_parity(pair) -> None:
    _, manifest, _ = pair
    report = check_parity(manifest, torch_backend_for(manifest), OrtBackend(manifest, device="cpu"),
                          list(manifest.samples), beam_size=4, max_len=40)
    assert report.passed, [s.mismatches[:2] for s in report.searches]
