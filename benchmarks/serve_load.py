"""Load test of ``s2s-deploy serve`` on loopback: latency percentiles and throughput at several
client counts, against one sequential client; counts errors, checks every answer against
``s2s-deploy translate`` and watches the server's memory. Bounded in requests and in time.

usage: python benchmarks/serve_load.py EXPORT_DIR [--clients 1,8,64] [--requests 512] [--seconds 60]
                                        [--repeat 2] [--beam 1] [--workers 1] [--threads N] [--window-ms 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def rss_mib(pid: int) -> float:
    """Resident memory of the server and its worker processes."""
    total = 0
    for proc in [pid, *_descendants(pid)]:
        try:
            for line in Path(f"/proc/{proc}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except FileNotFoundError:
            continue
    return total / 1024


def _descendants(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            found += [int(child), *_descendants(int(child))]
    return found


def cli_translations(export_dir: str, texts: list[str], beam: int) -> list[str]:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as handle:
        handle.write("\n".join(texts) + "\n")
    try:
        result = subprocess.run([sys.executable, "-m", "s2s_deploy", "translate", export_dir, "--input", handle.name,
                                 "--beam", str(beam), "--device", "cpu"], capture_output=True, text=True, check=True)
    finally:
        os.unlink(handle.name)
    return result.stdout.splitlines()


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "s2s_deploy", "serve", args.export_dir, "--host", "127.0.0.1", "--port", str(port),
               "--workers", str(args.workers), "--window-ms", str(args.window_ms), "--max-queue", "100000"]
    if args.threads:
        command += ["--threads", str(args.threads)]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            if process.poll() is not None:
                sys.exit(f"serve exited: {process.stderr.read()}")
            time.sleep(0.1)
    process.kill()
    sys.exit("serve did not start in 60 s")


async def level(url: str, clients: int, texts: list[str], expected: dict[str, str], beam: int, requests: int,
                seconds: float) -> dict:
    """``clients`` concurrent clients, each sending one sentence per request and waiting for it."""
    latencies: list[float] = []
    errors = mismatches = 0
    issued = 0
    deadline = time.monotonic() + seconds + 30  # connecting gets 30 s of its own

    connected = 0
    go = asyncio.Event()

    async def client() -> None:  # its own connection: httpx's shared pool is slow with many waiters
        nonlocal issued, errors, mismatches, connected
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            await http.get("/health")  # connect before the clock starts: only requests are timed
            connected += 1
            if connected == clients:
                go.set()
            await go.wait()
            while issued < requests and time.monotonic() < deadline:
                text = texts[issued % len(texts)]
                issued += 1
                start = time.perf_counter()
                try:
                    response = await http.post("/translate", json={"texts": [text], "beam": beam})
                except httpx.HTTPError:
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - start)
                if response.status_code != 200:
                    errors += 1
                elif response.json()["translations"][0]["text"] != expected[text]:
                    mismatches += 1

    tasks = [asyncio.ensure_future(client()) for _ in range(clients)]
    await go.wait()
    began = time.perf_counter()
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - began
    cuts = statistics.quantiles(latencies, n=100, method="inclusive") if len(latencies) > 1 else [latencies[0]] * 99
    return {"clients": clients, "requests": len(latencies), "errors": errors, "mismatches": mismatches,
            "p50_ms": 1000 * cuts[49], "p95_ms": 1000 * cuts[94], "p99_ms": 1000 * cuts[98],
            "throughput": len(latencies) / wall, "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export_dir")
    parser.add_argument("--clients", default="1,8,64", help="client counts; 1 is the sequential baseline")
    parser.add_argument("--requests", type=int, default=512, help="requests per client count (at most)")
    parser.add_argument("--seconds", type=float, default=60, help="time limit per client count")
    parser.add_argument("--repeat", type=int, default=2, help="runs of the last client count")
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--window-ms", type=float, default=5.0)
    args = parser.parse_args()

    process, url = start_server(args)
    try:
        texts = _samples(args.export_dir)
        expected = dict(zip(texts, cli_translations(args.export_dir, texts, args.beam), strict=True))
        asyncio.run(level(url, 1, texts, expected, args.beam, min(16, args.requests), 30))  # warm-up
        print(f"serve {args.export_dir}: beam {args.beam}, {args.workers} worker(s), window {args.window_ms} ms, "
              f"{len(texts)} distinct sentences, one per request\n")
        print("| clients | requests | errors | mismatches | p50 ms | p95 ms | p99 ms | req/s | × sequential "
              "| server RSS MiB before → after |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        baseline = None
        failed = 0
        counts = [int(c) for c in args.clients.split(",")]
        for clients in counts + [counts[-1]] * (args.repeat - 1):  # repeats: memory must not keep growing
            before = rss_mib(process.pid)
            row = asyncio.run(level(url, clients, texts, expected, args.beam, args.requests, args.seconds))
            after = rss_mib(process.pid)
            baseline = baseline or row["throughput"]
            failed += row["errors"] + row["mismatches"]
            print(f"| {clients} | {row['requests']} | {row['errors']} | {row['mismatches']} | {row['p50_ms']:.1f} | "
                  f"{row['p95_ms']:.1f} | {row['p99_ms']:.1f} | {row['throughput']:.1f} | "
                  f"{row['throughput'] / baseline:.2f} | {before:.0f} → {after:.0f} |", flush=True)
        stats = httpx.get(f"{url}/health").json()
        print(f"\nlast worker asked: {stats['batches']} batches, {stats['sentences']} sentences, "
              f"largest batch {stats['largest']}")
    finally:
        process.terminate()
        code = process.wait(timeout=60)
    # uvicorn re-raises a SIGTERM it handled once it has shut down cleanly: -15 for one worker
    print(f"server exit code after SIGTERM: {code}")
    sys.exit(1 if failed or code not in (0, -15) else 0)


def _samples(export_dir: str) -> list[str]:
    from s2s_deploy.format.manifest import load_manifest

    return list(dict.fromkeys(load_manifest(export_dir).samples))


if __name__ == "__main__":
    main()
