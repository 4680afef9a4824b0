"""Translate a file on Ray: the chunks of ``jobs.files``, spread over an actor pool.

A Ray Data pipeline: one row per chunk of the input (its index and byte range), ``map_batches``
over a pool of actors that each load the export once and translate whole chunks, and the driver
writing the results back in input order through the same resumable part file as a single
machine. A chunk is translated exactly as ``s2s-deploy translate --output`` would, so the file is
byte-identical to the single-machine one, and a run interrupted under either can resume under
the other. (``ray.data.read_text`` is not used: it splits lines on ``str.splitlines`` separators
besides ``\\n``, which would shift alignment, and it cannot name the line of a UTF-8 error.)

The actors read their byte ranges of the input, and load the export, from the same paths as the
driver: on a cluster both must be readable on every node (docs/distributed.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.format.manifest import load_manifest
from s2s_deploy.jobs.files import (
    ChunkResult,
    Counts,
    FileJob,
    FileOptions,
    FileSummary,
    file_job,
    translate_chunk,
)

RAY_MISSING = "install the ray extra: pip install 's2s-deploy[ray]'"
_COUNTS = ("lines", "blank", "truncated", "skipped")


class ChunkTranslator:
    """Ray Data actor: loads the export once, then translates whole chunks read from the input file."""

    def __init__(self, export_dir: str, input_path: str, options: FileOptions, device: str,
                 threads: int | None, engine: str = "loop") -> None:
        from s2s_deploy.runtime.translator import Translator

        self.translator = Translator(export_dir, device=device, threads=threads, engine=engine)
        self.input_path = input_path
        self.options = options

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """An S2SError comes back as data: raised by the driver in input order, after the chunks before it."""
        texts: list[bytes] = []
        counts: list[Counts] = []
        errors: list[str] = []
        with open(self.input_path, "rb") as handle:
            for first_line, start, end in zip(batch["first_line"], batch["start"], batch["end"], strict=True):
                handle.seek(int(start))
                try:
                    result = translate_chunk(self.translator, handle.read(int(end - start)), int(first_line),
                                             self.options)
                except S2SError as exc:
                    result = ChunkResult(b"", Counts())
                    errors.append(str(exc))
                else:
                    errors.append("")
                texts.append(result.text)
                counts.append(result.counts)
        return {"index": batch["index"], "text": np.array(texts, dtype=object), "error": np.array(errors, dtype=object),
                **{name: np.array([getattr(c, name) for c in counts], dtype=np.int64) for name in _COUNTS}}


def chunk_ranges(path: str, offset: int, first_line: int, chunk_lines: int) -> Iterator[dict[str, int]]:
    """The chunks a single machine would read from ``offset`` on, as byte ranges: rows small enough for Ray."""
    with open(path, "rb") as handle:
        handle.seek(offset)
        index = 0
        while True:
            lines = list(islice(handle, chunk_lines))
            if not lines:
                return
            size = sum(len(line) for line in lines)
            yield {"index": index, "first_line": first_line, "start": offset, "end": offset + size,
                   "lines": len(lines)}
            index, offset, first_line = index + 1, offset + size, first_line + len(lines)


PROBE_SECONDS = 5.0


def _probe(address: str) -> None:
    """Fail in seconds, not minutes, when ``host:port`` does not answer (Ray itself retries for long)."""
    import socket

    host_port = address.split("://", 1)[-1].rsplit("/", 1)[0]
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        return  # "auto" and other forms Ray resolves itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_SECONDS).close()
    except OSError as exc:
        raise S2SError(f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}") from exc


def translate_dataset(export_dir: str | Path, input_path: str | Path, output_path: str | Path,
                      options: FileOptions | None = None, *, actors: int = 2, address: str | None = None,
                      resume: bool = False, progress: bool | None = None, device: str = "auto",
                      threads: int | None = 1, engine: str = "loop",
                      runtime_env: dict[str, Any] | None = None) -> FileSummary:
    """Translate ``input_path`` into ``output_path`` with ``actors`` Ray actors; same bytes as one machine.

    ``options`` as for ``translate_file``: their decoding options are resolved here, once, and
    every actor decodes with that one config. Uses the Ray already initialised in this process,
    else connects to ``address`` (``"auto"``, ``"ray://head:10001"``), else starts a local one,
    shut down again at the end. ``threads`` is ONNX Runtime's per actor: one per actor and one
    actor per core avoids oversubscription.
    """
    try:
        import ray
    except ImportError as exc:
        raise S2SError(RAY_MISSING) from exc
    if str(input_path) == "-":
        raise S2SError("--ray reads the input file on the workers: give a file, not stdin")
    if actors < 1:
        raise S2SError("actors must be at least 1")
    export_dir, input_path = str(Path(export_dir).resolve()), str(Path(input_path).resolve())
    manifest = load_manifest(export_dir)
    options = (options or FileOptions()).resolved(manifest)
    started = time.perf_counter()
    owned = not ray.is_initialized()
    if owned and address:
        _probe(address)
    with ray_noise_held_back() as own_stderr:
        if owned and address:
            # Ray retries a GCS that answers wrongly once a second, 20 times by default: keep it to seconds.
            wait = os.environ.setdefault("RAY_gcs_server_port_wait_time_s", str(int(PROBE_SECONDS)))
            try:
                ray.init(address=address, runtime_env=runtime_env)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise S2SError(f"cannot connect to the Ray cluster at {address}: {' '.join(str(exc).split())[:200]}") \
                    from exc
            finally:
                if wait == str(int(PROBE_SECONDS)):
                    os.environ.pop("RAY_gcs_server_port_wait_time_s", None)
        elif owned:
            ray.init(num_cpus=max(actors, os.cpu_count() or 1), runtime_env=runtime_env, include_dashboard=False,
                     logging_level=logging.WARNING)
        try:
            with contextlib.redirect_stderr(own_stderr), \
                    file_job(input_path, str(output_path), options, manifest, resume=resume) as job:
                chunks = list(chunk_ranges(input_path, job.input_bytes, job.lines + 1, options.chunk_lines))
                job.start_progress(progress, job.lines + sum(chunk["lines"] for chunk in chunks))
                if chunks:
                    _run(ray, job, chunks, export_dir, input_path, options, actors, device, threads, engine)
                return job.finish(started)
        finally:
            if owned:
                ray.shutdown()


@contextlib.contextmanager
def ray_noise_held_back() -> Iterator[TextIO]:
    """Keep what Ray prints in this process (its token-auth warning through its own logging handler,
    C++ ``core_worker`` lines straight to file descriptor 2) out of a successful run's output: file
    descriptor 2 goes to a temporary file while Ray runs, and that file is replayed on stderr only
    if the run fails. Yields a stream on the real stderr for our own progress bar and messages."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        own = open(os.dup(saved), "w", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115
        try:
            yield own
        except BaseException:
            _restore(saved)
            held.seek(0)
            sys.stderr.write(held.read().decode("utf-8", errors="replace"))
            raise
        else:
            _restore(saved)
        finally:
            own.close()


def _restore(saved: int) -> None:
    sys.stderr.flush()
    os.dup2(saved, 2)
    os.close(saved)


def _run(ray: Any, job: FileJob, chunks: list[dict[str, int]], export_dir: str, input_path: str,
         options: FileOptions, actors: int, device: str, threads: int | None, engine: str) -> None:
    """Chunks come back in any order; each is committed once all before it are."""
    from ray.data import ActorPoolStrategy, DataContext

    context, logger = DataContext.get_current(), logging.getLogger("ray.data")
    bars, level = context.enable_progress_bars, logger.level
    context.enable_progress_bars = False  # the job's own bar counts lines, not blocks
    logger.setLevel(logging.ERROR)  # nor its block-level progress log
    try:
        # One block per chunk (built here, no read tasks to compete with the actors for CPUs), so that
        # each chunk is a task of its own for whichever actor is free.
        dataset = ray.data.from_items(chunks, override_num_blocks=len(chunks)).map_batches(
            ChunkTranslator, batch_size=1, compute=ActorPoolStrategy(size=min(actors, len(chunks))), num_cpus=1,
            fn_constructor_kwargs={"export_dir": export_dir, "input_path": input_path, "options": options,
                                   "device": device, "threads": threads, "engine": engine})
        pending: dict[int, dict[str, Any]] = {}
        expected = 0
        for row in dataset.iter_rows():
            pending[int(row["index"])] = row
            while expected in pending:
                done = pending.pop(expected)
                if done["error"]:
                    raise S2SError(done["error"])
                result = ChunkResult(bytes(done["text"]), Counts(*(int(done[name]) for name in _COUNTS)))
                job.commit(job.read_chunk(), result)
                job.advance(result.counts.lines)
                expected += 1
    finally:
        context.enable_progress_bars = bars
        logger.setLevel(level)
    if expected != len(chunks):
        raise S2SError(f"Ray returned {expected} of {len(chunks)} chunks")
