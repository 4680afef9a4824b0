"""Decoder-step denormal flushing off and on (runtime/ort/denormals.py), in turn, on one export:
tokens per second of ``translate_ids`` and whether every token and score is bit-identical.

    python benchmarks/denormals_ab.py /tmp/race/mt5/s2s-int8 --beam 4 --batch-size 16

Each mode runs in a fresh process (ONNX Runtime fixes a process's flags at its first session).
Inputs: the ``inputs.json`` beside the export (``benchmarks/race_models.py``), exactly
``--length`` tokens per sentence, as the races ask."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def one(export: Path, beam: int, batch_size: int, length: int, rounds: int, flush: bool) -> dict:
    from s2s_deploy.runtime.ort import denormals

    if not flush:
        denormals._libm.cache_clear()
        denormals._libm = lambda: None  # type: ignore[assignment]  # as on a machine that cannot flush
    from s2s_deploy.runtime.translator import Translator

    sources = json.loads((export.parent / "inputs.json").read_text())["sources"]
    translator = Translator(export, device="cpu", threads=2)
    kwargs = dict(beam=beam, n_best=1, max_len=length, min_len=length, alpha=1.0, batch_size=batch_size)
    translator.translate_ids(sources[:batch_size], **kwargs)  # warm-up
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        found = translator.translate_ids(sources, **kwargs)
        times.append(time.perf_counter() - started)
    return {"tok_s": len(sources) * length / min(times),
            "out": [[(list(map(int, h.tokens)), np.float32(h.score).tobytes().hex()) for h in row] for row in found]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", type=Path)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mode", choices=["off", "on"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(one(args.export, args.beam, args.batch_size, args.length, args.rounds, args.mode == "on")))
        return
    results = {}
    for mode in ("off", "on"):
        done = subprocess.run([sys.executable, __file__, str(args.export), "--beam", str(args.beam), "--batch-size",
                               str(args.batch_size), "--length", str(args.length), "--rounds", str(args.rounds),
                               "--mode", mode], capture_output=True, text=True, check=True)
        results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    off, on = results["off"], results["on"]
    print(f"{args.export} beam {args.beam} x {args.batch_size}: off {off['tok_s']:.1f} tok/s, on {on['tok_s']:.1f} "
          f"tok/s ({on['tok_s'] / off['tok_s']:.2f}x); tokens and scores bit-identical: {off['out'] == on['out']}")


if __name__ == "__main__":
    main()
