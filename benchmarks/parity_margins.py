"""How far apart PyTorch and ONNX Runtime honestly are, and how far a real bug moves them.

    python benchmarks/parity_margins.py [--archs transformer,gru,...] [--threads 1,2,4] [--json F]

For every bundled model: teacher-force its greedy outputs on its samples through PyTorch and
ONNX Runtime (each thread count, sequential and parallel execution) and report the largest
per-step log-prob difference, over the whole vocabulary and where a search can act (each
side's top 16 plus every token at log p >= -10: what parity compares). Then the same
comparison after a bug: one weight matrix of the PyTorch side moved by 1% of its own scale.
The tolerance must sit between the two columns (docs/parity.md).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from s2s_deploy.export.exporter import export_model
from s2s_deploy.export.parity import searchable_diff, torch_backend_for
from s2s_deploy.export.registry import get_plugin
from s2s_deploy.export.sources import load_source
from s2s_deploy.runtime.manifest import load_manifest
from s2s_deploy.runtime.ort_backend import OrtBackend
from s2s_deploy.runtime.search import SearchConfig, search
from s2s_deploy.runtime.translator import encode_batch


def step_diffs(reference, candidate, src, src_len, targets) -> tuple[float, float]:
    """(whole vocabulary, searchable) max |Δ log p| over every teacher-forced step."""
    batch, steps = src.shape[0], max(len(t) for t in targets) + 1
    forced = np.full((batch, steps), reference.eos_id, dtype=np.int64)
    forced[:, 0] = reference.decoder_start_id
    for row, tokens in enumerate(targets):
        forced[row, 1 : 1 + len(tokens)] = tokens
    reorder = np.arange(batch, dtype=np.int64)
    whole = searchable = 0.0
    with reference.start(src, src_len) as first, candidate.start(src, src_len) as second:
        for t in range(steps):
            a, b = first.step(forced[:, t], reorder), second.step(forced[:, t], reorder)
            whole = max(whole, float(np.max(np.abs(a.astype(np.float64) - b))))
            searchable = max(searchable, searchable_diff(a, b))
    return whole, searchable


def measure(arch: str, workdir: Path, threads: list[int]) -> list[dict]:
    plugin = get_plugin(arch)
    source = load_source(plugin, None, workdir=workdir)
    out = workdir / arch
    export_model(plugin, source.model, source.config, source.src_vocab, source.tgt_vocab, out,
                 checkpoint_path=source.checkpoint_path, source=source.description, samples=source.samples,
                 training=source.info)
    manifest = load_manifest(out)
    src, src_len = encode_batch(list(manifest.samples), manifest.src_vocab, manifest.max_source_length)
    reference = torch_backend_for(manifest)
    targets = [h[0].tokens for h in search(reference, src, src_len, SearchConfig(1, 1, 64))]
    rows = []
    for count in threads:
        for mode in ("sequential", "parallel"):
            backend = OrtBackend(manifest, device="cpu", threads=count)
            if mode == "parallel":
                options = backend.decoder.get_session_options()
                options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
                backend.decoder = ort.InferenceSession(str(manifest.graph_path(manifest.decoder)), options,
                                                       providers=["CPUExecutionProvider"])
            whole, searchable = step_diffs(reference, backend, src, src_len, targets)
            rows.append({"arch": arch, "threads": count, "mode": mode, "whole_vocab": whole,
                         "searchable": searchable})
    buggy = torch_backend_for(manifest)
    weights = [p for p in buggy.model.parameters() if p.dim() == 2]
    with torch.no_grad():
        largest = max(weights, key=lambda p: p.numel())
        largest += 0.01 * largest.abs().mean()
    whole, searchable = step_diffs(buggy, OrtBackend(manifest, device="cpu", threads=threads[0]),
                                   src, src_len, targets)
    rows.append({"arch": arch, "threads": threads[0], "mode": "bug: largest matrix +1% of its mean |w|",
                 "whole_vocab": whole, "searchable": searchable})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default="transformer,gru,lstm,bahdanau,rnnsearch,convs2s")
    parser.add_argument("--threads", default="1,2,4")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for arch in args.archs.split(","):
            rows += measure(arch, Path(scratch), [int(t) for t in args.threads.split(",")])
    print("| model | ORT threads | execution | max diff, whole vocabulary | max diff, searchable |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['arch']} | {r['threads']} | {r['mode']} | {r['whole_vocab']:.2e} | {r['searchable']:.2e} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
