"""The front ends against transformers' extractors, and how far known mistakes move them.

    python benchmarks/frontend_margins.py

Prints the largest |ours − transformers| per input and configuration (the figures in
docs/parity.md, "Front ends"), then the same measure for deliberate mistakes on the 16 kHz speech
clip: the distance a real bug would put between the two.
"""

from __future__ import annotations

import warnings
from contextlib import nullcontext
from pathlib import Path
from unittest import mock

import numpy as np
import transformers
from PIL import Image, ImageDraw

from s2s_deploy.frontends import (
    KaldiFbank,
    WhisperLogMel,
    audio,
    frontend_from_preprocessor_config,
    load_audio,
    resample,
)

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"


def chords(rate: int, seconds: float = 3.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    out = np.zeros_like(t)
    for i, root in enumerate((220.0, 246.94, 196.0)):
        part = (t >= i) & (t < i + 1)
        for ratio in (1.0, 5 / 4, 3 / 2, 2.0):
            for harmonic in range(1, 6):
                out[part] += (
                    0.05 / harmonic * np.sin(2 * np.pi * root * ratio * harmonic * t[part]) * np.exp(-3 * (t[part] - i))
                )
    return out.astype(np.float32)


def clips() -> dict[str, np.ndarray]:
    found = {f"speech {rate} Hz": load_audio(DATA / f"speech_{rate}hz.flac", 16000) for rate in (8000, 16000, 44100)}
    found |= {f"chords {rate} Hz": resample(chords(rate), rate, 16000) for rate in (16000, 44100)}
    return found | {"silence": np.zeros(16000, dtype=np.float32)}


def whisper_reference(config: dict, clip: np.ndarray) -> np.ndarray:
    return transformers.WhisperFeatureExtractor(**config)(clip, sampling_rate=16000).input_features[0]


def kaldi_reference(config: dict, clip: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return transformers.Speech2TextFeatureExtractor(**config)(clip, sampling_rate=16000).input_features[0]


def agreement() -> None:
    rows = [
        (transformers.WhisperFeatureExtractor, {}, whisper_reference),
        (transformers.WhisperFeatureExtractor, {"feature_size": 128}, whisper_reference),
        (transformers.WhisperFeatureExtractor, {"chunk_length": 8}, whisper_reference),
        (transformers.Speech2TextFeatureExtractor, {}, kaldi_reference),
        (transformers.Speech2TextFeatureExtractor, {"do_ceptral_normalize": False}, kaldi_reference),
    ]
    inputs = clips()
    for extractor, config, reference in rows:
        ours = frontend_from_preprocessor_config(extractor(**config).to_dict())
        name = extractor.__name__
        cells = [f"{np.abs(ours(clip) - reference(config, clip)).max():.1e}" for clip in inputs.values()]
        print(f"| {name} {config or 'default'} | " + " | ".join(cells) + " |")
    print("inputs:", ", ".join(inputs))


def symmetric_window(n: int, hanning=np.hanning) -> np.ndarray:
    """np.hanning(n + 1)[:-1] is the periodic window; this makes that slice symmetric instead."""
    return np.append(hanning(n - 1), 0.0) if n == 401 else hanning(n)


SLANEY_FILTERS, KALDI_BANKS = audio.slaney_mel_filters, audio.kaldi_mel_banks  # before any patch


def unnormalised_filters(*args) -> np.ndarray:
    filters = SLANEY_FILTERS(*args)
    return filters / filters.max(axis=0)


def banks_from_zero(sampling_rate: int, n_fft: int, num_bins: int) -> np.ndarray:
    return KALDI_BANKS(sampling_rate, n_fft, num_bins, 0.0)


def mistakes() -> None:
    clip = load_audio(DATA / "speech_16000hz.flac", 16000)
    late, louder = np.concatenate([[0.0], clip]), clip * 1.01
    whisper, kaldi = whisper_reference({}, clip), kaldi_reference({}, clip)
    cases = [
        (
            "symmetric instead of periodic Hann (whisper)",
            mock.patch("numpy.hanning", symmetric_window),
            WhisperLogMel(),
            clip,
            whisper,
        ),
        (
            "filters not area-normalised (whisper)",
            mock.patch.object(audio, "slaney_mel_filters", unnormalised_filters),
            WhisperLogMel(),
            clip,
            whisper,
        ),
        ("input one sample late (whisper)", nullcontext(), WhisperLogMel(), late, whisper),
        ("input 1% louder (whisper)", nullcontext(), WhisperLogMel(), louder, whisper),
        (
            "lowest filter edge 0 Hz, not 20 (kaldi)",
            mock.patch.object(audio, "kaldi_mel_banks", banks_from_zero),
            KaldiFbank(),
            clip,
            kaldi,
        ),
        ("input one sample late (kaldi)", nullcontext(), KaldiFbank(), late, kaldi),
        ("input 1% louder (kaldi)", nullcontext(), KaldiFbank(), louder, kaldi),
    ]
    for name, patch, frontend, given, expected in cases:
        with patch:
            print(f"| {name} | {np.abs(frontend(given) - expected).max():.1e} |")


def images() -> None:
    rng = np.random.default_rng(0)
    picture = Image.fromarray(rng.integers(0, 256, (300, 200, 3), dtype=np.uint8))
    ImageDraw.Draw(picture).text((5, 5), "Invoice 2021-03-03", fill=(0, 0, 0))
    for config in ({}, {"size": {"height": 384, "width": 384}, "resample": 3}):
        reference = transformers.ViTImageProcessorPil(**config)
        ours = frontend_from_preprocessor_config(reference.to_dict())
        print(f"| vit {config or 'default'} | {np.abs(ours(picture) - reference(picture).pixel_values[0]).max():.1e} |")


if __name__ == "__main__":
    agreement()
    mistakes()
    images()
