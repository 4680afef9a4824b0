"""Hugging Face Speech2Text against ``transformers``' own ``Speech2TextForConditionalGeneration.generate``.

A tiny random Speech2Text (2+2 layers, d_model 64, two stride-2 GLU convolutions over 80 mel bins,
128 ids with ``<lang:en>`` and ``<lang:fr>`` at 4 and 5 in a word-level ``tokenizer.json``, ``w<id>``
elsewhere) is saved with ``save_pretrained`` beside a ``Speech2TextFeatureExtractor``'s
``preprocessor_config.json`` and a generation config that forces ``<lang:fr>`` first, as a
multilingual model's does; no network. It is exported with ``export --hf``, and 20 synthetic clips
of 0.3 to 1.4 s, featurised by transformers' extractor, padded into one batch and decoded by the
export, must match ``generate`` on each clip, greedy and beam 4, 20 new tokens; the torch-free front
end's features (within 3e-5 of the extractor's here) decode to the same tokens.

``generate`` runs one clip at a time: fed the padded batch with its ``attention_mask``, transformers'
subsampler lets the padding into each shorter clip's last frame (its convolutions are not masked),
which the export does not do; ``test_batched_generate_reads_the_padding`` shows the difference.
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

transformers = pytest.importorskip("transformers")

VOCAB = 128
BOS, PAD, EOS, UNK = 0, 1, 2, 3
EN, FR = 4, 5
SPECIAL_TOKENS = {BOS: "<s>", PAD: "<pad>", EOS: "</s>", UNK: "<unk>", EN: "<lang:en>", FR: "<lang:fr>"}
MAX_NEW = 20
INPUTS = 20
RATE = 16000
FRONT_END_ATOL = 2e-4  # docs/parity.md's bound for the audio front ends (tests/test_frontends.py)


def s2t_config() -> Any:
    return transformers.Speech2TextConfig(
        vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, conv_channels=64,
        conv_kernel_sizes=(5, 3), input_feat_per_channel=80, max_source_positions=200, max_target_positions=64,
        pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, decoder_start_token_id=EOS,
        init_std=0.3)  # peaked, tie-free logits (0.02 gives near-uniform ones, where rounding picks)


def clips(count: int = INPUTS) -> list[np.ndarray]:
    """Seeded synthetic audio of 0.3 to 1.4 s: chirps in noise of varied levels."""
    rng = np.random.default_rng(0)
    found = []
    for _ in range(count):
        t = np.arange(int(RATE * rng.uniform(0.3, 1.4))) / RATE
        f0, f1 = rng.uniform(100, 3000, 2)
        audio = 0.3 * np.sin(2 * np.pi * (f0 + (f1 - f0) * t / (2 * t[-1])) * t) + rng.normal(0, rng.uniform(0.01, 0.2),
                                                                                                len(t))
        found.append(audio.astype(np.float32))
    return found


def padded(features: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(batch, frames, bins)`` right-padded with zeros, as the extractor pads, and its attention mask."""
    lengths = torch.tensor([len(f) for f in features])
    batch = torch.zeros((len(features), int(lengths.max()), features[0].shape[1]))
    for i, f in enumerate(features):
        batch[i, : len(f)] = torch.from_numpy(f)
    return batch, (torch.arange(batch.shape[1])[None, :] < lengths[:, None]).long()


def favour_eos(model: Any, features: list[np.ndarray], strength: float = 0.8) -> None:
    """Random weights almost never pick EOS: point its output row along the mean state the output
    layer reads, so its logit is ``strength`` times a typical best one and transcripts end at varied lengths."""
    head = model.get_output_embeddings()
    seen = []
    hook = head.register_forward_hook(lambda _m, args, out: seen.append((args[0], out)))
    generator = torch.Generator().manual_seed(1)
    batch, mask = padded(features[:8])
    with torch.no_grad():
        model(input_features=batch, attention_mask=mask,
              decoder_input_ids=torch.randint(6, VOCAB, (8, 12), generator=generator))
    hook.remove()
    states, logits = seen[0][0].reshape(-1, seen[0][0].shape[-1]), seen[0][1].reshape(-1, VOCAB)
    mean = states.mean(0)
    with torch.no_grad():
        head.weight[EOS] = mean * (strength * logits.max(-1).values.median()) / mean.dot(mean)


def tokenizer_json(folder: Path) -> None:
    """One id per word: the special and language tokens at their ids, ``w<id>`` elsewhere."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    table = {SPECIAL_TOKENS.get(i, f"w{i}"): i for i in range(VOCAB)}
    tokenizer = Tokenizer(models.WordLevel(table, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", EOS)])
    tokenizer.save(str(folder / "tokenizer.json"))



@pytest.fixture(scope="module")
def s2t(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from s2s_deploy.runtime.transcriber import Transcriber

    root = tmp_path_factory.mktemp("s2t")
    hf_dir, out = root / "s2t-hf", root / "s2t"
    torch.manual_seed(0)
    model = transformers.Speech2TextForConditionalGeneration(s2t_config()).eval()
    extractor = transformers.Speech2TextFeatureExtractor(feature_size=80, num_mel_bins=80, sampling_rate=RATE)
    audio = clips()
    features = [extractor(a, sampling_rate=RATE)["input_features"][0] for a in audio]
    favour_eos(model, features)
    model.generation_config.forced_bos_token_id = FR
    model.save_pretrained(hf_dir)
    extractor.save_pretrained(hf_dir)
    tokenizer_json(hf_dir)
    result = CliRunner().invoke(main, ["export", "--hf", str(hf_dir), "--out", str(out)])
    assert result.exit_code == 0, result.output
    loaded = transformers.Speech2TextForConditionalGeneration.from_pretrained(hf_dir, local_files_only=True).eval()
    transcriber = Transcriber(out, device="cpu")
    return {"hf_dir": hf_dir, "out": out, "model": loaded, "transcriber": transcriber, "audio": audio,
            "hf_features": features, "features": [transcriber.features(a) for a in audio]}


def generated(model: Any, features: list[np.ndarray], beams: int, **settings: Any) -> list[tuple[int, ...]]:
    """``generate``'s new tokens per clip, each clip alone with its all-ones attention mask, up to the
    first EOS (it returns them after the decoder start)."""
    found = []
    with torch.no_grad():
        for f in features:
            batch, mask = padded([f])
            row = model.generate(input_features=batch, attention_mask=mask, num_beams=beams,
                                 max_new_tokens=MAX_NEW, **settings)[0, 1:].tolist()
            found.append(tuple(row[: row.index(EOS)] if EOS in row else row))
    return found


def decoded(s2t: dict[str, Any], beams: int, features: str = "hf_features", **options: Any) -> list[tuple[int, ...]]:
    """Our best hypothesis per clip, all clips padded into one batch, at ``generate``'s settings but the options."""
    from s2s_deploy.runtime.features import pad_features

    transcriber = s2t["transcriber"]
    config = transcriber.translator.search_config(beams, 1, MAX_NEW, **options)
    src, src_len = pad_features(s2t[features], transcriber.source)
    return [hyps[0].tokens for hyps in transcriber.translator.engine.search(src, src_len, config)]


def test_manifest_holds_the_front_end_and_the_forced_language(s2t: dict[str, Any]) -> None:
    from s2s_deploy.format.manifest import load_manifest

    manifest = load_manifest(s2t["out"])
    spec = manifest.encoder_input
    assert spec.shape == ("frames", 80) and dict(spec.frontend)["kind"] == "kaldi_fbank"
    assert manifest.decoder_start_id == EOS and manifest.eos_id == EOS
    assert manifest.search["forced_bos"] == FR and manifest.tgt_vocab.languages == (EN, FR)
    # generate's default max_length (20 with the decoder start, grown by it) is 20 new tokens: MAX_NEW,
    # so the tests below decode at the export's own length limit too
    assert manifest.search["max_len"] == MAX_NEW and manifest.search["beam_size"] == 1


def test_front_end_agrees_with_the_feature_extractor(s2t: dict[str, Any]) -> None:
    for ours, theirs in zip(s2t["features"], s2t["hf_features"], strict=True):
        assert ours.shape == theirs.shape
        np.testing.assert_allclose(ours, theirs, atol=FRONT_END_ATOL)


@pytest.mark.parametrize("beams", [1, 4])
def test_speech_to_text_matches_generate(s2t: dict[str, Any], beams: int) -> None:
    theirs = generated(s2t["model"], s2t["hf_features"], beams)
    assert decoded(s2t, beams) == theirs
    assert decoded(s2t, beams, features="features") == theirs  # our front end's features decode the same
    assert all(row[0] == FR for row in theirs)
    assert any(len(row) < MAX_NEW for row in theirs) and any(len(row) == MAX_NEW for row in theirs)
    assert len(set(theirs)) > INPUTS // 2  # the clips decode differently: the encoder is read


def test_target_lang_is_the_forced_bos_generate_takes(s2t: dict[str, Any]) -> None:
    """The export lists ``<lang:xx>`` tokens under the code ``lang:xx`` (docs/manifest.md's rule strips
    only wrapping punctuation, and ``:`` sits between letters)."""
    theirs = generated(s2t["model"], s2t["hf_features"], 1, forced_bos_token_id=EN)
    assert decoded(s2t, 1, target_lang="lang:en") == theirs and all(row[0] == EN for row in theirs)


def test_batched_generate_reads_the_padding(s2t: dict[str, Any]) -> None:
    """transformers' encoder on the padded batch: the longest clip's states are its own, a shorter
    clip's last state is not (its second convolution reads the first's output past the clip)."""
    model, features = s2t["model"], s2t["hf_features"]
    batch, mask = padded(features)
    longest = int(np.argmax([len(f) for f in features]))
    shortest = int(np.argmin([len(f) for f in features]))
    with torch.no_grad():
        together = model.get_encoder()(batch, attention_mask=mask).last_hidden_state
        for row, agrees in ((longest, True), (shortest, False)):
            alone = model.get_encoder()(*padded([features[row]])).last_hidden_state[0]
            assert torch.allclose(together[row, : len(alone)], alone, atol=1e-4) is agrees


def test_parity_reference_runs_on_clips_of_many_lengths(s2t: dict[str, Any]) -> None:
    result = CliRunner().invoke(main, ["parity", str(s2t["out"]), "--reference", str(s2t["hf_dir"])])
    assert result.exit_code == 0 and "parity: PASS" in result.output, result.output


def test_transcribe_prints_what_the_transcriber_returns(s2t: dict[str, Any], tmp_path: Path) -> None:
    import soundfile

    paths = []
    for i, audio in enumerate(s2t["audio"][:3]):
        paths.append(tmp_path / f"clip{i}.wav")
        soundfile.write(paths[-1], audio, RATE)
    result = CliRunner().invoke(main, ["transcribe", str(s2t["out"]), *map(str, paths), "--quiet"])
    assert result.exit_code == 0, result.output
    wanted = s2t["transcriber"]([str(p) for p in paths])
    assert result.stdout.splitlines() == [t.text for t in wanted]
    assert all(t.text.split()[0] == "<lang:fr>" or t.text.split()[0].startswith("w") for t in wanted)


@pytest.mark.parametrize(("file", "change", "message"), [
    ("config.json", {"input_feat_per_channel": 40}, "input_feat_per_channel"),
    ("config.json", {"input_channels": 2}, "input_channels"),
    ("config.json", {"num_conv_layers": 3}, "num_conv_layers"),
    ("preprocessor_config.json", {"dither": 1.0}, "dither"),
])
def test_export_refuses_what_it_cannot_honour(s2t: dict[str, Any], tmp_path: Path, file: str,
                                              change: dict[str, Any], message: str) -> None:
    folder = tmp_path / "hf"
    shutil.copytree(s2t["hf_dir"], folder)
    raw = json.loads((folder / file).read_text())
    raw.update(change)
    (folder / file).write_text(json.dumps(raw))
    result = CliRunner().invoke(main, ["export", "--hf", str(folder), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and result.output.startswith("error:")
