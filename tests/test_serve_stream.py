"""``serve``'s /transcribe with ``transcribe``'s reading options (vad and its parameters, word
timestamps) and streamed answers (``stream=true``: NDJSON, a line per segment as its window is
decoded, then the whole answer), against a live server on 127.0.0.1 with a real HTTP client.

The tiny timestamped Whisper of tests/test_hf_whisper_timestamps.py (a one-second window), exported
with its word-timestamp heads; a ten-second clip of its chirps is ten windows and more. Every
answer is held against what ``Transcriber`` (what ``transcribe`` runs) or the CLI itself gives. That
the first segment leaves before the last window is decoded is read from the server's own debug log
(``--log-level debug``): one stream's "window decoded" lines come from the decoding thread as each
window ends, its "line sent" lines from the event loop once a line was handed to the connection, in
one ordered log; the order of the two is asserted, never a duration.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("transformers")
from test_hf_whisper import clips
from test_hf_whisper_timestamps import RATE, save_timestamp_whisper
from test_serve import _free_port

from s2s_deploy.frontends.vad import VadOptions

pytestmark = pytest.mark.slow
SPEECH = Path(__file__).parent / "data" / "speech_16000hz.flac"


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, hf_exports: Any) -> Any:
    soundfile = pytest.importorskip("soundfile")
    from s2s_deploy.runtime.transcriber import Transcriber

    root = tmp_path_factory.mktemp("serve-stream")
    save_timestamp_whisper(root / "hf", 0.55, keep=0.5)
    out = hf_exports.get(root / "hf", "--word-timestamps")
    long = np.concatenate(clips(4, 1.8, 3.0, seed=1))
    soundfile.write(root / "long.wav", long, RATE, subtype="FLOAT")
    speech, rate = soundfile.read(SPEECH, dtype="float32")
    assert rate == RATE
    gap = np.zeros(int(1.5 * RATE), dtype=np.float32)
    soundfile.write(root / "speech.wav", np.concatenate([gap, speech, gap, speech, gap[: RATE // 2], speech, gap]),
                    RATE, subtype="FLOAT")
    log = root / "serve.log"
    port = _free_port()
    with log.open("w") as err:
        process = subprocess.Popen([sys.executable, "-m", "s2s_deploy", "serve", str(out), "--port", str(port),
                                    "--threads", "1", "--window-ms", "1", "--log-level", "debug"],
                                   stdout=subprocess.DEVNULL, stderr=err)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        assert process.poll() is None, log.read_text()
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "serve did not start within 90 s"
        time.sleep(0.2)
    yield {"root": root, "url": url, "log": log, "long": root / "long.wav", "speech": root / "speech.wav",
           "transcriber": Transcriber(out, device="cpu"), "out": out}
    process.terminate()
    process.wait(timeout=60)


def streamed(url: str, path: Path, **params: str) -> tuple[str, list[dict[str, Any]]]:
    """A streamed /transcribe: its content type and every line, parsed, in order of arrival."""
    with httpx.stream("POST", f"{url}/transcribe", params={**params, "stream": "true"}, content=path.read_bytes(),
                      timeout=120) as response:
        assert response.status_code == 200, response.read()
        return response.headers["content-type"], [json.loads(line) for line in response.iter_lines() if line]


def test_streamed_segments_are_the_answer_and_leave_before_the_last_window(setup: Any) -> None:
    """With timestamps: the streamed segments are the unstreamed answer's and ``transcribe --timestamps``'s
    (JSON output), their texts joined are its text, the last line is the unstreamed answer itself; the
    first line was sent before the last of the clip's windows was decoded. Without timestamps, the
    long clip's segments (read with timestamps inside, as ``generate`` reads it) still join to its text."""
    url, path = setup["url"], setup["long"]
    [want] = setup["transcriber"]([str(path)], timestamps=True)
    assert len(want.segments) > 3
    out = setup["root"] / "cli.json"
    cli = subprocess.run([sys.executable, "-m", "s2s_deploy", "transcribe", str(setup["out"]), str(path),
                          "--timestamps", "--output", str(out), "--quiet"], capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr
    [row] = json.loads(out.read_text())
    plain = httpx.post(f"{url}/transcribe", params={"timestamps": "true"}, content=path.read_bytes(), timeout=120)
    assert plain.status_code == 200, plain.text
    [answer] = plain.json()["transcriptions"]
    assert answer["segments"] == row["segments"] == [s.row() for s in want.segments]
    assert answer["text"] == row["text"] == want.text

    before = setup["log"].stat().st_size
    kind, lines = streamed(url, path, timestamps="true")
    assert kind == "application/x-ndjson"
    *segments, last = lines
    assert [line["segment"] for line in segments] == answer["segments"]
    assert "".join(line["segment"]["text"] for line in segments) == answer["text"]
    assert last == plain.json()

    with setup["log"].open() as log:
        log.seek(before)
        events = [line.split(": ", 1)[1].strip() for line in log if " stream " in line]
    decoded = [i for i, event in enumerate(events) if event == "window decoded"]
    sent = [i for i, event in enumerate(events) if event.endswith(" sent")]
    assert len(sent) == len(segments) and len(decoded) > 3, events
    assert sent[0] < decoded[-1], events  # the first line went out while later windows were still decoding

    [untimed] = setup["transcriber"]([str(path)])
    _, lines = streamed(url, path)
    *segments, last = lines
    assert last["transcriptions"][0]["text"] == untimed.text == "".join(line["segment"]["text"] for line in segments)
    assert len(segments) > 3


def test_vad_and_word_timestamps_answer_as_transcribe(setup: Any) -> None:
    """``vad=true`` with a ``vad_*`` parameter, streamed or not, answers as ``Transcriber(vad=...)``; its
    streamed segments are the answer's; ``word_timestamps=true`` on /transcribe and OpenAI's
    ``timestamp_granularities=["word"]`` through the official client give ``Transcriber``'s words."""
    import openai

    url, transcriber = setup["url"], setup["transcriber"]
    speech, long = setup["speech"], setup["long"]
    [want] = transcriber([str(speech)], vad=VadOptions(speech_pad_ms=100), timestamps=True)
    assert len(want.segments) >= 3 and want.text
    params = {"vad": "true", "vad_speech_pad_ms": "100", "timestamps": "true"}
    plain = httpx.post(f"{url}/transcribe", params=params, content=speech.read_bytes(), timeout=120)
    assert plain.status_code == 200, plain.text
    [answer] = plain.json()["transcriptions"]
    assert answer["text"] == want.text and answer["segments"] == [s.row() for s in want.segments]
    _, lines = streamed(url, speech, **params)
    assert [line["segment"] for line in lines[:-1]] == answer["segments"] and lines[-1] == plain.json()

    [worded] = transcriber([str(long)], word_timestamps=True, timestamps=True)
    assert len(worded.words) > 3
    expected = [{"start": w.start, "end": w.end, "word": w.text} for w in worded.words]
    plain = httpx.post(f"{url}/transcribe", params={"word_timestamps": "true", "timestamps": "true"},
                       content=long.read_bytes(), timeout=120)
    assert plain.status_code == 200, plain.text
    assert plain.json()["transcriptions"][0]["words"] == expected
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    with long.open("rb") as file:
        verbose = client.audio.transcriptions.create(model="whisper-1", file=file, response_format="verbose_json",
                                                     timestamp_granularities=["word"])
    assert verbose.text == worded.text
    assert [(w.word, w.start, w.end) for w in verbose.words] == [(w.text, w.start, w.end) for w in worded.words]


@pytest.mark.parametrize(("params", "message"), [
    ({"vad": "true", "vad_threshold": "2"}, "vad threshold must lie between 0 and 1, not 2.0"),
    ({"vad": "true", "vad_min_silence_ms": "ten"}, "'vad_min_silence_ms' must be a whole number, not \"ten\""),
    ({"vad_speech_pad_ms": "10"}, "'vad_speech_pad_ms': pass vad=true too"),
    ({"vad": "true", "beam": "2", "n_best": "2"}, "n_best must be 1, not 2"),
    ({"stream": "yes"}, "'stream' must be true or false, not \"yes\""),
    ({"word_timestamps": "1"}, "'word_timestamps' must be true or false, not \"1\""),
    ({"stream": "true", "compression_ratio_threshold": "-1"}, "'compression_ratio_threshold' must be >= 0"),
    ({"stream": "true", "vad_model": "/etc/passwd"}, "unknown parameter 'vad_model'"),
])
def test_bad_values_get_one_line_400(setup: Any, params: dict[str, str], message: str) -> None:
    """A bad reading or decoding value, streamed or not, is a 400 with one line and no Python repr,
    before anything is decoded; the option table's refusals name the option as the request does."""
    response = httpx.post(f"{setup['url']}/transcribe", params=params, content=setup["long"].read_bytes(), timeout=60)
    assert response.status_code == 400 and response.headers["content-type"] == "application/json", response.text
    error = response.json()["error"]
    assert message in error and "\n" not in error and "object at 0x" not in error, error
