"""Synthetic clips for the memory table of docs/performance.md ("Flat in duration"): a tone gliding in
pitch and loudness under noise, 44.1 kHz mono FLAC, written 10 s at a time, so a two-hour file never
sits in memory: ``python benchmarks/long_audio_clip.py MINUTES OUT.flac``."""

from __future__ import annotations

import sys

import numpy as np
import soundfile

RATE = 44100


def write_clip(minutes: float, out: str) -> None:
    rng = np.random.default_rng(0)
    total = int(minutes * 60 * RATE)
    with soundfile.SoundFile(out, "w", RATE, 1, format="FLAC") as f:
        for start in range(0, total, RATE * 10):
            t = np.arange(start, min(total, start + RATE * 10)) / RATE
            tone = 0.3 * np.sin(2 * np.pi * (220 + 60 * np.sin(t / 5)) * t) * (0.5 + 0.5 * np.sin(t / 3))
            f.write((tone + 0.01 * rng.standard_normal(len(t))).astype(np.float32))


if __name__ == "__main__":
    write_clip(float(sys.argv[1]), sys.argv[2])
