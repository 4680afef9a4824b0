"""Our engine against peers of ``../shared/peers``, repetition by repetition, so all see the
same machine: on a shared 2-core VM a slow phase lasts seconds to minutes, long enough to decide
a ratio measured system after system.

Each system runs in its own worker process (its own interpreter: the peer's venv, ours), idle
while another works, with a rest before each pass so the others' threads stop spinning. For
every cell (beam, batch), after a warm-up pass each, the systems take turns, rotating who goes
first; each round gives one ratio per peer (peer time / our time), and the cell reports the
median of those ratios beside each system's median tokens/s, and how many sentences of the last
pass each peer decoded to our tokens (the same model, decoded the same way, must agree).

With ``--bound``, this process also times the export's limits after every round, while the workers
wait (``s2s_deploy.bench.roofline``): the bound says what tokens/s no engine streaming these
weights could beat in that minute, so ``bound / peer`` is the highest ratio to the peer that the
minute allowed any engine, and ``products / peer`` the highest this ONNX Runtime's kernels allowed.

    python benchmarks/peers_interleaved.py --peers ../shared/peers --peer-python /tmp/peers-venv/bin/python \\
        --peer ct2-int8 --export /tmp/peers/s2s-int8 --reps 8

``--root`` races another model through the same harness: a folder made by
``benchmarks/race_models.py`` (``hf/``, ``optimum/``, ``ct2-fp32/``, ``ct2-int8/``, ``inputs.json``)
replaces the harness's Marian paths and inputs. ``--b1-sentences`` times batch-1 cells on the
first N inputs only (a 600M-parameter model streams 2.4 GB a step at batch 1).
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
    if args.root:
        _point_at(harness, args.root)
    if args.export:
        row = _load(Path(__file__).with_name("peers_row.py"), "peers_row")
        system = row.S2SDeploy(args.export, harness.THREADS, harness.GEN_LEN, "loop")
    else:
        system = unmerged_optimum(harness) if args.peer[0] == "ort-unmerged" else harness.SYSTEMS[args.peer[0]]()
    sources = harness.load_inputs()
    print(json.dumps({"ready": system.name}), flush=True)
    for line in sys.stdin:
        beam, batch, sentences = (int(x) for x in line.split())
        seconds, outputs = harness.one_pass(system, sources[:sentences], beam, batch)
        print(json.dumps({"seconds": seconds, "tokens": len(outputs) * harness.GEN_LEN, "outputs": outputs}),
              flush=True)


def unmerged_optimum(harness: Any) -> Any:
    """The harness's Optimum row on its two decoders (``decoder_model`` + ``decoder_with_past_model``)
    instead of the merged one: optimum-onnx 0.1.0's merged decoder sizes its empty first-step cache
    as ``d_model / heads`` per head, so it fails on mT5-small (6 heads of 64 in d 512)."""
    import functools

    from optimum.onnxruntime import ORTModelForSeq2SeqLM

    ORTModelForSeq2SeqLM.from_pretrained = functools.partial(ORTModelForSeq2SeqLM.from_pretrained, use_merged=False)
    system = harness.ORTOptimum()
    system.name += ", decoder and decoder_with_past"
    return system


def _point_at(harness: Any, root: Path) -> None:
    """The harness's model paths and inputs, moved to a ``race_models.py`` folder."""
    harness.MODEL_HF, harness.MODEL_ONNX = str(root / "hf"), str(root / "optimum")
    harness.MODEL_CT2 = {"ct2-fp32": (str(root / "ct2-fp32"), "float32"), "ct2-int8": (str(root / "ct2-int8"), "int8")}
    harness.INPUTS = str(root / "inputs.json")


class _Worker:
    def __init__(self, command: list[str]) -> None:
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.outputs: list[list[int]] = []  # the tokens of its last pass
        self.name = self._read()["ready"]

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"error: worker {self.process.args} exited with {self.process.wait()}")
        return json.loads(line)

    def run(self, beam: int, batch: int, sentences: int) -> tuple[float, int]:
        self.process.stdin.write(f"{beam} {batch} {sentences}\n")
        self.process.stdin.flush()
        answer = self._read()
        self.outputs = answer["outputs"]
        return answer["seconds"], answer["tokens"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=Path, required=True, help="the folder of bench_peers.py")
    parser.add_argument("--peer", action="append",
                        help="a key of the harness's SYSTEMS; repeat it to race several [default: ct2-int8]")
    parser.add_argument("--peer-python", default=sys.executable, help="the interpreter that has the peers installed")
    parser.add_argument("--export", type=Path, help="an s2s-deploy export of the harness's model")
    parser.add_argument("--root", type=Path, help="a benchmarks/race_models.py folder to race instead of the harness's")
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--b1-sentences", type=int, default=32, help="inputs per pass in batch-1 cells [default: 32]")
    parser.add_argument("--gap", type=float, default=0.3,
                        help="seconds of rest before each pass, so the other systems' idle threads stop spinning")
    parser.add_argument("--bound", action="store_true",
                        help="time the export's roofline limits after every round (see the docstring)")
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
    root = ["--root", str(args.root.resolve())] if args.root else []
    ours = _Worker([sys.executable, script, "--worker", "--peers", peers, "--export", str(args.export), *root])
    rivals = {key: _Worker([args.peer_python, script, "--worker", "--peers", peers, "--peer", key, *root])
              for key in args.peer or ["ct2-int8"]}
    results = []
    limits = None
    if args.bound:
        from s2s_deploy.bench import roofline
        from s2s_deploy.format.manifest import load_manifest

        manifest = load_manifest(args.export)
        threads = _load(args.peers / "bench_peers.py", "bench_peers").THREADS  # the harness's own count
        limits = roofline.LimitTimer(roofline.step_weights(manifest.graph_path(manifest.decoder)), threads)
    systems = {"ours": ours, **rivals}
    try:
        for beam, batch in args.cells:
            sentences = args.b1_sentences if batch == 1 else 1 << 30
            for system in systems.values():
                system.run(beam, batch, sentences)
            times: dict[str, list[float]] = {key: [] for key in systems}
            ceilings: dict[str, dict[str, list[float]]] = {key: {"bound": [], "products": []} for key in rivals}
            for rep in range(args.reps):
                turn = list(systems)[rep % len(systems):] + list(systems)[: rep % len(systems)]
                for key in turn:
                    time.sleep(args.gap)
                    seconds, tokens = systems[key].run(beam, batch, sentences)
                    times[key].append(seconds)
                if limits is not None:
                    now = limits.measure([beam * batch], budget_s=0.3)
                    for key in rivals:
                        peer_tok_s = tokens / times[key][-1]
                        ceilings[key]["bound"].append(roofline.bound(limits.weights, now, batch, beam)[0] / peer_tok_s)
                        ceilings[key]["products"].append(1000 * batch / now.products_ms[beam * batch] / peer_tok_s)
            cell: dict[str, Any] = {"beam": beam, "batch": batch, "tokens": tokens,
                                    "ours_tok_s": tokens / statistics.median(times["ours"]), "ours_s": times["ours"],
                                    "peers": {}}
            for key, peer in rivals.items():
                ratios = [p / o for p, o in zip(times[key], times["ours"], strict=True)]
                same = sum(a == b for a, b in zip(ours.outputs, peer.outputs, strict=True))
                row = {"name": peer.name, "tok_s": tokens / statistics.median(times[key]), "s": times[key],
                       "same_tokens": f"{same}/{len(ours.outputs)}",
                       "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}
                line = (f"beam {beam} batch {batch:2d}: {ours.name} {cell['ours_tok_s']:.1f} tok/s, {peer.name} "
                        f"{row['tok_s']:.1f} tok/s; per-round ratio median {row['ratio_median']:.2f}x "
                        f"[{row['ratio_min']:.2f}-{row['ratio_max']:.2f}]; same tokens {row['same_tokens']}")
                for kind, values in ceilings[key].items():
                    if values:
                        row[f"{kind}_ceiling"] = values
                        spread = f"[{min(values):.2f}-{max(values):.2f}]"
                        line += f"; {kind} / peer {statistics.median(values):.2f}x {spread}"
                cell["peers"][key] = row
                print(line, flush=True)
            results.append(cell)
    finally:
        for system in systems.values():
            system.close()
    print(json.dumps({"ours": ours.name, "reps": args.reps, "b1_sentences": args.b1_sentences, "cells": results}))


if __name__ == "__main__":
    main()
