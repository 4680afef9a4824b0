"""Two export folders of one model, timed pass against pass in one process.

    python benchmarks/export_ab.py A_DIR B_DIR [--beam 1] [--batch 1] [--pairs 8] [--sentences 16]
        [--tokens 32] [--threads 2]

For a change to the graphs or the session settings whose effect is a few percent: on a shared
VM the machine's speed moves more than that from minute to minute, so each pair of passes (the
same sentences, exactly ``--tokens`` tokens each, alternating who goes first) gives one ratio,
and the median of those ratios, with their range, is the figure. B/A above 1 means B is faster.
Both folders are loaded as ``translate`` loads them, so a changed graph must still pass its
manifest's checks.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from s2s_deploy.bench.runner import source_batches
from s2s_deploy.errors import S2SError
from s2s_deploy.runtime.translator import Translator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--sentences", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    try:
        systems = [Translator(path, device="cpu", threads=args.threads) for path in (args.a, args.b)]
        vocab = systems[0].manifest.src_vocab
        sources = [vocab.encode(text) for text in source_batches(args.a, args.sentences)]
    except S2SError as exc:
        raise SystemExit(f"error: {exc}") from None

    def one_pass(system: Translator) -> float:
        started = time.perf_counter()
        for i in range(0, len(sources), args.batch):
            system.translate_ids(sources[i : i + args.batch], beam=args.beam, n_best=1, max_len=args.tokens,
                                 min_len=args.tokens, batch_size=args.batch)
        return args.tokens * len(sources) / (time.perf_counter() - started)

    for system in systems:  # warm-up
        one_pass(system)
    speeds: list[list[float]] = [[], []]
    for pair in range(args.pairs):
        for i in (0, 1) if pair % 2 == 0 else (1, 0):
            time.sleep(0.3)  # the other's workers stop spinning
            speeds[i].append(one_pass(systems[i]))
    ratios = [b / a for a, b in zip(*speeds, strict=True)]
    print(f"beam {args.beam} batch {args.batch}: A {statistics.median(speeds[0]):.1f} tok/s, "
          f"B {statistics.median(speeds[1]):.1f} tok/s; B/A median {statistics.median(ratios):.3f} "
          f"[{min(ratios):.3f}-{max(ratios):.3f}] over {args.pairs} pairs")


if __name__ == "__main__":
    main()
