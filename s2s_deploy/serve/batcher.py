"""Dynamic batching: requests that arrive within a short window share one search call.

One batch runs at a time per process, on one executor thread whose ONNX Runtime sessions use
the process's intra-op threads, so a server never runs more compute threads than it was given.
The batcher sees items (texts, or a clip's features) and their source lengths only; what decodes
a batch is the caller's ``decode``. Imports nothing beyond the runtime and asyncio (the HTTP layer
is app.py).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from s2s_deploy.errors import S2SError
from s2s_deploy.runtime.decoding import SearchConfig

Decode = Callable[[list[Any], SearchConfig], list[Any]]
"""Decodes one batch of items with one config: one result per item, in order."""


class QueueFullError(S2SError):
    """The bounded queue holds as many sentences as it may: the client should retry later (503)."""


class TooLargeError(S2SError):
    """A request that could never fit one batch (413)."""


@dataclass(frozen=True)
class BatchLimits:
    """``window_ms``: how long the first request of a batch waits for others; a batch holds at most
    ``max_sentences`` and ``max_tokens`` = sentences × longest source (tokens with EOS, or a
    clip's frames) × beam; ``max_queue`` sentences may wait."""

    window_ms: float = 5.0
    max_sentences: int = 64
    max_tokens: int = 16384
    max_queue: int = 1024

    def __post_init__(self) -> None:
        if self.window_ms < 0 or min(self.max_sentences, self.max_tokens, self.max_queue) < 1:
            raise S2SError("batch window must be >= 0 ms and every batch/queue limit >= 1")


@dataclass
class _Job:
    items: Sequence[Any]
    longest: int
    config: SearchConfig
    arrived: float
    future: asyncio.Future = field(repr=False)


@dataclass
class BatchStats:
    batches: int = 0
    sentences: int = 0
    largest: int = 0


class Batcher:
    """``await submit(items, lengths, config)`` from any request handler; ``start()`` and
    ``aclose()`` from the application's lifespan, inside its event loop."""

    def __init__(self, decode: Decode, limits: BatchLimits) -> None:
        self.decode = decode
        self.limits = limits
        self.stats = BatchStats()
        self._pending: deque[_Job] = deque()
        self._queued = 0
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="s2s-search")
        self._task: asyncio.Task | None = None

    @property
    def queued(self) -> int:
        return self._queued

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def aclose(self) -> None:
        """Called after the server stopped taking requests and in-flight ones were answered."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._executor.shutdown(wait=True)

    def _cost(self, sentences: int, longest: int, config: SearchConfig) -> int:
        return sentences * longest * config.beam_size

    async def submit(self, items: Sequence[Any], lengths: Sequence[int], config: SearchConfig) -> list[Any]:
        """The items' results once their batch ran; ``lengths``: each item's source length."""
        return await self.enqueue(items, lengths, config)

    def enqueue(self, items: Sequence[Any], lengths: Sequence[int], config: SearchConfig) -> asyncio.Future:
        """``submit`` in two steps: the items queued (or refused) now, their results in the future
        returned, so a caller knows they were taken before it answers (a streamed answer's status)."""
        if len(items) > self.limits.max_sentences:
            raise TooLargeError(f"{len(items)} items exceed the batch limit of {self.limits.max_sentences}")
        longest = max(lengths)
        cost = self._cost(len(items), longest, config)
        if cost > self.limits.max_tokens:
            raise TooLargeError(f"{cost} padded source positions (items × longest × beam) exceed the batch limit "
                                f"of {self.limits.max_tokens}")
        if self._queued + len(items) > self.limits.max_queue:
            raise QueueFullError(f"the queue is full ({self._queued} items waiting); retry later")
        loop = asyncio.get_running_loop()
        job = _Job(items, longest, config, loop.time(), loop.create_future())
        self._pending.append(job)
        self._queued += len(items)
        self._wake.set()
        return job.future

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._pending:
                self._wake.clear()
                await self._wake.wait()
            first = self._pending[0]
            deadline = first.arrived + self.limits.window_ms / 1000
            while not self._batch_full(first.config) and (delay := deadline - loop.time()) > 0:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), delay)
                except asyncio.TimeoutError:
                    break
            jobs = self._take(first.config)
            await self._run(jobs)

    def _fits(self, jobs: list[_Job], config: SearchConfig) -> bool:
        sentences = sum(len(j.items) for j in jobs)
        longest = max(j.longest for j in jobs)
        within_tokens = self._cost(sentences, longest, config) <= self.limits.max_tokens
        return sentences <= self.limits.max_sentences and within_tokens

    def _batch_full(self, config: SearchConfig) -> bool:
        """True once the waiting requests with this config would overflow one batch."""
        same = [j for j in self._pending if j.config == config]
        return sum(len(j.items) for j in same) >= self.limits.max_sentences or not self._fits(same, config)

    def _take(self, config: SearchConfig) -> list[_Job]:
        """The oldest requests with the first one's options that fit together, in arrival order;
        the rest wait for the next batch."""
        taken: list[_Job] = []
        for job in list(self._pending):
            if job.config == config and self._fits([*taken, job], config):
                taken.append(job)
                self._pending.remove(job)
        self._queued -= sum(len(j.items) for j in taken)
        return taken

    async def _run(self, jobs: list[_Job]) -> None:
        items = [item for j in jobs for item in j.items]
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(self._executor, self.decode, items, jobs[0].config)
        except Exception as exc:  # one failing batch answers its requests, never stops the loop
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(exc)
            return
        self.stats.batches += 1
        self.stats.sentences += len(items)
        self.stats.largest = max(self.stats.largest, len(items))
        start = 0
        for job in jobs:
            if not job.future.done():  # a client that went away cancelled its future
                job.future.set_result(results[start : start + len(job.items)])
            start += len(job.items)
