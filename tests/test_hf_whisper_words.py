"""Word timestamps against transformers' ``generate(return_token_timestamps=True)``.

The tiny timestamped Whisper of tests/test_hf_whisper_timestamps.py, its generation_config.json given
three alignment heads, exported with ``--word-timestamps``. On 20 short clips (0.3-1.4 s, one window,
each clip's ``attention_mask`` from the feature extractor, so the warping reads only its own audio),
greedy and beam 4: the tokens are generate's, and each token's time is within one frame (20 ms) of
generate's ``token_timestamps``. Words, the CLI's JSON and subtitles, ``--vad`` with words, and the
refusals are checked on the same export.
"""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from test_hf_whisper import clips
from test_hf_whisper_timestamps import EOS, MAX_NEW, RATE, save_timestamp_whisper

from s2s_deploy.cli import main

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow
HEADS = [[1, 0], [1, 2], [0, 3]]
FRAME = 0.02


@pytest.fixture(scope="module")
def whisper(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from s2s_deploy.runtime.transcriber import Transcriber

    root = tmp_path_factory.mktemp("whisper-words")
    extractor, short = save_timestamp_whisper(root / "hf", 0.55, keep=0.5)
    raw = json.loads((root / "hf" / "generation_config.json").read_text())
    raw["alignment_heads"] = HEADS
    (root / "hf" / "generation_config.json").write_text(json.dumps(raw))
    result = CliRunner().invoke(main, ["export", "--hf", str(root / "hf"), "--out", str(root / "out"),
                                       "--word-timestamps"])
    assert result.exit_code == 0, result.output
    model = transformers.WhisperForConditionalGeneration.from_pretrained(root / "hf", local_files_only=True).eval()
    return {"root": root, "out": root / "out", "model": model, "extractor": extractor, "short": short,
            "transcriber": Transcriber(root / "out", device="cpu")}


def theirs(whisper: dict[str, Any], audio: list[np.ndarray], beams: int) -> list[tuple[list[int], list[float]]]:
    """generate's tokens (cut at EOS) and their token_timestamps, per clip, each clip alone."""
    found = []
    for clip in audio:
        inputs = whisper["extractor"](clip, sampling_rate=RATE, return_attention_mask=True, return_tensors="pt")
        with torch.no_grad():
            out = whisper["model"].generate(input_features=inputs["input_features"],
                                            attention_mask=inputs["attention_mask"], num_beams=beams,
                                            max_new_tokens=MAX_NEW, return_token_timestamps=True)
        tokens = out["sequences"][0].tolist()
        times = out["token_timestamps"][0].tolist()
        cut = tokens.index(EOS) if EOS in tokens else len(tokens)
        found.append((tokens[:cut], times[:cut]))
    return found


def ours(whisper: dict[str, Any], audio: list[np.ndarray], beams: int) -> list[tuple[list[int], list[float]]]:
    """Our tokens and each token's time (runtime/words.py), the clips decoded as one batch."""
    from s2s_deploy.runtime.words import window_times

    transcriber = whisper["transcriber"]
    config = transcriber.translator.search_config(beams, 1, MAX_NEW)
    features = [transcriber.features(a, whole=True) for a in audio]
    contents = [transcriber.frontend.content_frames(a) for a in audio]
    read: list[Any] = []
    transcriber.decode(features, config, None, read)
    listed = [(i, w) for i, windows in enumerate(read) for w in windows]
    times = window_times(transcriber.translator.backend, features, listed, contents, config)
    return [(list(w.best.tokens), t.tolist()) for (_, w), t in zip(listed, times, strict=True)]


@pytest.mark.parametrize("beams", [1, 4])
def test_token_times_match_generate(whisper: dict[str, Any], beams: int) -> None:
    audio = whisper["short"]
    expected, found = theirs(whisper, audio, beams), ours(whisper, audio, beams)
    assert [tokens for tokens, _ in found] == [tokens for tokens, _ in expected]
    differences = [abs(a - b) for (_, mine), (_, their) in zip(found, expected, strict=True)
                   for a, b in zip(mine, their, strict=True)]
    assert max(differences) <= FRAME + 1e-6
    assert np.mean(np.array(differences) < 1e-6) > 0.9  # nearly all on the same frame
    assert len({round(t, 2) for _, times in found for t in times}) > 10  # the times are not all alike


def test_words_follow_the_token_times(whisper: dict[str, Any]) -> None:
    audio = whisper["short"][:6]
    found = whisper["transcriber"](audio, word_timestamps=True, max_len=MAX_NEW)
    timed = ours(whisper, audio, 1)
    vocab = whisper["transcriber"].manifest.tgt_vocab
    for decoded, (tokens, times) in zip(found, timed, strict=True):
        text_tokens = [t for t in tokens if t < EOS]
        assert [w.text for w in decoded.words] == [vocab.decode([t]) for t in text_tokens]  # one word per token
        starts = [times[i] for i, t in enumerate(tokens) if t < EOS]
        assert [w.start for w in decoded.words] == pytest.approx(starts)
        assert all(a.start <= a.end <= b.start + 1e-9 for a, b in pairwise(decoded.words))


def test_cli_writes_words(whisper: dict[str, Any]) -> None:
    import soundfile

    root, out = whisper["root"], whisper["out"]
    wav = root / "clip.wav"
    soundfile.write(wav, whisper["short"][0], RATE, subtype="FLOAT")
    found = whisper["transcriber"](str(wav), word_timestamps=True)[0]
    result = CliRunner().invoke(main, ["transcribe", str(out), str(wav), "--word-timestamps", "--quiet",
                                       "--output", str(root / "words.json")])
    assert result.exit_code == 0, result.output
    [row] = json.loads((root / "words.json").read_text())
    assert [(w["start"], w["end"], w["word"]) for w in row["words"]] == [(w.start, w.end, w.text)
                                                                        for w in found.words]
    result = CliRunner().invoke(main, ["transcribe", str(out), str(wav), "--word-timestamps", "--quiet",
                                       "--output", str(root / "words.srt")])
    assert result.exit_code == 0, result.output
    cues = (root / "words.srt").read_text().strip().split("\n\n")
    assert len(cues) == len(found.words) and cues[0].splitlines()[2] == found.words[0].text


def test_vad_words_lie_in_the_speech(whisper: dict[str, Any], tmp_path: Path) -> None:
    from test_vad import speech_clip

    from s2s_deploy.frontends.vad import VadOptions, speech_spans

    audio, _ = speech_clip(tmp_path)
    options = VadOptions(speech_pad_ms=100)
    [found] = whisper["transcriber"](audio, vad=options, word_timestamps=True, timestamps=True)
    spans = speech_spans(audio, RATE, options, 1.0)
    assert found.words
    for word in found.words:
        assert word.start <= word.end
        assert any(a / RATE - 1e-6 <= word.start and word.end <= b / RATE + 1e-6 for a, b in spans), word


def test_an_export_without_heads_refuses_in_one_line(whisper: dict[str, Any], tmp_path: Path) -> None:
    """The same export with its manifest's alignment heads removed: its attention is no longer known to be
    theirs, so words are refused, in one line."""
    import shutil

    import soundfile

    folder = tmp_path / "out"
    shutil.copytree(whisper["out"], folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    del manifest["alignment_heads"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    audio = tmp_path / "a.wav"
    soundfile.write(audio, clips(1, 0.5, 0.6)[0], RATE)
    result = CliRunner().invoke(main, ["transcribe", str(folder), str(audio), "--word-timestamps", "--quiet"])
    assert result.exit_code != 0 and "export it with --word-timestamps" in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_default_heads_are_the_last_half_of_the_layers() -> None:
    from s2s_deploy.architecture.registry import get_plugin

    plugin = get_plugin("whisper")
    heads = plugin.hf_alignment_heads({"decoder_layers": 4, "decoder_attention_heads": 2}, {})
    assert heads == ((2, 0), (2, 1), (3, 0), (3, 1))
    assert plugin.hf_alignment_heads({}, {"alignment_heads": HEADS}) == tuple(map(tuple, HEADS))
