"""What every API that ``serve`` speaks shares: the one path a text or an upload takes through the
batcher, and the status code each refusal gets. The native API (app.py), the OpenAI-compatible one
(openai_api.py) and the LibreTranslate-compatible one (libretranslate.py) differ only in the shapes
of their requests and answers, so a clip or a sentence decodes the same whichever a client speaks.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.frontends.audio import AudioFile, AudioTooLongError
from s2s_deploy.runtime.decoding import SearchConfig
from s2s_deploy.runtime.transcriber import Transcriber, Transcription
from s2s_deploy.runtime.translator import Translation, Translator
from s2s_deploy.serve.batcher import Batcher, QueueFullError, TooLargeError


def refusal_status(exc: S2SError) -> int:
    """413 for what can never fit a batch or audio over the duration limit, 503 for a full queue, 400 for
    anything else the request got wrong."""
    return (413 if isinstance(exc, TooLargeError | AudioTooLongError) else 503 if isinstance(exc, QueueFullError)
            else 400)


def text_widths(translator: Translator, texts: list[str]) -> list[int]:
    """Each text's source width in tokens, padding included (what a batch's cost counts); a text
    over the model's limit can never fit (413)."""
    manifest = translator.manifest
    lengths = [len(manifest.src_vocab.encode(text)) for text in texts]
    limit = manifest.max_source_length
    for number, length in enumerate(lengths, 1):
        if limit is not None and length > limit:
            raise TooLargeError(f"text {number} has {length} tokens; the model's limit is {limit}")
    return [translator.padding.of(length) for length in lengths]


async def translate_texts(translator: Translator, batcher: Batcher, texts: list[str],
                          search: SearchConfig) -> list[Translation]:
    """``texts`` decoded in the batches the batcher forms with other requests' texts."""
    return await batcher.submit(texts, text_widths(translator, texts), search)


@dataclass(frozen=True)
class Clip:
    """One upload's transcription, and how long its audio is (seconds at the model's rate)."""

    result: Transcription
    duration: float


async def transcribe_upload(transcriber: Transcriber, batcher: Batcher, front_end: Executor, data: bytes,
                            search: SearchConfig, label: str = "from the upload") -> Clip:
    """An upload's bytes through the front end (decode, resample, features, block by block) on
    ``front_end``, beside the batch thread rather than in the event loop, then decoded in a batch with
    other requests' clips. Its header (rate, duration) is judged first, here, so a forged one is refused
    without waiting behind other uploads' front ends."""
    opened = transcriber.stream(data, label)

    def front(upload: AudioFile) -> tuple[np.ndarray, float]:
        features = transcriber.features(upload, label, True)
        return features, upload.samples / transcriber.sampling_rate

    features, duration = await asyncio.get_running_loop().run_in_executor(front_end, front, opened)
    frames = int(features.shape[transcriber.source.length_axis - 1])
    if transcriber.source.length_axis == len(transcriber.source.shape):  # a long clip runs a window at a time
        frames = min(frames, transcriber.window([features]))
    [result] = await batcher.submit([features], [frames], search)
    return Clip(result, duration)
