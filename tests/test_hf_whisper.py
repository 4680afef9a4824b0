"""Hugging Face Whisper against ``transformers``' own ``WhisperForConditionalGeneration.generate``.

A tiny random Whisper (2+2 layers, d_model 64, 128 ids with Whisper's special tokens placed at
100..107 and 127: ``<|notimestamps|>`` last, so no id is a timestamp; 80 mel bins; a 1-second window
of 100 frames for ``max_source_positions`` 50) is saved with ``save_pretrained`` beside a
``WhisperFeatureExtractor``'s ``preprocessor_config.json`` and a generation config that names the
language, the task, ``suppress_tokens`` and ``begin_suppress_tokens``, with a word-level
``tokenizer.json`` holding Whisper's special token strings at their ids (``w<id>`` elsewhere), so
language and task codes resolve; no network. It is exported with ``export --hf``, and again with
the language and task unset (``generate`` then detects the language), and 20 synthetic clips,
featurised by the torch-free front end, must decode token-identically to ``generate`` on the same
features, greedy and beam 4, 20 new tokens: as exported, with another language, with another task,
and detecting the language.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from s2s_deploy.cli import main
from s2s_deploy.errors import S2SError

transformers = pytest.importorskip("transformers")

VOCAB = 128
EOS = 100  # <|endoftext|>, also pad and bos, as in Whisper's own folders
SOT = 101  # <|startoftranscript|>
EN, FR = 102, 103
TRANSLATE, TRANSCRIBE = 104, 105
NO_SPEECH, PREV = 106, 107
NO_TIMESTAMPS = VOCAB - 1  # last: generate reads every id above it as a timestamp and cuts segments there
SPECIAL_TOKENS = {EOS: "<|endoftext|>", SOT: "<|startoftranscript|>", EN: "<|en|>", FR: "<|fr|>",
                  TRANSLATE: "<|translate|>", TRANSCRIBE: "<|transcribe|>", NO_SPEECH: "<|nospeech|>",
                  PREV: "<|startofprev|>", NO_TIMESTAMPS: "<|notimestamps|>"}
SUPPRESS = [1, 2, 7, SOT, EN, FR, TRANSLATE, TRANSCRIBE, NO_SPEECH, PREV]
BEGIN_SUPPRESS = [5, EOS]
MAX_NEW = 20
INPUTS = 20
RATE = 16000


def whisper_config(vocab: int = VOCAB) -> Any:
    return transformers.WhisperConfig(
        vocab_size=vocab, num_mel_bins=80, d_model=64, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
        max_source_positions=50, max_target_positions=64, pad_token_id=EOS, bos_token_id=EOS, eos_token_id=EOS,
        decoder_start_token_id=SOT, suppress_tokens=SUPPRESS, begin_suppress_tokens=BEGIN_SUPPRESS,
        init_std=0.3)  # peaked, tie-free logits (0.02 gives near-uniform ones, where rounding picks)


def lean(model: Any, features: torch.Tensor, rows: list[int], strength: float, keep: float = 0.0) -> None:
    """Random weights almost never pick EOS (or, with timestamps, end a segment): point each of ``rows``'
    output rows (``keep`` of it kept) along the mean state the output layer reads, so its logit is about
    ``strength`` times a typical best one and sentences and segments end at varied lengths."""
    head = model.get_output_embeddings()
    seen = []
    hook = head.register_forward_hook(lambda _m, args, out: seen.append((args[0], out)))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        model(input_features=features[:8], decoder_input_ids=torch.randint(0, 100, (8, 12), generator=generator))
    hook.remove()
    states, logits = seen[0][0].reshape(-1, seen[0][0].shape[-1]), seen[0][1].reshape(-1, head.weight.shape[0])
    mean = states.mean(0)
    with torch.no_grad():
        for row in rows:
            head.weight[row] = head.weight[row] * keep + mean * (strength * logits.max(-1).values.median()) / mean.dot(
                mean)


def balance_languages(model: Any, features: torch.Tensor) -> None:
    """Random weights may detect one language for every clip: then move ``<|fr|>``'s output row along
    the first step's mean state so that it wins on half the clips, halfway between two clips' leads
    (not at one: a tie would leave the choice to rounding)."""
    head = model.get_output_embeddings()
    seen = []
    hook = head.register_forward_hook(lambda _m, args, _out: seen.append(args[0][:, -1]))
    with torch.no_grad():
        model(input_features=features, decoder_input_ids=torch.full((len(features), 1), SOT))
    hook.remove()
    states = seen[0]
    mean = states.mean(0)
    with torch.no_grad():
        lead = states @ (head.weight[EN] - head.weight[FR])
        if (lead >= 0).all() or (lead < 0).all():
            ratios = (lead / (states @ mean)).sort().values
            head.weight[FR] += mean * (ratios[len(ratios) // 2 - 1] + ratios[len(ratios) // 2]) / 2


def tokenizer_json(folder: Path, vocab: int = VOCAB, special: dict[int, str] = SPECIAL_TOKENS) -> None:
    """One id per word: Whisper's special tokens at their ids (special), ``w<id>`` elsewhere; read by
    ``AutoTokenizer`` as it is (``test_hf_families.write_word_level``)."""
    from test_hf_families import write_word_level

    write_word_level(folder, [special.get(i, f"w{i}") for i in range(vocab)], "$A <|endoftext|>",
                     ("<|endoftext|>",), unk="<|endoftext|>")


def clips(count: int = INPUTS, low: float = 0.3, high: float = 1.4, seed: int = 0) -> list[np.ndarray]:
    """Seeded synthetic audio, chirps in noise, ``low`` to ``high`` seconds long (longer than the window is cut
    unless timestamps seek through it)."""
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(count):
        t = np.arange(int(RATE * rng.uniform(low, high))) / RATE
        f0, f1 = rng.uniform(100, 3000, 2)
        audio = 0.3 * np.sin(2 * np.pi * (f0 + (f1 - f0) * t / (2 * t[-1])) * t) + rng.normal(0, rng.uniform(0.01, 0.2),
                                                                                                len(t))
        found.append(audio.astype(np.float32))
    return found



def one_second_extractor() -> Any:
    """transformers' Whisper feature extractor of a one-second window (100 frames), as the tiny models read."""
    return transformers.WhisperFeatureExtractor(feature_size=80, sampling_rate=RATE, hop_length=160, chunk_length=1,
                                                n_fft=400)


def save_folder(hf_dir: Path, model: Any, extractor: Any, vocab: int = VOCAB,
                special: dict[int, str] = SPECIAL_TOKENS) -> None:
    """``model`` saved as a multilingual Whisper's hub folder (languages and tasks by code, French
    transcription) with ``extractor``'s config and a tokenizer of ``vocab`` ids."""
    generation = model.generation_config
    generation.lang_to_id = {"<|en|>": EN, "<|fr|>": FR}
    generation.task_to_id = {"translate": TRANSLATE, "transcribe": TRANSCRIBE}
    generation.no_timestamps_token_id = NO_TIMESTAMPS
    generation.is_multilingual = True
    generation.language, generation.task = "fr", "transcribe"
    generation._from_model_config = False  # as a hub folder's: transformers drops these keys otherwise
    model.save_pretrained(hf_dir)
    extractor.save_pretrained(hf_dir)
    tokenizer_json(hf_dir, vocab, special)


def save_whisper(hf_dir: Path) -> tuple[list[np.ndarray], torch.Tensor]:
    """The tiny Whisper (no timestamp ids, no alignment heads) saved into ``hf_dir``, EOS leaned and the
    languages balanced on ``clips()``: those clips and transformers' features of them."""
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(whisper_config()).eval()
    extractor = one_second_extractor()
    audio = clips()
    features = torch.from_numpy(np.stack([extractor(a, sampling_rate=RATE)["input_features"][0] for a in audio]))
    lean(model, features, [EOS], 0.85)
    balance_languages(model, features)
    save_folder(hf_dir, model, extractor)
    return audio, features


@pytest.fixture(scope="module")
def whisper(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from s2s_deploy.runtime.transcriber import Transcriber

    root = tmp_path_factory.mktemp("whisper")
    hf_dir, out = root / "whisper-hf", root / "whisper"
    audio, features = save_whisper(hf_dir)
    detect_dir, detect_out = root / "whisper-detect-hf", root / "whisper-detect"
    shutil.copytree(hf_dir, detect_dir)
    raw = json.loads((detect_dir / "generation_config.json").read_text())
    raw.update(language=None, task=None)  # generate detects the language and appends no task token
    (detect_dir / "generation_config.json").write_text(json.dumps(raw))
    for folder, target in ((hf_dir, out), (detect_dir, detect_out)):
        result = CliRunner().invoke(main, ["export", "--hf", str(folder), "--out", str(target)])
        assert result.exit_code == 0, result.output
    loaded = transformers.WhisperForConditionalGeneration.from_pretrained(hf_dir, local_files_only=True).eval()
    detecting = transformers.WhisperForConditionalGeneration.from_pretrained(detect_dir, local_files_only=True).eval()
    transcriber = Transcriber(out, device="cpu")
    ours = np.stack([transcriber.features(a) for a in audio])
    return {"hf_dir": hf_dir, "out": out, "model": loaded, "transcriber": transcriber, "features": ours,
            "hf_features": features, "detect_dir": detect_dir, "detect_out": detect_out, "detecting": detecting,
            "detector": Transcriber(detect_out, device="cpu")}


def generated(model: Any, features: np.ndarray, beams: int, **settings: Any) -> list[tuple[int, ...]]:
    """``generate``'s new tokens up to the first EOS (it returns them after the prompt, EOS-padded)."""
    with torch.no_grad():
        out = model.generate(input_features=torch.from_numpy(features), num_beams=beams, max_new_tokens=MAX_NEW,
                             **settings)
    return [tuple(row[: row.index(EOS)] if EOS in row else row) for row in out.tolist()]


def searched(transcriber: Any, features: np.ndarray, beams: int, **options: Any) -> list[Any]:
    """Our best hypothesis per clip, at ``generate``'s settings but the options."""
    config = transcriber.translator.search_config(beams, 1, MAX_NEW, **options)
    src_len = np.full(len(features), features.shape[-1], dtype=np.int64)
    return [hyps[0] for hyps in transcriber.translator.engine.search(features, src_len, config)]


def decoded(whisper: dict[str, Any], beams: int, rows: int = INPUTS, **options: Any) -> list[tuple[int, ...]]:
    return [h.tokens for h in searched(whisper["transcriber"], whisper["features"][:rows], beams, **options)]


def test_manifest_holds_whisper_decoding_rules(whisper: dict[str, Any]) -> None:
    from s2s_deploy.format.manifest import load_manifest

    manifest = load_manifest(whisper["out"])
    search = manifest.search
    assert search["decoder_prompt"] == [FR, TRANSCRIBE, NO_TIMESTAMPS]
    assert search["suppress_tokens"] == SUPPRESS and search["begin_suppress_tokens"] == BEGIN_SUPPRESS
    assert manifest.decoder_start_id == SOT and manifest.eos_id == EOS
    spec = manifest.encoder_input
    assert spec.shape == (80, "frames") and dict(spec.frontend)["chunk_length"] == 1
    assert not any(key.startswith("sampling") for key in search)


def test_front_end_agrees_with_whisper_feature_extractor(whisper: dict[str, Any]) -> None:
    assert whisper["features"].shape == (INPUTS, 80, 100)
    np.testing.assert_allclose(whisper["features"], whisper["hf_features"].numpy(), atol=2e-3)


@pytest.mark.parametrize("beams", [1, 4])
def test_whisper_matches_generate(whisper: dict[str, Any], beams: int) -> None:
    ours = decoded(whisper, beams)
    theirs = generated(whisper["model"], whisper["features"], beams)
    assert ours == theirs
    assert decoded(whisper, beams, rows=5) == theirs[:5]  # beam search steps differently below 8 sentences
    assert any(len(row) < MAX_NEW for row in theirs) and any(len(row) == MAX_NEW for row in theirs)
    assert len(set(theirs)) > INPUTS // 2  # the clips decode differently: the encoder is read


def test_the_prompt_and_suppression_are_what_generate_applies(whisper: dict[str, Any]) -> None:
    """Without the export's rules, ours decodes differently: each rule is doing work here."""
    theirs = generated(whisper["model"], whisper["features"], 1)
    assert decoded(whisper, 1, decoder_prompt=[EN, TRANSCRIBE, NO_TIMESTAMPS]) != theirs
    assert decoded(whisper, 1, decoder_prompt=[EN, TRANSCRIBE, NO_TIMESTAMPS]) == generated(
        whisper["model"], whisper["features"], 1, language="en")
    assert all(row[:1] not in ([5], [EOS]) for row in theirs)
    assert not any(set(row) & set(SUPPRESS) for row in theirs)


@pytest.mark.parametrize("beams", [1, 4])
def test_language_and_task_by_code_match_generate(whisper: dict[str, Any], beams: int) -> None:
    """``target_lang`` replaces the prompt's language token, ``task`` its task token, as ``generate``'s
    ``language`` and ``task`` do."""
    model, features = whisper["model"], whisper["features"]
    english = searched(whisper["transcriber"], features, beams, target_lang="en")
    assert {h.prompt for h in english} == {(EN, TRANSCRIBE, NO_TIMESTAMPS)}
    assert [h.tokens for h in english] == generated(model, features, beams, language="en")
    translated = searched(whisper["transcriber"], features, beams, task="translate")
    assert {h.prompt for h in translated} == {(FR, TRANSLATE, NO_TIMESTAMPS)}
    assert [h.tokens for h in translated] == generated(model, features, beams, task="translate")


@pytest.mark.parametrize("beams", [1, 4])
def test_language_detection_matches_generate(whisper: dict[str, Any], beams: int) -> None:
    """An export whose folder leaves the language open detects it per clip from the first step, as
    ``generate`` does (``detect_language``), and appends no task token; both languages occur."""
    from s2s_deploy.format.manifest import load_manifest

    manifest = load_manifest(whisper["detect_out"])
    assert manifest.search["decoder_prompt"] == [-1, NO_TIMESTAMPS]
    assert manifest.tgt_vocab.languages == (EN, FR) and manifest.tgt_vocab.tasks == (TRANSLATE, TRANSCRIBE)
    model, features = whisper["detecting"], whisper["features"]
    ours = searched(whisper["detector"], features, beams)
    assert [h.tokens for h in ours] == generated(model, features, beams)
    detected = model.detect_language(torch.from_numpy(features)).tolist()
    assert [h.prompt[0] for h in ours] == detected and set(detected) == {EN, FR}
    assert all(h.prompt == (h.prompt[0], NO_TIMESTAMPS) for h in ours)
    if beams == 1:  # a task goes right after the open slot, where generate puts it
        translated = searched(whisper["detector"], features, 1, task="translate")
        assert [h.tokens for h in translated] == generated(model, features, 1, task="translate")
        assert [h.prompt for h in translated] == [(lang, TRANSLATE, NO_TIMESTAMPS) for lang in detected]
        detector = whisper["detector"]
        languages = [t.language for t in detector.decode(list(features), detector.translator.search_config())]
        assert languages == [{EN: "en", FR: "fr"}[i] for i in detected]


@pytest.mark.parametrize(("out", "hf_dir"), [("out", "hf_dir"), ("detect_out", "detect_dir")])
def test_parity_reference_runs_on_features(whisper: dict[str, Any], out: str, hf_dir: str) -> None:
    result = CliRunner().invoke(main, ["parity", str(whisper[out]), "--reference", str(whisper[hf_dir])])
    assert result.exit_code == 0 and "parity: PASS" in result.output, result.output


def test_transcribe_takes_language_and_task_codes(whisper: dict[str, Any], tmp_path: Path) -> None:
    import soundfile

    path = tmp_path / "clip.wav"
    soundfile.write(path, clips(1, high=1.0)[0], RATE)  # within the window
    features = whisper["transcriber"].features(str(path))[None]
    result = CliRunner().invoke(main, ["transcribe", str(whisper["out"]), str(path), "--quiet"])
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == [f"w{i}" for i in generated(whisper["model"], features, 1)[0]]
    out = tmp_path / "out.json"
    result = CliRunner().invoke(main, ["transcribe", str(whisper["out"]), str(path), "--quiet", "--language", "en",
                                       "--task", "translate", "--output", str(out)])
    assert result.exit_code == 0, result.output
    [row] = json.loads(out.read_text())
    [want] = whisper["transcriber"]([str(path)], target_lang="en", task="translate")
    assert row["language"] == want.language == "en" and row["text"] == want.text
    assert want.text.split() == [f"w{i}" for i in generated(whisper["model"], features, 1, language="en",
                                                            task="translate")[0]]
    from s2s_deploy.serve.app import parse_query

    config = parse_query({"target_lang": "en", "task": "translate"}, whisper["transcriber"].translator, 4)
    assert config.decoder_prompt == (EN, TRANSLATE, NO_TIMESTAMPS)
    result = CliRunner().invoke(main, ["transcribe", str(whisper["out"]), str(path), "--language", "de"])
    assert result.exit_code == 1 and result.output == "error: unknown target_lang 'de'; known: en, fr\n"


@pytest.mark.parametrize(("change", "message"), [
    ({"return_timestamps": True}, "timestamps"),
    ({"no_speech_threshold": 0.6}, "no_speech_threshold"),
    ({"sequence_bias": [[[3], 1.0]]}, "sequence_bias"),
])
def test_export_refuses_what_it_does_not_reproduce(whisper: dict[str, Any], tmp_path: Path,
                                                   change: dict[str, Any], message: str) -> None:
    folder = tmp_path / "hf"
    shutil.copytree(whisper["hf_dir"], folder)
    raw = json.loads((folder / "generation_config.json").read_text())
    raw.update(change)
    (folder / "generation_config.json").write_text(json.dumps(raw))
    result = CliRunner().invoke(main, ["export", "--hf", str(folder), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and result.output.startswith("error:")


def test_export_refuses_detection_without_language_tokens(whisper: dict[str, Any], tmp_path: Path) -> None:
    folder = tmp_path / "hf"
    shutil.copytree(whisper["detect_dir"], folder)
    (folder / "tokenizer.json").unlink()
    result = CliRunner().invoke(main, ["export", "--hf", str(folder), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and "tokenizer.json" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and result.output.startswith("error:")


def test_export_refuses_a_window_the_encoder_does_not_read(whisper: dict[str, Any], tmp_path: Path) -> None:
    folder = tmp_path / "hf"
    shutil.copytree(whisper["hf_dir"], folder)
    raw = json.loads((folder / "preprocessor_config.json").read_text())
    raw["chunk_length"] = 2
    (folder / "preprocessor_config.json").write_text(json.dumps(raw))
    result = CliRunner().invoke(main, ["export", "--hf", str(folder), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and "exactly 100" in result.output, result.output
    (folder / "preprocessor_config.json").unlink()
    result = CliRunner().invoke(main, ["export", "--hf", str(folder), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and "preprocessor_config.json" in result.output, result.output


def test_timestamps_need_timestamp_tokens(whisper: dict[str, Any], tmp_path: Path) -> None:
    """This vocabulary ends at ``<|notimestamps|>``: the export sets no ``timestamp_begin``, and asking for
    timestamps is one line (tests/test_hf_whisper_timestamps.py has a vocabulary with them)."""
    import soundfile

    from s2s_deploy.format.manifest import load_manifest

    assert "timestamp_begin" not in load_manifest(whisper["out"]).search
    path = tmp_path / "clip.wav"
    soundfile.write(path, clips(1, high=1.0)[0], RATE)  # within the window
    result = CliRunner().invoke(main, ["transcribe", str(whisper["out"]), str(path), "--timestamps"])
    assert result.exit_code == 1 and result.output == ("error: timestamps: this export has no timestamp tokens (its "
                                                       "search block sets no timestamp_begin)\n")


PROMPT = "w12 w40 w77 w3 w91"
PROMPT_IDS = (12, 40, 77, 3, 91)


def prompt_ids(ids: tuple[int, ...] = PROMPT_IDS) -> torch.Tensor:
    """What ``WhisperProcessor.get_prompt_ids`` makes: ``<|startofprev|>``, then the text's ids."""
    return torch.tensor([PREV, *ids])


@pytest.mark.parametrize("beams", [1, 4])
def test_prompt_matches_generate(whisper: dict[str, Any], beams: int) -> None:
    """``prompt`` (text, or ids) is ``generate(prompt_ids=...)``: fed before ``<|startoftranscript|>``,
    stripped from the output, the export's decoder prompt unchanged after it."""
    model, features = whisper["model"], whisper["features"]
    theirs = generated(model, features, beams, prompt_ids=prompt_ids())
    ours = searched(whisper["transcriber"], features, beams, prompt=PROMPT)
    assert [h.tokens for h in ours] == theirs
    assert {h.prompt for h in ours} == {(FR, TRANSCRIBE, NO_TIMESTAMPS)}
    assert theirs != generated(model, features, beams)  # the prompt is read
    assert decoded(whisper, beams, rows=5, prompt=list(PROMPT_IDS)) == theirs[:5]


@pytest.mark.parametrize("beams", [1, 4])
def test_prompt_with_language_detection_matches_generate(whisper: dict[str, Any], beams: int) -> None:
    """An open language slot is chosen as ``detect_language`` chooses it, without the prompt."""
    model, features = whisper["detecting"], whisper["features"]
    ours = searched(whisper["detector"], features, beams, prompt=PROMPT)
    assert [h.tokens for h in ours] == generated(model, features, beams, prompt_ids=prompt_ids())
    detected = model.detect_language(torch.from_numpy(features)).tolist()
    assert [h.prompt for h in ours] == [(lang, NO_TIMESTAMPS) for lang in detected] and set(detected) == {EN, FR}


def test_prompt_lengths_follow_generate(whisper: dict[str, Any]) -> None:
    """Without a caller's max_len, the export's (20 here: max_length's) stays while the prompt fits half the
    64 positions, as ``generate`` keeps it; a prompt past the positions left shrinks it to them (the start
    token counted, as ``generate`` counts it); a caller's max_len that does not fit is one line."""
    model, features, transcriber = whisper["model"], whisper["features"][:8], whisper["transcriber"]
    ids = tuple(10 + 2 * i for i in range(20))
    config = transcriber.translator.search_config(prompt=list(ids))
    assert config.max_len == 20
    src_len = np.full(len(features), features.shape[-1], dtype=np.int64)
    ours = [hyps[0].tokens for hyps in transcriber.translator.engine.search(features, src_len, config)]
    with torch.no_grad():
        out = model.generate(input_features=torch.from_numpy(features), prompt_ids=prompt_ids(ids)).tolist()
    assert ours == [tuple(row[: row.index(EOS)] if EOS in row else row) for row in out]
    assert transcriber.translator.search_config(prompt=list(range(10, 52))).max_len == 64 - 1 - 43 - 3
    with pytest.raises(S2SError, match="max_len 41 and the 24 prompt tokens"):
        transcriber.translator.search_config(max_len=41, prompt=list(ids))


def test_transcribe_takes_a_prompt(whisper: dict[str, Any], tmp_path: Path) -> None:
    import soundfile

    from s2s_deploy.runtime.transcriber import Transcriber
    from s2s_deploy.serve.app import parse_query

    path = tmp_path / "clip.wav"
    soundfile.write(path, clips(1, high=1.0)[0], RATE)  # within the window
    features = whisper["transcriber"].features(str(path))[None]
    want = [f"w{i}" for i in generated(whisper["model"], features, 1, prompt_ids=prompt_ids())[0]]
    result = CliRunner().invoke(main, ["transcribe", str(whisper["out"]), str(path), "--quiet", "--prompt", PROMPT])
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == want
    prompted = Transcriber(whisper["out"], device="cpu", prompt=PROMPT)
    assert prompted([str(path)])[0].text.split() == want
    assert prompted([str(path)], prompt="")[0].text == whisper["transcriber"]([str(path)])[0].text
    config = parse_query({"prompt": PROMPT}, whisper["transcriber"].translator, 4)
    assert config.prompt == PROMPT_IDS and config.prompt_start == PREV


def test_prompt_refusals(whisper: dict[str, Any], tmp_path: Path) -> None:
    """A folder whose tokenizer has no ``<|startofprev|>`` takes no prompt, and a prompt holds text
    only: one line each, exit 1."""
    import soundfile

    from s2s_deploy.format.manifest import load_manifest
    from s2s_deploy.runtime.transcriber import Transcriber

    assert load_manifest(whisper["out"]).search["prompt_start"] == PREV
    path = tmp_path / "clip.wav"
    soundfile.write(path, clips(1, high=1.0)[0], RATE)  # within the window
    result = CliRunner().invoke(main, ["transcribe", str(whisper["out"]), str(path), "--prompt", "<|en|> w5"])
    assert result.exit_code == 1 and result.output == "error: prompt holds '<|en|>' (id 102), which is not text\n"
    folder = tmp_path / "hf"
    shutil.copytree(whisper["hf_dir"], folder)
    tokenizer_json(folder, special={k: v for k, v in SPECIAL_TOKENS.items() if k != PREV})
    result = CliRunner().invoke(main, ["export", "--hf", str(folder), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "prompt_start" not in load_manifest(tmp_path / "out").search
    result = CliRunner().invoke(main, ["transcribe", str(tmp_path / "out"), str(path), "--prompt", PROMPT])
    assert result.exit_code == 1 and result.output == ("error: prompt: this export takes no prompt (its search "
                                                       "block sets no prompt_start)\n")
    with pytest.raises(S2SError, match="takes no prompt"):
        Transcriber(tmp_path / "out", device="cpu", prompt=PROMPT)


def test_a_clip_longer_than_the_window_is_read_window_by_window(whisper: dict[str, Any], tmp_path: Path) -> None:
    """This export has no timestamp tokens: a clip of two to three windows is decoded one whole window
    after another (never cut to the first), each window as ``generate`` decodes it alone."""
    import soundfile

    transcriber = whisper["transcriber"]
    audio = clips(3, 2.2, 2.9, seed=5)
    ours = transcriber(audio + clips(1, high=1.0))
    for clip, got in zip(audio, ours[:3], strict=True):
        whole = transcriber.features(clip, whole=True)
        windows = np.zeros((3, 80, 100), dtype=np.float32)
        for i in range(3):
            part = whole[:, 100 * i: 100 * (i + 1)]
            windows[i, :, : part.shape[-1]] = part
        want = [f"w{t}" for row in generated(whisper["model"], windows, 1) for t in row]
        assert got.text.split() == want and not got.segments
    assert ours[-1].text == transcriber(clips(1, high=1.0))[0].text  # a clip within the window, as alone
    path = tmp_path / "long.wav"
    soundfile.write(path, audio[0], RATE)
    result = CliRunner().invoke(main, ["transcribe", str(whisper["out"]), str(path), "--quiet"])
    assert result.exit_code == 0 and result.stdout.split() == ours[0].text.split(), result.output
    result = CliRunner().invoke(main, ["transcribe", str(whisper["out"]), str(path), "--beam", "2", "--n-best", "2"])
    assert result.exit_code == 1 and len(result.output.splitlines()) == 1, result.output
    assert result.output.startswith(f"error: {path} is longer than the encoder's window of 100 frames")
