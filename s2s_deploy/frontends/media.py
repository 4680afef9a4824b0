"""One row per medium: everything the rest of the package asks of "audio or image?".

A place that needs to know how a medium's files are read, which command and API read it, what
``transformers`` calls its input, whether it has a time axis (timestamps, subtitles, windows), which
``serve`` endpoint takes it, or how to make seeded inputs for parity, reads its ``Medium`` here
rather than testing the medium's name. A new medium is one new row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.frontends import AUDIO, IMAGE, FrontEnd, load_audio, load_image


def synthetic_clips(sampling_rate: int, count: int = 16, seed: int = 0, seconds: tuple[float, float] = (0.3, 1.5),
                    label: str = "synthetic clip") -> dict[str, np.ndarray]:
    """Seeded parity audio for an export that reads features and stores no samples: chirps of
    ``seconds`` (0.3-1.5 s) in noise of varied levels; shapes and decoding rules, not words, are what
    they test. Timestamped parity adds a few longer than the window, under another ``label``."""
    rng = np.random.default_rng(seed)
    clips = {}
    for i in range(count):
        t = np.arange(int(sampling_rate * rng.uniform(*seconds))) / sampling_rate
        f0, f1 = rng.uniform(100, min(3000, sampling_rate / 3), 2)
        chirp = 0.3 * np.sin(2 * np.pi * (f0 + (f1 - f0) * t / (2 * t[-1])) * t)
        clips[f"{label} {i + 1}"] = (chirp + rng.normal(0, rng.uniform(0.01, 0.2), len(t))).astype(np.float32)
    return clips


def synthetic_images(count: int = 16, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded parity images: RGB gradients of 16-96 pixels a side under uniform noise, with a dark band
    across some; the front end resizes them to the model's size."""
    rng = np.random.default_rng(seed)
    images = {}
    for i in range(count):
        height, width = (int(n) for n in rng.integers(16, 97, 2))
        y, x = np.mgrid[0:height, 0:width]
        slope = rng.uniform(-3, 3, (2, 3))
        pixels = 128 + x[..., None] * slope[0] + y[..., None] * slope[1] + rng.normal(0, rng.uniform(5, 60),
                                                                                       (height, width, 3))
        if i % 2:
            top = int(rng.integers(0, height))
            pixels[top : top + max(1, height // 5)] *= 0.2
        images[f"synthetic image {i + 1}"] = np.clip(pixels, 0, 255).astype(np.uint8)
    return images


@dataclass(frozen=True)
class Medium:
    """What a medium's inputs are, who reads them, and how parity makes them."""

    name: str
    item: str
    """One input, in messages ("clip", "image")."""
    command: str
    """The command that reads it."""
    api: str
    """The Python class that reads it (``s2s_deploy.runtime``)."""
    transformers_input: str
    """The keyword ``transformers``' models take it as."""
    timed: bool
    """It has a time axis: timestamps, subtitles, and window-by-window reading apply."""
    endpoint: str | None
    """The ``serve`` path that takes it, or None where ``serve`` does not."""
    read_file: Callable[[str | Path, FrontEnd], Any]
    """A file as the front end's raw input."""
    synthetic: Callable[[FrontEnd], dict[str, Any]]
    """Seeded parity inputs, by label, for an export that stores no samples of its own."""

    @property
    def readers(self) -> str:
        return f"{self.command} (or {self.api})"

    def read_files(self, frontend: FrontEnd, paths: Sequence[str] | None = None) -> dict[str, Any]:
        """Parity inputs: the files ``paths`` lists, or seeded synthetic ones."""
        if paths is None:
            return self.synthetic(frontend)
        return {path: self.read_file(path, frontend) for path in paths}


MEDIA: dict[str, Medium] = {
    AUDIO: Medium(AUDIO, "clip", "transcribe", "Transcriber", "input_features", timed=True, endpoint="/transcribe",
                  read_file=lambda path, frontend: load_audio(path, frontend.sampling_rate),
                  synthetic=lambda frontend: synthetic_clips(frontend.sampling_rate)),
    IMAGE: Medium(IMAGE, "image", "caption", "Captioner", "pixel_values", timed=False, endpoint=None,
                  read_file=lambda path, frontend: load_image(path),
                  synthetic=lambda frontend: synthetic_images()),
}


def medium_of(frontend: FrontEnd) -> Medium:
    """The row of the medium ``frontend`` reads."""
    if frontend.reads not in MEDIA:
        raise S2SError(f"front end {frontend.kind}: no medium {frontend.reads!r}; known: {', '.join(sorted(MEDIA))}")
    return MEDIA[frontend.reads]
