"""Audio in, text out, from an export whose encoder reads features: front end → pad → search → detokenise.

The front end is the one the manifest names (``encoder_input.frontend``), computed in numpy, so
deployment needs no torch and no transformers. The search is the text path's, unchanged: greedy,
beam and n-best with every decoding option of docs/decoding.md; with ``timestamps`` it runs once per
window (runtime/timestamps.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.frontends import AUDIO, decode_audio, load_audio, resample
from s2s_deploy.frontends.audio import AudioFile, Level, check_duration, check_rate, check_samples
from s2s_deploy.frontends.media import MEDIA
from s2s_deploy.frontends.vad import VadOptions
from s2s_deploy.runtime.decoding import SearchConfig
from s2s_deploy.runtime.features import Decoded, FeatureReader, Segment, pad_features
from s2s_deploy.runtime.translator import Translator
from s2s_deploy.runtime.vad import decode_speech
from s2s_deploy.runtime.words import decode_words

Clip = str | Path | bytes | np.ndarray | tuple[np.ndarray, int] | AudioFile
"""A file path, an encoded file's bytes (an upload), samples at the model's sampling rate,
``(samples, rate)`` (resampled), or an ``AudioFile`` opened already."""

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
    the previous passage, names, spellings) unless the call gives its own (``""``: none).
    ``max_duration``: seconds; a longer clip is refused in one line (a file's from its header, before
    it is decoded). ``warn``: where one-line warnings go (a truncated file); stderr by default.
    A file or upload is read block by block (memory holds its features, not its samples)."""

    medium = MEDIA[AUDIO]

    def __init__(self, export_dir: str | Path | Translator, device: str = "auto", threads: int | None = None,
                 spin: bool = True, prompt: str | None = None, max_duration: float | None = None,
                 warn: Callable[[str], None] | None = None) -> None:
        super().__init__(export_dir, device, threads, spin)
        if max_duration is not None and not max_duration > 0:
            raise S2SError(f"max_duration must be a positive number of seconds, not {max_duration!r}")
        self.max_duration = max_duration
        self.warn = warn if warn is not None else _to_stderr
        self.prompt = prompt
        if prompt is not None:
            self.translator.search_config(prompt=prompt)  # a folder that takes no prompt says so now

    def __call__(self, items: Any, beam: int | None = None, n_best: int | None = None, max_len: int | None = None,
                 alpha: float | None = None, batch_size: int = 16, *, config: SearchConfig | None = None,
                 on_error: Callable[[str], None] | None = None, vad: bool | VadOptions = False,
                 word_timestamps: bool = False, **options: Any) -> list[Decoded]:
        """``vad``: decode only each clip's speech (True: faster-whisper's batched defaults; or
        ``VadOptions``), as runtime/vad.py reads it. ``word_timestamps``: each result's ``words`` timed
        (runtime/words.py; an export made with ``--word-timestamps``). ``on_error`` (without them): a clip
        that cannot be read is told to it in one line and the rest are decoded."""
        if config is None and options.get("prompt") is None:  # a ready config holds the prompt it was made with
            options["prompt"] = self.prompt
        if not vad and not word_timestamps:
            return super().__call__(items, beam, n_best, max_len, alpha, batch_size, config=config,
                                    on_error=on_error, **options)
        if self.single(items):
            items = [items]
        if not len(items):
            raise S2SError("no audio given")
        config = self.translator.config_for(config, beam, n_best, max_len, alpha, options)
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
        return (isinstance(clips, str | Path | bytes | tuple | AudioFile)
                or (isinstance(clips, np.ndarray) and clips.ndim == 1))

    def stream(self, clip: Clip, label: str) -> AudioFile | None:
        """A file or an upload, opened (its header judged) to be read block by block; arrays: None."""
        if isinstance(clip, AudioFile):  # opened already (serve judges the header before queueing)
            return clip
        if isinstance(clip, str | Path):
            path = Path(clip)
            if path.is_dir():
                raise S2SError(f"{path} is a directory, not an audio file")
            if not path.is_file():
                raise S2SError(f"audio file not found: {path}")
            return AudioFile(path, str(path), self.sampling_rate, self.max_duration, self.warn)
        if isinstance(clip, bytes):
            return AudioFile(clip, label, self.sampling_rate, self.max_duration, self.warn)
        return None

    def load(self, clip: Clip, label: str) -> np.ndarray:
        """One clip as float32 samples at ``sampling_rate``."""
        if isinstance(clip, str | Path):
            audio = load_audio(clip, self.sampling_rate, self.max_duration, self.warn)
        elif isinstance(clip, bytes):
            audio = decode_audio(clip, self.sampling_rate, label, self.max_duration, self.warn)
        elif isinstance(clip, tuple):
            samples, rate = clip
            samples = np.asarray(samples)
            check_rate(float(rate), label)
            check_duration(len(samples), float(rate), self.max_duration, label)
            if int(rate) != rate:
                raise S2SError(f"{label}: the sampling rate must be a whole number of Hz, not {rate!r}")
            audio = resample(samples.astype(np.float32), int(rate), self.sampling_rate)
        else:
            audio = np.asarray(clip, dtype=np.float32)
            check_duration(len(audio), self.sampling_rate, self.max_duration, label)
        if audio.size == 0:
            raise S2SError(f"{label}: no audio samples")
        check_samples(audio, label)
        if not isinstance(clip, str | Path | bytes):  # a file's level was judged as it was read
            level = Level()
            level.add(audio)
            if line := level.warning(label):
                self.warn(line)
        return audio


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)
