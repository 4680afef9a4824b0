"""Canonical padded batching against the rules it replaced, A/B in one process, modes alternated.

Modes (``runtime/translator.Widths``):
- ``canonical``: every source padded to the next multiple of 32 ids, batched within its width
  (what translate, Translator, serve and the file jobs do since 2026-11-28);
- ``exact-length``: the same rule with a step of 1: batches of one source length, no padding
  (what int8 per-row exports did before);
- ``longest``: any lengths together, padded to the batch's longest (what fp32 did before, and
  per-tensor int8 still does; not batch-independent).

usage: python benchmarks/canonical_widths.py EXPORT_DIR [--modes exact-length,canonical]
       [--batch-size 16] [--rounds 9] [--sentences 32] [--beams 1,4] [--threads 1]
Prints, per beam and mode, generated tokens (EOS counted) per second of process CPU time and of
wall time (medians over the rounds, range in brackets), each mode's ratio to the first, and
whether every mode gave the same text. Process CPU time at one thread is the figure to read on
a machine that other work loads. ``--batch-size 1`` decodes one sentence per call.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from s2s_deploy.runtime.translator import Translator, Widths

MODES = ("canonical", "exact-length", "longest")


def widths(mode: str, limit: int | None) -> Widths:
    return {"canonical": Widths(True, limit), "exact-length": Widths(True, limit, step=1),
            "longest": Widths(False)}[mode]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export_dir")
    parser.add_argument("--modes", default="exact-length,canonical")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--sentences", type=int, default=32)
    parser.add_argument("--beams", default="1,4")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    modes = args.modes.split(",")
    if not set(modes) <= set(MODES):
        parser.error(f"modes are {', '.join(MODES)}")
    translator = Translator(args.export_dir, device="cpu", threads=args.threads)
    manifest = translator.manifest
    texts = (list(manifest.samples) * args.sentences)[: args.sentences]
    lengths = [len(manifest.src_vocab.encode(text)) for text in texts]
    print(f"{args.export_dir}: {len(texts)} sentences, {len(set(lengths))} lengths "
          f"({min(lengths)}-{max(lengths)} ids), batch {args.batch_size}, "
          f"{args.threads} thread(s), {args.rounds} rounds")

    def run(mode: str, beam: int) -> tuple[float, float, list[str]]:
        translator.padding = widths(mode, manifest.max_source_length)
        cpu, wall = time.process_time(), time.perf_counter()
        if args.batch_size == 1:
            found = [t for text in texts for t in translator([text], beam=beam)]
        else:
            found = translator(texts, beam=beam, batch_size=args.batch_size)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        tokens = sum(len(manifest.tgt_vocab.encode(t.text, add_eos=False)) + 1 for t in found)
        return tokens / cpu, tokens / wall, [t.text for t in found]

    for beam in (int(b) for b in args.beams.split(",")):
        for mode in modes:  # warm-up: sessions, buffers and bindings of every shape
            run(mode, beam)
        rates: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes}
        texts_of: dict[str, list[str]] = {}
        for r in range(args.rounds):
            for mode in modes if r % 2 == 0 else modes[::-1]:
                cpu_rate, wall_rate, texts_of[mode] = run(mode, beam)
                rates[mode].append((cpu_rate, wall_rate))
        first = float(np.median([c for c, _ in rates[modes[0]]]))
        for mode in modes:
            cpu_rates = np.array([c for c, _ in rates[mode]])
            wall_rates = np.array([w for _, w in rates[mode]])
            print(f"beam {beam} {mode:>12}: {np.median(cpu_rates):7.0f} tok per CPU-s [{cpu_rates.min():.0f}-"
                  f"{cpu_rates.max():.0f}], {np.median(wall_rates):6.0f} tok/s wall, "
                  f"x{np.median(cpu_rates) / first:.3f} of {modes[0]}")
        print(f"beam {beam} same text in every mode: {len({tuple(t) for t in texts_of.values()}) == 1}")


if __name__ == "__main__":
    main()
