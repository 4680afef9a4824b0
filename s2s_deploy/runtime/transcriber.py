"""Audio in, text out, from an export whose encoder reads features: front end → pad → search → detokenise.

The front end is the one the manifest names (``encoder_input.frontend``), computed in numpy, so
deployment needs no torch and no transformers. The search is the text path's, unchanged: greedy,
beam and n-best with every decoding option of docs/decoding.md; with ``timestamps`` it runs once per
window (runtime/timestamps.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.frontends import AUDIO, decode_audio, load_audio, resample
from s2s_deploy.frontends.media import MEDIA
from s2s_deploy.frontends.vad import VadOptions
from s2s_deploy.runtime.features import Decoded, FeatureReader, Segment, pad_features
from s2s_deploy.runtime.translator import Translator
from s2s_deploy.runtime.vad import decode_speech
from s2s_deploy.runtime.words import decode_words

Clip = str | Path | bytes | np.ndarray | tuple[np.ndarray, int]
"""A file path, an encoded file's bytes (an upload), samples at the model's sampling rate, or
``(samples, rate)`` (resampled)."""

Transcription = Decoded
"""One clip's text (``Decoded``: source, text, score, hypotheses, language, and with ``timestamps``
its ``segments``)."""

__all__ = ["Clip", "Segment", "Transcriber", "Transcription", "pad_features"]


class Transcriber(FeatureReader):
    """The speech API: ``Transcriber("exported/speech")(["clip.flac"], beam=4)``.

    A clip is a path to an audio file (any format soundfile reads, resampled to the model's rate),
    a float array of samples already at ``sampling_rate``, or ``(samples, rate)``. ``options``: any
    decoding option by name, as ``Translator`` takes them; defaults come from the manifest.
    ``timestamps=True`` (an export with timestamp tokens) times segments; a clip longer than the
    encoder's window is read window by window either way (docs/decoding.md, "Timestamps").
    ``prompt``: earlier text every call is fed before the start token (Whisper's initial prompt:
    the previous passage, names, spellings) unless the call gives its own (``""``: none)."""

    medium = MEDIA[AUDIO]

    def __init__(self, export_dir: str | Path | Translator, device: str = "auto", threads: int | None = None,
                 spin: bool = True, prompt: str | None = None) -> None:
        super().__init__(export_dir, device, threads, spin)
        self.prompt = prompt
        if prompt is not None:
            self.translator.search_config(prompt=prompt)  # a folder that takes no prompt says so now

    def __call__(self, items: Any, beam: int | None = None, n_best: int | None = None, max_len: int | None = None,
                 alpha: float | None = None, batch_size: int = 16, vad: bool | VadOptions = False,
                 word_timestamps: bool = False, **options: Any) -> list[Decoded]:
        """``vad``: decode only each clip's speech (True: faster-whisper's batched defaults; or
        ``VadOptions``), as runtime/vad.py reads it. ``word_timestamps``: each result's ``words`` timed
        (runtime/words.py; an export made with ``--word-timestamps``)."""
        if options.get("prompt") is None:
            options["prompt"] = self.prompt
        if not vad and not word_timestamps:
            return super().__call__(items, beam, n_best, max_len, alpha, batch_size, **options)
        if self.single(items):
            items = [items]
        if not len(items):
            raise S2SError("no audio given")
        config = self.translator.search_config(beam, n_best, max_len, alpha, **options)
        labels = [str(item) if isinstance(item, str | Path) else f"{self.label} {i + 1}"
                  for i, item in enumerate(items)]
        if vad:
            return decode_speech(self, items, labels, config, vad if isinstance(vad, VadOptions) else VadOptions(),
                                 batch_size, word_timestamps)
        found: list[Decoded] = []
        for start in range(0, len(items), batch_size):
            chunk = range(start, min(start + batch_size, len(items)))
            audio = [self.load(items[i], labels[i]) for i in chunk]
            features = [self.features(a, labels[i], whole=True) for a, i in zip(audio, chunk, strict=True)]
            contents = [self.frontend.content_frames(a) or f.shape[-1] for a, f in zip(audio, features, strict=True)]
            found += decode_words(self, features, contents, config, [labels[i] for i in chunk])
        return found

    @property
    def sampling_rate(self) -> int:
        return int(self.frontend.sampling_rate)

    def single(self, clips: Any) -> bool:
        return isinstance(clips, str | Path | bytes | tuple) or (isinstance(clips, np.ndarray) and clips.ndim == 1)

    def load(self, clip: Clip, label: str) -> np.ndarray:
        """One clip as float32 samples at ``sampling_rate``."""
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
        return audio
