"""Decoding options (docs/decoding.md): each gives identical tokens on PyTorch and ONNX Runtime,
does what it says, and costs nothing when off (the search never fetches the full log-probs)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from test_plugins import ARCH_CASES

from s2s_deploy.cli import main
from s2s_deploy.errors import S2SError
from s2s_deploy.format.manifest import Manifest, load_manifest
from s2s_deploy.modeling.torch_backend import torch_backend_for
from s2s_deploy.runtime.options import StepOptions, sentence_limits
from s2s_deploy.runtime.ort.backend import OrtBackend
from s2s_deploy.runtime.scoring import score
from s2s_deploy.runtime.search import SearchConfig, search
from s2s_deploy.runtime.translator import Translator, Widths, batches_of, encode_batch

SENTENCES = 6


@pytest.fixture(scope="module")
def transformer(exports) -> tuple[Manifest, OrtBackend, object]:
    _, manifest = exports.get("transformer")
    return manifest, OrtBackend(manifest, device="cpu", threads=1), torch_backend_for(manifest)


def batch(manifest: Manifest, n: int = SENTENCES) -> tuple[list[str], np.ndarray, np.ndarray]:
    texts = list(manifest.samples)[:n]
    src, src_len = encode_batch(texts, manifest.src_vocab)
    return texts, src, src_len


def ids(manifest: Manifest, text: str) -> tuple[int, ...]:
    return tuple(manifest.tgt_vocab.encode(text, add_eos=False))


def tokens_of(hyps) -> list[list[tuple[int, ...]]]:
    return [[h.tokens for h in sentence] for sentence in hyps]


def option_configs(manifest: Manifest) -> dict[str, SearchConfig]:
    """One config per option, greedy and (where it makes sense) beam."""
    e, le = ids(manifest, "e"), ids(manifest, "le ")
    configs = {
        "min_len": SearchConfig(min_len=30, max_len=40),
        "repetition_penalty": SearchConfig(repetition_penalty=3.0, max_len=40),
        "no_repeat_ngram_size": SearchConfig(no_repeat_ngram_size=2, max_len=40),
        "encoder_no_repeat_ngram_size": SearchConfig(encoder_no_repeat_ngram_size=2, max_len=40),
        "prefix": SearchConfig(prefix=le, max_len=40),
        "suppress_tokens": SearchConfig(suppress_tokens=e, max_len=40),
        "disable_unk": SearchConfig(disable_unk=True, max_len=40),
        "bad_words_ids": SearchConfig(bad_words_ids=(ids(manifest, "mars"), e), max_len=40),
        "forced_eos": SearchConfig(forced_eos=True, max_len=8),
        "max_len_a_b": SearchConfig(max_len_a=0.5, max_len_b=2, max_len=40),
        "sampling": SearchConfig(sampling_topk=0, sampling_temperature=3.0, seed=7, max_len=40),
        "sampling_topk_topp": SearchConfig(sampling_topk=4, sampling_topp=0.8, sampling_temperature=2.0, seed=3,
                                           max_len=40),
    }
    for name in ("repetition_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "prefix",
                 "suppress_tokens", "bad_words_ids",
                 "forced_eos", "max_len_a_b", "min_len"):
        configs[f"{name}-beam"] = replace(configs[name], beam_size=3, n_best=2)
    return configs


def test_every_option_is_token_identical_on_both_backends(transformer) -> None:
    manifest, ort_backend, torch_backend = transformer
    _, src, src_len = batch(manifest)
    for name, config in option_configs(manifest).items():
        got, want = search(ort_backend, src, src_len, config), search(torch_backend, src, src_len, config)
        assert tokens_of(got) == tokens_of(want), name
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose([h.score for h in g], [h.score for h in w], atol=1e-4, err_msg=name)


@pytest.mark.parametrize(("arch", "max_len"), ARCH_CASES, ids=[a for a, _ in ARCH_CASES])
def test_every_plugin_runs_with_options_on(exports, arch: str, max_len: int) -> None:
    _, manifest = exports.get(arch)
    _, src, src_len = batch(manifest, 4)
    ort_backend, torch_backend = OrtBackend(manifest, device="cpu", threads=1), torch_backend_for(manifest)
    for config in (
        SearchConfig(max_len=max_len, no_repeat_ngram_size=3, repetition_penalty=1.3, disable_unk=True,
                     prefix=ids(manifest, "d"), max_len_a=1.0, max_len_b=5, forced_eos=True),
        SearchConfig(beam_size=3, max_len=max_len, no_repeat_ngram_size=3, bad_words_ids=(ids(manifest, "e"),)),
        SearchConfig(max_len=max_len, sampling_topk=0, sampling_temperature=2.0, seed=1),
    ):
        got = search(ort_backend, src, src_len, config)
        assert tokens_of(got) == tokens_of(search(torch_backend, src, src_len, config))
        assert all(h.tokens or h.finished for hyps in got for h in hyps)


def has_repeated(tokens: tuple[int, ...], n: int) -> bool:
    grams = [tokens[i : i + n] for i in range(len(tokens) - n + 1)]
    return len(grams) != len(set(grams))


@pytest.mark.parametrize("beam", [1, 4])
def test_no_repeat_ngram_output_has_no_repeated_trigram(transformer, beam: int) -> None:
    manifest, ort_backend, _ = transformer
    texts = [*list(manifest.samples)[:SENTENCES], "seven thousand, seven hundred and seventy-seven"]  # sept ... sept
    src, src_len = encode_batch(texts, manifest.src_vocab)
    plain = search(ort_backend, src, src_len, SearchConfig(beam, max_len=60))
    assert any(has_repeated(h.tokens, 3) for hyps in plain for h in hyps)  # the option has work to do
    for hyps in search(ort_backend, src, src_len, SearchConfig(beam, max_len=60, no_repeat_ngram_size=3)):
        assert not any(has_repeated(h.tokens, 3) for h in hyps)


def test_prefix_is_kept_verbatim_per_sentence(transformer) -> None:
    manifest, _, _ = transformer
    translate = Translator(manifest.directory, device="cpu", threads=1)
    texts = list(manifest.samples)[:3]
    prefixes = ["lundi", "zzz ", "1"]
    for beam in (1, 3):
        for text, result in zip(texts, translate(texts, beam=beam, prefix=prefixes), strict=True):
            assert result.text.startswith(prefixes[texts.index(text)])
    for result in translate(texts, prefix="mardi "):
        assert result.text.startswith("mardi ")


def test_seeded_sample_is_reproducible_across_backends_and_batch_sizes(transformer) -> None:
    manifest, ort_backend, torch_backend = transformer
    texts, src, src_len = batch(manifest)
    config = SearchConfig(sampling_topk=0, sampling_temperature=3.0, seed=11, max_len=40)
    together = tokens_of(search(ort_backend, src, src_len, config))
    assert together == tokens_of(search(torch_backend, src, src_len, config))
    alone = []
    for i in range(len(texts)):
        one_src, one_len = encode_batch([texts[i]], manifest.src_vocab)
        alone.extend(tokens_of(search(torch_backend if i % 2 else ort_backend, one_src, one_len, config)))
    assert alone == together
    greedy = tokens_of(search(ort_backend, src, src_len, SearchConfig(max_len=40)))
    assert greedy != together  # temperature 3 does sample
    assert tokens_of(search(ort_backend, src, src_len, replace(config, seed=12))) != together


def test_score_of_a_greedy_output_equals_its_score(transformer) -> None:
    manifest, ort_backend, torch_backend = transformer
    _, src, src_len = batch(manifest)
    greedy = [hyps[0] for hyps in search(ort_backend, src, src_len, SearchConfig(max_len=60))]
    assert all(h.finished for h in greedy)
    atol = manifest.to_dict()["validation"]["atol"]  # the step graph's own PyTorch-vs-ONNX tolerance
    for backend in (ort_backend, torch_backend):
        scored = score(backend, src, src_len, [h.tokens for h in greedy])
        for h, s in zip(greedy, scored, strict=True):
            assert len(s.token_log_probs) == len(h.token_log_probs)
            np.testing.assert_allclose(s.token_log_probs, h.token_log_probs, atol=atol)


def test_translator_score_and_stream(transformer) -> None:
    manifest, _, _ = transformer
    translate = Translator(manifest.directory, device="cpu", threads=1)
    texts = list(manifest.samples)[:3]
    results = translate(texts)
    scored = translate.score(texts, [r.text for r in results])
    for r, s in zip(results, scored, strict=True):
        assert s.log_prob / len(s.token_log_probs) ** 0.75 == pytest.approx(r.score, abs=1e-4)
    assert translate.score(texts[:1], ["zzzz"])[0].log_prob < scored[0].log_prob
    for text, result in zip(texts, results, strict=True):
        pieces = list(translate.stream(text))
        assert len(pieces) > 1 and "".join(pieces) == result.text
    with pytest.raises(S2SError, match="targets"):
        translate.score(texts, texts[:1])


def test_length_options(transformer) -> None:
    manifest, ort_backend, _ = transformer
    _, src, src_len = batch(manifest)
    config = SearchConfig(beam_size=3, max_len_a=0.5, max_len_b=2, max_len=40)
    limits = sentence_limits(config, src_len)
    assert limits.max() < 40  # the relative limit binds
    for hyps, limit in zip(search(ort_backend, src, src_len, config), limits, strict=True):
        assert all(len(h.token_log_probs) <= limit for h in hyps)
    for hyps in search(ort_backend, src, src_len, SearchConfig(max_len=6, forced_eos=True)):
        assert hyps[0].finished and len(hyps[0].token_log_probs) == 6


def test_suppression_options_remove_tokens(transformer) -> None:
    manifest, ort_backend, _ = transformer
    _, src, src_len = batch(manifest)
    e = ids(manifest, "e")[0]
    plain = search(ort_backend, src, src_len, SearchConfig(max_len=40))
    assert any(e in hyps[0].tokens for hyps in plain)
    for config in (SearchConfig(max_len=40, suppress_tokens=(e,)), SearchConfig(max_len=40, bad_words_ids=((e,),))):
        assert not any(e in hyps[0].tokens for hyps in search(ort_backend, src, src_len, config))
    mars = ids(manifest, "mars")
    for hyps in search(ort_backend, src, src_len, SearchConfig(4, max_len=40, bad_words_ids=(mars,))):
        assert all(not _contains(h.tokens, mars) for h in hyps)


def _contains(tokens: tuple[int, ...], words: tuple[int, ...]) -> bool:
    return any(tokens[i : i + len(words)] == words for i in range(len(tokens) - len(words) + 1))


def test_processor_on_known_log_probs() -> None:
    """Repetition penalty, n-gram ban, min_len and forcing on a hand-made step."""
    config = SearchConfig(repetition_penalty=2.0, no_repeat_ngram_size=2, min_len=5, prefix=(4, 5, 4), max_len=9)
    options = StepOptions(config, np.array([[6, 2]]), np.array([2]), eos_id=2, vocab_size=8, unk_id=3)
    log_probs = np.log(np.full((1, 8), 1 / 8, dtype=np.float32))
    out = options.process(log_probs, np.array([1]), np.array([0]))
    assert out[0, 4] == log_probs[0, 4] and np.isinf(out[0, [0, 1, 2, 3, 5, 6, 7]]).all()  # forced prefix[0]
    options.process(log_probs, np.array([4]), np.array([0]))
    options.process(log_probs, np.array([5]), np.array([0]))
    out = options.process(log_probs, np.array([4]), np.array([0]))  # history 4 5 4, past the prefix
    assert np.isinf(out[0, 5])  # "4 5" was seen: 5 may not follow 4 again
    assert np.isinf(out[0, 2])  # min_len
    assert out[0, 4] == pytest.approx(2 * log_probs[0, 4]) and out[0, 6] == log_probs[0, 6]


def test_options_off_never_fetch_full_log_probs(transformer) -> None:
    """The hot path is the in-graph TopK alone: a run whose ``step`` fails still decodes."""
    manifest, ort_backend, _ = transformer
    _, src, src_len = batch(manifest)

    class TopOnly:
        def __init__(self, backend: OrtBackend) -> None:
            self.backend = backend

        def __getattr__(self, name: str):
            return getattr(self.backend, name)

        def start(self, *args, **kwargs):
            run = self.backend.start(*args, **kwargs)

            def refuse(*_: object) -> None:
                raise AssertionError("full log-probs fetched with every option off")

            run.step = refuse
            return run

    for config in (SearchConfig(max_len=30), SearchConfig(4, 2, max_len=30, min_len=3)):
        search(TopOnly(ort_backend), src, src_len, config)
    with pytest.raises(AssertionError, match="full log-probs"):
        search(TopOnly(ort_backend), src, src_len, SearchConfig(max_len=30, no_repeat_ngram_size=4))


def test_max_batch_tokens_limits_batches(transformer) -> None:
    manifest, _, _ = transformer
    texts = list(manifest.samples)[:8]
    rows = [manifest.src_vocab.encode(text) for text in texts]
    for padding, limit in ((Widths(False), 60), (Widths(True), 100)):
        chunks = batches_of(rows, padding, 32, limit)
        assert sorted(i for chunk in chunks for i in chunk) == list(range(len(rows)))
        assert max(len(chunk) for chunk in chunks) > 1  # the limit binds, but not to one row a batch
        for chunk in chunks:
            assert len(chunk) == 1 or len(chunk) * padding.of(max(len(rows[i]) for i in chunk)) <= limit
    translate = Translator(manifest.directory, device="cpu", threads=1)
    assert translate(texts, max_batch_tokens=100) == translate(texts)


def test_translator_reads_search_defaults_from_the_manifest(transformer, tmp_path: Path) -> None:
    manifest, _, _ = transformer
    copy = tmp_path / "export"
    shutil.copytree(manifest.directory, copy)
    raw = json.loads((copy / "manifest.json").read_text())
    raw["search"].update({"prefix": list(ids(manifest, "zz")), "no_repeat_ngram_size": 3})
    (copy / "manifest.json").write_text(json.dumps(raw))
    translate = Translator(copy, device="cpu", threads=1)
    config = translate.search_config()
    assert config.no_repeat_ngram_size == 3 and config.prefix == ids(manifest, "zz")
    assert translate.search_config(no_repeat_ngram_size=0).no_repeat_ngram_size == 0  # the caller wins
    assert translate([manifest.samples[0]])[0].text.startswith("zz")
    with pytest.raises(S2SError, match="unknown decoding option"):
        translate.search_config(top_k=3)


def test_cli_options_score_and_errors(transformer, tmp_path: Path) -> None:
    manifest, _, _ = transformer
    runner, export = CliRunner(), str(manifest.directory)
    text = manifest.samples[0]
    result = runner.invoke(main, ["translate", export, text, "--prefix", "lundi", "--no-repeat-ngram-size", "3",
                                  "--beam", "3", "--disable-unk", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("lundi")
    streamed = runner.invoke(main, ["translate", export, text, "--stream", "--device", "cpu"])
    plain = runner.invoke(main, ["translate", export, text, "--device", "cpu"])
    assert streamed.exit_code == 0 and streamed.stdout == plain.stdout
    (tmp_path / "s.txt").write_text(f"{text}\n", encoding="utf-8")
    (tmp_path / "t.txt").write_text(plain.stdout, encoding="utf-8")
    scored = runner.invoke(main, ["score", export, "--source", str(tmp_path / "s.txt"), "--target",
                                  str(tmp_path / "t.txt"), "--tokens", "--device", "cpu"])
    assert scored.exit_code == 0, scored.output
    total, per_token = scored.stdout.strip().split("\t")
    assert float(total) == pytest.approx(sum(float(v) for v in per_token.split()), abs=1e-3)
    for bad in (["--sampling-topk", "3", "--beam", "2"], ["--suppress", "no-such-token"],
                ["--stream", "--beam", "2"], ["--sampling-topp", "0"]):
        failed = runner.invoke(main, ["translate", export, text, "--device", "cpu", *bad])
        assert failed.exit_code != 0 and "Traceback" not in failed.output, bad


def test_fused_options_match_the_step_loop(transformer, tmp_path: Path) -> None:
    from s2s_deploy.runtime.ort.generate import GraphEngine
    from s2s_deploy.transforms.fuse import GENERATE_FILE, add_to_manifest, build_generate, fuse_generate

    manifest, ort_backend, _ = transformer
    plain = {i.name for i in build_generate(manifest, True).graph.input}
    assert not plain & {"suppress_tokens", "prefix", "forced_eos"}  # off: the plain graph
    copy = tmp_path / "fused"
    shutil.copytree(manifest.directory, copy)
    fused = load_manifest(copy)
    add_to_manifest(fused, fuse_generate(fused, copy / GENERATE_FILE, options=True), beam=True, options=True)
    engine = GraphEngine(load_manifest(copy), device="cpu", threads=1)
    _, src, src_len = batch(manifest)
    e = ids(manifest, "e")
    for beam in (1, 3):
        for config in (SearchConfig(beam, max_len=40), SearchConfig(beam, max_len=40, prefix=ids(manifest, "le ")),
                       SearchConfig(beam, max_len=40, suppress_tokens=e, disable_unk=True),
                       SearchConfig(beam, max_len=40, bad_words_ids=(e,)),
                       SearchConfig(beam, max_len=9, forced_eos=True, min_len=3)):
            want = tokens_of(search(ort_backend, src, src_len, config))
            assert tokens_of(engine.search(src, src_len, config)) == want
    with pytest.raises(S2SError, match="no_repeat_ngram_size"):
        engine.search(src, src_len, SearchConfig(max_len=40, no_repeat_ngram_size=3))


def test_beam_options_with_a_narrow_first_step(transformer) -> None:
    """Beam search starts on one row per sentence: the options follow the rows through that
    step too, in a batch of many sentences."""
    manifest, ort_backend, torch_backend = transformer
    texts = (list(manifest.samples) * 10)[:10]
    src, src_len = encode_batch(texts, manifest.src_vocab)
    for config in (SearchConfig(4, 2, max_len=40, prefix=ids(manifest, "le ")),
                   SearchConfig(4, 2, max_len=40, no_repeat_ngram_size=2, repetition_penalty=1.2)):
        got = search(ort_backend, src, src_len, config)
        assert tokens_of(got) == tokens_of(search(torch_backend, src, src_len, config))
        if config.prefix:
            assert all(h.tokens[:3] == config.prefix for hyps in got for h in hyps)


def test_cli_fuse_options_flag(transformer, tmp_path: Path) -> None:
    manifest, _, _ = transformer
    copy = tmp_path / "export"
    shutil.copytree(manifest.directory, copy)
    result = CliRunner().invoke(main, ["fuse", str(copy), "--greedy-only", "--options"])
    assert result.exit_code == 0, result.output
    entry = load_manifest(copy).to_dict()["graphs"]["generate"]
    assert "options" in entry and {"suppress_tokens", "prefix", "forced_eos"} <= {i["name"] for i in entry["inputs"]}
    text = manifest.samples[0]
    graph = CliRunner().invoke(main, ["translate", str(copy), text, "--engine", "graph", "--prefix", "le ",
                                      "--device", "cpu"])
    loop = CliRunner().invoke(main, ["translate", str(copy), text, "--prefix", "le ", "--device", "cpu"])
    assert graph.exit_code == 0 and graph.stdout == loop.stdout and graph.stdout.startswith("le ")
    refused = CliRunner().invoke(main, ["translate", str(copy), text, "--engine", "graph", "--repetition-penalty",
                                        "1.2", "--device", "cpu"])
    assert refused.exit_code != 0 and "repetition_penalty" in refused.output
