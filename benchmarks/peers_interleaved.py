"""Our engine against one peer of ``../shared/peers``, repetition by repetition, so both see the
same machine: on a shared 2-core VM a slow phase lasts seconds to minutes, long enough to decide
a ratio measured system after system.

Each system runs in its own worker process (its own interpreter: the peer's venv, ours), idle
while the other works, with a rest before each pass so the other's threads stop spinning. For
every cell (beam, batch), after a warm-up pass each, the two take turns, alternating who goes
first; each pair of passes gives one ratio (peer time / our time), and the cell reports the
median of those ratios beside each system's median tokens/s.

With ``--bound``, this process also times the export's limits after every pair, while both workers
wait (``s2s_deploy.bench.roofline``): the bound says what tokens/s no engine streaming these
weights could beat in that minute, so ``bound / peer`` is the highest ratio to the peer that the
minute allowed any engine, and ``products / peer`` the highest this ONNX Runtime's kernels allowed.

    python benchmarks/peers_interleaved.py --peers ../shared/peers --peer-python /tmp/peers-venv/bin/python \\
        --peer ct2-int8 --export /tmp/peers/s2s-int8 --reps 8
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CELLS = ((1, 1), (1, 16), (4, 1), (4, 16))


def _load(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None or not path.is_file():
        raise SystemExit(f"error: no {path.name} in {path.parent}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cells(text: str) -> tuple[tuple[int, int], ...]:
    """``"1x1,4x16"`` as ((1, 1), (4, 16)): beam, then batch."""
    try:
        cells = tuple(tuple(int(n) for n in cell.split("x")) for cell in text.split(","))
    except ValueError:
        cells = ()
    if not cells or any(len(cell) != 2 or min(cell) < 1 for cell in cells):
        raise argparse.ArgumentTypeError(f"expected cells like 1x1,4x16 (beam x batch), got {text!r}")
    return cells


def worker(args: argparse.Namespace) -> None:
    """Answer 'beam batch' lines with the seconds of one pass over the harness's 32 inputs."""
    harness = _load(args.peers / "bench_peers.py", "bench_peers")
    if args.export:
        row = _load(Path(__file__).with_name("peers_row.py"), "peers_row")
        system = row.S2SDeploy(args.export, harness.THREADS, harness.GEN_LEN, "loop")
    else:
        system = harness.SYSTEMS[args.peer]()
    sources = harness.load_inputs()
    print(json.dumps({"ready": system.name}), flush=True)
    for line in sys.stdin:
        beam, batch = (int(x) for x in line.split())
        seconds, _ = harness.one_pass(system, sources, beam, batch)
        print(json.dumps({"seconds": seconds, "tokens": len(sources) * harness.GEN_LEN}), flush=True)


class _Worker:
    def __init__(self, command: list[str]) -> None:
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.name = self._read()["ready"]

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"error: worker {self.process.args} exited with {self.process.wait()}")
        return json.loads(line)

    def run(self, beam: int, batch: int) -> tuple[float, int]:
        self.process.stdin.write(f"{beam} {batch}\n")
        self.process.stdin.flush()
        answer = self._read()
        return answer["seconds"], answer["tokens"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=Path, required=True, help="the folder of bench_peers.py")
    parser.add_argument("--peer", default="ct2-int8", help="a key of the harness's SYSTEMS")
    parser.add_argument("--peer-python", default=sys.executable, help="the interpreter that has the peer installed")
    parser.add_argument("--export", type=Path, help="an s2s-deploy export of the harness's model")
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--gap", type=float, default=0.3,
                        help="seconds of rest before each pass, so the other system's idle threads stop spinning")
    parser.add_argument("--bound", action="store_true",
                        help="time the export's roofline limits after every pair (see the docstring)")
    parser.add_argument("--cells", type=_cells, default=CELLS,
                        help="beam x batch cells to time, comma-separated [default: 1x1,1x16,4x1,4x16]")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.export is None:
        raise SystemExit("error: --export is required")
    script, peers = str(Path(__file__).resolve()), str(args.peers.resolve())
    ours = _Worker([sys.executable, script, "--worker", "--peers", peers, "--export", str(args.export)])
    peer = _Worker([args.peer_python, script, "--worker", "--peers", peers, "--peer", args.peer])
    results = []
    limits = None
    if args.bound:
        from s2s_deploy.bench import roofline
        from s2s_deploy.format.manifest import load_manifest

        manifest = load_manifest(args.export)
        threads = _load(args.peers / "bench_peers.py", "bench_peers").THREADS  # the harness's own count
        limits = roofline.LimitTimer(roofline.step_weights(manifest.graph_path(manifest.decoder)), threads)
    try:
        for beam, batch in args.cells:
            ours.run(beam, batch)
            peer.run(beam, batch)
            times: dict[str, list[float]] = {"ours": [], "peer": []}
            ceilings: dict[str, list[float]] = {"bound": [], "products": []}
            for rep in range(args.reps):
                order = (("ours", ours), ("peer", peer)) if rep % 2 == 0 else (("peer", peer), ("ours", ours))
                for key, system in order:
                    time.sleep(args.gap)
                    seconds, tokens = system.run(beam, batch)
                    times[key].append(seconds)
                if limits is not None:
                    now = limits.measure([beam * batch], budget_s=0.3)
                    peer_tok_s = tokens / times["peer"][-1]
                    ceilings["bound"].append(roofline.bound(limits.weights, now, batch, beam)[0] / peer_tok_s)
                    ceilings["products"].append(1000 * batch / now.products_ms[beam * batch] / peer_tok_s)
            ratios = [p / o for p, o in zip(times["peer"], times["ours"], strict=True)]
            cell = {"beam": beam, "batch": batch, "tokens": tokens,
                    "ours_tok_s": tokens / statistics.median(times["ours"]),
                    "peer_tok_s": tokens / statistics.median(times["peer"]),
                    "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                    "ours_s": times["ours"], "peer_s": times["peer"]}
            line = (f"beam {beam} batch {batch:2d}: {ours.name} {cell['ours_tok_s']:.1f} tok/s, {peer.name} "
                    f"{cell['peer_tok_s']:.1f} tok/s; per-pair ratio median {cell['ratio_median']:.2f}x "
                    f"[{cell['ratio_min']:.2f}-{cell['ratio_max']:.2f}]")
            for key, values in ceilings.items():
                if values:
                    cell[f"{key}_ceiling"] = values
                    line += (f"; {key} / peer {statistics.median(values):.2f}x "
                             f"[{min(values):.2f}-{max(values):.2f}]")
            results.append(cell)
            print(line, flush=True)
    finally:
        ours.close()
        peer.close()
    print(json.dumps({"ours": ours.name, "peer": peer.name, "reps": args.reps, "cells": results}))


if __name__ == "__main__":
    main()
