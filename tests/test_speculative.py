"""Exact speculative greedy and the k-position decoder step it verifies drafts with.

Fast: the draft lookup, the vocabulary map, the refusals, ``decode_steps`` against k single
steps (with a rollback) and against ``forward`` in PyTorch, and speculative greedy against plain
greedy token for token on tiny random models in PyTorch (random weights repeat themselves, so
drafts are accepted and rolled back often), bare and with each log-prob option, prefix and prompt.
Slow (exports): the same in ONNX Runtime's step loop on the bundled trained transformer, tiny
Hugging Face Marian, BART, mBART and M2M100 folders at their own settings (forced BOS and EOS) and a
tiny Whisper (decoder prompt, prompt), the export's parity record, and the one-line refusals of an
export without the k-position step (an int8 copy's among them).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from s2s_deploy.architecture.registry import get_plugin
from s2s_deploy.errors import S2SError
from s2s_deploy.format.vocab import Vocabulary
from s2s_deploy.modeling.graphs import EncoderGraph, MultiStepGraph, StepGraph
from s2s_deploy.modeling.torch_backend import TorchBackend
from s2s_deploy.runtime.backend import Backend
from s2s_deploy.runtime.decoding import DecodingError, plain, prefixes_of, resolve
from s2s_deploy.runtime.options import StepOptions
from s2s_deploy.runtime.search import greedy, speculative_greedy
from s2s_deploy.runtime.speculative import MIN_BOUND, SAFETY, Accepting, draft, drift_bound, source_in_target

VOCAB = 39


# --- the draft lookup --------------------------------------------------------------------------


def test_draft_follows_the_longest_tail_found_latest() -> None:
    history = [5, 6, 7, 9, 5, 6, 7, 8, 1, 5, 6, 7]
    # the tail 5 6 7 was last followed by 8 1 (not by the earlier 9)
    assert draft(history, [], 2) == [8, 1]
    assert draft(history, [], 5) == [8, 1, 5, 6, 7]


def test_draft_reads_the_source_where_the_hypothesis_has_no_match() -> None:
    source = [11, 12, 13, 14, 15, -1]
    assert draft([3, 12, 13], source, 3) == [14, 15]  # -1 (no target token) is never drafted
    assert draft([3, 12, 13], [], 3) == []


def test_draft_falls_back_to_shorter_tails_and_respects_count() -> None:
    assert draft([4, 9, 2, 9], [], 3) == [2, 9]  # "2 9" and "4 9 2 9"... the 1-gram 9 was followed by 2
    assert draft([1, 2, 3], [7, 3, 8, 9], 1) == [8]
    assert draft([1, 2, 3], [7, 3, 8, 9], 0) == []
    assert draft([], [1, 2], 3) == []


def test_source_in_target_maps_shared_tokens_and_never_a_special() -> None:
    source = Vocabulary.build(["abc"])
    target = Vocabulary.build(["bcd"])
    mapped = source_in_target(source, target)
    for i, token in enumerate(source.tokens):
        if i in set(source.special_ids().values()):
            assert mapped[i] == -1
        elif token in target.tokens:
            assert target.tokens[mapped[i]] == token
        else:
            assert mapped[i] == -1
    assert (mapped >= 0).sum() == 2  # b and c


def test_drift_bound_has_a_floor_and_scales_the_measured_difference() -> None:
    assert drift_bound(None) == MIN_BOUND
    assert drift_bound(1e-7) == MIN_BOUND
    assert drift_bound(1e-4) == pytest.approx(SAFETY * 1e-4)


# --- tiny models in PyTorch ----------------------------------------------------------------------


def tiny(arch: str, **config: Any) -> tuple[Any, Any, Any]:
    plugin = get_plugin(arch)
    cfg = dataclasses.replace(plugin.preset(plugin.default_preset), **config)
    torch.manual_seed(0)
    model = plugin.build(cfg, VOCAB, VOCAB).eval()
    if arch == "transformer":  # sharper than the default init: random outputs without near-ties
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(3.0)
    return plugin, cfg, model


TINY = {
    "transformer": {"d_model": 32, "num_heads": 4, "ffn_hidden": 64, "max_len": 64},
    "bart": {"d_model": 32, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "max_position_embeddings": 64},
    "marian": {"d_model": 32, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "max_position_embeddings": 64},
}


@pytest.mark.parametrize("model", list(TINY))
def test_decode_steps_match_single_steps_with_rollback_and_forward(model: str) -> None:
    plugin, cfg, built = tiny(model, **TINY[model])
    memory, state = plugin.memory_specs(cfg), plugin.state_specs(cfg)
    encoder, step, multi = (EncoderGraph(built, memory, state), StepGraph(built, memory, state),
                            MultiStepGraph(built, memory, state))
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(4, VOCAB, (2, 7), generator=generator)
    src_len = torch.tensor([7, 4])
    tokens = torch.randint(4, VOCAB, (2, 7), generator=generator)
    with torch.no_grad():
        encoded = encoder(src, src_len)[: len(memory)]
        first = [torch.zeros(s.zeros_shape(2, 0)) for s in state]
        past, singles = first, []
        for t in range(7):
            out = step(tokens[:, t], torch.tensor(t), torch.arange(2), *encoded, *past)
            singles.append(out[0])
            past = list(out[1:1 + len(state)])
        singles_t = torch.stack(singles, 1)
        out = multi(tokens[:, :4], torch.tensor(0), torch.tensor(0), *encoded, *first)
        assert torch.allclose(out[0], singles_t[:, :4], atol=1e-4)
        # two of the four positions rejected: dropped inside the next call, which goes on from position 2
        again = multi(tokens[:, 2:], torch.tensor(2), torch.tensor(2), *encoded, *out[1:])
        assert torch.allclose(again[0], singles_t[:, 2:], atol=1e-4)
        assert all(a.shape == b.shape for a, b in zip(again[1:], past, strict=True))
        for grown, stepped in zip(again[1:], past, strict=True):
            assert torch.allclose(grown, stepped, atol=1e-4)
        whole = torch.log_softmax(built(src, src_len, tokens), dim=-1)
        assert torch.allclose(multi(tokens, torch.tensor(0), torch.tensor(0), *encoded, *first)[0], whole, atol=1e-4)


def torch_backend(arch: str, eos_bias: float = 0.0) -> TorchBackend:
    """A tiny random model; ``eos_bias`` raises EOS' logit (random weights almost never end)."""
    plugin, cfg, model = tiny(arch, **TINY[arch])
    vocab = Vocabulary.build(["abcdefghijklmnopqrstuvwxyz012345678"])
    assert len(vocab) == VOCAB
    if eos_bias:
        with torch.no_grad():
            bias = model.final_logits_bias[0] if hasattr(model, "final_logits_bias") else model.output.bias
            bias[vocab.eos_id] += eos_bias
    return TorchBackend(plugin, model, cfg, vocab, src_vocab=vocab)


def sources(count: int, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 12, count)
    src = np.zeros((count, lengths.max()), dtype=np.int64)
    for i, n in enumerate(lengths):
        src[i, :n] = rng.integers(4, VOCAB, n)
        src[i, n - 1] = 2  # eos
    return src, lengths.astype(np.int64)


@pytest.mark.parametrize("model", list(TINY))
@pytest.mark.parametrize("drafts", [1, 3, 6])
def test_speculative_greedy_is_plain_greedy_in_pytorch(model: str, drafts: int) -> None:
    backend = torch_backend(model)
    src, src_len = sources(12)
    config = plain(1, 40)
    expected = greedy(backend, src, src_len, config)
    counts = Accepting()
    found = speculative_greedy(backend, src, src_len, dataclasses.replace(config, speculative=drafts), counts)
    assert [h.tokens for h in found] == [h.tokens for h in expected]
    assert [h.finished for h in found] == [h.finished for h in expected]
    for got, want in zip(found, expected, strict=True):
        assert np.allclose(got.token_log_probs, want.token_log_probs, atol=2 * MIN_BOUND)
    assert counts.accepted > 0 and counts.accepted < counts.drafted  # both paths were taken
    assert counts.calls < sum(len(h.token_log_probs) for h in expected)


def test_a_near_tie_is_decided_by_plain_greedy() -> None:
    """With a margin no decision clears, every sentence is redone by plain greedy: the same tokens."""

    class Wide(TorchBackend):
        multi_step_drift = 1e3  # a bound of 1.6e4: no margin exceeds twice that

    plugin, cfg, model = tiny("transformer", **TINY["transformer"])
    vocab = Vocabulary.build(["abcdefghijklmnopqrstuvwxyz012345678"])
    backend = Wide(plugin, model, cfg, vocab, src_vocab=vocab)
    src, src_len = sources(4)
    counts = Accepting()
    found = speculative_greedy(backend, src, src_len, plain(1, 20, speculative=2), counts)
    assert counts.redone == 4
    assert [h.tokens for h in found] == [h.tokens for h in greedy(backend, src, src_len, plain(1, 20))]


EDITS = {
    "min_len": {"min_len": 9},
    "min_len, suppressed": {"min_len": 6, "suppress_tokens": (5, 9)},
    "forced_bos": {"forced_bos": 7},
    "forced_eos": {"forced_eos": True, "max_len": 12},
    "forced_bos and eos, per-sentence limits": {"forced_bos": 7, "forced_eos": True, "max_len_a": 1.0,
                                                "max_len_b": 2},
    "no_repeat_ngram": {"no_repeat_ngram_size": 2},
    "encoder_no_repeat_ngram": {"encoder_no_repeat_ngram_size": 1},
    "repetition_penalty": {"repetition_penalty": 1.3},
    "bans": {"suppress_tokens": (5, 9), "begin_suppress_tokens": (2, 11), "bad_words_ids": ((12, 13), (14,)),
             "disable_unk": True},
    "prefix": {"prefix": (7, 8, 9)},
    "prefix per sentence": {"prefix": tuple((4 + i % 5, 20 + i % 3) for i in range(12))},
    "decoder_prompt": {"decoder_prompt": (5, 6, 7)},
    "decoder_prompt, no-speech read": {"decoder_prompt": (5, 6), "no_speech_token": 9},
    "prompt and decoder_prompt": {"prompt": (11, 12, 13, 14, 15, 16, 17), "prompt_start": 20,
                                  "decoder_prompt": (5, 6), "no_speech_token": 9, "forced_eos": True},
}


ENDING = {"transformer": 24.0, "bart": 0.2}
"""EOS biases at which the tiny models' sentences end early, some before 9 tokens, some never."""


@pytest.mark.parametrize("model", list(ENDING))
@pytest.mark.parametrize("name", list(EDITS))
def test_speculative_greedy_takes_greedys_edits_and_prompts(model: str, name: str) -> None:
    """Each option edits each position of a k-position pass as plain greedy's step there: the same
    tokens, prompts and no-speech probabilities (within the bound)."""
    backend = torch_backend(model, ENDING[model])
    src, src_len = sources(12)
    config = plain(**{"max_len": 30, **EDITS[name]})
    expected = greedy(backend, src, src_len, config)
    counts = Accepting()
    found = speculative_greedy(backend, src, src_len, dataclasses.replace(config, speculative=3), counts)
    assert [h.tokens for h in found] == [h.tokens for h in expected]
    assert [(h.finished, h.prompt) for h in found] == [(h.finished, h.prompt) for h in expected]
    for got, want in zip(found, expected, strict=True):
        assert np.allclose(got.token_log_probs, want.token_log_probs, atol=2 * MIN_BOUND)
        assert (got.no_speech_prob is None) == (want.no_speech_prob is None)
        if want.no_speech_prob is not None:
            assert got.no_speech_prob == pytest.approx(want.no_speech_prob, abs=MIN_BOUND)
    assert counts.redone <= 3  # a near-tie sends a sentence to plain greedy: rare, never the rule
    if model == "transformer" and name != "no_repeat_ngram":  # its drafts repeat the hypothesis' n-grams
        assert counts.accepted > 0  # (the tiny BART seldom repeats itself: nothing to draft from)


STEP_BOUNDED = {"forced_bos", "forced_eos", "prefix", "min_len", "max_len", "max_len_a", "max_len_b", "decoder_prompt",
                "prompt", "prompt_start", "no_speech_token"}
"""Options that edit some steps only (or none): a pass past them is ranked in the graph."""


@pytest.mark.parametrize("name", list(EDITS))
def test_steps_no_option_edits_are_told_apart(name: str) -> None:
    """Where ``edits_between`` says no option edits a step, ``edit`` leaves its log-probs as they are
    (so the in-graph TopK ranks them as plain greedy's options would); it says so past a forced BOS,
    a prefix or min_len, before a forced EOS, and never for an option of every step."""
    rng = np.random.default_rng(0)
    src, src_len = sources(1)
    config = plain(**{"max_len": 30, **EDITS[name]})
    if len(prefixes_of(config)) > 1:
        config = dataclasses.replace(config, prefix=prefixes_of(config)[0])
    edits = StepOptions(config, src, src_len, 2, VOCAB, 3)
    idle = []
    for t in range(30):
        logits = rng.standard_normal((1, VOCAB)).astype(np.float32)
        log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        if not edits.edits_between(t, t):
            idle.append(t)
            assert np.array_equal(edits.edit(log_probs, rng.integers(4, VOCAB, (1, t)), t), log_probs)
    assert bool(idle) == (set(EDITS[name]) <= STEP_BOUNDED)
    for first in range(30):  # a pass's steps together: edited where any one of them is
        for last in range(first, 30):
            assert edits.edits_between(first, last) == any(t not in idle for t in range(first, last + 1))


def test_speculative_edits_change_the_tokens() -> None:
    """The edits above are not idle: each option set moves some token, in one tiny model or the
    other, against plain greedy without it."""
    src, src_len = sources(12)
    moved: set[str] = set()
    for model, eos_bias in ENDING.items():
        backend = torch_backend(model, eos_bias)
        bare = [h.tokens for h in greedy(backend, src, src_len, plain(max_len=30))]
        for name, options in EDITS.items():
            edited = speculative_greedy(backend, src, src_len, plain(**{"max_len": 30, "speculative": 3, **options}))
            if [h.tokens for h in edited] != bare:
                moved.add(name)
    assert moved == set(EDITS)


@pytest.mark.parametrize("options", [{"beam_size": 2}, {"sampling_topk": 0},
                                     {"timestamps": True, "timestamp_begin": 30},
                                     {"temperature": (0.0, 0.2)}, {"log_prob_threshold": -1.0},
                                     {"decoder_prompt": (5, -1)}])
def test_speculative_refuses_what_it_cannot_decode_exactly(options: dict[str, Any]) -> None:
    backend = torch_backend("transformer")
    src, src_len = sources(1)
    config = dataclasses.replace(plain(max(2, options.get("beam_size", 1)) if "beam_size" in options else 1, 10),
                                 speculative=2, **{k: v for k, v in options.items() if k != "beam_size"})
    with pytest.raises(S2SError) as refused:
        speculative_greedy(backend, src, src_len, config)
    assert "\n" not in str(refused.value)


def test_a_model_without_the_k_position_step_is_refused() -> None:
    plugin = get_plugin("gru")
    cfg = plugin.preset(plugin.default_preset)
    model = plugin.build(cfg, VOCAB, VOCAB).eval()
    assert not model.multi_step
    vocab = Vocabulary.build(["abcdefghijklmnopqrstuvwxyz012345678"])
    backend: Backend = TorchBackend(plugin, model, cfg, vocab)
    src, src_len = sources(1)
    with pytest.raises(S2SError, match="no k-position decoder step"):
        speculative_greedy(backend, src, src_len, plain(1, 10, speculative=2))


# --- exports: ONNX Runtime's step loop ---------------------------------------------------------


def task_sources(manifest: Any, count: int) -> tuple[np.ndarray, np.ndarray]:
    from s2s_deploy.runtime.translator import encode_batch
    from s2s_deploy.train.tasks import generate_pairs

    return encode_batch([pair.source for pair in generate_pairs("en-fr", count, seed=7)], manifest.src_vocab, None)


@pytest.fixture(scope="module")
def multi_transformer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The bundled Transformer exported with ``multi_step`` (opt-in: the shared exports lack it)."""
    from s2s_deploy.architecture.registry import get_plugin
    from s2s_deploy.export.exporter import export_model
    from s2s_deploy.export.sources import load_source
    from s2s_deploy.format.manifest import load_manifest

    root = tmp_path_factory.mktemp("multi")
    plugin = get_plugin("transformer")
    source = load_source(plugin, None, workdir=root)
    export_model(plugin, source.model, source.config, source.src_vocab, source.tgt_vocab, root / "transformer",
                 checkpoint_path=source.checkpoint_path, source=source.description, samples=source.samples,
                 training=source.info, multi_step=True)
    return load_manifest(root / "transformer")


@pytest.mark.slow
def test_bundled_transformer_export_speculates_exactly(multi_transformer: Any) -> None:
    from s2s_deploy.runtime.ort.backend import OrtBackend

    manifest = multi_transformer
    assert manifest.decoder_multi is not None
    assert manifest.multi_step_max_abs_diff is not None and manifest.multi_step_max_abs_diff < 1e-4
    backend = OrtBackend(manifest, device="cpu", threads=1)
    src, src_len = task_sources(manifest, 60)
    config = resolve(manifest, {})
    expected = greedy(backend, src, src_len, config)
    for drafts in (1, 3, 6):
        counts = Accepting()
        found = speculative_greedy(backend, src, src_len, resolve(manifest, {"speculative": drafts}), counts)
        assert [h.tokens for h in found] == [h.tokens for h in expected]
        bound = drift_bound(manifest.multi_step_max_abs_diff)
        for got, want in zip(found, expected, strict=True):
            assert np.allclose(got.token_log_probs, want.token_log_probs, rtol=0, atol=bound)
        assert counts.accepted > 0
    # batched or alone, a sentence's speculative result is the same to the bit
    alone = [speculative_greedy(backend, src[i:i + 1], src_len[i:i + 1], resolve(manifest, {"speculative": 3}))[0]
             for i in range(5)]
    assert alone == speculative_greedy(backend, src[:5], src_len[:5], resolve(manifest, {"speculative": 3}))


@pytest.mark.slow
def test_translator_takes_the_option_and_refuses_it_in_one_line(multi_transformer: Any, exports: Any,
                                                                tmp_path: Path) -> None:
    from s2s_deploy.runtime.translator import Translator
    from s2s_deploy.transforms.quantize import quantize_export

    manifest = multi_transformer
    translator = Translator(manifest.directory, device="cpu", threads=1)
    texts = list(manifest.samples[:8])
    assert [t.text for t in translator(texts, speculative=4)] == [t.text for t in translator(texts)]
    with pytest.raises(DecodingError, match="greedy only") as refused:
        translator(texts[:1], beam=2, speculative=4)
    assert "\n" not in str(refused.value)
    report = quantize_export(manifest, "int8", tmp_path / "int8")
    assert report.multi_step is not None and "not carried over" in report.multi_step  # the report says why
    quantized = Translator(tmp_path / "int8", device="cpu", threads=1)
    assert quantized.manifest.decoder_multi is None
    with pytest.raises(DecodingError, match=r"no k-position decoder step .*int8 copies drop it") as refused:
        quantized(texts[:1], speculative=4)
    assert "\n" not in str(refused.value)
    _, plain_export = exports.get("transformer")  # exported without --multi-step
    assert plain_export.decoder_multi is None
    with pytest.raises(DecodingError, match="no k-position decoder step"):
        Translator(plain_export.directory, device="cpu", threads=1)(texts[:1], speculative=4)


def hf_folder(root: Path, family: str) -> Path:
    """A tiny random family folder as tests/test_hf_families.py builds them, its generation settings
    (a forced BOS) included."""
    import transformers
    from test_hf_families import BY_TYPE, favour_eos

    row = BY_TYPE[family]
    torch.manual_seed(0)
    model = getattr(transformers, row.model_class)(row.config()).eval()
    favour_eos(model, row.eos_strength)
    for key, value in row.generation:
        setattr(model.generation_config, key, value)
    folder = root / family
    model.save_pretrained(folder)
    row.tokenizer(folder)
    return folder


def same_as_greedy(backend: Backend, src: np.ndarray, src_len: np.ndarray, config: Any, drafts: int) -> Accepting:
    """Speculative greedy's hypotheses are plain greedy's: tokens, endings and prompts equal, log-probs
    and no-speech probabilities within the drift bound. Returns the acceptance."""
    expected = greedy(backend, src, src_len, config)
    counts = Accepting()
    found = speculative_greedy(backend, src, src_len, dataclasses.replace(config, speculative=drafts), counts)
    assert [h.tokens for h in found] == [h.tokens for h in expected]
    assert [(h.finished, h.prompt) for h in found] == [(h.finished, h.prompt) for h in expected]
    bound = drift_bound(backend.multi_step_drift)
    for got, want in zip(found, expected, strict=True):
        assert np.allclose(got.token_log_probs, want.token_log_probs, rtol=0, atol=bound)
        assert (got.no_speech_prob is None) == (want.no_speech_prob is None)
        if want.no_speech_prob is not None:
            assert got.no_speech_prob == pytest.approx(want.no_speech_prob, abs=bound)
    return counts


OWN_EDITS = {"marian": {}, "bart": {"forced_bos": 0, "forced_eos": True}, "mbart": {"forced_eos": True},
             "m2m_100": {"forced_bos": "NLLB_TARGET"}}
"""What each family's own settings (its generation config, as exported) edit: checked, so the test
speculates through them (NLLB_TARGET: tests/test_hf_families.py's target language id)."""


@pytest.mark.slow
@pytest.mark.parametrize("family", list(OWN_EDITS))
def test_hf_families_speculate_exactly_at_their_own_settings(family: str, hf_exports: Any, tmp_path: Path) -> None:
    """Forced BOS (BART, NLLB's target language), forced EOS at the length limit, min_len and a
    decoder prompt: the exports' own settings and more, speculated token for token."""
    pytest.importorskip("transformers")
    from test_hf_families import NLLB_TARGET

    from s2s_deploy.format.manifest import load_manifest
    from s2s_deploy.runtime.ort.backend import OrtBackend

    manifest = load_manifest(hf_exports.get(hf_folder(tmp_path, family), "--multi-step"))
    assert manifest.decoder_multi is not None
    backend = OrtBackend(manifest, device="cpu", threads=1)
    rng = np.random.default_rng(0)
    rows = [[int(t) for t in rng.integers(4, 40, rng.integers(3, 12))] + [manifest.src_vocab.eos_id]
            for _ in range(16)]
    src = np.full((len(rows), max(map(len, rows))), manifest.src_vocab.pad_id, dtype=np.int64)
    for i, row in enumerate(rows):
        src[i, :len(row)] = row
    src_len = np.array([len(r) for r in rows], dtype=np.int64)
    own = resolve(manifest, {"max_len": 16})
    for name, value in OWN_EDITS[family].items():
        assert getattr(own, name) == (NLLB_TARGET if value == "NLLB_TARGET" else value)
    accepted = 0
    for settings in ({}, {"min_len": 10}, {"decoder_prompt": (10, 11, 12)}):
        config = resolve(manifest, {"max_len": 16, **settings})
        accepted += same_as_greedy(backend, src, src_len, config, 4).accepted
    assert accepted > 0


@pytest.mark.slow
def test_prompted_whisper_speculates_exactly(hf_exports: Any, tmp_path: Path) -> None:
    """A Whisper-style export at its own settings (the decoder prompt, suppressed tokens, the
    no-speech probability read) and with a ``prompt`` fed before the start token."""
    pytest.importorskip("transformers")
    from test_hf_whisper import PROMPT_IDS, save_whisper

    from s2s_deploy.format.manifest import load_manifest
    from s2s_deploy.runtime.ort.backend import OrtBackend
    from s2s_deploy.runtime.transcriber import Transcriber

    hf_dir = tmp_path / "whisper-hf"
    audio, _ = save_whisper(hf_dir)
    out = hf_exports.get(hf_dir, "--multi-step")
    manifest = load_manifest(out)
    assert manifest.decoder_multi is not None
    features = np.stack([Transcriber(out, device="cpu").features(a) for a in audio])
    src_len = np.full(len(features), features.shape[-1], dtype=np.int64)
    backend = OrtBackend(manifest, device="cpu", threads=1)
    own = resolve(manifest, {"max_len": 20})
    assert own.decoder_prompt and own.suppress_tokens and own.no_speech_token >= 0
    accepted = same_as_greedy(backend, features, src_len, own, 4).accepted
    prompted = resolve(manifest, {"max_len": 20, "prompt": list(PROMPT_IDS)})
    accepted += same_as_greedy(backend, features, src_len, prompted, 4).accepted
    assert accepted > 0
