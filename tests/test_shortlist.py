"""The vmap vocabulary shortlist (runtime/shortlist.py): CTranslate2's format read as it reads it,
each sentence restricted to its own allowed tokens, whatever its batchmates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from s2s_deploy.cli import main
from s2s_deploy.errors import S2SError
from s2s_deploy.format.vocab import Vocabulary
from s2s_deploy.runtime.shortlist import SPACE_MARK, read_vmap, restrict, write_vmap
from s2s_deploy.runtime.translator import Translator


@pytest.fixture
def vocabs() -> tuple[Vocabulary, Vocabulary]:
    return (Vocabulary.build(["the cat sat on the mat"], level="word"),
            Vocabulary.build(["le chat assis sur tapis"], level="word"))


def test_vmap_rules_ngrams_and_always_line(vocabs, tmp_path: Path) -> None:
    src, tgt = vocabs
    path = tmp_path / "map.vmap"
    path.write_text("cat\tchat\nthe cat\tle\non the mat\tsur tapis\n\tassis\nmat\tunknown-token\nzebra\tle\n")
    shortlist = read_vmap(path, src, tgt)
    ids = src.encode("the cat", add_eos=False)
    names = lambda allowed: {tgt.tokens[i] for i in allowed.tolist()}  # noqa: E731
    fixed = {tgt.tokens[i] for i in (tgt.unk_id, tgt.bos_id, tgt.eos_id)}
    assert names(shortlist.allowed(ids)) == {"chat", "le", "assis"} | fixed  # unigram + bigram + always
    assert names(shortlist.allowed(src.encode("on the mat", add_eos=False))) == {"sur", "tapis", "assis"} | fixed
    assert names(shortlist.allowed(src.encode("sat", add_eos=False))) == {"assis"} | fixed
    prefix = tuple(tgt.encode("tapis", add_eos=False))
    assert "tapis" in names(shortlist.allowed(src.encode("sat", add_eos=False), prefix))
    assert shortlist.longest == 3


def test_vmap_refusals_are_one_line(vocabs, tmp_path: Path) -> None:
    src, tgt = vocabs
    (tmp_path / "bad.vmap").write_text("cat chat\n")
    with pytest.raises(S2SError, match=r"bad.vmap:1: .*no tab"):
        read_vmap(tmp_path / "bad.vmap", src, tgt)
    (tmp_path / "foreign.vmap").write_text("zebra\tle\n")
    with pytest.raises(S2SError, match="no rule whose source tokens"):
        read_vmap(tmp_path / "foreign.vmap", src, tgt)
    with pytest.raises(S2SError, match="not found"):
        read_vmap(tmp_path / "absent.vmap", src, tgt)


def test_restrict_renormalises_over_the_allowed_ids() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 10)).astype(np.float32)
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    allowed = rng.random((3, 10)) < 0.4
    allowed[:, 0] = True
    out = restrict(log_probs, allowed)
    assert np.all(np.isneginf(out[~allowed]))
    np.testing.assert_allclose(np.exp(out).sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(out[0, allowed[0]] - out[0, 0], log_probs[0, allowed[0]] - log_probs[0, 0], atol=1e-6)


def test_char_space_is_written_as_the_space_mark(tmp_path: Path) -> None:
    src = tgt = Vocabulary.build(["a b"], level="char")
    pairs = [(src.encode("a b"), tgt.encode("b a"))]
    write_vmap(tmp_path / "c.vmap", pairs, src, tgt, per_token=5)
    text = (tmp_path / "c.vmap").read_text()
    assert SPACE_MARK in text and " \t" not in text
    assert tgt.tokens.index(" ") in read_vmap(tmp_path / "c.vmap", src, tgt).allowed(src.encode("a", add_eos=False))


def test_translator_obeys_each_sentences_own_shortlist(exports, tmp_path: Path) -> None:
    _, manifest = exports.get("transformer")
    texts = list(manifest.samples[:6])
    plain = Translator(manifest.directory, device="cpu")
    reference = plain(texts)
    src, tgt = manifest.src_vocab, manifest.tgt_vocab
    pairs = [(src.encode(t), tgt.encode(r.text)) for t, r in zip(texts, reference, strict=True)]
    path = tmp_path / "samples.vmap"
    write_vmap(path, pairs, src, tgt, per_token=4)  # tight: most sentences lose tokens they need
    shortlisted = Translator(manifest.directory, device="cpu", vmap=path)
    shortlist = shortlisted.shortlist
    for beam in (1, 3):
        together = shortlisted(texts, beam=beam)
        for text, result in zip(texts, together, strict=True):
            allowed = set(shortlist.allowed(src.encode(text)).tolist())
            assert set(tgt.encode(result.text, add_eos=False)) <= allowed
            alone = shortlisted([text], beam=beam)[0]  # its own set, whatever the batch
            # (this fp32 export pads batches, which moves scores in the last bits: docs/parity.md)
            assert alone.text == result.text and alone.score == pytest.approx(result.score, abs=1e-5)
    assert [r.text for r in shortlisted(texts)] != [r.text for r in reference]  # it really restricted
    # a shortlist that allows every target token changes no token
    (tmp_path / "all.vmap").write_text("\t" + " ".join(SPACE_MARK if t == " " else t for t in tgt.tokens) + "\n")
    everything = Translator(manifest.directory, device="cpu", vmap=tmp_path / "all.vmap")
    assert [r.text for r in everything(texts, beam=3)] == [r.text for r in plain(texts, beam=3)]


def test_translate_vmap_cli(exports, tmp_path: Path) -> None:
    _, manifest = exports.get("transformer")
    (tmp_path / "in.txt").write_text("four nights\n")
    (tmp_path / "m.vmap").write_text("\tq\n")
    runner = CliRunner()
    result = runner.invoke(main, ["translate", str(manifest.directory), "--input", str(tmp_path / "in.txt"),
                                  "--output", str(tmp_path / "out.txt"), "--vmap", str(tmp_path / "m.vmap")])
    assert result.exit_code == 1 and result.stderr.strip().splitlines() == [
        "error: --vmap applies to output on the terminal, not --output files"]
    result = runner.invoke(main, ["translate", str(manifest.directory), "four nights", "--quiet",
                                  "--vmap", str(tmp_path / "m.vmap")])
    assert result.exit_code == 0 and set(result.stdout.strip()) <= {"q"}
    with pytest.raises(S2SError, match="step loop"):
        Translator(manifest.directory, device="cpu", engine="graph", vmap=tmp_path / "m.vmap")
