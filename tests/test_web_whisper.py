"""Whisper in the browser page, against ``Transcriber`` (``transcribe``) on the same samples.

The tiny timestamped Whisper of tests/test_hf_whisper_timestamps.py (a one-second window, timestamp
tokens that fire; exported once with ``--word-timestamps``), its page written with ``web --vad``, driven
in one headless Chromium for the whole module (examples/web/drive.js's ``calls`` job):

- clips of one window and of three, seeking by their timestamps: the page's segments (start, end, text)
  and text equal ``transcribe --timestamps``'s, and its plain text ``transcribe``'s, greedy and beam 4;
- tests/test_vad.py's espeak-ng clip (three sentences between inserted silences, noise throughout) with
  ``--vad``: Silero's model through onnxruntime-web gives the same speech chunks as frontends/vad.py,
  and the text and segments equal ``transcribe --vad``'s, at the default options and another set;
- word timestamps (runtime/words.py ported: the alignment heads' attention, median filter, DTW): the
  page's words and their times equal ``transcribe --word-timestamps``'s, with and without timestamps and
  VAD; the float32 steps are numpy's operation for operation, so the times are equal, not close (the
  test allows 1e-9 s for float64 rounding in the last step, and finds 0);
- the same Whisper with its language left open (detected on the first window, kept for the rest):
  segments, text and language equal ``transcribe``'s, greedy and beam 4;
- the page as a user drives it: the clip uploaded with the boxes ticked shows the same text and segments,
  and its player highlights the word whose [start, end) holds the time it is sought to (karaoke).

Under Node alone (no export, no browser; the fast tier): search.js's reading of a byte-level tokenizer.json
(real Whisper's decoder) equals ``tokenizers``' own decode, and its strip is Python's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from test_web import BEAMS, DIST, ROOT, browser_missing, gru_and_dist, run_page, static_site

from s2s_deploy.cli import main

VAD_SETS = ({}, {"speech_pad_ms": 0, "min_silence_duration_ms": 300})
"""The page's VAD options (over page.json's, VadOptions()'s defaults) in each run."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A folder served on 127.0.0.1 only, for the whole module."""
    folder = tmp_path_factory.mktemp("site")
    with static_site(folder) as url:
        yield folder, url


@pytest.fixture(scope="module")
def run(served: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory, hf_exports: Any) -> dict[str, Any]:
    """The exports (conftest's shared ``hf_exports``, copied: the page is written into the folder), their
    pages (``web --vad``), the clips, and what the pages answered for each call."""
    if browser_missing() is not None:
        pytest.skip(browser_missing() or "")
    pytest.importorskip("transformers")
    soundfile = pytest.importorskip("soundfile")
    from test_hf_whisper import clips
    from test_hf_whisper_timestamps import save_timestamp_whisper
    from test_vad import RATE, speech_clip

    from s2s_deploy.runtime.transcriber import Transcriber

    root = tmp_path_factory.mktemp("web-whisper")
    save_timestamp_whisper(root / "hf", 0.55, keep=0.5)
    site, url = served
    folder = site / "whisper"
    shutil.copytree(hf_exports.get(root / "hf", "--word-timestamps"), folder)
    result = CliRunner().invoke(main, ["web", str(folder), "--ort-web", str(DIST), "--vad"])
    assert result.exit_code == 0, result.output
    transcriber = Transcriber(folder, device="cpu")
    window = transcriber.window([])
    short = clips(2, 0.5, 0.95, seed=3)  # one window of 100 frames
    long = clips(2, 2.3, 2.9, seed=4)  # three windows at least
    timed = [*short, *long]
    speech, _ = speech_clip(root)
    wav = root / "speech.wav"
    soundfile.write(wav, speech, RATE, subtype="FLOAT")
    detect_hf, detect = root / "detect-hf", site / "detect"
    shutil.copytree(root / "hf", detect_hf)
    raw = json.loads((detect_hf / "generation_config.json").read_text())
    raw.update(language=None, task=None)  # the decoder prompt's language slot left open
    (detect_hf / "generation_config.json").write_text(json.dumps(raw))
    shutil.copytree(hf_exports.get(detect_hf), detect)
    result = CliRunner().invoke(main, ["web", str(detect), "--ort-web", str(DIST)])
    assert result.exit_code == 0, result.output
    calls: list[list[Any]] = [["goto", f"{url}/detect/index.html"]]
    calls += [["transcribe", [c.tolist() for c in timed], beam, {"timestamps": True}] for beam in BEAMS]
    calls.append(["goto", f"{url}/whisper/index.html"])
    for beam in BEAMS:
        calls += [["transcribe", [c.tolist() for c in timed], beam, {"timestamps": True}],
                  ["transcribe", [c.tolist() for c in timed], beam, {}]]
    for options in VAD_SETS:
        calls.append(["transcribe", [speech.tolist()], 1, {"timestamps": True, "vad": options or True}])
    calls.append(["transcribe", [speech.tolist()], 4, {"vad": True}])
    calls += [["transcribe", [c.tolist() for c in timed], 1, {"words": True}],
              ["transcribe", [c.tolist() for c in timed], 4, {"words": True, "timestamps": True}],
              ["transcribe", [speech.tolist()], 1, {"words": True, "vad": True}]]
    [uploaded] = transcriber(speech, beam=4, vad=True, timestamps=True, word_timestamps=True)
    seek = [(w.start + w.end) / 2 for w in uploaded.words if w.end - w.start >= 0.06][:6]
    job = {"calls": calls, "upload": str(wav), "boxes": {"vad": True, "timestamps": True, "words": True},
           "seek": seek}
    shot = root / "page.png"
    page = run_page(f"{url}/whisper/index.html", shot, job, timeout=900)
    page["detected"] = page["results"][1: 1 + len(BEAMS)]
    page["results"] = page["results"][2 + len(BEAMS):]
    return {"transcriber": transcriber, "window": window, "short": short, "long": long, "timed": timed,
            "speech": speech, "page": page, "shot": shot, "folder": folder, "rate": RATE, "uploaded": uploaded,
            "seek": seek, "detect": Transcriber(detect, device="cpu"), "detect_dir": detect}


def _segments(found: Any) -> list[tuple[float, float, str]]:
    return [(s.start, s.end, s.text) for s in found.segments]


def _page_segments(row: dict[str, Any]) -> list[tuple[float, float, str]]:
    return [(s["start"], s["end"], s["text"]) for s in row["segments"]]


@pytest.mark.slow
def test_page_seeks_by_timestamps_as_transcribe(run: dict[str, Any]) -> None:
    """Segments and text of ``transcribe --timestamps``, and plain ``transcribe``'s text, greedy and beam 4,
    on clips of one window and of three (the clips must really seek: several windows, several segments)."""
    transcriber, timed, page = run["transcriber"], run["timed"], run["page"]["results"]
    frames = [transcriber.features(c, "clip", whole=True).shape[-1] for c in timed]
    assert [f <= run["window"] for f in frames] == [True, True, False, False]
    assert all(f > 2 * run["window"] for f in frames[2:])
    for b, beam in enumerate(BEAMS):
        with_times, plain = page[2 * b], page[2 * b + 1]
        want = transcriber(timed, beam=beam, timestamps=True)
        assert [_page_segments(r) for r in with_times] == [_segments(w) for w in want], beam
        assert [r["text"] for r in with_times] == [w.text for w in want], beam
        assert [r["text"] for r in plain] == [w.text for w in transcriber(timed, beam=beam)], beam
        assert sum(len(w.segments) for w in want[2:]) > 2 * len(want[2:])  # the long clips were cut in segments
        assert all(r["ms"] > 0 for r in with_times)
    assert any(s[2] for w in page[0] for s in _page_segments(w))  # text, not only timestamps


@pytest.mark.slow
def test_page_detects_the_language_as_transcribe(run: dict[str, Any]) -> None:
    """An open language slot: chosen on each clip's first window by the best language log-prob and kept."""
    detect, timed = run["detect"], run["timed"]
    assert -1 in json.loads((run["detect_dir"] / "manifest.json").read_text())["search"]["decoder_prompt"]
    for beam, rows in zip(BEAMS, run["page"]["detected"], strict=True):
        want = detect(timed, beam=beam, timestamps=True)
        assert [_page_segments(r) for r in rows] == [_segments(w) for w in want], beam
        assert [(r["text"], r.get("language")) for r in rows] == [(w.text, w.language) for w in want], beam
        assert all(w.language for w in want)


@pytest.mark.slow
def test_page_vad_reads_the_speech_as_transcribe_vad(run: dict[str, Any]) -> None:
    """Silero through onnxruntime-web: the same speech chunks (samples) as frontends/vad.py, and the same
    text and segments as ``transcribe --vad``, at two option sets; beam 4's text too."""
    from s2s_deploy.frontends.vad import VadOptions, speech_spans

    transcriber, speech, page, rate = run["transcriber"], run["speech"], run["page"]["results"], run["rate"]
    seconds = run["window"] * transcriber.frontend.frame_seconds
    first = 2 * len(BEAMS)
    for k, given in enumerate(VAD_SETS):
        options = VadOptions(**given)
        [row] = page[first + k]
        chunks = speech_spans(speech, rate, options, seconds)
        assert [tuple(c) for c in row["chunks"]] == chunks, given
        assert len(chunks) >= 3  # three sentences heard, each at least once
        [want] = transcriber(speech, vad=options, timestamps=True)
        assert _page_segments(row) == _segments(want), given
        assert row["text"] == want.text and want.text, given
    [row] = page[first + len(VAD_SETS)]
    assert row["text"] == transcriber(speech, beam=4, vad=True)[0].text


WORD_BOUND = 1e-9
"""Seconds between the page's word times and Python's: both sides round alike at every float32 step, so
the bound only covers float64 rounding in the last sums; the runs find 0."""


def _same_words(row: dict[str, Any], want: Any) -> float:
    """The largest difference in seconds between the page's word times and ``want``'s (texts equal)."""
    have = row["words"]
    assert [w["text"] for w in have] == [w.text for w in want.words]
    worst = max([abs(h[k] - getattr(w, k)) for h, w in zip(have, want.words, strict=True) for k in ("start", "end")],
                default=0.0)
    assert worst <= WORD_BOUND, (have, want.words)
    return worst


@pytest.mark.slow
def test_page_word_times_are_transcribes(run: dict[str, Any]) -> None:
    """``transcribe --word-timestamps``'s words and times: plain greedy (the short clips one search, the
    long ones sought), beam 4 with timestamps, and greedy through VAD (times mapped back to the clip)."""
    transcriber, timed, speech, page = run["transcriber"], run["timed"], run["speech"], run["page"]["results"]
    first = 2 * len(BEAMS) + len(VAD_SETS) + 1
    plain, stamped, [vad] = page[first: first + 3]
    worst = 0.0
    for rows, want in ((plain, transcriber(timed, beam=1, word_timestamps=True)),
                       (stamped, transcriber(timed, beam=4, timestamps=True, word_timestamps=True))):
        for row, w in zip(rows, want, strict=True):
            assert row["text"] == w.text
            worst = max(worst, _same_words(row, w))
        starts = [w.start for found in want for w in found.words]
        assert len(starts) > 10 and len(set(starts)) >= 8  # words, timed apart (a random model bunches some)
    [want] = transcriber(speech, beam=1, vad=True, word_timestamps=True)
    assert vad["text"] == want.text and want.words
    worst = max(worst, _same_words(vad, want))
    print(f"word times: max |page - transcribe| {worst:.3g} s")


@pytest.mark.slow
def test_page_shows_what_a_user_uploads(run: dict[str, Any]) -> None:
    """The upload with "timestamps", "voice activity detection" and "word timestamps" ticked: one row, the
    clip's text, each segment's line, and a karaoke line whose highlight follows the player: sought to the
    middle of a word, that word (by ``transcribe``'s times) is the one highlighted."""
    [row] = run["page"]["table"]
    want = run["uploaded"]
    assert row[0] == f"speech.wav [{want.language}]" and row[1].startswith(want.text)
    for segment in want.segments:
        assert f"[{segment.start:.2f} → {segment.end:.2f}] {segment.text}" in run["page"]["html"]
    expected = [next(i for i, w in enumerate(want.words) if w.start <= t < w.end) for t in run["seek"]]
    assert len(expected) >= 3 and run["page"]["karaoke"] == expected
    assert run["shot"].stat().st_size > 10_000


DECODE = """
const { HFDecoder, strip } = require(process.argv[1]);
const job = JSON.parse(require('fs').readFileSync(0, 'utf8'));
const decoder = new HFDecoder(job.tokenizer);
console.log(JSON.stringify({ texts: job.ids.map((ids) => decoder.decode(ids)), stripped: job.strip.map(strip) }));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
def test_byte_level_tokenizer_reads_back_as_tokenizers_reads_it() -> None:
    """A byte-level BPE (Whisper's decoder) trained on text with two- to four-byte characters: random id runs,
    which cut characters apart, decode as ``Tokenizer.decode(ids, skip_special_tokens=True)`` decodes them
    (broken UTF-8 as U+FFFD); and strip removes Python's whitespace, not JavaScript's."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(["héllo wörld ça va", "日本語 テキスト", "emoji 🎉 ok"] * 5, trainer)
    rng = np.random.default_rng(0)
    ids = [rng.integers(0, tokenizer.get_vocab_size(), int(rng.integers(1, 12))).tolist() for _ in range(200)]
    ids.append(tokenizer.encode("emoji 🎉 ça 日本語").ids)
    spaces = ["\x1c a \x1f", "\x85b\x85", "\ufeffc\ufeff", "\u3000 d\t\n", " e\u2028"]
    job = {"tokenizer": json.loads(tokenizer.to_str()), "ids": ids, "strip": spaces}
    done = subprocess.run(["node", "-e", DECODE, str(ROOT / "s2s_deploy" / "web" / "search.js")],
                          input=json.dumps(job), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    want = [tokenizer.decode(run, skip_special_tokens=True) for run in ids]
    assert found["texts"] == want
    assert any("\ufffd" in text for text in want) and want[-1] == "emoji 🎉 ça 日本語"
    assert found["stripped"] == [text.strip() for text in spaces]


def test_web_vad_refuses_an_export_without_16khz_audio(exports, tmp_path: Path) -> None:
    """``web --vad`` on a text export: one line, nothing written; without ``--vad`` page.json says no VAD."""
    from s2s_deploy.web.bundle import PAGE_JSON

    folder, dist = gru_and_dist(exports, tmp_path)
    result = CliRunner().invoke(main, ["web", str(folder), "--ort-web", str(dist), "--vad"])
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert result.output.startswith("error: ") and "--vad reads audio at 16000 Hz" in result.output
    assert not (folder / "index.html").exists()
    result = CliRunner().invoke(main, ["web", str(folder), "--ort-web", str(dist)])
    assert result.exit_code == 0, result.output
    assert json.loads((folder / PAGE_JSON).read_text()) == {"vad": None}
