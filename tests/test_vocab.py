"""Vocabulary: special ids as data, framing, the older forms it still reads, and what it refuses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from s2s_deploy.format.manifest import load_manifest
from s2s_deploy.format.subword import TokenizerFile, TokenizerFileError
from s2s_deploy.format.vocab import Vocabulary, VocabularyError
from s2s_deploy.runtime.translator import Translator

MARIAN_LIKE = ("</s>", "<unk>", "a", "b", "c", "<pad>")


def marian_like(**fields) -> Vocabulary:
    return Vocabulary(MARIAN_LIKE, **{"level": "char", "pad_id": 5, "bos_id": None, "eos_id": 0, "unk_id": 1,
                                      "decoder_start_id": 5, **fields})


def test_built_vocabularies_keep_specials_at_0_to_3() -> None:
    vocab = Vocabulary.build(["abc"])
    assert vocab.tokens[:4] == ("<pad>", "<bos>", "<eos>", "<unk>")
    assert vocab.special_ids() == {"pad": 0, "bos": 1, "eos": 2, "unk": 3, "decoder_start": 1}
    assert vocab.encode("ab") == [4, 5, 2]


def test_special_ids_anywhere() -> None:
    vocab = marian_like()
    assert vocab.encode("abz") == [2, 3, 1, 0]
    assert vocab.decode([5, 2, 3, 0, 4]) == "ab"  # the start (pad) is dropped, EOS ends it
    assert Vocabulary.from_dict(json.loads(json.dumps(vocab.to_dict()))) == vocab


def test_prefix_suffix_and_hidden() -> None:
    vocab = marian_like(prefix=(4,), suffix=(0, 3), hidden=(4,))
    assert vocab.encode("ab") == [4, 2, 3, 0, 3]
    assert vocab.encode("ab", add_eos=False) == [2, 3]
    assert vocab.decode([4, 2, 3]) == "ab"


def test_without_unk_an_unknown_token_is_an_error() -> None:
    with pytest.raises(VocabularyError, match="no unk"):
        marian_like(unk_id=None).encode("az")


@pytest.mark.parametrize(("fields", "message"), [
    ({"eos_id": 6}, "special id eos=6"),
    ({"pad_id": True}, "special id pad=True"),
    ({"suffix": (9,)}, "suffix holds 9"),
    ({"decoder_start_id": None}, "without bos needs an explicit decoder_start"),
    ({"level": "bytes"}, "unknown tokenisation level"),
    ({"level": "sentencepiece"}, "needs tokenizer file"),
])
def test_bad_vocabularies_are_refused(fields: dict, message: str) -> None:
    with pytest.raises(VocabularyError, match=message):
        marian_like(**fields)


def test_the_older_form_has_specials_at_0_to_3() -> None:
    tokens = ["<pad>", "<bos>", "<eos>", "<unk>", "x"]
    old = Vocabulary.from_dict({"level": "char", "tokens": tokens})
    assert old == Vocabulary.build(["x"])
    assert Vocabulary.from_dict({"tokens": tokens}, decoder_start_id=2).decoder_start_id == 2
    with pytest.raises(VocabularyError, match="must start with"):
        Vocabulary.from_dict({"level": "char", "tokens": list(MARIAN_LIKE)})


@pytest.mark.parametrize("name", ["../x.model", "a/b.json", ".hidden", "encoder.onnx", "manifest.json",
                                  "checkpoint.safetensors"])
def test_tokenizer_file_names_are_plain(name: str) -> None:
    with pytest.raises(TokenizerFileError, match="plain file name"):
        TokenizerFile(name, b"data")


def test_a_format_2_export_still_reads(exports, tmp_path: Path) -> None:
    """Format 2 had no per-vocabulary specials; it must decode exactly as the format-3 export does."""
    _, manifest = exports.get("gru")
    old = tmp_path / "format2"
    shutil.copytree(manifest.directory, old)
    raw = json.loads((old / "manifest.json").read_text(encoding="utf-8"))
    raw["format"] = "s2s-deploy-manifest/2"
    raw["search"]["length_penalty_alpha"] = raw["search"].pop("alpha")  # format 2 names it so
    raw["vocab"] = {side: {"level": v["level"], "tokens": v["tokens"]} for side, v in raw["vocab"].items()}
    (old / "manifest.json").write_text(json.dumps(raw), encoding="utf-8")
    assert load_manifest(old).tgt_vocab == manifest.tgt_vocab
    texts = list(manifest.samples[:4])
    assert ([t.text for t in Translator(old, device="cpu")(texts, beam=3)]
            == [t.text for t in Translator(manifest.directory, device="cpu")(texts, beam=3)])


def test_special_tokens_must_agree_with_the_target_vocabulary(exports, tmp_path: Path) -> None:
    from s2s_deploy.errors import ManifestError

    _, manifest = exports.get("gru")
    bad = tmp_path / "bad"
    shutil.copytree(manifest.directory, bad)
    raw = json.loads((bad / "manifest.json").read_text(encoding="utf-8"))
    raw["special_tokens"]["eos"] = 3
    (bad / "manifest.json").write_text(json.dumps(raw), encoding="utf-8")
    with pytest.raises(ManifestError, match="disagree"):
        load_manifest(bad)
