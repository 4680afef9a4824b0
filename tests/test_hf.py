"""Hugging Face families against ``transformers`` itself: tiny random models built from configs
(no hub), saved with ``save_pretrained``, exported through ``--hf``, then greedy and beam 4
token for token against ``model.generate`` and teacher-forced log-probs against the HF model."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from s2s_deploy.export.hf import search_defaults, special_ids
from s2s_deploy.format.manifest import load_manifest
from s2s_deploy.runtime.ort.backend import OrtBackend
from s2s_deploy.runtime.search import SearchConfig, search
from s2s_deploy.verify.parity import check_parity, forced_step_diff
from s2s_deploy.verify.reference import HFBackend, load_transformers_model

transformers = pytest.importorskip("transformers")

VOCAB = 96
MAX_NEW = 24
SENTENCES = 8


def _marian() -> object:
    # opus-mt's id layout: eos 0, unk 1, pad (= decoder start) last
    config = transformers.MarianConfig(
        vocab_size=VOCAB, decoder_vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_position_embeddings=64, pad_token_id=VOCAB - 1, eos_token_id=0, decoder_start_token_id=VOCAB - 1,
        bos_token_id=None, forced_eos_token_id=0, scale_embedding=True, activation_function="swish",
        init_std=0.3, share_encoder_decoder_embeddings=True,
    )
    return transformers.MarianMTModel(config)


def _bart() -> object:
    config = transformers.BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=2,
        init_std=0.3,
    )
    return transformers.BartForConditionalGeneration(config)


def _mbart() -> object:
    config = transformers.MBartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=2,
        scale_embedding=True, init_std=0.3,
    )
    return transformers.MBartForConditionalGeneration(config)


def _t5(initializer_factor: float = 8.0) -> object:
    config = transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=20, pad_token_id=0, eos_token_id=1,
        decoder_start_token_id=0, initializer_factor=initializer_factor,
    )
    return transformers.T5ForConditionalGeneration(config)


def _favour_eos(model: object, eos: int, strength: float = 0.9) -> None:
    """Random weights almost never pick EOS. Point the (tied) EOS embedding along the mean of the
    states the output layer reads, scaled so its logit is ``strength`` times a typical best logit:
    sentences then end at varied lengths, and EOS handling is tested too."""
    seen = []
    hook = model.get_output_embeddings().register_forward_hook(lambda _m, args, out: seen.append((args[0], out)))
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(3, VOCAB - 1, (8, 10), generator=generator)
    with torch.no_grad():
        model(input_ids=src, decoder_input_ids=torch.randint(3, VOCAB - 1, (8, 12), generator=generator))
    hook.remove()
    states, logits = seen[0][0].reshape(-1, seen[0][0].shape[-1]), seen[0][1].reshape(-1, VOCAB)
    mean = states.mean(0)
    target = strength * logits.max(-1).values.median()
    with torch.no_grad():
        model.get_output_embeddings().weight[eos] = mean * target / mean.dot(mean)


FAMILIES = {"marian": ("marian", _marian), "bart": ("bart", _bart), "mbart": ("bart", _mbart), "t5": ("t5", _t5),
            "t5-unit-init": ("t5", lambda: _t5(1.0))}
"""``t5``'s initializer factor of 8 makes choices peaked and tie-free for the token tests, but its
logits reach the hundreds, where float32 rounding differs by 1e-3; log-probs are compared on T5's
default scale (``t5-unit-init``), and ``test_t5_is_transformers_arithmetic`` proves exactness."""


class HFExports:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: dict[str, tuple[object, Path, Path]] = {}

    def get(self, family: str) -> tuple[object, Path, Path]:
        if family not in self.done:
            from click.testing import CliRunner

            from s2s_deploy.cli import main

            torch.manual_seed(0)
            model = FAMILIES[family][1]().eval()
            _favour_eos(model, model.config.eos_token_id)
            hf_dir, out = self.root / f"{family}-hf", self.root / family
            model.save_pretrained(hf_dir)
            result = CliRunner().invoke(main, ["export", "--hf", str(hf_dir), "--out", str(out)])
            assert result.exit_code == 0, result.output
            self.done[family] = (model, hf_dir, out)
        return self.done[family]


@pytest.fixture(scope="module")
def hf_exports(tmp_path_factory: pytest.TempPathFactory) -> HFExports:
    return HFExports(tmp_path_factory.mktemp("hf"))


def _sources(vocab_size: int, eos: int, specials: set[int]) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
    rng = np.random.default_rng(0)
    ordinary = np.array([i for i in range(vocab_size) if i not in specials])
    rows = [[*rng.choice(ordinary, rng.integers(3, 12)).tolist(), eos] for _ in range(SENTENCES)]
    return rows


def _padded(rows: list[list[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    batch = np.full((len(rows), int(lengths.max())), pad, dtype=np.int64)
    for i, row in enumerate(rows):
        batch[i, : len(row)] = row
    return batch, lengths


def _generate(model: object, src: np.ndarray, src_len: np.ndarray, beams: int, alpha: float,
              eos: int) -> list[tuple[int, ...]]:
    """transformers' generate with every other processor off: tokens after the start, up to EOS."""
    mask = (np.arange(src.shape[1])[None, :] < src_len[:, None]).astype(np.int64)
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(mask), num_beams=beams,
            length_penalty=alpha, early_stopping=False, max_length=MAX_NEW + 1, min_length=0, do_sample=False,
            no_repeat_ngram_size=0, repetition_penalty=1.0, bad_words_ids=None, forced_bos_token_id=None,
            forced_eos_token_id=None, num_return_sequences=1,
        )
    results = []
    for row in out[:, 1:].tolist():
        results.append(tuple(row[: row.index(eos)] if eos in row else row))
    return results


@pytest.mark.parametrize("family", list(FAMILIES))
def test_export_picks_the_plugin_and_records_the_models_settings(hf_exports: HFExports, family: str) -> None:
    model, hf_dir, out = hf_exports.get(family)
    manifest = load_manifest(out)
    assert manifest.plugin == FAMILIES[family][0]
    config = json.loads((hf_dir / "config.json").read_text())
    generation = json.loads((hf_dir / "generation_config.json").read_text())
    ids = special_ids(config, generation)
    assert manifest.decoder_start_id == model.generation_config.decoder_start_token_id == ids["decoder_start"]
    assert manifest.eos_id == model.config.eos_token_id
    assert manifest.tgt_vocab.pad_id == model.config.pad_token_id
    search = manifest.to_dict()["search"]
    for key, value in search_defaults(config, generation).items():
        assert search[key] == value
    if model.generation_config.forced_eos_token_id is not None:
        assert search["forced_eos"] is True


@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_and_beam_match_transformers_generate(hf_exports: HFExports, family: str) -> None:
    model, _, out = hf_exports.get(family)
    manifest = load_manifest(out)
    vocab = manifest.tgt_vocab
    rows = _sources(len(vocab), vocab.eos_id, {i for i in vocab.special_ids().values() if i is not None})
    src, src_len = _padded(rows, vocab.pad_id)
    backend = OrtBackend(manifest, device="cpu")
    # beam 4 with alpha 0: both stopping rules then return the best-scoring finished hypothesis
    # (log P only falls as a hypothesis grows, so no later finish can beat the one either rule stops at)
    for beams, alpha in ((1, 1.0), (4, 0.0)):
        ours = [h[0].tokens for h in search(backend, src, src_len, SearchConfig(beams, 1, MAX_NEW, alpha))]
        theirs = _generate(model, src, src_len, beams, alpha, vocab.eos_id)
        assert ours == theirs, (family, beams)
    ended = sum(vocab.eos_id in row for row in _generate(model, src, src_len, 4, 0.0, -1))
    assert ended > 0, "some sentences must end, or EOS handling goes untested"


@pytest.mark.parametrize("family", ["marian", "bart", "mbart", "t5-unit-init"])
def test_teacher_forced_log_probs_match_transformers(hf_exports: HFExports, family: str) -> None:
    _, hf_dir, out = hf_exports.get(family)
    manifest = load_manifest(out)
    vocab = manifest.tgt_vocab
    rows = _sources(len(vocab), vocab.eos_id, {i for i in vocab.special_ids().values() if i is not None})
    src, src_len = _padded(rows, vocab.pad_id)
    reference = HFBackend(load_transformers_model(hf_dir), vocab.decoder_start_id, vocab.eos_id)
    targets = [h[0].tokens for h in search(reference, src, src_len, SearchConfig(1, 1, MAX_NEW, 1.0))]
    diff = forced_step_diff(reference, OrtBackend(manifest, device="cpu"), src, src_len, targets)
    # fp32 rounding scales with the log-probs' size: T5's init here (initializer_factor 8, needed for
    # peaked, tie-free choices) gives log-probs in the hundreds and thousands, so the gate is the
    # plugin's atol or 2e-6 of the largest |log p| (about 16 float32 ulps), whichever is larger
    scale = _largest_log_prob(reference, src, src_len, targets)
    assert 0.0 < diff <= max(manifest.to_dict()["validation"]["atol"], 2e-6 * scale), (diff, scale)


def test_t5_is_transformers_arithmetic(hf_exports: HFExports, monkeypatch: pytest.MonkeyPatch) -> None:
    """In float64 the plugin's T5 and transformers' agree to rounding, so the float32 differences
    of the peaked test model are rounding too. transformers computes T5LayerNorm's variance in
    float32 whatever the model's dtype; that one cast is lifted here."""
    from transformers.models.t5 import modeling_t5

    from s2s_deploy.architecture.registry import get_plugin
    from s2s_deploy.export.hf import load_hf

    def norm(self: object, hidden: torch.Tensor) -> torch.Tensor:
        variance = hidden.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden * torch.rsqrt(variance + self.variance_epsilon))  # type: ignore[attr-defined]

    monkeypatch.setattr(modeling_t5.T5LayerNorm, "forward", norm)
    model, hf_dir, _ = hf_exports.get("t5")
    reference = copy.deepcopy(model).double().eval()
    ours = load_hf(get_plugin("t5"), hf_dir).model.double().eval()
    vocab = load_manifest(hf_exports.get("t5")[2]).tgt_vocab
    src, src_len = _padded(_sources(VOCAB, vocab.eos_id, {vocab.pad_id, vocab.eos_id}), vocab.pad_id)
    tgt_in = torch.from_numpy(np.random.default_rng(1).integers(2, VOCAB, (len(src), 10)))
    tgt_in[:, 0] = vocab.decoder_start_id
    mask = torch.from_numpy((np.arange(src.shape[1])[None, :] < src_len[:, None]).astype(np.int64))
    with torch.no_grad():
        theirs = reference(input_ids=torch.from_numpy(src), attention_mask=mask, decoder_input_ids=tgt_in).logits
        mine = ours(torch.from_numpy(src), torch.from_numpy(src_len), tgt_in)
    scale = float(theirs.abs().max())
    assert scale > 10 and float((mine - theirs).abs().max()) <= 1e-12 * scale


def _largest_log_prob(backend: HFBackend, src: np.ndarray, src_len: np.ndarray,
                      targets: list[tuple[int, ...]]) -> float:
    steps = max(len(t) for t in targets) + 1
    forced = np.full((len(targets), steps), backend.eos_id, dtype=np.int64)
    forced[:, 0] = backend.decoder_start_id
    for row, tokens in enumerate(targets):
        forced[row, 1 : 1 + len(tokens)] = tokens
    reorder = np.arange(len(targets), dtype=np.int64)
    with backend.start(src, src_len) as run:
        return max(float(np.abs(run.step(forced[:, t], reorder)).max()) for t in range(steps))


def test_parity_command_against_the_hf_folder(hf_exports: HFExports) -> None:
    from click.testing import CliRunner

    from s2s_deploy.cli import main

    _, hf_dir, out = hf_exports.get("marian")
    result = CliRunner().invoke(main, ["parity", str(out), "--reference", str(hf_dir), "--max-len", "16"])
    assert result.exit_code == 0, result.output
    assert "parity: PASS" in result.output
    manifest = load_manifest(out)
    report = check_parity(manifest, HFBackend(load_transformers_model(hf_dir), manifest.decoder_start_id,
                                              manifest.eos_id),
                          OrtBackend(manifest, device="cpu"), list(manifest.samples)[:4], beam_size=4, max_len=16)
    assert report.passed


def test_arch_and_checkpoint_folder_export_like_hf(hf_exports: HFExports, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from s2s_deploy.cli import main

    _, hf_dir, out = hf_exports.get("t5")
    runner = CliRunner()
    again = tmp_path / "again"
    result = runner.invoke(main, ["export", "--arch", "t5", "--checkpoint", str(hf_dir), "--out", str(again)])
    assert result.exit_code == 0, result.output
    assert load_manifest(again).to_dict()["config"] == load_manifest(out).to_dict()["config"]
    wrong = runner.invoke(main, ["export", "--arch", "bart", "--checkpoint", str(hf_dir), "--out", str(tmp_path / "x")])
    assert wrong.exit_code == 1 and "'t5' model" in wrong.output


def test_translator_takes_its_defaults_from_the_manifest(hf_exports: HFExports) -> None:
    from s2s_deploy.runtime.translator import Translator

    _, _, out = hf_exports.get("bart")
    translator = Translator(out, device="cpu")
    search = translator.manifest.to_dict()["search"]
    config = translator.search_config()
    assert config.beam_size == search.get("beam_size", 1)
    assert config.alpha == search["alpha"]
    assert config.max_len == search.get("max_len", translator.manifest.max_target_length)
    assert translator.search_config(beam=2, alpha=0.5, max_len=5) == replace(
        config, beam_size=2, alpha=0.5, max_len=5, min_len=min(config.min_len, 5))


def test_a_folder_with_tokenizer_json_exports_a_text_model(tmp_path: Path) -> None:
    """BART with a tokenizers ``tokenizer.json`` whose post-processor frames a sentence as
    ``<s> ... </s>``: the export takes text (level ``hf``, the file copied and hashed), frames it
    the same way, and translates text exactly as transformers does on the tokenizer's ids. The
    tokenizer has fewer ids than the embedding has rows, as T5's (32,100 against 32,128)."""
    from click.testing import CliRunner
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from s2s_deploy.cli import main
    from s2s_deploy.runtime.translator import Translator

    words = ["<s>", "<pad>", "</s>", "<unk>", *(f"w{i}" for i in range(4, VOCAB - 6))]  # fewer ids than the model
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A </s>",
                                                             special_tokens=[("<s>", 0), ("</s>", 2)])
    torch.manual_seed(0)
    model = _bart().eval()
    _favour_eos(model, model.config.eos_token_id)
    hf_dir, out = tmp_path / "bart-hf", tmp_path / "bart"
    model.save_pretrained(hf_dir)
    tokenizer.save(str(hf_dir / "tokenizer.json"))
    result = CliRunner().invoke(main, ["export", "--hf", str(hf_dir), "--out", str(out)])
    assert result.exit_code == 0, result.output
    manifest = load_manifest(out)
    source = manifest.to_dict()["vocab"]["source"]
    assert source["level"] == "hf" and source["prefix"] == [0] and source["suffix"] == [2]
    assert (out / source["tokenizer"]["file"]).read_bytes() == (hf_dir / "tokenizer.json").read_bytes()
    from s2s_deploy.transforms.inspect import deployable_files

    assert source["tokenizer"]["file"] in deployable_files(manifest)  # translate reads it
    texts = ["w5 w17 w40 w41", "w90 w4", "w63 w63 w12 w77 w30 w8"]
    translator = Translator(out, device="cpu")
    ours = [t.text for t in translator(texts, beam=1, max_len=MAX_NEW, alpha=1.0, forced_eos=False)]
    encoded = [tokenizer.encode(text).ids for text in texts]
    src, src_len = _padded(encoded, model.config.pad_token_id)
    theirs = [tokenizer.decode(list(ids)) for ids in _generate(model, src, src_len, 1, 1.0, model.config.eos_token_id)]
    assert ours == theirs and any(ours)


def test_an_opus_mt_folder_exports_a_text_model(tmp_path: Path) -> None:
    """opus-mt's own tokenizer files (``source.spm``, ``target.spm``, ``vocab.json``): the export
    takes text, and translates it exactly as transformers' MarianTokenizer and generate do."""
    import io

    import sentencepiece
    from click.testing import CliRunner

    from s2s_deploy.cli import main
    from s2s_deploy.runtime.translator import Translator

    words = ("alpha", "beta", "gamma", "delta", "march", "april", "one", "two", "three", "hello", "world")
    rng = np.random.default_rng(0)
    corpus = [" ".join(rng.choice(words, rng.integers(2, 8))) for _ in range(300)]
    hf_dir, out = tmp_path / "opus-mt-hf", tmp_path / "opus-mt"
    hf_dir.mkdir()
    for name in ("source.spm", "target.spm"):
        model_bytes = io.BytesIO()
        sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=model_bytes,
                                                 vocab_size=28 if name == "source.spm" else 31, minloglevel=2)
        (hf_dir / name).write_bytes(model_bytes.getvalue())
    pieces = sorted({p for name in ("source.spm", "target.spm")
                     for p in _pieces(hf_dir / name) if p not in ("<unk>", "<s>", "</s>")})
    vocab = ["</s>", "<unk>", *pieces]
    vocab += [f"x{i}" for i in range(len(vocab), VOCAB - 1)] + ["<pad>"]  # opus-mt: eos 0, unk 1, pad last
    (hf_dir / "vocab.json").write_text(json.dumps({piece: i for i, piece in enumerate(vocab)}))
    torch.manual_seed(0)
    model = _marian().eval()
    _favour_eos(model, model.config.eos_token_id)
    model.save_pretrained(hf_dir)
    result = CliRunner().invoke(main, ["export", "--hf", str(hf_dir), "--out", str(out)])
    assert result.exit_code == 0, result.output
    manifest = load_manifest(out)
    assert manifest.to_dict()["vocab"]["source"]["level"] == "sentencepiece"
    assert {"source.spm", "target.spm"} <= {p.name for p in out.iterdir()}
    texts = ["hello world", "three alpha march", "gamma gamma beta one two", "delta"]
    ours = [t.text for t in Translator(out, device="cpu")(texts, beam=1, max_len=MAX_NEW, alpha=1.0, forced_eos=False)]
    tokenizer = transformers.MarianTokenizer(str(hf_dir / "source.spm"), str(hf_dir / "target.spm"),
                                             str(hf_dir / "vocab.json"))
    batch = tokenizer(texts, return_tensors="np", padding=True)
    src, src_len = batch["input_ids"].astype(np.int64), batch["attention_mask"].sum(axis=1).astype(np.int64)
    assert [list(row[:n]) for row, n in zip(src, src_len, strict=True)] == [
        manifest.src_vocab.encode(text) for text in texts]
    generated = _generate(model, src, src_len, 1, 1.0, model.config.eos_token_id)
    theirs = [tokenizer.decode(list(ids), skip_special_tokens=True) for ids in generated]
    assert ours == theirs and any(ours)


def _pieces(path: Path) -> list[str]:
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=str(path))
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


@pytest.mark.parametrize(("positions", "dim"), [(512, 512), (64, 7)])
def test_marian_positions_computed_in_the_graph_equal_the_transformers_table(positions: int, dim: int) -> None:
    """The exports compute Marian's sinusoids instead of storing the table: bit for bit the same rows."""
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    from s2s_deploy.modeling.parts import sinusoids_split, split_denominators

    table = MarianSinusoidalPositionalEmbedding(positions, dim).create_weight()
    computed = sinusoids_split(torch.arange(positions), split_denominators(dim), dim)
    assert torch.equal(computed, table)


def test_search_defaults_are_generates_for_what_the_folder_leaves_out() -> None:
    """save_pretrained omits settings at their defaults: the export must write generate's own."""
    from s2s_deploy.errors import CheckpointError

    config = {"eos_token_id": 2, "pad_token_id": 1, "decoder_start_token_id": 2, "max_position_embeddings": 16}
    found = search_defaults(config, {"forced_bos_token_id": 0, "forced_eos_token_id": 2})
    assert found == {"beam_size": 1, "alpha": 1.0, "early_stopping": False, "no_repeat_ngram_size": 0,
                     "max_len": 15, "min_len": 0, "forced_bos": 0, "forced_eos": True}  # 16 positions, start included
    assert search_defaults(config, {"max_length": 200, "min_length": 3})["max_len"] == 199
    assert search_defaults(config, {"max_new_tokens": 30, "early_stopping": "never"})["max_len"] == 30
    for unsupported in ({"repetition_penalty": 1.2}, {"forced_eos_token_id": 5}, {"num_beam_groups": 2},
                        {"do_sample": True, "num_beams": 4}):
        with pytest.raises(CheckpointError):
            search_defaults(config, unsupported)


@pytest.mark.parametrize(("windows", "reason"), [([4, 6], "divide the largest"), ([2, 4], "at least 4"),
                                                 ([8], "per encoder layer (2)"), (512, None)])
def test_led_refuses_windows_transformers_cannot_run(tmp_path: Path, windows: object, reason: str | None) -> None:
    """An LED window that ``transformers`` cannot run is one ``error:`` line naming
    ``attention_window``, at export and before any weight is read (the folder holds one)."""
    from click.testing import CliRunner
    from safetensors.torch import save_file

    from s2s_deploy.cli import main

    config = {"model_type": "led", "vocab_size": VOCAB, "d_model": 16, "encoder_layers": 2, "decoder_layers": 2,
              "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 32,
              "decoder_ffn_dim": 32, "max_encoder_position_embeddings": 64, "max_decoder_position_embeddings": 64,
              "attention_window": windows, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
              "decoder_start_token_id": 2}
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file({"final_logits_bias": torch.zeros(1, VOCAB)}, str(tmp_path / "model.safetensors"))
    result = CliRunner().invoke(main, ["export", "--hf", str(tmp_path), "--out", str(tmp_path / "out")])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: led: config "), result.output
    if reason is None:  # one window for every layer, over the 64-row table: the table is the limit named
        assert "max_encoder_position_embeddings=64" in lines[0]
    else:
        assert "attention_window" in lines[0] and reason in lines[0]
