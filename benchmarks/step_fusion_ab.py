"""A decoder step session with and without ONNX Runtime's ``MatMulScaleFusion``, on one Whisper-sized
export's decoder alone (encoder outputs computed once, untimed), pass against pass in one process.

    python benchmarks/step_fusion_ab.py /tmp/wrace/base/s2s-fp32 /tmp/wrace/base/clips.npy [--reps 2]

The race's own ``Ours`` engine (benchmarks/race_whisper.py) decodes exactly 32 tokens per clip; the
two engines differ only in ``STEP_DISABLED_OPTIMIZERS`` when their decoder session is made. Prints
seconds per pass over the clips for each cell and whether both gave the same tokens.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import race_whisper

import s2s_deploy.runtime.ort.backend as backend


def engine(export: Path, clips: np.ndarray, disabled: tuple[str, ...]) -> race_whisper.Ours:
    backend.STEP_DISABLED_OPTIMIZERS = disabled  # read when the decoder session is made
    return race_whisper.Ours(export, clips)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", type=Path)
    parser.add_argument("clips", type=Path, help="the race's clips.npy (16 kHz samples, one row per clip)")
    parser.add_argument("--clips-count", type=int, default=8)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    clips = np.load(args.clips)[: args.clips_count]
    engines = {"fused": engine(args.export, clips, ()), "unfused": engine(args.export, clips, ("MatMulScaleFusion",))}
    for beam, batch in ((1, 1), (1, 8), (5, 1), (5, 8)):
        for each in engines.values():
            each.decode(beam, batch)  # warm-up; computes the encoder outputs once
        seconds: dict[str, list[float]] = {name: [] for name in engines}
        tokens = {}
        for _ in range(args.reps):
            for name, each in engines.items():
                began = time.perf_counter()
                tokens[name] = each.decode(beam, batch)
                seconds[name].append(round(time.perf_counter() - began, 2))
        print(f"beam {beam} x {batch}: {seconds}, same tokens: {tokens['fused'] == tokens['unfused']}", flush=True)


if __name__ == "__main__":
    main()
