"""Two source trees of s2s-deploy on one export, timed pass against pass: a change to the runtime
whose effect is a few percent, measured as benchmarks/export_ab.py measures a change to the graphs.

    python benchmarks/code_ab.py A_TREE B_TREE EXPORT_DIR [--beams 1,4] [--batch 1] [--pairs 8]
        [--sentences 16] [--tokens 32] [--threads 1]

A_TREE and B_TREE are folders holding an ``s2s_deploy`` package (``git archive main s2s_deploy |
tar -x -C /tmp/a`` gives one). Each runs in its own worker process with that tree first on its
path, idle while the other works, with a rest before each pass so the other's threads stop
spinning. For each beam, after a warm-up pass each, the two take turns, alternating who goes
first; each pair (the same sentences, exactly ``--tokens`` tokens each) gives one ratio, and the
median of those ratios, with their range, is the figure. B/A above 1 means B is faster. Each pass
is timed twice: wall clock, and the worker's own CPU time (``time.process_time``), which on a
machine others load moves far less than the wall clock does (at ``--threads 1`` the worker has
no idle pool threads whose spinning it would count).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def worker(args: argparse.Namespace) -> None:
    """Answer each 'beam' line with the tokens per wall and per CPU second of one pass over the
    sentences, one batch at a time."""
    import s2s_deploy
    from s2s_deploy.bench.runner import source_batches
    from s2s_deploy.runtime.translator import Translator

    system = Translator(args.export, device="cpu", threads=args.threads)
    vocab = system.manifest.src_vocab
    sources = [vocab.encode(text) for text in source_batches(args.export, args.sentences)]
    print(json.dumps({"ready": str(Path(s2s_deploy.__file__).parent.parent)}), flush=True)
    for line in sys.stdin:
        beam = int(line)
        started, cpu = time.perf_counter(), time.process_time()
        for i in range(0, len(sources), args.batch):
            system.translate_ids(sources[i : i + args.batch], beam=beam, n_best=1, max_len=args.tokens,
                                 min_len=args.tokens, batch_size=args.batch)
        tokens = args.tokens * len(sources)
        print(json.dumps({"wall": tokens / (time.perf_counter() - started),
                          "cpu": tokens / (time.process_time() - cpu)}), flush=True)


class _Worker:
    def __init__(self, tree: Path, argv: list[str]) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
        self.process = subprocess.Popen([sys.executable, __file__, "--worker", *argv], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env=env, cwd=tree)
        self.tree = self._read()["ready"]

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"error: worker {self.process.args} exited with {self.process.wait()}")
        return json.loads(line)

    def run(self, beam: int) -> dict[str, float]:
        self.process.stdin.write(f"{beam}\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("export", type=Path)
    parser.add_argument("--beams", default="1,4")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--sentences", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    for tree in (args.a, args.b):
        if not (tree / "s2s_deploy" / "__init__.py").is_file():
            raise SystemExit(f"error: {tree} holds no s2s_deploy package")
    shared = [str(args.a), str(args.b), str(args.export.resolve()), "--batch", str(args.batch), "--sentences",
              str(args.sentences), "--tokens", str(args.tokens), "--threads", str(args.threads)]
    workers = [_Worker(args.a.resolve(), shared), _Worker(args.b.resolve(), shared)]
    try:
        print(f"A {workers[0].tree}\nB {workers[1].tree}")
        for beam in (int(b) for b in args.beams.split(",")):
            for w in workers:  # warm-up
                w.run(beam)
            passes: list[list[dict[str, float]]] = [[], []]
            for pair in range(args.pairs):
                for i in (0, 1) if pair % 2 == 0 else (1, 0):
                    time.sleep(0.3)
                    passes[i].append(workers[i].run(beam))
            for clock in ("wall", "cpu"):
                a, b = ([p[clock] for p in side] for side in passes)
                ratios = [y / x for x, y in zip(a, b, strict=True)]
                print(f"beam {beam} batch {args.batch}, {clock:4}: A {statistics.median(a):.1f} tok/s, "
                      f"B {statistics.median(b):.1f} tok/s; B/A median {statistics.median(ratios):.3f} "
                      f"(range {min(ratios):.3f}-{max(ratios):.3f}, {args.pairs} pairs)", flush=True)
    finally:
        for w in workers:
            w.close()


if __name__ == "__main__":
    main()
