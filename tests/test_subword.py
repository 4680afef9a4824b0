"""SentencePiece and Hugging Face ``tokenizers`` exports, end to end and without network: tiny
tokenizers trained here, a seeded random Transformer, export, then text and ids through
``Translator``, ``translate`` and ``translate --ids``, in PyTorch, ONNX Runtime and without torch."""

from __future__ import annotations

import io
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from s2s_deploy.architecture.registry import get_plugin
from s2s_deploy.cli import main
from s2s_deploy.errors import ManifestError
from s2s_deploy.export.exporter import export_model
from s2s_deploy.format.manifest import load_manifest
from s2s_deploy.format.vocab import Vocabulary, VocabularyError
from s2s_deploy.modeling.checkpoint import load_checkpoint, save_checkpoint
from s2s_deploy.modeling.torch_backend import torch_backend_for
from s2s_deploy.runtime.ort.backend import OrtBackend
from s2s_deploy.runtime.translator import Translator
from s2s_deploy.verify.parity import check_parity

WORDS = ("alpha", "beta", "gamma", "delta", "march", "april", "one", "two", "three", "four", "hello", "world",
         "mercredi", "quatre", "vingt", "semaines", "jours", "après", "trois", "janvier", "février")
TINY = get_plugin("transformer").config_type(d_model=32, num_heads=2, ffn_hidden=64, encoder_layers=1,
                                             decoder_layers=1, dropout=0.0, max_len=64, tie_output=False)
# (tied random embeddings make a model that repeats its start token, which would detokenise to nothing)
TEXTS = ["hello world", "three days after march one", "vingt et une semaines", "alpha", "quatre beta zeta"]
MAX_LEN = 12


def lines(seed: int, count: int = 300) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8))) for _ in range(count)]


def sentencepiece_model(path: Path) -> Path:
    """Unigram, 40 pieces, specials in SentencePiece's own order: unk 0, bos 1, eos 2, pad 3."""
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(lines(0)), model_writer=model, vocab_size=40,
                                             model_type="unigram", pad_id=3, minloglevel=2)
    path.write_bytes(model.getvalue())
    return path


def bpe_tokenizer(path: Path) -> Path:
    """Byte-pair encoding with Metaspace; specials <s> 0, <pad> 1, </s> 2, <unk> 3, as BART's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=70, special_tokens=["<s>", "<pad>", "</s>", "<unk>"], show_progress=False)
    tokenizer.train_from_iterator(lines(1), trainer)
    tokenizer.save(str(path))
    return path


def wordpiece_tokenizer(path: Path) -> Path:
    """WordPiece; specials [EOS] 0, [UNK] 1, [PAD] 2 and no BOS, so decoding starts from pad (Marian's way)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=90, special_tokens=["[EOS]", "[UNK]", "[PAD]"],
                                        show_progress=False)
    tokenizer.train_from_iterator(lines(2), trainer)
    tokenizer.save(str(path))
    return path


def vocabularies(kind: str, work: Path) -> tuple[Vocabulary, Vocabulary]:
    if kind == "sentencepiece":
        shared = Vocabulary.from_sentencepiece(sentencepiece_model(work / "spm.model"))
        return shared, shared
    source = Vocabulary.from_hf_tokenizer(bpe_tokenizer(work / "source.json"), pad="<pad>", eos="</s>", bos="<s>",
                                          unk="<unk>")
    source = Vocabulary(**{**_fields(source), "prefix": (source.bos_id,)})  # BART frames <s> ... </s>
    target = Vocabulary.from_hf_tokenizer(wordpiece_tokenizer(work / "target.json"), pad="[PAD]", eos="[EOS]",
                                          unk="[UNK]", decoder_start_id=2)
    return source, target


def _fields(vocab: Vocabulary) -> dict:
    return {name: getattr(vocab, name) for name in ("tokens", "level", "pad_id", "bos_id", "eos_id", "unk_id",
                                                    "decoder_start_id", "suffix", "hidden", "tokenizer")}


@pytest.fixture(scope="module", params=["sentencepiece", "hf"])
def export(request, tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp(f"subword-{request.param}")
    src_vocab, tgt_vocab = vocabularies(request.param, work)
    plugin = get_plugin("transformer")
    torch.manual_seed(1)
    model = plugin.build(TINY, len(src_vocab), len(tgt_vocab)).eval()
    path = save_checkpoint(work / "m.safetensors", plugin, TINY, model, src_vocab, tgt_vocab)
    out = work / "export"
    export_model(plugin, model, TINY, src_vocab, tgt_vocab, out, checkpoint_path=path,
                 source=f"seeded random transformer, {request.param} tokenizers", samples=TEXTS)
    return out


def test_manifest_records_the_tokenizer_files(export: Path) -> None:
    manifest = load_manifest(export)
    raw = manifest.to_dict()
    for side, vocab in (("source", manifest.src_vocab), ("target", manifest.tgt_vocab)):
        entry = raw["vocab"][side]["tokenizer"]
        assert raw["vocab"][side]["level"] in ("sentencepiece", "hf")
        assert (export / entry["file"]).is_file() and entry["sha256"] == vocab.tokenizer.sha256
    loaded = load_checkpoint(export / "checkpoint.safetensors")
    assert (loaded.src_vocab, loaded.tgt_vocab) == (manifest.src_vocab, manifest.tgt_vocab)
    assert not any(name.startswith("s2s_deploy.") for name in loaded.tensors)


def test_vocabulary_round_trips_in_vocabulary_text(export: Path) -> None:
    manifest = load_manifest(export)
    src = manifest.src_vocab
    ids = src.encode("hello world")
    assert ids[: len(src.prefix)] == list(src.prefix) and ids[-1] == src.eos_id
    assert src.decode(src.encode("hello world", add_eos=False)) == "hello world"


@pytest.mark.parametrize("beam", [1, 4])
def test_text_equals_detokenised_ids(export: Path, beam: int) -> None:
    translator = Translator(export, device="cpu")
    manifest = translator.manifest
    results = translator(TEXTS, beam=beam, n_best=min(beam, 2), max_len=MAX_LEN)
    hyps = translator.translate_ids([manifest.src_vocab.encode(t) for t in TEXTS], beam=beam, n_best=min(beam, 2),
                                    max_len=MAX_LEN)
    for result, ids in zip(results, hyps, strict=True):
        assert [text for text, _ in result.hypotheses] == [manifest.tgt_vocab.decode(h.tokens) for h in ids]
        assert [score for _, score in result.hypotheses] == [h.score for h in ids]
    assert any(r.text for r in results), "a random model still emits tokens that detokenise to text"


def test_pytorch_and_onnxruntime_agree(export: Path) -> None:
    manifest = load_manifest(export)
    report = check_parity(manifest, torch_backend_for(manifest), OrtBackend(manifest, device="cpu"), TEXTS,
                          beam_size=4, max_len=MAX_LEN)
    assert report.passed, [s.mismatches[:2] for s in report.searches]


def test_translate_ids_command_matches_translator(export: Path, tmp_path: Path) -> None:
    manifest = load_manifest(export)
    rows = [manifest.src_vocab.encode(t) for t in TEXTS]
    want = Translator(export, device="cpu").translate_ids(rows, beam=2, max_len=MAX_LEN)
    given = tmp_path / "ids.txt"
    given.write_text("".join(" ".join(map(str, row)) + "\n" for row in rows), encoding="utf-8")
    args = ["translate", str(export), "--ids", "--beam", "2", "--max-len", str(MAX_LEN), "--device", "cpu"]
    result = CliRunner().invoke(main, [*args, "--input", str(given)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [" ".join(map(str, h[0].tokens)) for h in want]
    out = tmp_path / "out.txt"
    streamed = CliRunner().invoke(main, [*args, "--input", str(given), "--output", str(out), "--quiet"])
    assert streamed.exit_code == 0, streamed.output
    assert out.read_text(encoding="utf-8").splitlines() == result.stdout.splitlines()
    text = CliRunner().invoke(main, ["translate", str(export), *TEXTS, "--beam", "2", "--max-len", str(MAX_LEN),
                                     "--device", "cpu"])
    assert text.stdout.splitlines() == [manifest.tgt_vocab.decode(h[0].tokens) for h in want]


@pytest.mark.parametrize("line", ["1 2 x", "99999", "2 -1"])
def test_translate_ids_refuses_bad_ids(export: Path, line: str) -> None:
    result = CliRunner().invoke(main, ["translate", str(export), "--ids", line, "--device", "cpu"])
    assert result.exit_code != 0
    assert result.output.strip().count("\n") == 0 and "input 1" in result.output


def test_translates_without_torch(export: Path) -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "from s2s_deploy.runtime import Translator\n"
            f"for t in Translator({str(export)!r}, device='cpu')({TEXTS!r}, beam=2, max_len={MAX_LEN}):\n"
            "    print(repr(t.text))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    want = Translator(export, device="cpu")(TEXTS, beam=2, max_len=MAX_LEN)
    assert result.stdout.splitlines() == [repr(t.text) for t in want]


def test_python_example_matches_translate(export: Path) -> None:
    script = Path(__file__).resolve().parents[1] / "examples" / "python_runtime" / "translate.py"
    code = (f"import sys, runpy; sys.modules['torch'] = None; sys.argv = {[str(script), str(export), *TEXTS]!r}; "
            f"runpy.run_path({str(script)!r}, run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [t.text for t in Translator(export, device="cpu")(TEXTS)]


def test_a_modified_tokenizer_file_is_refused(export: Path, tmp_path: Path) -> None:
    """One changed byte of a tokenizer file is one line, from loading and from ``inspect --verify``."""
    copy = tmp_path / "copy"
    shutil.copytree(export, copy)
    manifest = load_manifest(copy)
    names = {vocab.tokenizer.name for vocab in (manifest.src_vocab, manifest.tgt_vocab)}
    assert names <= set(manifest.listed_files())
    for name in names:
        data = bytearray((copy / name).read_bytes())
        data[len(data) // 2] ^= 0x01
        (copy / name).write_bytes(bytes(data))
        with pytest.raises(ManifestError, match="sha256"):
            load_manifest(copy)
        result = CliRunner().invoke(main, ["inspect", "--verify", str(copy)])
        assert result.exit_code == 1 and f"{name} modified" in result.stderr.strip().splitlines()[-1]
        data[len(data) // 2] ^= 0x01
        (copy / name).write_bytes(bytes(data))


@pytest.mark.parametrize("name", ["../outside.model", "/etc/passwd", "link.model"])
def test_tokenizer_paths_must_stay_inside_the_folder(export: Path, tmp_path: Path, name: str) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(export, copy)
    raw = json.loads((copy / "manifest.json").read_text(encoding="utf-8"))
    entry = raw["vocab"]["source"]["tokenizer"]
    (tmp_path / "outside.model").write_bytes((copy / entry["file"]).read_bytes())
    (copy / "link.model").symlink_to(tmp_path / "outside.model")
    entry["file"] = name
    (copy / "manifest.json").write_text(json.dumps(raw), encoding="utf-8")
    result = CliRunner().invoke(main, ["translate", str(copy), "hello", "--device", "cpu"])
    assert result.exit_code != 0 and "outside the export folder" in result.output
    assert result.output.strip().count("\n") == 0


def test_an_hf_token_table_must_agree_with_the_tokenizer(tmp_path: Path) -> None:
    vocab = Vocabulary.from_hf_tokenizer(wordpiece_tokenizer(tmp_path / "t.json"), pad="[PAD]", eos="[EOS]",
                                         unk="[UNK]", decoder_start_id=2)
    swapped = (vocab.tokens[1], vocab.tokens[0], *vocab.tokens[2:])
    with pytest.raises(VocabularyError, match="disagree"):
        Vocabulary(**{**_fields(vocab), "tokens": swapped})


NODE_DIR = Path(__file__).resolve().parents[1] / "examples" / "node"


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
@pytest.mark.skipif(not (NODE_DIR / "node_modules" / "onnxruntime-node").is_dir(),
                    reason="run `npm install --ignore-scripts` in examples/node first (.ci/run does)")
def test_node_example_refuses_subword_levels(export: Path) -> None:
    result = subprocess.run(["node", "translate.js", str(export), "hello"], cwd=NODE_DIR, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0 and "needs its tokenizer library" in result.stderr


@pytest.mark.parametrize("beam", [1, 3])
def test_generate_onnx_matches_the_loop(export: Path, tmp_path: Path, beam: int) -> None:
    """The fused graph reads the start and EOS ids from the manifest: the hf target has EOS 0, start 2."""
    from s2s_deploy.transforms.fuse import add_to_manifest, fuse_generate

    folder = tmp_path / "fused"
    shutil.copytree(export, folder)
    add_to_manifest(load_manifest(folder), fuse_generate(load_manifest(folder), folder / "generate.onnx"), beam=True)
    want = Translator(folder, device="cpu")(TEXTS, beam=beam, max_len=MAX_LEN)
    got = Translator(folder, device="cpu", engine="graph")(TEXTS, beam=beam, max_len=MAX_LEN)
    assert [t.text for t in got] == [t.text for t in want]


def test_a_quantised_copy_keeps_its_tokenizer_files(export: Path, tmp_path: Path) -> None:
    from s2s_deploy.transforms.quantize import quantize_export

    report = quantize_export(load_manifest(export), "int8", tmp_path / "int8")
    quantised = load_manifest(report.directory)
    assert (quantised.src_vocab, quantised.tgt_vocab) == (load_manifest(export).src_vocab,
                                                          load_manifest(export).tgt_vocab)
    assert len(Translator(report.directory, device="cpu")(TEXTS, max_len=MAX_LEN)) == len(TEXTS)


def test_a_tokenizer_that_cannot_encode_is_one_line() -> None:
    """A WordLevel tokenizer.json whose unknown token is missing from its vocabulary fails on any
    unknown word: tokenizers raises a bare Exception, which must become one line naming the file."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from s2s_deploy.format.subword import HFTokenizer, TokenizerFile, TokenizerFileError

    tokenizer = Tokenizer(models.WordLevel({"a": 0, "b": 1}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    model = HFTokenizer(TokenizerFile("tokenizer.json", tokenizer.to_str().encode()))
    assert model.ids("a b") == [0, 1]
    with pytest.raises(TokenizerFileError, match=r"^tokenizer.json cannot encode 'a c': .*Missing"):
        model.ids("a c")
