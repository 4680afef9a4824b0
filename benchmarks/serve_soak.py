"""Load and faults against `s2s-deploy serve --workers 2`, measured: answers lost, answers that
differ from `translate` (or `transcribe`), p99 latency and memory over time.

    python benchmarks/serve_soak.py exported/transformer [--clients 64] [--duration 600]
        [--workers 2] [--kill-at 0.5 | --no-kill] [--json soak.json]
    python benchmarks/serve_soak.py exported/speech --clients 8 --duration 240 --no-kill [--audio DIR]

An export that reads audio gets the audio soak (``audio_client``): each client sends, back to back,
good clips (tests/data's three FLACs and files made from them: WAV, stereo, a 20-s clip of several
windows, a WAV whose header promises twice the data it holds) and hostile ones (a header claiming
1 Hz or a 10 MHz rate, a data chunk claiming hours, a header alone, NaN and infinite samples, empty,
random, JSON and PNG bytes, and bodies over the 32 MB upload limit), at random to ``/transcribe``
(a third of the good ones streamed, ``stream=true``) and to OpenAI's ``/v1/audio/transcriptions``.
Every good answer's text must equal what ``Transcriber`` (what ``transcribe`` runs) gives that file;
every hostile one must be a 4xx whose error is one line with no Python repr. A 503 (queue full) is
an answer; anything else, a dropped connection or a 5xx is lost or unexpected.

The text soak:

N clients each send requests back to back for the duration, on a fresh connection each (a
connection kept alive would tie a later request to a worker that is gone). Most are translations
of 1-8 of the export's stored samples, greedy or beam 4 with n-best 2, each answer held against
what `Translator` gives that sentence alone (texts exactly, scores within 1e-4: a batchmate's
padding moves fp32 scores in the last bits). Mixed in: malformed JSON (400 expected), 50 MB
bodies (413 expected, before the body is read), slow clients that dribble a request out over a
few seconds (its answer expected), and clients that send a request and hang up at once.

At ``--kill-at`` of the duration, one worker process gets SIGKILL; uvicorn starts another.
Requests in flight at that moment may fail (the process that held their connection is gone: no
one is left to answer 5xx); any other failure counts as lost. The server's process tree's memory
(RSS), and each worker's, is sampled every few seconds; flat memory is judged by the least-squares
slope over the second half of the run, once the first half has seen the mix's batch shapes.
Exit 1 unless nothing was wrong and nothing was lost beyond the killed worker's requests in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.format.manifest import load_manifest
from s2s_deploy.runtime.translator import Translator

SETTINGS = ((1, 1), (4, 2))
BIG_BODY = 50 * 1024 * 1024
KINDS = (("translate", 0.80), ("malformed", 0.05), ("big", 0.03), ("slow", 0.05), ("hang-up", 0.07))
Expected = dict[tuple[int, int], dict[str, list[tuple[str, float]]]]


@dataclass
class Tally:
    sent: dict[str, int] = field(default_factory=dict)
    statuses: dict[str, dict[str, int]] = field(default_factory=dict)
    right: int = 0
    wrong: int = 0
    wrong_examples: list[str] = field(default_factory=list)
    failed_in_flight_at_kill: int = 0
    lost: int = 0
    lost_examples: list[str] = field(default_factory=list)
    unexpected_status: int = 0
    latencies: list[float] = field(default_factory=list)
    memory: list[dict[str, float]] = field(default_factory=list)
    killed_pid: int | None = None
    killed_at_s: float | None = None
    unexpected_examples: list[str] = field(default_factory=list)
    idle_mb: float | None = None

    def count(self, kind: str, outcome: str) -> None:
        self.sent[kind] = self.sent.get(kind, 0) + 1
        by_kind = self.statuses.setdefault(kind, {})
        by_kind[outcome] = by_kind.get(outcome, 0) + 1


def expected_answers(export: Path, samples: list[str]) -> Expected:
    """Each sample's n-best alone, per setting: what `s2s-deploy translate` prints for it."""
    translator = Translator(export, device="cpu", threads=1)
    return {(beam, n_best): {text: list(result.hypotheses)
                             for text, result in zip(samples, translator(samples, beam, n_best, batch_size=1),
                                                     strict=True)}
            for beam, n_best in SETTINGS}


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def process_tree(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            for task in Path(f"/proc/{current}/task").iterdir():
                todo.extend(int(p) for p in (task / "children").read_text().split())
        except OSError:
            continue
    return found


def workers_of(pid: int) -> list[int]:
    """uvicorn's worker processes: the server's children started by multiprocessing (not its
    resource tracker)."""
    found = []
    for child in process_tree(pid)[1:]:
        try:
            if "spawn_main" in Path(f"/proc/{child}/cmdline").read_text():
                found.append(child)
        except OSError:
            continue
    return found


async def raw_request(port: int, head: bytes, body: bytes | memoryview, dribble_s: float = 0.0,
                      hang_up: bool = False, timeout: float = 300,
                      expect_continue: bool = False) -> tuple[int | None, bytes]:
    """One request on a raw socket: the body sent in pieces over ``dribble_s``, or the connection
    closed right after sending (``hang_up``); with ``expect_continue``, the body only after a
    100 Continue, as curl sends large bodies. Returns the status (None: no answer) and body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        if expect_continue:
            first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
            if not first.startswith(b"HTTP/1.1 100"):
                answer = first + await asyncio.wait_for(reader.read(), timeout)
                body = b""
        pieces = 8 if dribble_s else max(1, len(body) // (1 << 20))
        step = max(1, -(-len(body) // pieces))
        for start in range(0, len(body), step):
            writer.write(bytes(body[start : start + step]))
            await writer.drain()
            if dribble_s:
                await asyncio.sleep(dribble_s / pieces)
        if hang_up:
            return None, b""
        if body or not expect_continue:
            answer = await asyncio.wait_for(reader.read(), timeout)
    except (ConnectionError, OSError, asyncio.IncompleteReadError):
        try:
            answer = await asyncio.wait_for(reader.read(), 5)  # a 413 may have been written before the reset
        except (ConnectionError, OSError, asyncio.TimeoutError):
            return None, b""
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()
    if not answer.startswith(b"HTTP/1.1 "):
        return None, answer
    head_part, _, payload = answer.partition(b"\r\n\r\n")
    return int(head_part.split(b" ", 2)[1]), payload


def request_head(length: int, expect_continue: bool = False) -> bytes:
    expect = "Expect: 100-continue\r\n" if expect_continue else ""
    return (f"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n{expect}Connection: close\r\n\r\n").encode()


def check(expected: Expected, setting: tuple[int, int], texts: list[str], body: dict, tally: Tally) -> None:
    got = body.get("translations", [])
    ok = len(got) == len(texts)
    for text, answer in zip(texts, got, strict=False):
        want = expected[setting][text]
        hyps = answer.get("hypotheses", [])
        ok = ok and [h["text"] for h in hyps] == [t for t, _ in want] and all(
            abs(h["score"] - s) <= 1e-4 for h, (_, s) in zip(hyps, want, strict=True))
    if ok:
        tally.right += 1
    else:
        tally.wrong += 1
        if len(tally.wrong_examples) < 5:
            tally.wrong_examples.append(json.dumps({"texts": texts, "setting": setting, "got": got})[:500])


def in_flight_at_kill(tally: Tally, sent_s: float, ended_s: float) -> bool:
    return tally.killed_at_s is not None and sent_s <= tally.killed_at_s <= ended_s


async def client(number: int, port: int, samples: list[str], expected: Expected, deadline: float,
                 started: float, tally: Tally) -> None:
    rng = random.Random(number)
    big = memoryview(b" " * BIG_BODY)
    http = httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_keepalive_connections=0))
    url = f"http://127.0.0.1:{port}/translate"
    async with http:
        while time.monotonic() < deadline:
            kind = rng.choices([k for k, _ in KINDS], [w for _, w in KINDS])[0]
            setting = rng.choice(SETTINGS)
            texts = [rng.choice(samples) for _ in range(rng.randint(1, 8))]
            payload = json.dumps({"texts": texts, "beam": setting[0], "n_best": setting[1]}).encode()
            sent = time.monotonic()
            if kind == "translate":
                try:
                    response = await http.post(url, content=payload, headers={"content-type": "application/json"})
                except httpx.TransportError as exc:
                    if in_flight_at_kill(tally, sent - started, time.monotonic() - started):
                        tally.failed_in_flight_at_kill += 1
                        tally.count(kind, "no answer (worker killed)")
                    else:
                        tally.lost += 1
                        tally.count(kind, "no answer")
                        if len(tally.lost_examples) < 5:
                            tally.lost_examples.append(f"{sent - started:.1f}s: {type(exc).__name__}: {exc}")
                    continue
                tally.count(kind, str(response.status_code))
                if response.status_code == 200:
                    tally.latencies.append(time.monotonic() - sent)
                    check(expected, setting, texts, response.json(), tally)
                elif response.status_code != 503:  # a full queue is an answer, not a loss
                    tally.unexpected_status += 1
            elif kind == "malformed":
                status, _ = await raw_request(port, request_head(len(payload) - 3), payload[:-3])
                tally.count(kind, str(status))
                if status is None and in_flight_at_kill(tally, sent - started, time.monotonic() - started):
                    tally.failed_in_flight_at_kill += 1  # its connection was the killed worker's
                else:
                    tally.unexpected_status += status != 400
            elif kind == "big":  # half as curl sends a large body (Expect: 100-continue), half all at once
                asks = rng.random() < 0.5
                status, _ = await raw_request(port, request_head(BIG_BODY, asks), big, expect_continue=asks)
                tally.count(f"{kind}{' (expect 100)' if asks else ''}", str(status) if status else "reset")
                tally.unexpected_status += status != 413 if asks else status not in (413, None)
            elif kind == "slow":
                status, body = await raw_request(port, request_head(len(payload)), payload,
                                                 dribble_s=rng.uniform(1, 4))
                tally.count(kind, str(status))
                if status == 200:
                    check(expected, setting, texts, json.loads(body), tally)
                elif status is None and in_flight_at_kill(tally, sent - started, time.monotonic() - started):
                    tally.failed_in_flight_at_kill += 1
                elif status != 503:
                    tally.unexpected_status += 1
            else:
                await raw_request(port, request_head(len(payload)), payload, hang_up=True)
                tally.count(kind, "hung up")


async def watch(process: subprocess.Popen, started: float, deadline: float, kill_at: float, every_s: float,
                tally: Tally) -> None:
    """Sample the server's memory; SIGKILL one worker at ``kill_at`` seconds."""
    while time.monotonic() < deadline:
        now = time.monotonic() - started
        if tally.killed_at_s is None and kill_at >= 0 and now >= kill_at:
            victims = workers_of(process.pid)
            if victims:
                tally.killed_pid = victims[0]
                tally.killed_at_s = time.monotonic() - started
                os.kill(victims[0], signal.SIGKILL)
        tree, workers = process_tree(process.pid), workers_of(process.pid)
        tally.memory.append({"t_s": round(now, 1), "total_mb": round(sum(rss_mb(p) for p in tree), 1),
                             "workers": len(workers), "workers_mb": [round(rss_mb(p), 1) for p in workers],
                             "worker_pids": workers})
        await asyncio.sleep(every_s)


AUDIO_DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
UPLOAD_LIMIT = 32 << 20
"""serve.app.MAX_AUDIO_BYTES: a larger body is refused before it is read."""
AUDIO_KINDS = (("good", 0.68), ("hostile", 0.30), ("oversized", 0.02))
ENDPOINTS = ("/transcribe", "/v1/audio/transcriptions")


def wav_bytes(samples: np.ndarray, rate: int, subtype: str = "PCM_16") -> bytes:
    import io

    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="WAV", subtype=subtype)
    return buffer.getvalue()


def patched(wav: bytes, rate: int | None = None, data_size: int | None = None) -> bytes:
    """A canonical 44-byte-header WAV with its header lying: another sample (and byte) rate, or a data
    chunk claiming ``data_size`` bytes (the RIFF size to match)."""
    head = bytearray(wav[:44])
    assert head[:4] == b"RIFF" and head[36:40] == b"data", "not a canonical WAV"
    if rate is not None:
        block = int.from_bytes(head[32:34], "little")
        head[24:28], head[28:32] = rate.to_bytes(4, "little"), (rate * block).to_bytes(4, "little")
    if data_size is not None:
        head[40:44], head[4:8] = data_size.to_bytes(4, "little"), min(data_size + 36, 0xFFFFFFFF).to_bytes(4, "little")
    return bytes(head) + wav[44:]


def flac_claiming(flac: bytes, samples: int) -> bytes:
    """A FLAC whose STREAMINFO claims ``samples`` samples (its 36-bit total), its audio unchanged."""
    assert flac[:4] == b"fLaC" and flac[4] & 0x7F == 0, "not a FLAC starting with its STREAMINFO"
    packed = int.from_bytes(flac[18:26], "big")
    return flac[:18] + ((packed >> 36 << 36) | samples).to_bytes(8, "big") + flac[26:]


def audio_files(folder: Path | None) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """The good files (name: bytes) and the hostile ones, made from tests/data's FLACs (or ``folder``'s)."""
    import soundfile

    good: dict[str, bytes] = {}
    flacs = sorted((folder or AUDIO_DATA).glob("*.flac"))
    if not flacs:
        raise S2SError(f"no .flac files in {folder or AUDIO_DATA}")
    for path in flacs:
        good[path.name] = path.read_bytes()
        samples, rate = soundfile.read(path, dtype="float32")
        good[f"{path.stem}.wav"] = wav_bytes(samples, rate)
        good[f"{path.stem}-stereo.wav"] = wav_bytes(np.stack([samples, 0.5 * samples], axis=1), rate)
    speech, rate = soundfile.read(flacs[0], dtype="float32")
    gap = np.zeros(rate, dtype=np.float32)
    long = np.concatenate([speech, gap, speech, gap * 3, speech, gap * 4, speech, gap * 5, speech])
    good["long.wav"] = wav_bytes(long, rate)  # several of the encoder's windows
    whole = wav_bytes(speech, rate)
    good["truncated.wav"] = whole[: 44 + (len(whole) - 44) // 4 * 2]  # its header promises twice the data: warned
    good["oversized-data-chunk.wav"] = patched(whole, data_size=0xFFFFFF00)  # libsndfile reads what is there
    floats = wav_bytes(speech, rate, "FLOAT")
    rng = np.random.default_rng(0)
    nan = speech.copy()
    nan[len(nan) // 2] = np.nan
    inf = speech.copy()
    inf[10] = np.inf
    hostile = {
        "1hz-header.wav": patched(whole[:4096], rate=1),  # 4 KB claiming an hour: over the duration limit
        "10mhz-header.wav": patched(whole, rate=10_000_000),
        "hours-claimed.flac": flac_claiming(good[flacs[0].name], (1 << 36) - 1),  # 1,193 hours at 16 kHz, in 21 KB
        "header-only.wav": patched(whole[:44], data_size=0),
        "nan.wav": wav_bytes(nan, rate, "FLOAT"),
        "inf.wav": wav_bytes(inf, rate, "FLOAT"),
        "empty": b"",
        "random.bin": rng.bytes(20000),
        "json.txt": json.dumps({"texts": ["not audio"]}).encode(),
        "png.png": b"\x89PNG\r\n\x1a\n" + rng.bytes(3000),
        "half-float-header.wav": floats[:30],
    }
    return good, hostile


def transcribed(export: Path, good: dict[str, bytes], folder: Path) -> dict[str, str]:
    """What `transcribe` prints for each good file (written to ``folder``, read as the CLI reads them)."""
    from s2s_deploy.runtime.transcriber import Transcriber

    transcriber = Transcriber(export, device="cpu", threads=1, warn=lambda line: None)
    paths = []
    for name, data in good.items():
        (folder / name).write_bytes(data)
        paths.append(str(folder / name))
    return {name: result.text for name, result in zip(good, transcriber(paths), strict=True)}


def one_line_error(status: int, body: bytes) -> bool:
    """A 4xx whose error (native ``{"error": str}`` or OpenAI's ``{"error": {"message": str}}``) is one
    line with no Python repr."""
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    message = error.get("message") if isinstance(error, dict) else error
    return (400 <= status < 500 and isinstance(message, str) and bool(message) and "\n" not in message
            and " object at 0x" not in message and "Traceback" not in message)


async def audio_client(number: int, port: int, good: dict[str, bytes], hostile: dict[str, bytes],
                       expected: dict[str, str], deadline: float, started: float, tally: Tally) -> None:
    rng = random.Random(number)
    http = httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_keepalive_connections=0))
    base = f"http://127.0.0.1:{port}"
    big = memoryview(b"\0" * (UPLOAD_LIMIT + (1 << 20)))
    async with http:
        while time.monotonic() < deadline:
            kind = rng.choices([k for k, _ in AUDIO_KINDS], [w for _, w in AUDIO_KINDS])[0]
            endpoint = rng.choice(ENDPOINTS)
            openai = endpoint.startswith("/v1")
            if kind == "oversized":  # judged from Content-Length, before the body is read; sent as curl sends
                head = (f"POST {endpoint} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "  # a large body
                        f"{'multipart/form-data; boundary=x' if openai else 'audio/wav'}\r\n"
                        f"Content-Length: {len(big)}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n").encode()
                status, body = await raw_request(port, head, big, expect_continue=True)
                label = f"oversized {endpoint}"
                tally.count(label, str(status) if status else "reset")
                if status is None or not one_line_error(status, body):
                    tally.unexpected_status += 1
                    note(tally, f"{label}: {status} {body[:200]!r}")
                continue
            name = rng.choice(list(good if kind == "good" else hostile))
            data = (good if kind == "good" else hostile)[name]
            stream = not openai and kind == "good" and rng.random() < 1 / 3
            label = f"{kind} {endpoint}{' stream' if stream else ''}"
            sent = time.monotonic()
            try:
                if openai:
                    response = await http.post(base + endpoint, files={"file": (name, data)},
                                               data={"model": "m", "response_format": "json"})
                    status, body = response.status_code, response.content
                elif stream:
                    async with http.stream("POST", base + endpoint, params={"stream": "true"},
                                           content=data) as response:
                        status, body = response.status_code, await response.aread()
                else:
                    response = await http.post(base + endpoint, content=data)
                    status, body = response.status_code, response.content
            except httpx.TransportError as exc:
                tally.lost += 1
                tally.count(label, "no answer")
                if len(tally.lost_examples) < 5:
                    tally.lost_examples.append(f"{sent - started:.1f}s {label} {name}: {type(exc).__name__}: {exc}")
                continue
            tally.count(label, str(status))
            if kind == "hostile":
                if not one_line_error(status, body):
                    tally.unexpected_status += 1
                    note(tally, f"{label} {name}: {status} {body[:200]!r}")
                continue
            if status == 503:
                continue
            if status != 200:
                tally.unexpected_status += 1
                note(tally, f"{label} {name}: {status} {body[:200]!r}")
                continue
            tally.latencies.append(time.monotonic() - sent)
            if openai:
                text = json.loads(body)["text"]
            else:
                lines = [json.loads(line) for line in body.splitlines() if line.strip()]
                text = lines[-1]["transcriptions"][0]["text"]
                pieces = [line["segment"]["text"].strip() for line in lines[:-1]]
                if stream and " ".join(p for p in pieces if p) != " ".join(text.split()):
                    text = None  # the streamed segments are not the answer (windows' texts joined by a space)
            if text == expected[name]:
                tally.right += 1
            else:
                tally.wrong += 1
                if len(tally.wrong_examples) < 5:
                    tally.wrong_examples.append(f"{label} {name}: {text!r} != {expected[name]!r}")


def note(tally: Tally, line: str) -> None:
    if len(tally.unexpected_examples) < 10:
        tally.unexpected_examples.append(line)


def slope_mb_per_min(memory: list[dict[str, float]], after_s: float) -> float:
    """The least-squares slope of the server's RSS after ``after_s`` seconds, in MB per minute."""
    points = [(m["t_s"], m["total_mb"]) for m in memory if m["t_s"] >= after_s]
    if len(points) < 3:
        return float("nan")
    t, mb = np.array(points).T
    return float(np.polyfit(t, mb, 1)[0] * 60)


def start_server(export: Path, workers: int, port: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "s2s_deploy", "serve", str(export), "--port", str(port), "--workers", str(workers)]
    # stderr to a file, not a pipe nobody reads during the run: once a pipe's 64 KB fill with the damaged
    # clips' warnings, the worker thread writing the next one blocks, and every request queued behind it
    log = tempfile.TemporaryFile("w+")  # noqa: SIM115 (open for as long as the server runs)
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.seek(0)
            raise SystemExit(f"error: serve exited {process.returncode}: {log.read().strip()}")
        try:
            if len(workers_of(process.pid)) >= workers and httpx.get(f"http://127.0.0.1:{port}/health",
                                                                     timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    process.kill()
    raise SystemExit("error: serve did not start within 120 s")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else float("nan")


def summary(tally: Tally, args: argparse.Namespace) -> list[str]:
    memory = tally.memory
    settled = [m["total_mb"] for m in memory if m["t_s"] >= min(30.0, args.duration / 5)]
    lines = [
        f"{args.clients} clients, {args.duration:.0f} s, serve --workers {args.workers}; "
        + (f"worker {tally.killed_pid} killed at {tally.killed_at_s:.1f} s" if tally.killed_at_s is not None
           else "no worker killed"),
        f"requests: {sum(tally.sent.values())} ({', '.join(f'{k} {v}' for k, v in tally.sent.items())})",
        f"outcomes: {json.dumps(tally.statuses)}",
        f"answers checked: {tally.right} right, {tally.wrong} wrong; no answer: "
        f"{tally.failed_in_flight_at_kill} in flight on the killed worker (slow clients included), "
        f"{tally.lost} lost otherwise; "
        f"{tally.unexpected_status} unexpected statuses",
        f"latency of checked answers: p50 {percentile(tally.latencies, 50):.3f} s, "
        f"p99 {percentile(tally.latencies, 99):.3f} s, max {max(tally.latencies, default=float('nan')):.3f} s",
    ]
    if memory:
        warm = min(30.0, args.duration / 5)
        lines.append(f"server RSS (all processes): first {memory[0]['total_mb']:.0f} MB, after warm-up "
                     f"{settled[0] if settled else float('nan'):.0f} MB, min {min(settled, default=0):.0f} / "
                     f"max {max(settled, default=0):.0f} MB, last {memory[-1]['total_mb']:.0f} MB; slope after "
                     f"{warm:.0f} s {slope_mb_per_min(memory, warm):+.2f} MB/min over {len(settled)} samples"
                     + (f"; idle {tally.idle_mb:.0f} MB 5 s after the load" if tally.idle_mb is not None else ""))
        half = args.duration / 2
        late = [m["total_mb"] for m in memory if m["t_s"] >= half]
        lines.append(f"server RSS over the second half (from {half:.0f} s): {min(late, default=0):.0f}-"
                     f"{max(late, default=0):.0f} MB, slope {slope_mb_per_min(memory, half):+.2f} MB/min over "
                     f"{len(late)} samples; first half from {warm:.0f} s: "
                     f"{slope_mb_per_min([m for m in memory if m['t_s'] < half], warm):+.2f} MB/min")
    if tally.unexpected_examples:
        lines.append("unexpected: " + " | ".join(tally.unexpected_examples))
    if tally.wrong_examples:
        lines.append("wrong: " + " | ".join(tally.wrong_examples))
    if tally.lost_examples:
        lines.append("lost: " + " | ".join(tally.lost_examples))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", type=Path)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--duration", type=float, default=600.0, help="Seconds of load.")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--kill-at", type=float, default=0.5, help="Share of the duration at which a worker dies.")
    parser.add_argument("--no-kill", action="store_true", help="Kill no worker: every request must be answered.")
    parser.add_argument("--audio", type=Path, default=None,
                        help="A folder of good .flac clips for an audio export [tests/data].")
    parser.add_argument("--sample-every", type=float, default=5.0, help="Seconds between memory samples.")
    parser.add_argument("--json", type=Path, default=None, help="Write the whole record here.")
    args = parser.parse_args()
    try:
        audio = load_manifest(args.export).encoder_input.is_features
        if audio:
            good, hostile = audio_files(args.audio)
            with tempfile.TemporaryDirectory() as folder:
                heard = transcribed(args.export, good, Path(folder))
        else:
            samples = list(load_manifest(args.export).samples)
            if not samples:
                raise S2SError(f"{args.export} stores no sample inputs to send")
            expected = expected_answers(args.export, samples)
    except S2SError as exc:
        raise SystemExit(f"error: {exc}") from None
    port = free_port()
    process = start_server(args.export, args.workers, port)
    tally = Tally()

    async def soak() -> None:
        started = time.monotonic()
        deadline = started + args.duration
        clients = (audio_client(n, port, good, hostile, heard, deadline, started, tally) if audio
                   else client(n, port, samples, expected, deadline, started, tally) for n in range(args.clients))
        kill_at = -1.0 if args.no_kill else args.kill_at * args.duration
        await asyncio.gather(watch(process, started, deadline, kill_at, args.sample_every, tally), *clients)
        await asyncio.sleep(5)  # the load over: what stays resident
        tally.idle_mb = round(sum(rss_mb(p) for p in process_tree(process.pid)), 1)

    try:
        asyncio.run(soak())
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
    lines = summary(tally, args)
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "summary": lines,
                                         **asdict(tally)}, indent=1))
    sys.exit(1 if tally.wrong or tally.lost or tally.unexpected_status else 0)


if __name__ == "__main__":
    main()
