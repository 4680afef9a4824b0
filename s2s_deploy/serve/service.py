"""What every API that ``serve`` speaks shares: the one path a text or an upload takes through the
batcher, and the status code each refusal gets. The native API (app.py), the OpenAI-compatible one
(openai_api.py) and the LibreTranslate-compatible one (libretranslate.py) differ only in the shapes
of their requests and answers, so a clip or a sentence decodes the same whichever a client speaks.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.frontends.audio import AudioFile, AudioTooLongError
from s2s_deploy.frontends.vad import VadOptions
from s2s_deploy.runtime.decoding import SearchConfig
from s2s_deploy.runtime.features import Segment, Told
from s2s_deploy.runtime.transcriber import Transcriber, Transcription
from s2s_deploy.runtime.translator import Translation, Translator
from s2s_deploy.runtime.vad import check_one_hypothesis, joined, restored, speech_inputs
from s2s_deploy.runtime.words import decode_words
from s2s_deploy.serve.batcher import Batcher, Decode, QueueFullError, TooLargeError


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


@dataclass(frozen=True)
class Reading:
    """What an audio request asks beyond the decoding options (those go through the option table):
    voice activity detection with faster-whisper's parameters (``VadOptions`` checks them, as for
    ``transcribe --vad``) and word timestamps: ``Transcriber``'s ``vad`` and ``word_timestamps``."""

    vad: VadOptions | None = None
    words: bool = False


@dataclass(frozen=True)
class Upload:
    """One item the batcher decodes: an upload's features (or one of its speech windows'), its frames
    of audio (word timestamps align to these), whether its words are timed, and who is told its
    segments as each window is decoded (None: nobody)."""

    features: np.ndarray
    content: int
    words: bool = False
    told: Told | None = None


def upload_decoder(transcriber: Transcriber) -> Decode:
    """The batcher's decode for uploads: one batch's items through ``Transcriber.decode``, those whose
    words are timed through ``decode_words`` (a second pass over their windows), as ``transcribe``
    decodes them."""

    def decode(items: Sequence[Upload], config: SearchConfig) -> list[Transcription]:
        found: list[Transcription | None] = [None] * len(items)
        for words in (False, True):
            picked = [i for i, item in enumerate(items) if item.words == words]
            if not picked:
                continue
            features, told = [items[i].features for i in picked], [items[i].told for i in picked]
            labels = [f"{transcriber.label} {i + 1}" for i in picked]
            decoded = (decode_words(transcriber, features, [items[i].content for i in picked], config, labels, told)
                       if words else transcriber.decode(features, config, labels, told=told))
            for i, result in zip(picked, decoded, strict=True):
                found[i] = result
        return [result for result in found if result is not None]

    return decode


LOG = logging.getLogger("s2s_deploy.serve")
"""``serve --log-level debug`` shows when each streamed window was decoded and each line sent."""


class Stream:
    """Where one streamed upload's segments go: ``queue`` on the event loop, each decoded window's segments
    in order, then ``DONE`` once the transcription ended (``finish``)."""

    DONE = None
    numbers = itertools.count(1)

    def __init__(self) -> None:
        self.number = next(Stream.numbers)
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[Segment, ...] | None] = asyncio.Queue()

    def told(self, segments: tuple[Segment, ...]) -> None:
        """From the thread that decodes, as each window is decoded."""
        LOG.debug("stream %d: window decoded", self.number)
        self.loop.call_soon_threadsafe(self.queue.put_nowait, segments)

    def deliver(self, segments: tuple[Segment, ...]) -> None:
        """On the event loop: a speech window's segments, decoded (with VAD)."""
        LOG.debug("stream %d: window decoded", self.number)
        self.queue.put_nowait(segments)

    def finish(self, _: object = None) -> None:
        self.queue.put_nowait(self.DONE)



async def transcribe_upload(transcriber: Transcriber, batcher: Batcher, front_end: Executor, data: bytes,
                            search: SearchConfig, label: str = "from the upload", reading: Reading = Reading(),
                            stream: Stream | None = None, taken: Callable[[], None] | None = None) -> Clip:
    """An upload's bytes through the front end (decode, resample, features, block by block) on
    ``front_end``, beside the batch thread rather than in the event loop, then decoded in a batch with
    other requests' clips. Its header (rate, duration) is judged first, here, so a forged one is refused
    without waiting behind other uploads' front ends. ``reading``: VAD and word timestamps, read as
    ``transcribe`` reads them (the whole clip loaded for either, as there). ``stream``: given the segments
    as they are decoded (with VAD, a speech window's once it and those before it are). ``taken``: called
    once the clip is read and queued, when nothing but a failed batch can refuse it any more."""
    opened = transcriber.stream(data, label)
    if reading.words and not transcriber.manifest.alignment_heads:
        raise S2SError(f"word timestamps: this export ({Path(transcriber.manifest.directory).name}) has no alignment "
                       "heads; export it with --word-timestamps")
    if search.hallucination_silence_threshold is not None and not transcriber.manifest.alignment_heads:
        raise S2SError(f"hallucination_silence_threshold times words: this export "
                       f"({Path(transcriber.manifest.directory).name}) has no alignment heads; export it with "
                       "--word-timestamps")
    if reading.vad is not None:
        check_one_hypothesis(search)
        return await _speech_only(transcriber, batcher, front_end, data, search, label, reading.vad, reading.words,
                                  stream, taken)
    loop = asyncio.get_running_loop()

    def front(upload: AudioFile) -> tuple[np.ndarray, int, float]:
        if not reading.words:
            features = transcriber.features(upload, label, True)
            return features, 0, upload.samples / transcriber.sampling_rate
        audio = transcriber.load(data, label)  # as Transcriber(...)(clips, word_timestamps=True) reads it
        features = transcriber.features(audio, label, True)
        content = transcriber.frontend.content_frames(audio) or features.shape[-1]
        return features, content, len(audio) / transcriber.sampling_rate

    features, content, duration = await loop.run_in_executor(front_end, front, opened)
    upload = Upload(features, content, reading.words, None if stream is None else stream.told)
    decoded = batcher.enqueue([upload], [frames_of(transcriber, features)], search)
    if taken is not None:
        taken()
    [result] = await decoded
    return Clip(result, duration)


def frames_of(transcriber: Transcriber, features: np.ndarray) -> int:
    """What one clip costs a batch: its frames, a long clip's window's (it runs a window at a time)."""
    frames = int(features.shape[transcriber.source.length_axis - 1])
    if transcriber.source.length_axis == len(transcriber.source.shape):
        frames = min(frames, transcriber.window([features]))
    return frames


async def _speech_only(transcriber: Transcriber, batcher: Batcher, front_end: Executor, data: bytes,
                       search: SearchConfig, label: str, vad: VadOptions, words: bool,
                       stream: Stream | None, taken: Callable[[], None] | None) -> Clip:
    """VAD: the clip's speech windows (runtime/vad.py's, as ``transcribe --vad`` cuts them), each queued as
    an item of its own, so they share batches with each other and with other requests; joined as there."""
    loop = asyncio.get_running_loop()

    def front() -> tuple[list, float]:
        audio = transcriber.load(data, label)
        return speech_inputs(transcriber, audio, label, vad), len(audio) / transcriber.sampling_rate

    windows, duration = await loop.run_in_executor(front_end, front)
    heard: list[list[Segment]] = [[] for _ in windows]  # each window's segments, told on the batch thread
    jobs = []
    try:
        for k, (_, features, content) in enumerate(windows):
            jobs.append(batcher.enqueue([Upload(features, content, words, heard[k].extend)],
                                        [frames_of(transcriber, features)], search))
        if taken is not None:
            taken()
        decoded = []
        for k, job in enumerate(jobs):  # in order: a window's segments once it and every earlier one are decoded
            [result] = await job
            decoded.append(result)
            if stream is not None and heard[k]:
                stream.deliver(tuple(restored(windows[k][0], segment) for segment in heard[k]))
    finally:
        for job in jobs:
            job.cancel()
    return Clip(joined(label, [(w, d) for (w, _, _), d in zip(windows, decoded, strict=True)], search.timestamps),
                duration)
