"""Build a vmap shortlist from an export's training data, then measure what it costs and saves.

    python benchmarks/vmap_shortlist.py EXPORT_DIR --out FILE [--per-token 20] [--always 0]
                                        [--train 20000] [--pairs 300] [--sentences 64] [--threads 2]

The vmap (CTranslate2's format, runtime/shortlist.py) lists for each source token the
``--per-token`` target tokens that most often share a training pair with it (``write_vmap``), and
the ``--always`` most frequent target tokens on the always-allowed line. Then, on the first
``--pairs`` test pairs of the export's task, greedy and beam 4, with and without the shortlist:
BLEU, exact match, token agreement with the unrestricted search, and the mean share of the
target vocabulary a sentence may use; and greedy tokens/s at batch 1 and 16 over ``--sentences``
sources (best of 3 passes after one warm-up).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from s2s_deploy.format.manifest import load_manifest
from s2s_deploy.runtime.decoding import SearchConfig, plain
from s2s_deploy.runtime.ort.backend import OrtBackend
from s2s_deploy.runtime.search import StepLoop
from s2s_deploy.runtime.shortlist import read_vmap, write_vmap
from s2s_deploy.runtime.translator import search_ids, unpadded
from s2s_deploy.train.evaluate import task_of
from s2s_deploy.train.metrics import score
from s2s_deploy.train.tasks import load_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export_dir", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--per-token", type=int, default=20)
    parser.add_argument("--always", type=int, default=0)
    parser.add_argument("--train", type=int, default=20000)
    parser.add_argument("--pairs", type=int, default=300)
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    manifest = load_manifest(args.export_dir)
    task = load_task(*task_of(manifest, None))
    src_vocab, tgt_vocab = manifest.src_vocab, manifest.tgt_vocab
    train = [(src_vocab.encode(p.source), tgt_vocab.encode(p.target)) for p in list(task.train)[: args.train]]
    rules = write_vmap(args.out, train, src_vocab, tgt_vocab, args.per_token, args.always)
    shortlist = read_vmap(args.out, src_vocab, tgt_vocab)
    pairs = list(task.test)[: args.pairs]
    ids = [src_vocab.encode(p.source) for p in pairs]
    share = np.mean([len(shortlist.allowed(row)) / len(tgt_vocab) for row in ids])
    print(f"{args.out}: {rules} rules from {len(train)} training pairs; a test sentence may use "
          f"{100 * share:.1f}% of the {len(tgt_vocab)} target tokens on average")
    engine = StepLoop(OrtBackend(manifest, device="cpu", threads=args.threads))
    exact = unpadded(manifest)

    def decode(config: SearchConfig, rows: list, batch: int) -> list[tuple[int, ...]]:
        return [h[0].tokens for h in search_ids(engine, rows, src_vocab.pad_id, config, batch, exact)]

    print("| search | shortlist | BLEU | exact match | tokens as without | greedy tok/s b1 | greedy tok/s b16 |")
    print("|---|---|---|---|---|---|---|")
    found = {}
    for mode, beam in (("greedy", 1), ("beam4", 4)):
        for name, vmap in (("none", None), ("vmap", shortlist)):
            config = replace(plain(beam, manifest.max_target_length or 256), vmap=vmap)
            tokens = found[mode, name] = decode(config, ids, 32)
            scores = score([tgt_vocab.decode(t) for t in tokens], [p.target for p in pairs], task.bleu_tokenize)
            same = sum(a == b for a, b in zip(found[mode, "none"], tokens, strict=True)) / len(tokens)
            speed = ["", ""]
            if beam == 1:
                for column, batch in enumerate((1, 16)):
                    best = 0.0
                    for rep in range(4):
                        started = time.perf_counter()
                        out = decode(config, ids[: args.sentences], batch)
                        if rep:
                            best = max(best, sum(len(t) + 1 for t in out) / (time.perf_counter() - started))
                    speed[column] = f"{best:.0f}"
            print(f"| {mode} | {name} | {scores.bleu:.2f} | {100 * scores.exact_match:.1f}% | {100 * same:.1f}% | "
                  f"{speed[0]} | {speed[1]} |")


if __name__ == "__main__":
    main()
