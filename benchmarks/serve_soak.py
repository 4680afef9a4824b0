"""Load and faults against `s2s-deploy serve --workers 2`, measured: answers lost, answers that
differ from `translate`, p99 latency and memory over time.

    python benchmarks/serve_soak.py exported/transformer [--clients 64] [--duration 600]
        [--workers 2] [--kill-at 0.5] [--json soak.json]

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
(RSS) is sampled every few seconds. Exit 1 unless nothing was wrong and nothing was lost beyond
the killed worker's requests in flight.
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
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

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
    """uvicorn's worker processes: the server's children started by multiprocessing."""
    found = []
    for child in process_tree(pid)[1:]:
        try:
            if "multiprocessing" in Path(f"/proc/{child}/cmdline").read_text():
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
        if tally.killed_at_s is None and now >= kill_at:
            victims = workers_of(process.pid)
            if victims:
                tally.killed_pid = victims[0]
                tally.killed_at_s = time.monotonic() - started
                os.kill(victims[0], signal.SIGKILL)
        tree = process_tree(process.pid)
        tally.memory.append({"t_s": round(now, 1), "total_mb": round(sum(rss_mb(p) for p in tree), 1),
                             "workers": len(workers_of(process.pid))})
        await asyncio.sleep(every_s)


def start_server(export: Path, workers: int, port: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "s2s_deploy", "serve", str(export), "--port", str(port), "--workers", str(workers)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"error: serve exited {process.returncode}: {process.stderr.read().strip()}")
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
        f"{args.clients} clients, {args.duration:.0f} s, serve --workers {args.workers}; worker "
        f"{tally.killed_pid} killed at {tally.killed_at_s or 0:.1f} s",
        f"requests: {sum(tally.sent.values())} ({', '.join(f'{k} {v}' for k, v in tally.sent.items())})",
        f"outcomes: {json.dumps(tally.statuses)}",
        f"translations checked: {tally.right} right, {tally.wrong} wrong; no answer: "
        f"{tally.failed_in_flight_at_kill} in flight on the killed worker (slow clients included), "
        f"{tally.lost} lost otherwise; "
        f"{tally.unexpected_status} unexpected statuses",
        f"latency of answered translations: p50 {percentile(tally.latencies, 50):.3f} s, "
        f"p99 {percentile(tally.latencies, 99):.3f} s, max {max(tally.latencies, default=float('nan')):.3f} s",
    ]
    if memory:
        lines.append(f"server RSS (all processes): first {memory[0]['total_mb']:.0f} MB, after warm-up "
                     f"{settled[0] if settled else float('nan'):.0f} MB, min {min(settled, default=0):.0f} / "
                     f"max {max(settled, default=0):.0f} MB, last {memory[-1]['total_mb']:.0f} MB")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", type=Path)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--duration", type=float, default=600.0, help="Seconds of load.")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--kill-at", type=float, default=0.5, help="Share of the duration at which a worker dies.")
    parser.add_argument("--sample-every", type=float, default=5.0, help="Seconds between memory samples.")
    parser.add_argument("--json", type=Path, default=None, help="Write the whole record here.")
    args = parser.parse_args()
    try:
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
        await asyncio.gather(watch(process, started, deadline, args.kill_at * args.duration, args.sample_every,
                                   tally),
                             *(client(n, port, samples, expected, deadline, started, tally)
                               for n in range(args.clients)))

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
