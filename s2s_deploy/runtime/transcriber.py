"""Audio in, text out, from an export whose encoder reads features: front end → pad → search → detokenise.

The front end is the one the manifest names (``encoder_input.frontend``), computed in numpy, so
deployment needs no torch and no transformers. The search is the text path's, unchanged: greedy,
beam and n-best with every decoding option of docs/decoding.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.format.source import SourceSpec
from s2s_deploy.frontends import decode_audio, load_audio, resample
from s2s_deploy.frontends.source import checked_features, frontend_for
from s2s_deploy.runtime.decoding import SearchConfig
from s2s_deploy.runtime.search import Hypothesis
from s2s_deploy.runtime.translator import Translator

Clip = str | Path | bytes | np.ndarray | tuple[np.ndarray, int]
"""A file path, an encoded file's bytes (an upload), samples at the model's sampling rate, or
``(samples, rate)`` (resampled)."""


@dataclass(frozen=True)
class Transcription:
    source: str
    """The file's path, or ``clip N`` for an array."""
    text: str
    score: float
    hypotheses: tuple[tuple[str, float], ...]
    language: str | None = None
    """The code of the language token its decoder prompt held (detected where the prompt left it
    open, ``en`` for ``<|en|>``); None without one."""


def pad_features(items: Sequence[np.ndarray], source: SourceSpec) -> tuple[np.ndarray, np.ndarray]:
    """``src`` ``(batch, *shape)`` right-padded along the frames axis with the source's ``pad_value``, and
    each item's frame count as ``src_len``."""
    axis = source.length_axis - 1
    lengths = np.array([item.shape[axis] for item in items], dtype=np.int64)
    batch = np.full((len(items), *source.item_shape(int(lengths.max()))), source.pad_value, dtype=source.dtype)
    for row, item in enumerate(items):
        index = [slice(None)] * item.ndim
        index[axis] = slice(0, item.shape[axis])
        batch[(row, *index)] = item
    return batch, lengths


class Transcriber:
    """The speech API: ``Transcriber("exported/speech")(["clip.flac"], beam=4)``.

    A clip is a path to an audio file (any format soundfile reads, resampled to the model's rate),
    a float array of samples already at ``sampling_rate``, or ``(samples, rate)``. ``options``: any
    decoding option by name, as ``Translator`` takes them; defaults come from the manifest."""

    def __init__(self, export_dir: str | Path | Translator, device: str = "auto", threads: int | None = None,
                 spin: bool = True) -> None:
        """``export_dir``: a folder, or a Translator already open on one (whose sessions are then shared)."""
        self.translator = (export_dir if isinstance(export_dir, Translator)
                           else Translator(export_dir, device=device, threads=threads, spin=spin))
        self.manifest = self.translator.manifest
        self.source = self.manifest.encoder_input
        if not self.source.is_features:
            raise S2SError(f"{self.manifest.directory} translates text (its encoder reads token ids): use translate")
        self.frontend = frontend_for(self.source)
        self.notice = self.translator.notice
        self.provider = self.translator.provider

    @property
    def sampling_rate(self) -> int:
        rate = getattr(self.frontend, "sampling_rate", None)
        if rate is None:
            raise S2SError(f"the front end {self.frontend.kind} reads images, not audio")
        return int(rate)

    def features(self, clip: Clip, label: str = "clip") -> np.ndarray:
        """One clip's encoder input: the front end's features, checked against the declared shape."""
        if isinstance(clip, str | Path):
            audio = load_audio(clip, self.sampling_rate)
        elif isinstance(clip, bytes):
            audio = decode_audio(clip, self.sampling_rate, label)
        elif isinstance(clip, tuple):
            samples, rate = clip
            audio = resample(np.asarray(samples, dtype=np.float32), int(rate), self.sampling_rate)
        else:
            audio = np.asarray(clip, dtype=np.float32)
        if audio.size == 0:
            raise S2SError(f"{label}: no audio samples")
        if not np.isfinite(audio).all():
            raise S2SError(f"{label}: the audio holds NaN or infinite samples")
        return checked_features(self.source, self.frontend(audio), label)

    def __call__(self, clips: Clip | Sequence[Clip], beam: int | None = None, n_best: int | None = None,
                 max_len: int | None = None, alpha: float | None = None, batch_size: int = 16,
                 **options: Any) -> list[Transcription]:
        """One Transcription per clip, in order; clips are featurised and decoded ``batch_size`` at a time."""
        if isinstance(clips, str | Path | bytes | tuple) or (isinstance(clips, np.ndarray) and clips.ndim == 1):
            clips = [clips]
        if not len(clips):
            raise S2SError("no audio to transcribe")
        config = self.translator.search_config(beam, n_best, max_len, alpha, **options)
        labels = [str(clip) if isinstance(clip, str | Path) else f"clip {i + 1}" for i, clip in enumerate(clips)]
        found: list[Transcription] = []
        for start in range(0, len(clips), batch_size):
            chunk = range(start, min(start + batch_size, len(clips)))
            features = [self.features(clips[i], labels[i]) for i in chunk]
            found += self.decode(features, config, [labels[i] for i in chunk])
        return found

    def decode(self, features: Sequence[np.ndarray], config: SearchConfig,
               labels: Sequence[str] | None = None) -> list[Transcription]:
        """Items from ``features`` decoded as one batch with a resolved ``config`` (``serve`` batches clips
        from several requests this way)."""
        labels = labels if labels is not None else [f"clip {i + 1}" for i in range(len(features))]
        src, src_len = pad_features(features, self.source)
        return [self._transcription(label, hyps)
                for label, hyps in zip(labels, self.translator.engine.search(src, src_len, config), strict=True)]

    def _transcription(self, label: str, hyps: list[Hypothesis]) -> Transcription:
        vocab = self.manifest.tgt_vocab
        texts = tuple((vocab.decode(h.tokens), h.score) for h in hyps)
        language = next((vocab.code_of(i) for i in hyps[0].prompt if i in vocab.languages), None)
        return Transcription(label, texts[0][0], texts[0][1], texts, language)
