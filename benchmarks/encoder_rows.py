"""A features encoder one row at a time against the whole batch in one run (docs/parity.md, "Audio and
images: the encoder one row at a time"; docs/performance.md).

usage:
  python benchmarks/encoder_rows.py EXPORT_DIR [--windows 8] [--rounds 2] [--threads 1,2]

Seeded random features of the encoder's whole window, ``--windows`` rows; per thread count, the runtime's
own encoder session (``runtime/ort/backend.py``), the batch run whole and through ``encode_rows`` in turn,
``--rounds`` times after a warm-up of each. Prints process CPU-seconds (what a loaded machine cannot
inflate much) and wall seconds of each, their ratio (one row at a time / whole batch), and whether
every output of every row was bit-identical both ways (the batch's rows are not, where ONNX Runtime's
one-row convolution blocks its sums otherwise).
"""

from __future__ import annotations

import argparse
import time
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime as ort

from s2s_deploy.format.manifest import load_manifest
from s2s_deploy.runtime.ort.backend import create_session, encode_rows, output_batch_axes


def whole(encoder: ort.InferenceSession, names: list[str], src: np.ndarray,
          src_len: np.ndarray) -> dict[str, np.ndarray]:
    """The batch in one run, as the encoder of a token export runs."""
    return dict(zip(names, encoder.run(names, {"src": src, "src_len": src_len}), strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export", type=Path)
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", default="1,2")
    args = parser.parse_args()
    manifest = load_manifest(args.export)
    if not manifest.encoder_input.is_features or manifest.max_source_length is None:
        raise SystemExit(f"{args.export}: needs an encoder that reads features of a fixed window")
    shape = manifest.encoder_input.item_shape(manifest.max_source_length)
    src = np.random.default_rng(0).normal(-0.2, 0.5, (args.windows, *shape)).astype(manifest.encoder_input.dtype)
    src_len = np.full(args.windows, manifest.max_source_length, dtype=np.int64)
    axes = output_batch_axes(manifest)
    for threads in (int(t) for t in args.threads.split(",")):
        encoder = create_session(manifest.graph_path(manifest.encoder), "cpu", threads)
        names = [o.name for o in encoder.get_outputs()]
        runs = {"batch": partial(whole, encoder, names, src, src_len),
                "rows": partial(encode_rows, encoder, names, src, src_len, axes)}
        found = {how: run() for how, run in runs.items()}  # the warm-up
        cpu: dict[str, list[float]] = {how: [] for how in runs}
        wall: dict[str, list[float]] = {how: [] for how in runs}
        for _ in range(args.rounds):
            for how, run in runs.items():
                cpu0, wall0 = time.process_time(), time.perf_counter()
                run()
                cpu[how].append(time.process_time() - cpu0)
                wall[how].append(time.perf_counter() - wall0)
        same = all(np.array_equal(found["batch"][n], found["rows"][n]) for n in names)
        print(f"{threads} thread(s), {args.windows} windows, {args.rounds} rounds: CPU s whole batch "
              f"{[round(x, 2) for x in cpu['batch']]}, one row at a time {[round(x, 2) for x in cpu['rows']]}: "
              f"{sum(cpu['rows']) / sum(cpu['batch']):.3f}x; wall {sum(wall['rows']) / sum(wall['batch']):.3f}x; "
              f"outputs bit-identical: {same}", flush=True)


if __name__ == "__main__":
    main()
