"""s2s-deploy serve: the HTTP contract through Starlette's TestClient, dynamic batching, and real
uvicorn processes on 127.0.0.1 (one worker and two, SIGTERM with a request in flight)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

import httpx
from starlette.testclient import TestClient

from s2s_deploy.cli.serve import split_threads
from s2s_deploy.errors import S2SError
from s2s_deploy.runtime.translator import Translator
from s2s_deploy.serve.app import MAX_BODY_BYTES, ServeConfig, create_app
from s2s_deploy.serve.batcher import BatchLimits


@pytest.fixture(scope="module")
def gru(exports):
    return exports.get("gru")[1]


def client(manifest, **limits) -> TestClient:
    return TestClient(create_app(ServeConfig(str(manifest.directory), BatchLimits(**limits), threads=1)))


def test_translate_health_metadata(gru) -> None:
    texts = list(gru.samples[:3])
    expected = Translator(gru.directory, device="cpu")(texts, beam=4, n_best=2)
    with client(gru) as http:
        response = http.post("/translate", json={"texts": texts, "beam": 4, "n_best": 2})
        assert response.status_code == 200, response.text
        got = response.json()["translations"]
        assert [t["text"] for t in got] == [t.text for t in expected]
        assert [[h["text"] for h in t["hypotheses"]] for t in got] == [[h[0] for h in t.hypotheses] for t in expected]
        assert http.get("/health").json()["status"] == "ok"
        meta = http.get("/metadata").json()
        assert meta["plugin"]["name"] == "gru"
        assert meta["vocab_size"] == {"source": len(gru.src_vocab), "target": len(gru.tgt_vocab)}
        assert meta["limits"]["max_source_length"] == gru.max_source_length


@pytest.mark.parametrize(("body", "message"), [
    ({"texts": []}, "'texts' must be a non-empty list of strings"),
    ({"texts": ["a", 3]}, "'texts' must be a non-empty list of strings"),
    ({"texts": ["  "]}, "text 1 is empty"),
    ({"texts": ["a"], "beam": 0}, "'beam' must be between 1 and 65536, not 0"),
    ({"texts": ["a"], "beam": True}, "'beam' must be a whole number, not true"),
    ({"texts": ["a"], "beam": 17}, "beam 17 exceeds this server's largest, 16: name a smaller 'beam'"),
    ({"texts": ["a"], "beam": 2, "n_best": 3}, "n_best 3 needs a beam of at least 3 (beam_size is 2)"),
    ({"texts": ["a"], "alpha": "x"}, "'alpha' must be a finite number, not \"x\""),
    ({"texts": ["a"], "max_len": 0}, "'max_len' must be between 1 and 65536, not 0"),
    ({"texts": ["a"], "max_len": 100000}, "'max_len' must be between 1 and 65536, not 100000"),
    ({"texts": ["a"], "timestamps": None, "prompt": 5}, "'prompt' must be text or a list of target ids, not 5"),
    ({"texts": ["a"], "prompt": [1, "x"]}, "'prompt' holds [1, \"x\"], not target ids"),
    ({"texts": ["a"], "timestamps": "yes"}, "'timestamps' must be true or false, not \"yes\""),
    ({"texts": ["a"], "target_lang": ["fr"]}, "'target_lang' must be a code of at most 64 characters, not [\"fr\"]"),
    ({"texts": ["a"], "prompt": "earlier text"}, "prompt: this export takes no prompt"),
    ({"texts": ["a"], "temperatur": 1}, "unknown field 'temperatur'"),
    ({"texts": ["a"], "temperature": "0,0.5"}, "the temperature fallback and its options"),
    (["a"], "the body must be a JSON object"),
])
def test_bad_requests_get_400_with_one_line(gru, body, message: str) -> None:
    with client(gru) as http:
        response = http.post("/translate", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error.startswith(message) and "\n" not in error


def test_invalid_json_is_400(gru) -> None:
    with client(gru) as http:
        response = http.post("/translate", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json() == {"error": "the body is not valid JSON"}


def test_oversized_requests_get_413(exports) -> None:
    transformer = exports.get("transformer")[1]
    limit = transformer.max_source_length
    assert limit is not None
    with client(transformer, max_sentences=4, max_tokens=200) as http:
        too_long = http.post("/translate", json={"texts": ["x" * limit]})  # EOS makes it limit + 1
        too_many = http.post("/translate", json={"texts": ["one"] * 5})
        too_wide = http.post("/translate", json={"texts": ["twenty-one weeks"] * 4, "beam": 4})
    assert too_long.status_code == 413 and f"limit is {limit}" in too_long.json()["error"]
    assert too_many.status_code == 413 and "batch limit of 4" in too_many.json()["error"]
    assert too_wide.status_code == 413 and "padded source positions" in too_wide.json()["error"]
    with client(transformer) as http:
        huge = http.post("/translate", content=b" " * (MAX_BODY_BYTES + 1))
    assert huge.status_code == 413 and "at most" in huge.json()["error"]


def concurrently(manifest, limits: BatchLimits, texts: list[str]) -> tuple[list[tuple[int, dict]], dict]:
    """One request per text, all at once, in-process; the answers and /health afterwards."""

    async def scenario() -> tuple[list[tuple[int, dict]], dict]:
        app = create_app(ServeConfig(str(manifest.directory), limits, threads=1))
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
        async with app.router.lifespan_context(app), http:
            responses = await asyncio.gather(*(http.post("/translate", json={"texts": [t]}) for t in texts))
            stats = (await http.get("/health")).json()
        return [(r.status_code, r.json()) for r in responses], stats

    return asyncio.run(scenario())


def test_concurrent_requests_share_batches_and_queue_answers_503(gru) -> None:
    """Twelve single-sentence requests inside a long window make one or two batches; with a queue
    of four sentences, the requests beyond it are refused with 503, the others answered."""
    texts = list(gru.samples[:12])
    expected = [t.text for t in Translator(gru.directory, device="cpu")(texts)]

    answered, stats = concurrently(gru, BatchLimits(window_ms=500, max_sentences=64), texts)
    assert [body["translations"][0]["text"] for _, body in answered] == expected
    assert stats["sentences"] == 12 and stats["batches"] <= 2 and stats["largest"] >= 6

    answered, _ = concurrently(gru, BatchLimits(window_ms=500, max_queue=4), texts)
    codes = [code for code, _ in answered]
    assert codes.count(200) >= 4 and codes.count(503) >= 1 and set(codes) == {200, 503}
    refused = next(body for code, body in answered if code == 503)
    assert refused["error"].startswith("the queue is full")
    for (code, body), text in zip(answered, expected, strict=True):
        if code == 200:
            assert body["translations"][0]["text"] == text


def test_a_batch_respects_the_sentence_limit(gru) -> None:
    answered, stats = concurrently(gru, BatchLimits(window_ms=300, max_sentences=3), list(gru.samples[:10]))
    assert {code for code, _ in answered} == {200}
    assert stats["largest"] == 3 and stats["batches"] >= 4 and stats["sentences"] == 10


def test_threads_and_workers_never_oversubscribe() -> None:
    assert split_threads(1, None, 2) == 1  # a core for the event loop
    assert split_threads(1, None, 16) == 15
    assert split_threads(2, None, 16) == 7
    assert split_threads(2, None, 2) == 1
    assert split_threads(2, None, 3) == 1  # a worker has at least one thread
    assert split_threads(2, 1, 2) == 1
    with pytest.raises(S2SError, match="exceed the 2 available cores"):
        split_threads(2, 2, 2)
    with pytest.raises(S2SError, match="--workers 3 exceed the 2 available cores"):
        split_threads(3, None, 2)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(manifest, *args: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    command = [sys.executable, "-m", "s2s_deploy", "serve", str(manifest.directory), "--port", str(port), *args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"serve exited {process.returncode}: {process.stderr.read()}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    raise AssertionError("serve did not start within 90 s")


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found.update(int(p) for p in (task / "children").read_text().split())
    return found


@pytest.mark.slow
def test_uvicorn_two_workers_and_sigterm_lets_requests_finish(gru) -> None:
    """A real server with two worker processes. SIGTERM once the first of 24 concurrent requests is
    answered: the other requests, queued or running, still get their full answers, and it exits 0."""
    texts = list(gru.samples[:16])
    expected = [t.text for t in Translator(gru.directory, device="cpu")(texts, beam=8)]
    process, url = _start(gru, "--workers", "2")
    try:
        workers = {child for child in _children(process.pid)
                   if "multiprocessing" in Path(f"/proc/{child}/cmdline").read_text()}
        assert len(workers) >= 2

        async def requests_then_sigterm() -> tuple[list[httpx.Response], int]:
            async with httpx.AsyncClient(timeout=120) as http:
                pending = [asyncio.ensure_future(http.post(f"{url}/translate", json={"texts": texts, "beam": 8}))
                           for _ in range(24)]
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                in_flight = sum(not p.done() for p in pending)
                os.kill(process.pid, signal.SIGTERM)
                return list(await asyncio.gather(*pending)), in_flight

        responses, in_flight = asyncio.run(requests_then_sigterm())
        assert in_flight > 0
        assert {r.status_code for r in responses} == {200}
        for response in responses:
            assert [t["text"] for t in response.json()["translations"]] == expected
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert f"2 worker(s) × {split_threads(2, None, len(os.sched_getaffinity(0)))} thread(s)" in process.stderr.read()


def test_serve_refuses_oversubscription_and_a_bad_folder(tmp_path: Path, gru) -> None:
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "s2s_deploy", "serve", *args], capture_output=True, text=True,
                              timeout=60)

    cores = len(os.sched_getaffinity(0))
    result = run(str(gru.directory), "--workers", "2", "--threads", str(cores))
    assert result.returncode == 1 and result.stderr.strip().count("\n") == 0
    assert "exceed the" in result.stderr
    result = run(str(tmp_path))
    assert result.returncode == 1 and "no manifest.json" in result.stderr


def test_serve_without_the_extra_names_it(gru) -> None:
    code = ("import sys; sys.modules['uvicorn'] = None\nfrom s2s_deploy.cli import main\n"
            f"main(['serve', {str(gru.directory)!r}])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip() == json.loads('"error: serve needs the [serve] extra: pip install '
                                               '\\"s2s-deploy[serve]\\" (uvicorn missing)"')


def _cli_translations(manifest, texts: list[str], beam: int, n_best: int) -> dict[str, list[tuple[float, str]]]:
    """What `s2s-deploy translate --scores` prints, per source text: its n-best (score, text)."""
    unique = sorted(set(texts))
    result = subprocess.run([sys.executable, "-m", "s2s_deploy", "translate", str(manifest.directory), *unique,
                             "--beam", str(beam), "--n-best", str(n_best), "--scores", "--quiet"],
                            capture_output=True, text=True, timeout=120, check=True)
    lines = [line.split("\t", 1) for line in result.stdout.splitlines()]
    assert len(lines) == len(unique) * n_best
    return {text: [(float(score), hyp) for score, hyp in lines[i * n_best : (i + 1) * n_best]]
            for i, text in enumerate(unique)}


@pytest.mark.slow
def test_serve_with_threads_answers_as_translate_prints(gru) -> None:
    """A real server with two intra-op threads, twelve clients at once, each sending requests of its
    own beam, n-best and batch size: every answer is what `s2s-deploy translate` prints for it."""
    import random

    rng = random.Random(3)
    settings = ((1, 1), (2, 2), (4, 3))
    requests = [(rng.choice(settings), [rng.choice(gru.samples) for _ in range(rng.randint(1, 6))])
                for _ in range(36)]
    expected = {(beam, n_best): _cli_translations(gru, [t for s, texts in requests if s == (beam, n_best)
                                                        for t in texts], beam, n_best)
                for beam, n_best in settings}
    process, url = _start(gru, "--threads", "2", "--window-ms", "20")
    try:
        async def clients() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=120) as http:
                async def one_client(mine: list) -> list[httpx.Response]:
                    return [await http.post(f"{url}/translate", json={"texts": texts, "beam": beam, "n_best": n_best})
                            for (beam, n_best), texts in mine]
                answers = await asyncio.gather(*(one_client(requests[i::12]) for i in range(12)))
            return [answers[i % 12][i // 12] for i in range(len(requests))]

        responses = asyncio.run(clients())
    finally:
        process.terminate()
        process.wait(timeout=60)
    for ((beam, n_best), texts), response in zip(requests, responses, strict=True):
        assert response.status_code == 200, response.text
        for text, got in zip(texts, response.json()["translations"], strict=True):
            want = expected[(beam, n_best)][text]
            assert [h["text"] for h in got["hypotheses"]] == [hyp for _, hyp in want]
            np.testing.assert_allclose([h["score"] for h in got["hypotheses"]], [s for s, _ in want], atol=6e-5)


@pytest.mark.slow
def test_the_soak_benchmark_runs_clean_for_seconds(gru) -> None:
    """benchmarks/serve_soak.py in miniature: faults mixed in and a worker killed halfway, yet no
    wrong answer and nothing lost beyond that worker's requests in flight (exit 0)."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "serve_soak.py"
    result = subprocess.run([sys.executable, str(script), str(gru.directory), "--clients", "4", "--duration", "6",
                             "--sample-every", "1"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 wrong;" in result.stdout and "killed at" in result.stdout


@pytest.mark.slow
def test_the_audio_soak_runs_clean_for_seconds(exports) -> None:
    """benchmarks/serve_soak.py's audio soak in miniature, on the bundled speech export: good, damaged and
    hostile clips to /transcribe (streamed and not) and /v1/audio/transcriptions from 4 clients; every
    good answer is transcribe's, every hostile one a one-line 4xx, nothing lost (exit 0)."""
    speech = exports.get("speech")[1]
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "serve_soak.py"
    result = subprocess.run([sys.executable, str(script), str(speech.directory), "--clients", "4", "--duration", "8",
                             "--no-kill", "--sample-every", "1"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 wrong;" in result.stdout and " 0 lost otherwise; 0 unexpected statuses" in result.stdout
    assert '"hostile /' in result.stdout and '"good /' in result.stdout, result.stdout


def test_reading_parameters_are_vad_options_or_one_line() -> None:
    """/transcribe's vad_* parameters become the VadOptions ``transcribe --vad-*`` makes (VadOptions checks
    them); a bad one, or one without vad=true, is one line naming it."""
    from s2s_deploy.frontends.vad import VadOptions
    from s2s_deploy.serve.app import BadRequestError, parse_reading

    reading, stream = parse_reading({"vad": "true", "vad_threshold": "0.3", "vad_min_silence_ms": "500",
                                     "vad_max_speech_s": "12.5", "word_timestamps": "true", "stream": "true"})
    assert reading.vad == VadOptions(threshold=0.3, min_silence_duration_ms=500, max_speech_duration_s=12.5)
    assert reading.words and stream
    assert parse_reading({}) == (parse_reading({"vad": "false"})[0], False) and parse_reading({})[0].vad is None
    for query, message in [({"vad_threshold": "0.3"}, "'vad_threshold': pass vad=true too"),
                           ({"vad": "true", "vad_speech_pad_ms": "-1"}, "vad speech_pad_ms must be at least 0, not -1"),
                           ({"vad": "true", "vad_speech_pad_ms": "1.5"}, "'vad_speech_pad_ms' must be a whole number"),
                           ({"vad": "1"}, "'vad' must be true or false, not \"1\"")]:
        with pytest.raises(BadRequestError, match=message) as caught:
            parse_reading(query)
        assert "\n" not in str(caught.value)


SPEECH_CLIPS = sorted((Path(__file__).parent / "data").glob("speech_*hz.flac"))


@pytest.mark.slow
def test_transcribe_endpoint_answers_as_the_transcriber(exports) -> None:
    """An audio upload (any rate, FLAC here) through the batcher gives what Transcriber gives; clips
    from concurrent requests share batches; a text export and an audio export each send the client
    to the other endpoint in one line."""
    from s2s_deploy.runtime.transcriber import Transcriber

    speech = exports.get("speech")[1]
    expected = Transcriber(speech.directory, device="cpu")(SPEECH_CLIPS, beam=4, n_best=2)

    async def upload_all() -> tuple[list[httpx.Response], dict, dict]:
        app = create_app(ServeConfig(str(speech.directory), BatchLimits(window_ms=200), threads=1))
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
        async with app.router.lifespan_context(app), http:
            responses = await asyncio.gather(*(http.post("/transcribe", params={"beam": 4, "n_best": 2},
                                                         content=clip.read_bytes()) for clip in SPEECH_CLIPS))
            threads.update(t.name for t in threading.enumerate())
            return list(responses), (await http.get("/health")).json(), (await http.get("/metadata")).json()

    threads: set[str] = set()
    responses, health, metadata = asyncio.run(upload_all())
    # the concurrent uploads' front ends queued on the app's one front-end thread, not a thread each
    assert sum(name.startswith("s2s-front-end") for name in threads) == 1, threads
    assert not any(name.startswith("asyncio_") for name in threads), threads
    assert [r.status_code for r in responses] == [200] * len(SPEECH_CLIPS), responses[0].text
    got = [r.json()["transcriptions"][0] for r in responses]
    assert [g["text"] for g in got] == [e.text for e in expected]
    assert [g["language"] for g in got] == [e.language for e in expected]  # none: the prompt names no language
    assert [[h["text"] for h in g["hypotheses"]] for g in got] == [[h[0] for h in e.hypotheses] for e in expected]
    assert max(abs(g["score"] - e.score) for g, e in zip(got, expected, strict=True)) < 1e-5
    assert metadata["endpoint"] == "/transcribe"
    assert health["largest"] >= 2  # the uploads shared a batch rather than running one by one
    with client(speech) as http:
        for params, content, status, message in [
            ({}, b"not audio", 400, "cannot read audio from the upload"),
            ({}, b"", 400, "the body is empty"),
            ({"beam": "four"}, SPEECH_CLIPS[0].read_bytes(), 400, "'beam' must be a number, not \"four\""),
            ({"temperatur": "1"}, SPEECH_CLIPS[0].read_bytes(), 400, "unknown parameter 'temperatur'"),
            ({"no_speech_threshold": "0.6"}, SPEECH_CLIPS[0].read_bytes(), 400, "names no no-speech token"),
            ({"beam": "0"}, SPEECH_CLIPS[0].read_bytes(), 400, "'beam' must be between 1 and 65536, not 0"),
            ({"timestamps": "on"}, SPEECH_CLIPS[0].read_bytes(), 400, "'timestamps' must be true or false, not \"on\""),
        ]:
            response = http.post("/transcribe", params=params, content=content)
            assert response.status_code == status and message in response.json()["error"], response.text
            assert "\n" not in response.json()["error"]
        response = http.post("/translate", json={"texts": ["a"]})
        assert response.status_code == 400 and "POST the audio file to /transcribe" in response.json()["error"]
    gru = exports.get("gru")[1]
    with client(gru) as http:
        response = http.post("/transcribe", content=SPEECH_CLIPS[0].read_bytes())
        assert response.status_code == 400 and "POST JSON to /translate" in response.json()["error"]
