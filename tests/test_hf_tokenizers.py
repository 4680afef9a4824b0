"""Every text family's slow tokenizer files as the export's vocabulary, against ``transformers``.

One row per family in ``FOLDERS``: the files its older Hub folders ship instead of a
``tokenizer.json`` (``spiece.model``, ``sentencepiece.bpe.model`` with or without ``vocab.json``,
``vocab.json`` with ``merges.txt``, ``prophetnet.tokenizer``), made here from tiny trained models
with no network, and a ``config.json``. The export reads the folder (``text_vocabularies``) and
must tokenise the built-in multilingual sample exactly as ``AutoTokenizer`` does, and detokenise
seeded random id streams as ``tokenizer.decode(ids, skip_special_tokens=True)`` does. The rows
that export and decode (``translate`` against ``decode(generate(...))``) are marked slow.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
sentencepiece = pytest.importorskip("sentencepiece")

from s2s_deploy.architecture.declaration import HFWeights  # noqa: E402
from s2s_deploy.export.hf import plugin_for, special_ids, text_vocabularies  # noqa: E402
from s2s_deploy.export.hf_tokenizer import load_auto_tokenizer  # noqa: E402
from s2s_deploy.export.tokenizer_parity import SAMPLE, check_tokenizer  # noqa: E402

CORPUS = (
    "the quick brown fox jumps over the lazy dog", "hello world, how are you today?", "it's a nice day",
    "café naïve résumé über Straße", "Привет мир как дела", "东京 北京 日本 中国", "مرحبا بالعالم",
    "नमस्ते दुनिया", "numbers 1,234.56 and 2024-03-15", "https://example.com/path?q=1",
) * 20


def spm(kind: str, size: int, **options: Any) -> bytes:
    """A tiny trained SentencePiece model (``character_coverage`` 1: every corpus character a piece)."""
    buffer = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS), model_writer=buffer, vocab_size=size,
                                             model_type=kind, character_coverage=1.0, hard_vocab_limit=False,
                                             minloglevel=2, **options)
    return buffer.getvalue()


T5_IDS = {"pad_id": 0, "eos_id": 1, "unk_id": 2, "bos_id": -1}  # t5-small's spiece.model layout


def t5_files(folder: Path) -> None:
    (folder / "spiece.model").write_bytes(spm("unigram", 120, **T5_IDS))


def pegasus_files(folder: Path) -> None:
    (folder / "spiece.model").write_bytes(spm("unigram", 120, **T5_IDS))


def fairseq_spm_files(folder: Path, **config: Any) -> None:
    """mBART/NLLB/XLM-R style: ``sentencepiece.bpe.model`` whose ids the tokenizer shifts by fairseq's offset."""
    (folder / "sentencepiece.bpe.model").write_bytes(spm("bpe", 120))
    if config:
        (folder / "tokenizer_config.json").write_text(json.dumps(config))


def m2m100_files(folder: Path) -> None:
    """M2M100: ``sentencepiece.bpe.model`` split into pieces, ``vocab.json`` maps them (fairseq's order)."""
    model = spm("bpe", 120)
    (folder / "sentencepiece.bpe.model").write_bytes(model)
    processor = sentencepiece.SentencePieceProcessor(model_proto=model)
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    table = ["<s>", "<pad>", "</s>", "<unk>", *sorted(p for p in pieces if p not in ("<s>", "</s>", "<unk>"))]
    (folder / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(table)}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "M2M100Tokenizer", "src_lang": "en",
                                                               "tgt_lang": "fr"}))


MUSTC = ("pt", "fr", "ru", "nl", "ro", "it", "es", "de")


def speech_to_text_files(folder: Path, **config: Any) -> None:
    """Speech2Text's target side: ``sentencepiece.bpe.model`` holding MuST-C's ``<lang:xx>`` pieces,
    ``vocab.json`` mapping pieces to ids, the target language named in ``tokenizer_config.json``
    (with ``config``'s settings: ``do_upper_case``, as LibriSpeech's folders set it)."""
    model = spm("unigram", 120, user_defined_symbols=[f"<lang:{code}>" for code in MUSTC])
    (folder / "sentencepiece.bpe.model").write_bytes(model)
    processor = sentencepiece.SentencePieceProcessor(model_proto=model)
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    table = ["<s>", "<pad>", "</s>", "<unk>", *(p for p in pieces if p not in ("<s>", "</s>", "<unk>"))]
    (folder / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(table)}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "Speech2TextTokenizer",
                                                               "lang_codes": "mustc", "tgt_lang": "fr", **config}))


def opus_mt(folder: Path) -> None:
    """opus-mt's ``source.spm``, ``target.spm`` and ``vocab.json`` (eos 0, unk 1, pad last)."""
    source, target = spm("unigram", 100), spm("unigram", 90)
    (folder / "source.spm").write_bytes(source)
    (folder / "target.spm").write_bytes(target)
    pieces: set[str] = set()
    for model in (source, target):
        processor = sentencepiece.SentencePieceProcessor(model_proto=model)
        pieces |= {processor.id_to_piece(i) for i in range(processor.get_piece_size())}
    table = ["</s>", "<unk>", *sorted(pieces - {"<unk>", "<s>", "</s>"}), "<pad>"]
    (folder / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(table)}))


def fsmt_files(folder: Path) -> None:
    """FSMT's ``vocab-src.json``, ``vocab-tgt.json`` (fewer tokens) and ``merges.txt``: subword-nmt BPE
    (``</w>`` ends a word) over Moses-tokenised text, and ``tokenizer_config.json``'s ``langs``."""
    import sacremoses
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    moses = sacremoses.MosesTokenizer(lang="en")
    lines = [" ".join(moses.tokenize(line, escape=True)) for line in CORPUS]
    tokenizer = Tokenizer(models.BPE(end_of_word_suffix="</w>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=220, end_of_word_suffix="</w>",
                                                             show_progress=False))
    tokenizer.model.save(str(folder))
    learned = sorted(json.loads((folder / "vocab.json").read_text()), key=len)
    (folder / "vocab.json").unlink()
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    (folder / "vocab-src.json").write_text(json.dumps({t: i for i, t in enumerate(specials + learned)}))
    (folder / "vocab-tgt.json").write_text(json.dumps({t: i for i, t in enumerate(specials + learned[:-30])}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "FSMTTokenizer", "langs": ["en", "de"],
                                                               "do_lower_case": False}))


def byte_bpe_files(folder: Path) -> None:
    """GPT-2's byte-level BPE (BART, LED, Blenderbot): ``vocab.json`` and ``merges.txt``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=330, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.model.save(str(folder))
    vocab = json.loads((folder / "vocab.json").read_text())
    vocab["<mask>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))


def wordpiece_files(folder: Path) -> None:
    """ProphetNet's ``prophetnet.tokenizer``: BERT's ``vocab.txt``, one token a line. Made from the
    corpus without a trainer (``tokenizers``' WordPiece trainer breaks ties in another order each run):
    the specials, every lower-cased character alone and as a continuation, then the corpus's most
    frequent lower-cased words, ties in alphabetical order."""
    import collections
    import unicodedata

    specials = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]", "[X_SEP]"]
    text = " ".join(CORPUS).lower()
    chars = sorted({c for c in text if not c.isspace() and unicodedata.category(c)[0] != "M"})
    words = collections.Counter(w for w in text.split() if w.isalpha() and len(w) > 1)
    common = [w for w, _ in sorted(words.items(), key=lambda item: (-item[1], item[0]))][:60]
    table = [*specials, *chars, *(f"##{c}" for c in chars), *common]
    (folder / "prophetnet.tokenizer").write_text("".join(f"{token}\n" for token in dict.fromkeys(table)),
                                                 encoding="utf-8")


@dataclass(frozen=True)
class Folder:
    """A family's slow files: ``model_type``, how to write them, the config's special ids and its vocabulary size."""

    model_type: str
    files: Callable[[Path], None]
    ids: dict[str, int]
    size: int
    level: str = "hf"
    target_size: int | None = None  # a separate target vocabulary's (FSMT)
    variant: str = ""

    def write(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        self.files(folder)
        sizes = {"vocab_size": self.size} if self.target_size is None else {
            "src_vocab_size": self.size, "tgt_vocab_size": self.target_size, "langs": ["en", "de"]}
        config = {"model_type": self.model_type, **sizes, **{f"{k}_token_id": v for k, v in self.ids.items()}}
        (folder / "config.json").write_text(json.dumps(config))
        return folder


BART_IDS = {"bos": 0, "pad": 1, "eos": 2, "decoder_start": 2}
T5_CONFIG_IDS = {"pad": 0, "eos": 1, "decoder_start": 0}
FOLDERS: tuple[Folder, ...] = (
    Folder("t5", t5_files, T5_CONFIG_IDS, 256),
    Folder("mt5", t5_files, T5_CONFIG_IDS, 256),
    # transformers' clean_up_tokenization after decoding (" ." -> ".", " n't" -> "n't", ...), as many T5
    # folders' tokenizer_config.json turn it on: written into the converted tokenizer's decoder
    Folder("t5", lambda f: (t5_files(f), (f / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "T5Tokenizer", "clean_up_tokenization_spaces": True}))), T5_CONFIG_IDS, 256,
        variant="cleanup"),
    Folder("umt5", lambda f: (t5_files(f), (f / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "T5Tokenizer"}))), T5_CONFIG_IDS, 256),
    Folder("longt5", lambda f: (t5_files(f), (f / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "T5Tokenizer"}))), T5_CONFIG_IDS, 256),
    Folder("pegasus", pegasus_files, T5_CONFIG_IDS, 256),
    Folder("pegasus_x", lambda f: (pegasus_files(f), (f / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PegasusTokenizer"}))), T5_CONFIG_IDS, 256),
    Folder("mbart", lambda f: fairseq_spm_files(f, tokenizer_class="MBartTokenizer", src_lang="en_XX"),
           BART_IDS, 256),
    Folder("m2m_100", lambda f: fairseq_spm_files(f, tokenizer_class="NllbTokenizer", src_lang="fra_Latn"),
           BART_IDS, 400),
    Folder("m2m_100", m2m100_files, BART_IDS, 256, level="sentencepiece"),
    Folder("speech_to_text", speech_to_text_files, {"bos": 0, "pad": 1, "eos": 2, "decoder_start": 2}, 256,
           level="sentencepiece"),
    Folder("speech_to_text", lambda f: speech_to_text_files(f, do_upper_case=True, do_lower_case=True),
           {"bos": 0, "pad": 1, "eos": 2, "decoder_start": 2}, 256, level="sentencepiece", variant="cased"),
    Folder("marian", opus_mt, {"pad": 255, "eos": 0, "decoder_start": 255}, 256, level="sentencepiece"),
    Folder("bart", byte_bpe_files, BART_IDS, 360),
    Folder("led", byte_bpe_files, BART_IDS, 360),
    Folder("blenderbot", byte_bpe_files, {"bos": 0, "pad": 1, "eos": 2, "decoder_start": 0}, 360),
    Folder("fsmt", fsmt_files, BART_IDS, 256, level="moses", target_size=230),
    Folder("prophetnet", wordpiece_files, {"pad": 0, "bos": 2, "eos": 2, "decoder_start": 2}, 256),
)


def _row_id(folder: Folder) -> str:
    return "-".join(part for part in (folder.model_type, folder.level != "hf" and folder.level, folder.variant) if part)


def vocabularies(folder: Folder, path: Path) -> tuple[Any, Any]:
    config = json.loads((path / "config.json").read_text())
    weights = HFWeights(None, {}, folder.size, folder.target_size or folder.size)
    return text_vocabularies(plugin_for(config), path, weights, special_ids(config, {}))


@pytest.mark.parametrize("folder", FOLDERS, ids=_row_id)
def test_slow_files_tokenise_as_transformers(folder: Folder, tmp_path: Path) -> None:
    path = folder.write(tmp_path / "hf")
    assert not (path / "tokenizer.json").exists()
    source, target = vocabularies(folder, path)
    assert source.level == folder.level and target.level == folder.level
    tokenizer = load_auto_tokenizer(path)
    report = check_tokenizer(tokenizer, source, target, SAMPLE, [])
    assert report.encoded == len(SAMPLE) and report.decoded > 0
    assert report.passed, "\n".join(m.line() for m in report.mismatches)


def test_language_tokens_come_from_the_slow_tokenizer(tmp_path: Path) -> None:
    """M2M100's ``__xx__`` tokens follow ``vocab.json`` only in its tokenizer: the export names them
    (so ``target_lang`` finds them), frames a source as ``__en__ ... </s>``, and decodes them as
    transformers does (5.24 keeps them in the text: they are not among its special tokens)."""
    folder = next(f for f in FOLDERS if f.level == "sentencepiece" and f.model_type == "m2m_100")
    path = folder.write(tmp_path / "hf")
    source, target = vocabularies(folder, path)
    tokenizer = load_auto_tokenizer(path)
    french = tokenizer.convert_tokens_to_ids("__fr__")
    assert source.prefix == (tokenizer.convert_tokens_to_ids("__en__"),) and source.suffix == (tokenizer.eos_token_id,)
    assert target.tokens[french] == "__fr__"
    assert target.decode([french, 10, 11]) == tokenizer.decode([french, 10, 11], skip_special_tokens=True)


def test_speech_to_text_cases_text_as_its_tokenizer(tmp_path: Path) -> None:
    """Speech2Text's ``do_upper_case`` upper-cases what ``decode`` writes (Python's ``str.upper``:
    ``ß`` becomes ``SS``): the target vocabulary's ``upper_case``, written to the manifest. Its
    ``do_lower_case`` changes nothing transformers 5 tokenises (4.x lower-cased the text; 5 lower-cases
    only tokens added later), so the export lower-cases nothing either: "Hello" keeps its ``H``."""
    folder = next(f for f in FOLDERS if f.variant == "cased")
    path = folder.write(tmp_path / "hf")
    source, target = vocabularies(folder, path)
    tokenizer = load_auto_tokenizer(path)
    assert tokenizer.do_upper_case and tokenizer.do_lower_case
    assert target.upper_case and target.to_dict()["upper_case"] is True and not source.upper_case
    text = "Hello straße"
    assert source.encode(text) == tokenizer(text)["input_ids"] != tokenizer(text.lower())["input_ids"]
    ids = tokenizer("hello straße", add_special_tokens=False)["input_ids"]
    assert target.decode(ids) == tokenizer.decode(ids, skip_special_tokens=True) == "HELLO STRASSE"


def test_a_broken_tokenizer_fails_with_the_text_and_both_id_sequences(tmp_path: Path) -> None:
    """A ``tokenizer.json`` whose normaliser was removed (T5's strips and folds nothing then)
    tokenises the sample otherwise: the report names the first differing text and both ids."""
    from s2s_deploy.format.subword import HF, TokenizerFile
    from s2s_deploy.format.vocab import Vocabulary

    folder = FOLDERS[0]
    path = folder.write(tmp_path / "hf")
    source, target = vocabularies(folder, path)
    data = json.loads(source.tokenizer.data)
    assert data["normalizer"] is not None
    data["normalizer"] = None
    broken = TokenizerFile("tokenizer.json", json.dumps(data).encode())
    fields = {k: getattr(source, k) for k in ("pad_id", "bos_id", "eos_id", "unk_id", "decoder_start_id", "prefix",
                                               "suffix")}
    source = Vocabulary(source.tokens, HF, tokenizer=broken, **fields)
    tokenizer = load_auto_tokenizer(path)
    report = check_tokenizer(tokenizer, source, target, SAMPLE, [])
    assert not report.passed
    first = report.mismatches[0]
    assert first.what == "source ids" and first.text in SAMPLE
    assert first.ours == source.encode(first.text) and first.theirs == tokenizer(first.text)["input_ids"]
    assert first.ours != first.theirs and repr(first.text) in first.line()


# Export and decode: a tiny random model of the row's family over its slow files alone.
END_TO_END = {  # row (model_type, level) -> transformers class and what its config sets
    ("t5", "hf"): ("T5ForConditionalGeneration", "T5Config", {}),
    ("mbart", "hf"): ("MBartForConditionalGeneration", "MBartConfig", {"forced_eos_token_id": 2}),
    ("m2m_100", "sentencepiece"): ("M2M100ForConditionalGeneration", "M2M100Config", {}),
    ("bart", "hf"): ("BartForConditionalGeneration", "BartConfig", {"forced_eos_token_id": 2}),
    ("prophetnet", "hf"): ("ProphetNetForConditionalGeneration", "ProphetNetConfig", {}),
    ("pegasus", "hf"): ("PegasusForConditionalGeneration", "PegasusConfig", {}),
    # FSMT's own max_length (200) is the export's: its per-step log-probs are compared with transformers'
    # cached steps (plugins/fsmt.py's hf_step_cache says why), the tokenizer is the moses level
    ("fsmt", "moses"): ("FSMTForConditionalGeneration", "FSMTConfig", {"langs": ["en", "de"],
                                                                     "forced_eos_token_id": 2}),
}
TRANSLATED = 20
EOS_STRENGTH = {("mbart", "hf"): 0.5}  # at 0.8 mBART's first token is EOS for every sample text
MAX_NEW = 20


def _model(folder: Folder) -> Any:
    from test_hf_families import _bart_sizes, _t5_sizes, favour_eos

    model_class, config_class, extra = END_TO_END[(folder.model_type, folder.level)]
    ids = {f"{k}_token_id": v for k, v in folder.ids.items()}
    if config_class.startswith("T5"):
        sizes = {**_t5_sizes(), "vocab_size": folder.size, "initializer_factor": 1.0}
    elif config_class.startswith("FSMT"):  # two vocabularies, of the row's two sizes
        sizes = {**_bart_sizes(), "src_vocab_size": folder.size, "tgt_vocab_size": folder.target_size,
                 "max_position_embeddings": 256}
    elif config_class.startswith("ProphetNet"):
        sizes = {"vocab_size": folder.size, "hidden_size": 64, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128,
                 "num_encoder_layers": 2, "num_decoder_layers": 2, "num_encoder_attention_heads": 4,
                 "num_decoder_attention_heads": 4, "max_position_embeddings": 256, "ngram": 2, "num_buckets": 8,
                 "relative_max_distance": 20, "init_std": 0.3}
    else:
        sizes = {**_bart_sizes(), "vocab_size": folder.size, "max_position_embeddings": 256}
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**(sizes | ids | extra))).eval()
    favour_eos(model, EOS_STRENGTH.get((folder.model_type, folder.level), 0.8))  # some end early, most run on
    return model


def generate_only_text(model: Any, path: Path, size: int, target_size: int | None = None) -> None:
    """A random model picks any id; a trained one never picks the rows its tokenizer does not name
    (T5's spare rows, M2M100's made-up words, decoded by transformers as ``<unk>`` or nothing) and
    seldom a special token. ``generation_config.json`` suppresses both (EOS aside), as the export
    and ``generate`` read it, so the decoded texts are texts. ``target_size``: a separate target
    vocabulary's (FSMT's), whose names are what the tokenizer decodes each id to."""
    from s2s_deploy.export.hf_tokenizer import read_slow_tokenizer

    slow = read_slow_tokenizer(path, size)
    named = set(slow.vocab.values())
    if target_size is not None:
        tokenizer = load_auto_tokenizer(path)
        named = {i for i in range(target_size) if tokenizer.convert_ids_to_tokens(i) != tokenizer.unk_token}
        size = target_size
    spare = {i for i in range(size) if i not in named}
    model.generation_config.suppress_tokens = sorted(spare | (set(slow.special) - {model.config.eos_token_id}))


@pytest.mark.slow
@pytest.mark.parametrize("key", list(END_TO_END), ids=lambda key: "-".join(key))
def test_export_from_slow_files_translates_as_generate_and_decode(key: tuple[str, str], tmp_path: Path) -> None:
    """``export --hf`` over the slow files alone, then ``parity --reference`` (tokens against
    ``generate``, and the tokenizer on the multilingual sample, ``generate``'s outputs and random
    ids) passes, and ``Translator(texts)`` equals ``tokenizer.decode(generate(**tokenizer(text)))``
    on 20 inputs; for M2M100 also with ``target_lang`` against ``generate(forced_bos_token_id=...)``."""
    from click.testing import CliRunner

    from s2s_deploy.cli import main
    from s2s_deploy.runtime.translator import Translator

    folder = next(f for f in FOLDERS if (f.model_type, f.level) == key)
    hf_dir, out = tmp_path / "hf", tmp_path / "out"
    folder.write(hf_dir)
    model = _model(folder)
    tokenizer = load_auto_tokenizer(hf_dir)
    generate_only_text(model, hf_dir, folder.size, folder.target_size)
    if folder.model_type == "m2m_100":  # the target language is the forced first token
        model.generation_config.forced_bos_token_id = tokenizer.convert_tokens_to_ids("__fr__")
    model.save_pretrained(hf_dir)
    assert not (hf_dir / "tokenizer.json").exists()
    runner = CliRunner()
    result = runner.invoke(main, ["export", "--hf", str(hf_dir), "--out", str(out)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["parity", str(out), "--reference", str(hf_dir)])
    assert result.exit_code == 0 and "tokenizer vs transformers: source ids identical" in result.output, result.output
    if folder.model_type == "t5":  # --input: the user's own lines are what is tokenised
        lines = tmp_path / "mine.txt"
        lines.write_text("Grüße aus Köln!\nnaïve 😀 text\n", encoding="utf-8")
        result = runner.invoke(main, ["parity", str(out), "--reference", str(hf_dir), "--input", str(lines)])
        assert result.exit_code == 0 and "source ids identical 2/2" in result.output, result.output
    texts = [t for t in SAMPLE if t.strip()][:TRANSLATED]
    assert len(texts) == TRANSLATED
    translator = Translator(out, device="cpu")
    for options in ({}, {"target_lang": "de"}) if folder.model_type == "m2m_100" else ({},):
        settings = {"forced_bos_token_id": tokenizer.convert_tokens_to_ids("__de__")} if options else {}
        ours = [t.text for t in translator(texts, beam=1, max_len=MAX_NEW, **options)]
        theirs = []
        for text in texts:  # one at a time: no padding in the reference
            inputs = tokenizer(text, return_tensors="pt")
            with torch.no_grad():
                ids = model.generate(**inputs, num_beams=1, max_new_tokens=MAX_NEW, **settings)
            theirs.append(tokenizer.decode(ids[0], skip_special_tokens=True))
        assert ours == theirs
        assert len(set(theirs)) >= 3 and sum(bool(t.strip()) for t in theirs) >= TRANSLATED // 2
    if folder.level == "moses":  # the client written from docs/manifest.md alone, on a real moses export
        import subprocess
        import sys

        client = Path(__file__).resolve().parents[1] / "examples" / "python" / "manifest_client.py"
        cli = subprocess.run([sys.executable, "-m", "s2s_deploy", "translate", str(out), *texts, "--quiet", "--threads",
                              "1", "--beam", "1"], capture_output=True, text=True, timeout=600)
        docs = subprocess.run([sys.executable, str(client), str(out), *texts, "--threads", "1", "--beam", "1"],
                              capture_output=True, text=True, timeout=600)
        assert cli.returncode == 0 and docs.returncode == 0, cli.stderr + docs.stderr
        assert docs.stdout.splitlines() == cli.stdout.splitlines() and len(cli.stdout.splitlines()) == TRANSLATED


@pytest.mark.parametrize("n", [1, 2, 3])
def test_encoder_no_repeat_ngram_size_bans_what_transformers_bans(n: int) -> None:
    """``StepOptions`` against transformers' ``EncoderNoRepeatNGramLogitsProcessor`` over beam
    rows of two sentences, step by step: the same ids are impossible (``generate``'s
    ``input_ids`` start with the decoder start, which the search feeds at step 0)."""
    import numpy as np
    from transformers.generation.logits_process import EncoderNoRepeatNGramLogitsProcessor

    from s2s_deploy.runtime.decoding import SearchConfig
    from s2s_deploy.runtime.options import StepOptions

    rng = np.random.default_rng(n)
    vocab, beams, start = 12, 3, 2
    src = np.array([[4, 5, 6, 4, 5, 7, 3], [8, 9, 8, 9, 10, 3, 0]])
    src_len = np.array([7, 6])
    options = StepOptions(SearchConfig(beam_size=beams, max_len=10, encoder_no_repeat_ngram_size=n), src, src_len,
                          eos_id=3, vocab_size=vocab, unk_id=None)
    theirs = EncoderNoRepeatNGramLogitsProcessor(n, torch.from_numpy(src[:, :6]))  # no padding in either row
    theirs.generated_ngrams[0] = EncoderNoRepeatNGramLogitsProcessor(n, torch.from_numpy(src[:1])).generated_ngrams[0]
    rows = len(src) * beams
    history = np.full((rows, 1), start)
    tokens, reorder = np.full(rows, start), np.arange(rows)
    banned_somewhere = False
    for _ in range(6):
        out = options.process(np.zeros((rows, vocab), dtype=np.float32), tokens, reorder)
        want = theirs(torch.from_numpy(history), torch.zeros(rows, vocab)).numpy()
        assert np.array_equal(np.isinf(out), np.isinf(want))
        banned_somewhere |= bool(np.isinf(out).any())
        # the next step: each row continues a random row of its own sentence with a source id or another
        reorder = np.array([r // beams * beams + rng.integers(beams) for r in range(rows)])
        tokens = np.array([rng.choice(src[r // beams][:4]) if rng.random() < 0.7 else rng.integers(vocab)
                           for r in range(rows)])
        history = np.concatenate([history[reorder], tokens[:, None]], axis=1)
    assert banned_somewhere


def test_a_tokenizer_json_gets_the_cleanup_its_config_turns_on(tmp_path: Path) -> None:
    """A folder with a ``tokenizer.json`` (no conversion) whose ``tokenizer_config.json`` turns
    ``clean_up_tokenization_spaces`` on: the export's decoding does what ``decode`` does after the
    tokenizer, and the cleanup changes some text (it is not a no-op on these streams)."""
    folder = FOLDERS[0]
    path = folder.write(tmp_path / "hf")
    tokenizer = load_auto_tokenizer(path)
    tokenizer.backend_tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "T5Tokenizer",
                                                           "clean_up_tokenization_spaces": True}))
    source, target = vocabularies(folder, path)
    assert json.loads(target.tokenizer.data)["decoder"]["type"] == "Sequence"
    cleaning = load_auto_tokenizer(path)
    report = check_tokenizer(cleaning, source, target, SAMPLE, [])
    assert report.passed, "\n".join(m.line() for m in report.mismatches)
    ids = tokenizer("Hello , world . Isn 't it ?", add_special_tokens=False)["input_ids"]
    assert target.decode(ids) == cleaning.decode(ids, skip_special_tokens=True) != tokenizer.decode(ids)


def blenderbot_small_files(folder: Path) -> None:
    """BlenderbotSmall's ``vocab.json`` and ``merges.txt``: its own BPE, a word's inner pieces ending ``@@``."""
    (folder / "vocab.json").write_text(json.dumps({"__null__": 0, "__start__": 1, "__end__": 2, "__unk__": 3,
                                                   "h@@": 4, "e@@": 5, "he@@": 6, "llo": 7, "l@@": 8, "o": 9}))
    (folder / "merges.txt").write_text("#version: 0.2\nh e\nl l\nll o</w>\n")


@pytest.mark.parametrize("model_type", ["blenderbot-small", "xlm-prophetnet"])
def test_a_family_no_level_holds_exports_ids_only_and_says_why(model_type: str, tmp_path: Path) -> None:
    """BlenderbotSmall's ``@@`` BPE (transformers has no converter for it) and XLM-ProphetNet's
    SentencePiece (whose tokenizer transformers 5 no longer ships) are ids only, by the plugin's
    ``hf_ids_only``; the export's one ``exporting ... from`` line names why (docs/families.md has the detail)."""
    from s2s_deploy.export.sources import load_source

    path = tmp_path / "hf"
    path.mkdir()
    torch.manual_seed(0)
    if model_type == "blenderbot-small":
        config = transformers.BlenderbotSmallConfig(vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1,
                                                    encoder_attention_heads=2, decoder_attention_heads=2,
                                                    encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32)
        transformers.BlenderbotSmallForConditionalGeneration(config).save_pretrained(path)
        blenderbot_small_files(path)
        tokenizer = load_auto_tokenizer(path)
        assert tokenizer is not None and tokenizer.tokenize("hello") == ["he@@", "llo"]  # what it would read
        reason = "no converter for its '@@' BPE"
    else:
        config = transformers.ProphetNetConfig(vocab_size=64, hidden_size=16, encoder_ffn_dim=32, decoder_ffn_dim=32,
                                               num_encoder_layers=1, num_decoder_layers=1,
                                               num_encoder_attention_heads=2, num_decoder_attention_heads=2,
                                               max_position_embeddings=32, ngram=2, pad_token_id=0)
        transformers.ProphetNetForConditionalGeneration(config).save_pretrained(path)
        saved = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps(saved | {"model_type": "xlm-prophetnet"}))
        (path / "sentencepiece.bpe.model").write_bytes(spm("bpe", 120))
        assert not hasattr(transformers, "XLMProphetNetTokenizer")
        reason = "no XLMProphetNetTokenizer"
    plugin = plugin_for(json.loads((path / "config.json").read_text()))
    source = load_source(plugin, path, workdir=tmp_path)
    assert source.src_vocab.tokenizer is None and source.tgt_vocab.tokenizer is None
    assert f"({model_type}; ids only: " in source.description and reason in source.description
    assert "\n" not in source.description


def test_a_tokenizer_that_raises_is_named_in_the_one_line(tmp_path: Path) -> None:
    """A ProphetNet folder whose ``prophetnet.tokenizer`` is not UTF-8: transformers raises reading
    it, the export falls back to ids only, and its one ``exporting ... from`` line says why (the
    exception's type and message, no traceback)."""
    from s2s_deploy.export.sources import load_source

    path = tmp_path / "hf"
    config = transformers.ProphetNetConfig(vocab_size=64, hidden_size=16, encoder_ffn_dim=32, decoder_ffn_dim=32,
                                           num_encoder_layers=1, num_decoder_layers=1, num_encoder_attention_heads=2,
                                           num_decoder_attention_heads=2, max_position_embeddings=32, ngram=2,
                                           pad_token_id=0)
    torch.manual_seed(0)
    transformers.ProphetNetForConditionalGeneration(config).save_pretrained(path)
    (path / "prophetnet.tokenizer").write_bytes(b"\xff[PAD]\n[UNK]\n")
    with pytest.raises(UnicodeDecodeError) as raised:  # what transformers itself says of the folder
        transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    reason = f"UnicodeDecodeError: {raised.value}"
    source = load_source(plugin_for(json.loads((path / "config.json").read_text())), path, workdir=tmp_path)
    assert source.src_vocab.tokenizer is None and source.tgt_vocab.tokenizer is None
    assert f"(prophetnet; ids only: transformers read no tokenizer from it ({reason}))" in source.description
    assert "\n" not in source.description and "Traceback" not in source.description
    failures: list[str] = []
    assert load_auto_tokenizer(path, failures) is None and failures == [reason]  # parity's skip says it too


def test_a_converter_that_raises_is_named(tmp_path: Path) -> None:
    """The converter's failure (where ProphetNet's read as ids only in two runs of the suite) is
    said, not swallowed: the tokenizer's framing and vocabulary stand, its ``tokenizer.json`` is none."""
    from s2s_deploy.export.hf_tokenizer import read_slow_tokenizer

    folder = next(f for f in FOLDERS if f.model_type == "prophetnet")
    path = folder.write(tmp_path / "hf")
    failures: list[str] = []
    slow = read_slow_tokenizer(path, folder.size, "NoSuchConverter", failures)
    assert slow is not None and slow.tokenizer_json is None and slow.vocab
    assert failures == ["NoSuchConverter could not convert ProphetNetTokenizer: AttributeError: module "
                        "'transformers.convert_slow_tokenizer' has no attribute 'NoSuchConverter'"]


def test_the_converters_are_read_whatever_transformers_package_attribute_holds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers exports a function named as its ``convert_slow_tokenizer`` module: once its
    ``processing_utils`` re-runs the package's ``__init__`` (``direct_transformers_import``, on the
    first model class imported) after the module was imported, the new lazy package lacks the module
    attribute and ``from transformers import convert_slow_tokenizer`` gives the function. The export
    imports the module by its full name, so ProphetNet's converter is found in that state too."""
    import sys

    from s2s_deploy.export.hf_tokenizer import read_slow_tokenizer

    package = vars(sys.modules["transformers"])
    monkeypatch.setitem(package, "convert_slow_tokenizer", None)  # undone last: the attribute as it was
    monkeypatch.delitem(package, "convert_slow_tokenizer")  # the state direct_transformers_import leaves
    from transformers import convert_slow_tokenizer

    assert callable(convert_slow_tokenizer) and not hasattr(convert_slow_tokenizer, "BertConverter")
    folder = next(f for f in FOLDERS if f.model_type == "prophetnet")
    path = folder.write(tmp_path / "hf")
    failures: list[str] = []
    slow = read_slow_tokenizer(path, folder.size, "BertConverter", failures)
    assert slow is not None and slow.tokenizer_json is not None and failures == []
