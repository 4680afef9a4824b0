"""Which ``quantize --int4`` block size and accuracy level? Accuracy, size and speed of each.

    python benchmarks/int4_choice.py EXPORT_DIR [--pairs 300] [--blocks 16,32,64,128] [--levels 1,4]
                                     [--sentences 64] [--threads 2] [--json FILE]

For each combination this writes an int4 copy of the fp32 export (``quantize_export``), then on
the first ``--pairs`` test pairs of the export's task, greedy and beam 4: BLEU and exact match
against the references, and token agreement with the fp32 export (the share of sentences whose
1-best tokens are identical: what ``parity`` holds a quantised copy to). Then greedy tokens/s at
batch 1 and 16 over ``--sentences`` test sources (best of 3 passes, one warm-up), and the
deployable bytes. The fp32 export is measured alike, as the first row.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from s2s_deploy.format.manifest import Manifest, load_manifest
from s2s_deploy.runtime.decoding import plain
from s2s_deploy.runtime.ort.backend import OrtBackend
from s2s_deploy.runtime.search import StepLoop
from s2s_deploy.runtime.translator import search_ids, unpadded
from s2s_deploy.train.evaluate import task_of
from s2s_deploy.train.metrics import score
from s2s_deploy.train.tasks import load_task
from s2s_deploy.transforms.inspect import deployable_files
from s2s_deploy.transforms.quantize import Int4Config, quantize_export


def _decode(manifest: Manifest, backend: OrtBackend, sources: list[str], beam: int, batch: int) -> list[tuple]:
    """Each source's 1-best tokens, batched as ``translate`` batches this export."""
    config = plain(beam, manifest.max_target_length or 256)
    ids = [manifest.src_vocab.encode(text) for text in sources]
    found = search_ids(StepLoop(backend), ids, manifest.src_vocab.pad_id, config, batch, unpadded(manifest))
    return [hyps[0].tokens for hyps in found]


def _speed(manifest: Manifest, backend: OrtBackend, sources: list[str], batch: int) -> float:
    """Greedy target tokens per second, best of 3 timed passes after one warm-up."""
    best = 0.0
    for rep in range(4):
        started = time.perf_counter()
        results = _decode(manifest, backend, sources, 1, batch)
        elapsed = time.perf_counter() - started
        tokens = sum(len(r) + 1 for r in results)
        if rep:
            best = max(best, tokens / elapsed)
    return best


def measure(manifest: Manifest, reference: dict | None, pairs: list, sentences: list[str], threads: int) -> dict:
    backend = OrtBackend(manifest, device="cpu", threads=threads)
    sources, targets = [p.source for p in pairs], [p.target for p in pairs]
    tokenize = load_task(*task_of(manifest, None)).bleu_tokenize
    row: dict = {"bytes": sum(deployable_files(manifest).values())}
    for mode, beam in (("greedy", 1), ("beam4", 4)):
        tokens = _decode(manifest, backend, sources, beam, 32)
        scores = score([manifest.tgt_vocab.decode(t) for t in tokens], targets, tokenize)
        row[mode] = {"bleu": scores.bleu, "exact_match": scores.exact_match, "tokens": tokens}
        if reference is not None:
            same = sum(a == b for a, b in zip(reference[mode]["tokens"], tokens, strict=True))
            row[mode]["agreement"] = same / len(tokens)
    for batch in (1, 16):
        row[f"tok_s_b{batch}"] = _speed(manifest, backend, sentences, batch)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export_dir", type=Path)
    parser.add_argument("--pairs", type=int, default=300)
    parser.add_argument("--blocks", default="16,32,64,128")
    parser.add_argument("--levels", default="1,4")
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    fp32 = load_manifest(args.export_dir)
    pairs = list(load_task(*task_of(fp32, None)).test)[: args.pairs]
    sentences = [p.source for p in pairs[: args.sentences]]
    rows = {"fp32": measure(fp32, None, pairs, sentences, args.threads)}
    with tempfile.TemporaryDirectory() as tmp:
        for level in map(int, args.levels.split(",")):
            for block in map(int, args.blocks.split(",")):
                out = Path(tmp) / f"int4-b{block}-l{level}"
                quantize_export(fp32, "int4", out, int4=Int4Config(block, level))
                rows[out.name] = measure(load_manifest(out), rows["fp32"], pairs, sentences, args.threads)
    print("| model | MB | greedy BLEU | greedy exact | greedy agreement | beam4 BLEU | beam4 exact | "
          "beam4 agreement | tok/s b1 | tok/s b16 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        g, b = r["greedy"], r["beam4"]
        agree = (f"{100 * g['agreement']:.1f}%", f"{100 * b['agreement']:.1f}%") if "agreement" in g else ("-", "-")
        print(f"| {name} | {r['bytes'] / 1e6:.2f} | {g['bleu']:.2f} | {100 * g['exact_match']:.1f}% | {agree[0]} | "
              f"{b['bleu']:.2f} | {100 * b['exact_match']:.1f}% | {agree[1]} | {r['tok_s_b1']:.0f} | "
              f"{r['tok_s_b16']:.0f} |")
    if args.json:
        for r in rows.values():
            for mode in ("greedy", "beam4"):
                r[mode].pop("tokens")
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
