"""Every Hugging Face family against ``transformers``' own ``generate``, at the folder's own settings.

One row per family in ``FAMILIES`` (as CTranslate2's converter table): its ``model_type``, a
config builder (2+2 layers, d_model 64), the ``transformers`` model class, and the tokenizer
files the family ships, made here with no network. Each row builds a tiny random model, saves
it with ``save_pretrained``, exports it once per session with ``export --hf``, and translates
20 inputs greedy and beam 4 (``max_new_tokens`` 20), which must be token-identical to
``model.generate`` on the folder as saved: whatever ``generation_config.json`` says or leaves
to ``generate``'s defaults (α, early stopping, forced BOS/EOS, ...), the export must reproduce.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

VOCAB = 128
D_MODEL = 64
MAX_NEW = 20
INPUTS = 20
SEED = 0


def word_level(words: list[str], single: str, special: tuple[str, ...]) -> Callable[[Path], None]:
    """A ``tokenizer.json`` with one id per whitespace-separated word, framing a sentence as
    ``single`` (a tokenizers template: ``"<s> $A </s>"``, ``"$A </s>"``, ...), its words other than
    ``w<id>`` and the unknown token registered as special tokens (as a real tokenizer's are), and a
    ``tokenizer_config.json`` naming transformers' generic class, so that ``AutoTokenizer``
    (``parity --reference``'s tokenizer check) reads this file as it is rather than as the family's own
    BPE or SentencePiece class."""

    def write(folder: Path) -> None:
        write_word_level(folder, words, single, special)

    return write


def write_word_level(folder: Path, words: list[str], single: str, special: tuple[str, ...],
                     unk: str = "<unk>") -> None:
    """``word_level``'s files, for the speech and vision harnesses too."""
    import re

    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, processors

    table = {w: i for i, w in enumerate(words)}
    tokenizer = Tokenizer(models.WordLevel(table, unk_token=unk))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(
        single=single, special_tokens=[(s, table[s]) for s in special])
    # the unknown token stays ordinary unless it frames a sentence too (Whisper's <|endoftext|>): the
    # export prints it, as transformers then does, and the sample texts keep it (their ids are unchanged)
    tokenizer.add_special_tokens([AddedToken(w, special=True, normalized=False) for w in words
                                  if not re.fullmatch(r"w\d+", w) and (w != unk or w in special)])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "TokenizersBackend"}))


def words_around(specials: dict[int, str], size: int = VOCAB) -> list[str]:
    """``size`` tokens: the specials at their ids, ``w<id>`` everywhere else."""
    return [specials.get(i, f"w{i}") for i in range(size)]


OPUS_WORDS = ("alpha", "beta", "gamma", "delta", "march", "april", "one", "two", "three", "hello", "world",
              "in", "on", "under", "river", "stone", "light", "green")


def opus_mt_files(folder: Path) -> None:
    """opus-mt's ``source.spm``, ``target.spm`` and ``vocab.json`` (eos 0, unk 1, pad last)."""
    import sentencepiece

    rng = np.random.default_rng(SEED)
    corpus = [" ".join(rng.choice(OPUS_WORDS, rng.integers(2, 8))) for _ in range(400)]
    pieces: set[str] = set()
    for name, size in (("source.spm", 36), ("target.spm", 40)):
        buffer = io.BytesIO()
        # the target side never saw "in": its id is a piece only source.spm holds, as in real opus-mt
        lines = corpus if name == "source.spm" else [" ".join(w for w in line.split() if w != "in") for line in corpus]
        sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buffer,
                                                 vocab_size=size, minloglevel=2)
        (folder / name).write_bytes(buffer.getvalue())
        processor = sentencepiece.SentencePieceProcessor(model_proto=buffer.getvalue())
        pieces |= {processor.id_to_piece(i) for i in range(processor.get_piece_size())}
    vocab = ["</s>", "<unk>", *sorted(pieces - {"<unk>", "<s>", "</s>"})]
    vocab += [f"x{i}" for i in range(len(vocab), VOCAB - 1)] + ["<pad>"]
    (folder / "vocab.json").write_text(json.dumps({piece: i for i, piece in enumerate(vocab)}))


def _marian() -> Any:
    return transformers.MarianConfig(
        vocab_size=VOCAB, decoder_vocab_size=VOCAB, pad_token_id=VOCAB - 1, eos_token_id=0,
        decoder_start_token_id=VOCAB - 1, bos_token_id=None, forced_eos_token_id=0,
        share_encoder_decoder_embeddings=True, **_bart_sizes())


def _bart() -> Any:
    return transformers.BartConfig(vocab_size=VOCAB, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                   decoder_start_token_id=2, forced_eos_token_id=2, **_bart_sizes())


def _mbart() -> Any:
    return transformers.MBartConfig(vocab_size=VOCAB, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                    decoder_start_token_id=2, forced_eos_token_id=2, scale_embedding=True,
                                    **_bart_sizes())


def _bart_sizes() -> dict[str, Any]:
    # init_std 0.3: peaked, tie-free choices (the default 0.02 gives near-uniform logits, where
    # float32 rounding picks between equals)
    return {"d_model": D_MODEL, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
            "decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128,
            "max_position_embeddings": 64, "init_std": 0.3}


def _t5() -> Any:
    return transformers.T5Config(vocab_size=VOCAB, d_model=D_MODEL, d_kv=16, d_ff=128, num_layers=2,
                                 num_decoder_layers=2, num_heads=4, relative_attention_num_buckets=8,
                                 relative_attention_max_distance=20, pad_token_id=0, eos_token_id=1,
                                 decoder_start_token_id=0, initializer_factor=2.0)


def _t5_sizes() -> dict[str, Any]:
    return {"vocab_size": VOCAB, "d_model": D_MODEL, "d_kv": 16, "d_ff": 128, "num_layers": 2, "num_decoder_layers": 2,
            "num_heads": 4, "relative_attention_num_buckets": 8, "relative_attention_max_distance": 20,
            "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0, "initializer_factor": 2.0}


NLLB_SOURCE, NLLB_TARGET = VOCAB - 2, VOCAB - 1  # eng_Latn, fra_Latn: NLLB's language tokens end the vocabulary


def _m2m100() -> Any:
    """NLLB's layout: the target language is the forced first token (``Family.generation``)."""
    return transformers.M2M100Config(vocab_size=VOCAB, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                     decoder_start_token_id=2, scale_embedding=True, **_bart_sizes())


def _pegasus() -> Any:
    return transformers.PegasusConfig(vocab_size=VOCAB, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                                      forced_eos_token_id=1, scale_embedding=True, **_bart_sizes())


def _pegasus_x(stagger: bool = True) -> Any:
    # blocks of 4 (staggered by 2 on the second layer) and 4 global tokens
    return transformers.PegasusXConfig(vocab_size=VOCAB, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                                       forced_eos_token_id=1, block_size=4, num_global_tokens=4,
                                       stagger_local_blocks=stagger, **_bart_sizes())


def _blenderbot() -> Any:
    # Blenderbot's default encoder_no_repeat_ngram_size=3 (facebook/blenderbot-400M-distill's too),
    # reproduced by the search
    return transformers.BlenderbotConfig(vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                         decoder_start_token_id=1, forced_eos_token_id=2, **_bart_sizes())


def _blenderbot_small() -> Any:
    return transformers.BlenderbotSmallConfig(vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                              decoder_start_token_id=1, forced_eos_token_id=2, **_bart_sizes())


def _led() -> Any:
    """Windows of 4 and 8 (2 and 4 tokens either side): the 4 to 13 source ids span up to 4 blocks
    of the second layer and 7 of the first, padding masked; both position tables from 0."""
    sizes = {k: v for k, v in _bart_sizes().items() if k != "max_position_embeddings"}
    return transformers.LEDConfig(vocab_size=VOCAB, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                  decoder_start_token_id=2, attention_window=[4, 8], max_encoder_position_embeddings=64,
                                  max_decoder_position_embeddings=64, **sizes)


FSMT_TARGET_VOCAB = VOCAB - 24  # separate source and target vocabularies of different sizes


def _fsmt() -> Any:
    return transformers.FSMTConfig(langs=["en", "de"], src_vocab_size=VOCAB, tgt_vocab_size=FSMT_TARGET_VOCAB,
                                   pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                                   forced_eos_token_id=2, **_bart_sizes())


def _prophetnet() -> Any:
    """ProphetNet's layout: pad 0, ``[SEP]`` (2) ends a source and starts the target; two
    predicting streams (``generate`` reads the first), 8 relative buckets up to distance 20."""
    return transformers.ProphetNetConfig(
        vocab_size=VOCAB, hidden_size=D_MODEL, encoder_ffn_dim=128, decoder_ffn_dim=128, num_encoder_layers=2,
        num_decoder_layers=2, num_encoder_attention_heads=4, num_decoder_attention_heads=4,
        max_position_embeddings=64, ngram=2, num_buckets=8, relative_max_distance=20, init_std=0.3,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2)


def ids_only(folder: Path) -> None:
    """No tokenizer file the export reads (FSMT ships Moses + BPE files): the export is ids-only,
    its source words ``t<id>``."""


@dataclass(frozen=True)
class Family:
    """One row: ``model_type``, how to build its config, its ``transformers`` class (by name),
    the tokenizer files its folders ship (written into the saved folder), the words the test's
    source texts are drawn from, and how strongly ``favour_eos`` pulls towards EOS."""

    model_type: str
    config: Callable[[], Any]
    model_class: str
    tokenizer: Callable[[Path], None]
    words: tuple[str, ...]
    eos_strength: float = 0.9  # favour_eos: a row where no sentence ends within MAX_NEW needs more
    generation: tuple[tuple[str, Any], ...] = ()
    """``generation_config.json`` settings: transformers 5 drops ``forced_bos_token_id`` from a
    model config's arguments, so a layout that forces a first token says so here."""
    variant: str = ""
    """A second row of one ``model_type`` (another attention kind) names itself here."""

    @property
    def key(self) -> str:
        """The row's name: its ``model_type``, and its variant if it has one."""
        return f"{self.model_type}-{self.variant}" if self.variant else self.model_type


BART_WORDS = tuple(f"w{i}" for i in range(4, VOCAB))
T5_WORDS = tuple(f"w{i}" for i in range(3, VOCAB))
MBART_WORDS = tuple(f"w{i}" for i in range(4, VOCAB - 1))

FAMILIES: tuple[Family, ...] = (
    Family("marian", _marian, "MarianMTModel", opus_mt_files, OPUS_WORDS),
    Family("bart", _bart, "BartForConditionalGeneration",
           word_level(words_around({0: "<s>", 1: "<pad>", 2: "</s>", 3: "<unk>"}), "<s> $A </s>", ("<s>", "</s>")),
           BART_WORDS, generation=(("forced_bos_token_id", 0),)),
    Family("mbart", _mbart, "MBartForConditionalGeneration",
           word_level(words_around({0: "<s>", 1: "<pad>", 2: "</s>", 3: "<unk>", VOCAB - 1: "en_XX"}),
                      "$A </s> en_XX", ("</s>", "en_XX")),
           MBART_WORDS),
    Family("t5", _t5, "T5ForConditionalGeneration",
           word_level(words_around({0: "<pad>", 1: "</s>", 2: "<unk>"}), "$A </s>", ("</s>",)), T5_WORDS, 1.1),
)
FAMILIES += (
    # mT5 projects without T5's d_model**-0.5 rescale: a quarter of T5's init keeps its logits as
    # moderate (at 8x, float32 rounding alone moves the cached step 3.6e-4 from the forward)
    Family("mt5", lambda: transformers.MT5Config(**{**_t5_sizes(), "initializer_factor": 0.25}),
           "MT5ForConditionalGeneration",
           FAMILIES[3].tokenizer, T5_WORDS, eos_strength=1.76),  # 12 of 20 end, greedy and beam 4
    Family("umt5", lambda: transformers.UMT5Config(**_t5_sizes()), "UMT5ForConditionalGeneration",
           FAMILIES[3].tokenizer, T5_WORDS),
    Family("m2m_100", _m2m100, "M2M100ForConditionalGeneration",
           word_level(words_around({0: "<s>", 1: "<pad>", 2: "</s>", 3: "<unk>", NLLB_SOURCE: "eng_Latn",
                                    NLLB_TARGET: "fra_Latn"}), "eng_Latn $A </s>", ("eng_Latn", "</s>")),
           tuple(f"w{i}" for i in range(4, VOCAB - 2)), eos_strength=1.25,
           generation=(("forced_bos_token_id", NLLB_TARGET),)),
    Family("pegasus", _pegasus, "PegasusForConditionalGeneration",
           word_level(words_around({0: "<pad>", 1: "</s>", 2: "<unk>"}), "$A </s>", ("</s>",)), T5_WORDS),
    # block_size 4: the 3 to 13 source ids span up to 4 blocks (5 on the staggered layer), padded to whole ones
    Family("pegasus_x", _pegasus_x, "PegasusXForConditionalGeneration", FAMILIES[3].tokenizer, T5_WORDS,
           eos_strength=1.1),
    Family("pegasus_x", lambda: _pegasus_x(stagger=False), "PegasusXForConditionalGeneration", FAMILIES[3].tokenizer,
           T5_WORDS, eos_strength=1.1, variant="unstaggered"),
    Family("blenderbot", _blenderbot, "BlenderbotForConditionalGeneration",
           word_level(words_around({0: "<pad>", 1: "<s>", 2: "</s>", 3: "<unk>"}), "$A </s>", ("</s>",)),
           BART_WORDS),
    Family("blenderbot-small", _blenderbot_small, "BlenderbotSmallForConditionalGeneration",
           word_level(words_around({0: "<pad>", 1: "<s>", 2: "</s>", 3: "<unk>"}), "$A </s>", ("</s>",)),
           BART_WORDS),
    Family("fsmt", _fsmt, "FSMTForConditionalGeneration", ids_only, tuple(f"t{i}" for i in range(3, VOCAB))),
    # local_radius 3: blocks of 4 tokens, so the 3 to 13 source ids span up to 4 blocks and the
    # neighbours' masking and padding are exercised
    Family("longt5", lambda: transformers.LongT5Config(**_t5_sizes(), local_radius=3), "LongT5ForConditionalGeneration",
           FAMILIES[3].tokenizer, T5_WORDS, eos_strength=1.1),
    # and the global blocks: 4 tokens each, so a sentence has 0 to 3 of them, its tail in the last
    Family("longt5", lambda: transformers.LongT5Config(**_t5_sizes(), local_radius=3, global_block_size=4,
                                                       encoder_attention_type="transient-global"),
           "LongT5ForConditionalGeneration", FAMILIES[3].tokenizer, T5_WORDS, eos_strength=1.1, variant="tglobal"),
    Family("led", _led, "LEDForConditionalGeneration", FAMILIES[1].tokenizer, BART_WORDS),
    # xlm-prophetnet is this model under another model_type (transformers 5 no longer ships it):
    # test_xlm_prophetnet_maps_as_prophetnet checks the mapping instead of a second export
    Family("prophetnet", _prophetnet, "ProphetNetForConditionalGeneration",
           word_level(words_around({0: "[PAD]", 1: "[CLS]", 2: "[SEP]", 3: "<unk>"}), "$A [SEP]", ("[SEP]",)),
           BART_WORDS),
)
BY_TYPE = {f.key: f for f in FAMILIES}


def favour_eos(model: Any, strength: float = 0.9) -> None:
    """Random weights almost never pick EOS. Point the EOS output row along the mean of the
    states the output layer reads, so its logit is ``strength`` times a typical best logit:
    sentences then end at varied lengths, and EOS handling is tested too."""
    head = model.get_output_embeddings()
    if isinstance(head, torch.nn.Embedding):  # FSMT answers with its target table, not its projection
        head = model.model.decoder.output_projection
    eos, vocab = model.config.eos_token_id, head.weight.shape[0]
    seen = []
    hook = head.register_forward_hook(lambda _m, args, out: seen.append((args[0], out)))
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(3, vocab - 1, (8, 10), generator=generator)
    with torch.no_grad():
        model(input_ids=src, decoder_input_ids=torch.randint(3, vocab - 1, (8, 12), generator=generator))
    hook.remove()
    states, logits = seen[0][0].reshape(-1, seen[0][0].shape[-1]), seen[0][1].reshape(-1, vocab)
    mean = states.mean(0)
    target = strength * logits.max(-1).values.median()
    with torch.no_grad():
        head.weight[eos] = mean * target / mean.dot(mean)


@dataclass(frozen=True)
class Built:
    family: Family
    hf_dir: Path
    out: Path
    model: Any  # transformers' model loaded back from hf_dir, with its generation_config.json


EXPORT_WORKERS = 2
"""Exports run this many at a time, each in its own process on one thread: an export is mostly
the dynamo trace, single-threaded Python, so two cores export two families at once."""


def build_and_export(model_type: str, root: Path) -> str | None:
    """One family's tiny model saved as a Hugging Face folder and exported with ``export --hf``
    (in a worker process); the CLI's output when the export fails, else None."""
    from click.testing import CliRunner

    from s2s_deploy.cli import main

    torch.set_num_threads(1)
    family = BY_TYPE[model_type]
    torch.manual_seed(SEED)
    model = getattr(transformers, family.model_class)(family.config()).eval()
    favour_eos(model, family.eos_strength)
    for key, value in family.generation:
        setattr(model.generation_config, key, value)
    hf_dir, out = root / f"{model_type}-hf", root / model_type
    model.save_pretrained(hf_dir)
    family.tokenizer(hf_dir)
    result = CliRunner().invoke(main, ["export", "--hf", str(hf_dir), "--out", str(out)])
    return None if result.exit_code == 0 else result.output


class FamilyExports:
    """One tiny model and one ``--hf`` export per family per session, started together for every
    family the session's tests name (``prefetch``) in a pool of ``EXPORT_WORKERS`` processes, and
    ``generate``'s answers kept per (family, beams), since several tests compare with them."""

    def __init__(self, root: Path, prefetch: list[str]) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        self.root = root
        self.done: dict[str, Built] = {}
        self.failed: dict[str, str] = {}
        self.answers: dict[tuple[str, int], list[tuple[int, ...]]] = {}
        self.pool = ProcessPoolExecutor(EXPORT_WORKERS, mp_context=multiprocessing.get_context("spawn"))
        self.pending = {t: self.pool.submit(build_and_export, t, root) for t in dict.fromkeys(prefetch)}

    def get(self, model_type: str) -> Built:
        if model_type in self.failed:  # one failed export per session, not one per test
            pytest.fail(self.failed[model_type])
        if model_type not in self.done:
            future = self.pending.pop(model_type, None) or self.pool.submit(build_and_export, model_type, self.root)
            failure = future.result()
            if failure is not None:
                self.failed[model_type] = failure
                pytest.fail(failure)
            hf_dir = self.root / f"{model_type}-hf"
            loaded = transformers.AutoModelForSeq2SeqLM.from_pretrained(hf_dir, local_files_only=True).eval()
            self.done[model_type] = Built(BY_TYPE[model_type], hf_dir, self.root / model_type, loaded)
        return self.done[model_type]

    def generated(self, built: Built, rows: list[list[int]], pad: int, beams: int) -> list[tuple[int, ...]]:
        """``generated(..., eos=-1)`` for the family's own inputs, computed once per beam size."""
        key = (built.family.key, beams)
        if key not in self.answers:
            self.answers[key] = generated(built.model, rows, pad, -1, beams)
        return self.answers[key]


@pytest.fixture(scope="session")
def family_exports(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Any:
    named = [item.callspec.params["model_type"] for item in request.session.items
             if hasattr(item, "callspec") and "model_type" in item.callspec.params]
    exports = FamilyExports(tmp_path_factory.mktemp("hf-families"), named)
    yield exports
    exports.pool.shutdown(cancel_futures=True)


def until_eos(row: tuple[int, ...], eos: int) -> tuple[int, ...]:
    return row[: row.index(eos)] if eos in row else row


def texts(family: Family, count: int = INPUTS) -> list[str]:
    rng = np.random.default_rng(SEED)
    return [" ".join(rng.choice(family.words, rng.integers(2, 12))) for _ in range(count)]


def generated(model: Any, rows: list[list[int]], pad: int, eos: int, beams: int,
              **settings: Any) -> list[tuple[int, ...]]:
    """``generate``'s tokens at the model's own settings, but ``num_beams``, ``max_new_tokens``
    and ``settings``: after the decoder start, up to the first EOS."""
    lengths = [len(r) for r in rows]
    ids = torch.full((len(rows), max(lengths)), pad, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
    mask = (torch.arange(ids.shape[1])[None, :] < torch.tensor(lengths)[:, None]).long()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, num_beams=beams, max_new_tokens=MAX_NEW, **settings)
    return [tuple(row[: row.index(eos)] if eos in row else row) for row in out[:, 1:].tolist()]


def agreement(exports: FamilyExports, built: Built,
              beams: int) -> tuple[int, list[tuple[str, tuple[int, ...], tuple[int, ...]]]]:
    """How many of the inputs ours translates to generate's tokens, and the ones that differ."""
    from s2s_deploy.runtime.translator import Translator

    translator = Translator(built.out, device="cpu")
    vocab = translator.manifest.src_vocab
    sources = texts(built.family)
    rows = [vocab.encode(text) for text in sources]
    ours = [h[0].tokens for h in translator.translate_ids(rows, beam=beams, max_len=MAX_NEW)]
    eos = translator.manifest.eos_id
    theirs = [until_eos(row, eos) for row in exports.generated(built, rows, vocab.pad_id, beams)]
    differ = [(s, o, t) for s, o, t in zip(sources, ours, theirs, strict=True) if o != t]
    return len(sources) - len(differ), differ


@pytest.mark.parametrize("model_type", [f.key for f in FAMILIES])
@pytest.mark.parametrize("beams", [1, 4])
def test_family_matches_generate_at_its_own_settings(family_exports: FamilyExports, model_type: str,
                                                     beams: int) -> None:
    built = family_exports.get(model_type)
    matches, differ = agreement(family_exports, built, beams)
    assert matches == INPUTS, (model_type, beams, differ[:3])


@pytest.mark.parametrize("model_type", [f.key for f in FAMILIES])
def test_family_inputs_tokenise_as_transformers_does(family_exports: FamilyExports, model_type: str) -> None:
    """The harness feeds ids both ways: they must be the ids the folder's own tokenizer gives,
    and some sentences, not all, must end before the limit, or EOS handling (or the limit) goes
    untested."""
    from s2s_deploy.format.manifest import load_manifest

    built = family_exports.get(model_type)
    manifest = load_manifest(built.out)
    sources = texts(built.family)
    if built.family.tokenizer is ids_only:
        assert [manifest.src_vocab.encode(s) for s in sources] == [
            [int(word[1:]) for word in s.split()] + [manifest.eos_id] for s in sources]
        tokenizer = None
    elif (built.hf_dir / "tokenizer.json").is_file():
        tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(built.hf_dir / "tokenizer.json"))
    else:
        tokenizer = transformers.MarianTokenizer(*(str(built.hf_dir / name) for name in
                                                   ("source.spm", "target.spm", "vocab.json")))
    if tokenizer is not None:
        assert [tokenizer(s)["input_ids"] for s in sources] == [manifest.src_vocab.encode(s) for s in sources]
    rows = [manifest.src_vocab.encode(s) for s in sources]
    for beams in (1, 4):  # before the limit: forced EOS ends every sentence at it
        ended = sum(manifest.eos_id in row[: MAX_NEW - 1]
                    for row in family_exports.generated(built, rows, manifest.src_vocab.pad_id, beams))
        assert 0 < ended < INPUTS, (beams, ended)


def test_marian_prints_a_source_only_piece_as_marian_tokenizer_does(family_exports: FamilyExports) -> None:
    """An opus-mt target id whose piece only ``source.spm`` holds: ``in in in``, not ``▁in▁in▁in``."""
    import sentencepiece

    from s2s_deploy.format.manifest import load_manifest

    built = family_exports.get("marian")
    files = [str(built.hf_dir / name) for name in ("source.spm", "target.spm", "vocab.json")]
    tokenizer = transformers.MarianTokenizer(*files)
    target = sentencepiece.SentencePieceProcessor(model_file=files[1])
    table = json.loads((built.hf_dir / "vocab.json").read_text())
    source_only = [i for piece, i in table.items() if piece.startswith("\u2581") and target.piece_to_id(piece) == 0]
    assert table["\u2581in"] in source_only
    vocab = load_manifest(built.out).tgt_vocab
    for i in source_only:
        assert vocab.decode([i] * 3) == tokenizer.decode([i] * 3, skip_special_tokens=True)
    assert vocab.decode([table["\u2581in"]] * 3) == "in in in"


ELSEWHERE = {"whisper": "tests/test_hf_whisper.py", "speech_to_text": "tests/test_hf_speech_to_text.py",
             "vision-encoder-decoder": "tests/test_hf_vision.py"}
"""Families whose encoder reads audio or images: the same checks against ``generate``, on clips or
images, in their own module."""
SAME_AS = {"xlm-prophetnet": "prophetnet"}
"""``model_type`` values that are another row's model under a second name, which the installed
``transformers`` no longer ships: ``test_xlm_prophetnet_maps_as_prophetnet`` checks the mapping."""


def test_every_hf_plugin_has_a_row() -> None:
    from s2s_deploy.architecture.registry import REGISTRY

    served = {t for entry in REGISTRY.entries() for t in entry.plugin.hf_model_types}
    rows = {f.model_type for f in FAMILIES}
    assert served <= rows | set(ELSEWHERE) | set(SAME_AS), sorted(served - rows - set(ELSEWHERE) - set(SAME_AS))
    assert set(SAME_AS.values()) <= rows
    assert all((Path(__file__).parent.parent / path).is_file() for path in ELSEWHERE.values())


def test_xlm_prophetnet_maps_as_prophetnet() -> None:
    """XLM-ProphetNet is ProphetNet's model (its modeling file was a copy) under its own
    ``model_type``: the same plugin loads it, to the same config and weights; and the settings
    ``generate`` cannot decode are refused in one line naming the key."""
    from s2s_deploy.errors import CheckpointError
    from s2s_deploy.export.hf import plugin_for

    torch.manual_seed(SEED)
    config = _prophetnet()
    tensors = transformers.ProphetNetForConditionalGeneration(config).state_dict()
    hf = config.to_dict()
    plugin = plugin_for(hf)
    assert plugin is plugin_for({**hf, "model_type": "xlm-prophetnet"})
    ours, theirs = plugin.from_hf(hf, tensors), plugin.from_hf({**hf, "model_type": "xlm-prophetnet"}, tensors)
    assert ours.config == theirs.config and ours.tensors.keys() == theirs.tensors.keys()
    assert (ours.config.ngram, ours.config.num_buckets, ours.config.relative_max_distance) == (2, 8, 20)
    for key, value in (("pad_token_id", 1), ("add_cross_attention", False)):
        with pytest.raises(CheckpointError, match=f"config {key}="):
            plugin.from_hf({**hf, key: value}, tensors)


def test_parity_reference_compares_with_generate(family_exports: FamilyExports, tmp_path: Path) -> None:
    """``parity --reference`` passes on an export that decodes as ``generate``, and fails on a
    copy whose only change is the length penalty (0.75, the pre-fix default, against 1.0)."""
    import shutil

    from click.testing import CliRunner

    from s2s_deploy.cli import main

    built = family_exports.get("bart")
    runner = CliRunner()
    result = runner.invoke(main, ["parity", str(built.out), "--reference", str(built.hf_dir)])
    assert result.exit_code == 0 and "parity: PASS" in result.output, result.output
    changed = tmp_path / "alpha"
    shutil.copytree(built.out, changed)
    raw = json.loads((changed / "manifest.json").read_text())
    assert raw["search"]["alpha"] == 1.0
    raw["search"]["alpha"] = 0.75
    (changed / "manifest.json").write_text(json.dumps(raw))
    result = runner.invoke(main, ["parity", str(changed), "--reference", str(built.hf_dir)])
    assert result.exit_code == 1 and "parity: FAIL" in result.output, result.output
    assert "beam4" in result.output and "generate" in result.output


@pytest.mark.parametrize(("early_stopping", "alpha"), [(True, 1.0), ("never", 1.0), (False, 0.5)])
def test_beam_stopping_rules_match_generate(family_exports: FamilyExports, early_stopping: bool | str,
                                            alpha: float) -> None:
    """``early_stopping`` true and "never", and another length penalty, given to both sides."""
    from s2s_deploy.runtime.translator import Translator

    built = family_exports.get("bart")
    translator = Translator(built.out, device="cpu")
    vocab = translator.manifest.src_vocab
    rows = [vocab.encode(text) for text in texts(built.family)]
    ours = [h[0].tokens for h in translator.translate_ids(rows, beam=4, max_len=MAX_NEW, alpha=alpha,
                                                          early_stopping=early_stopping)]
    theirs = generated(built.model, rows, vocab.pad_id, translator.manifest.eos_id, 4,
                       early_stopping=early_stopping, length_penalty=alpha)
    assert ours == theirs


def test_target_lang_code_is_the_forced_bos_generate_takes(family_exports: FamilyExports) -> None:
    """NLLB's language codes: the export lists them (the plugin's ``hf_language_codes``), and
    ``target_lang`` (``Translator``, ``translate --target-lang``, ``serve``) makes a code's id the
    forced first token, token-identical to ``generate(..., forced_bos_token_id=<the code's id>)``."""
    from click.testing import CliRunner

    from s2s_deploy.cli import main
    from s2s_deploy.runtime.translator import Translator
    from s2s_deploy.serve.app import parse_request

    built = family_exports.get("m2m_100")
    translator = Translator(built.out, device="cpu")
    vocab = translator.manifest.tgt_vocab
    assert [vocab.tokens[i] for i in vocab.languages] == ["eng_Latn", "fra_Latn"]
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(built.hf_dir / "tokenizer.json"))
    code = tokenizer.convert_tokens_to_ids("eng_Latn")  # not the folder's own fra_Latn
    sources = texts(built.family)
    rows = [translator.manifest.src_vocab.encode(text) for text in sources]
    for beams in (1, 4):
        ours = [h[0].tokens for h in translator.translate_ids(rows, beam=beams, max_len=MAX_NEW,
                                                              target_lang="eng_Latn")]
        theirs = generated(built.model, rows, vocab.pad_id, translator.manifest.eos_id, beams,
                           forced_bos_token_id=code)
        assert ours == theirs, beams
        assert all(row[0] == code for row in ours)
        default = [h[0].tokens for h in translator.translate_ids(rows, beam=beams, max_len=MAX_NEW)]
        assert all(row[0] != code for row in default)
    runner = CliRunner()
    result = runner.invoke(main, ["translate", str(built.out), *sources[:4], "--device", "cpu", "--beam", "4",
                                  "--target-lang", "eng_Latn"])
    assert result.exit_code == 0, result.output
    wanted = translator(sources[:4], beam=4, target_lang="eng_Latn")
    assert result.stdout.splitlines() == [t.text for t in wanted]
    refused = runner.invoke(main, ["translate", str(built.out), sources[0], "--target-lang", "deu_Latn"])
    assert refused.exit_code == 1 and len(refused.stderr.strip().splitlines()) == 1
    assert refused.stderr.startswith("error: unknown target_lang 'deu_Latn'; known: eng_Latn, fra_Latn")
    _, config = parse_request({"texts": sources[:1], "target_lang": "eng_Latn"}, translator, 16)
    assert config.forced_bos == code
