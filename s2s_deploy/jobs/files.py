"""Translate text files of any size: streamed in chunks, in order, resumable after an interrupt.

Needs numpy and onnxruntime only. The input is read ``chunk_lines`` lines at a time, never
whole; each chunk is sorted by length and batched for speed, then written back in input order,
one output line per input line (blank lines stay blank). Lines are split on ``\\n`` alone, so
the output lines up with ``wc -l`` and ``paste`` whatever characters the text holds.

The output grows in ``<output>.part``; after every chunk a sidecar ``<output>.part.json``
records the input, the options, the model and a hash of the input consumed so far, and only at
the end is the part file renamed over the output. A chunk is the unit of work everywhere (here
and on Ray), so a resumed run composes its batches exactly as an uninterrupted one and writes
the same bytes.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields, replace
from itertools import islice
from pathlib import Path
from typing import IO, Any

from s2s_deploy.errors import S2SError
from s2s_deploy.format.files import write_atomically
from s2s_deploy.format.manifest import MANIFEST_NAME, Manifest, sha256_of
from s2s_deploy.format.vocab import Vocabulary
from s2s_deploy.runtime.decoding import SearchConfig, resolve
from s2s_deploy.runtime.translator import Translator, batches_of, check_ids, parse_ids, unknown_tokens

CHUNK_LINES = 10_000
SAVE_SECONDS = 30.0  # a chunk's finished batches are saved this often, so Ctrl-C keeps them too
ON_LONG = ("truncate", "skip", "error")
ERRORS = ("strict", "replace")
STATE_FORMAT = "s2s-deploy-partial/1"
_LENIENT = {"on_long": "error", "errors": "strict"}  # a prefix made this way suits any value


@dataclass(frozen=True)
class FileOptions:
    """Everything that decides the output bytes; a resumed run must agree with them. ``search``:
    the decoding options (``Translator.search_config(...)`` or ``decoding.resolve``), resolved once
    per job; None for the export's own defaults."""

    search: SearchConfig | None = None
    batch_size: int = 32
    on_long: str = "truncate"
    errors: str = "strict"
    scores: bool = False
    chunk_lines: int = CHUNK_LINES
    ids: bool = False  # lines are whitespace-separated token ids, in and out (translate --ids)

    def __post_init__(self) -> None:
        if self.on_long not in ON_LONG:
            raise S2SError(f"on-long must be one of {', '.join(ON_LONG)}, not {self.on_long!r}")
        if self.errors not in ERRORS:
            raise S2SError(f"errors must be one of {', '.join(ERRORS)}, not {self.errors!r}")
        if min(self.batch_size, self.chunk_lines) < 1:
            raise S2SError("batch size and chunk lines must be at least 1")
        if self.search is not None and self.search.n_best != 1:
            raise S2SError("a file job writes one line per input line: n_best must be 1")

    def resolved(self, manifest: Manifest) -> FileOptions:
        """These options with ``search`` resolved against the export: once per job, not per chunk."""
        return self if self.search is not None else replace(self, search=resolve(manifest))

    def record(self) -> dict[str, Any]:
        """The options as the sidecar records them: flat and JSON-typed, so a resume compares key by key."""
        assert self.search is not None, "resolve the options first"
        flat = {**asdict(self.search), **{f.name: getattr(self, f.name) for f in fields(self) if f.name != "search"}}
        return json.loads(json.dumps(flat))


@dataclass(frozen=True)
class Counts:
    lines: int = 0
    blank: int = 0
    truncated: int = 0
    skipped: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


@dataclass(frozen=True)
class ChunkResult:
    text: bytes
    counts: Counts


@dataclass(frozen=True)
class FileSummary:
    output: str
    counts: Counts
    resumed: int
    seconds: float

    @property
    def lines_per_second(self) -> float:
        return (self.counts.lines - self.resumed) / max(self.seconds, 1e-9)

    def describe(self) -> str:
        c = self.counts
        where = "stdout" if self.output == "-" else self.output
        resumed = f", resumed after line {self.resumed}" if self.resumed else ""
        return (f"translated {c.lines} lines to {where} ({c.blank} blank, {c.truncated} truncated, "
                f"{c.skipped} skipped{resumed}) in {self.seconds:.1f} s, {self.lines_per_second:.0f} lines/s")


@dataclass(frozen=True)
class Pending:
    """The first ``batches`` batches of a chunk that is not yet committed: their lines by offset."""

    batches: int
    lines: dict[int, str]


class TranslationInterrupted(S2SError):
    """Ctrl-C: the message says what was kept and how to continue."""


def translate_chunk(translator: Translator, data: bytes, first_line: int, options: FileOptions,
                    on_batch: Callable[[int], None] | None = None, pending: Pending | None = None,
                    on_pending: Callable[[Pending], None] | None = None) -> ChunkResult:
    """One output line per line of ``data``; depends on its arguments alone, so every machine writes the same.

    ``pending`` holds the lines of this chunk's first batches from an interrupted run: they are
    not translated again, and the rest of the batches are the ones an uninterrupted run makes.
    ``on_pending`` is told after each batch what is done, for time-based resume points."""
    raw = data.split(b"\n")
    if raw[-1] == b"":
        raw.pop()
    manifest = translator.manifest
    vocab, limit = manifest.src_vocab, manifest.max_source_length
    config = options.resolved(manifest).search
    out = [""] * len(raw)
    todo: list[tuple[int, list[int]]] = []
    blank = truncated = skipped = 0
    for offset, line in enumerate(raw):
        text = _decode(line, first_line + offset, options.errors)
        if not text.strip():
            blank += 1
            continue
        ids = _source_ids(text, first_line + offset, vocab, options.ids)
        if not options.ids and vocab.unk_id in ids:
            translator.unknown.update(unknown_tokens([text], vocab))
        if limit is not None and len(ids) > limit:
            if options.on_long == "error":
                raise S2SError(f"input line {first_line + offset} has {len(ids)} tokens, over the model's limit "
                               f"of {limit}: pass --on-long truncate or skip")
            if options.on_long == "skip":
                skipped += 1
                continue
            ids = [*ids[: limit - len(vocab.suffix)], *vocab.suffix]
            truncated += 1
        todo.append((offset, ids))
    if on_batch and blank + skipped:
        on_batch(blank + skipped)
    done = Pending(0, {}) if pending is None else pending
    for offset, text in done.lines.items():
        out[offset] = text
    if on_batch and done.batches:
        on_batch(len(done.lines))
    padding = translator.padding
    batches = [[todo[i] for i in chunk] for chunk in batches_of([ids for _, ids in todo], padding, options.batch_size)]
    for number, batch in enumerate(batches):
        if number < done.batches:
            continue
        src, src_len = padding.pad([ids for _, ids in batch], vocab.pad_id)
        for (offset, _), hyps in zip(batch, translator.engine.search(src, src_len, config), strict=True):
            best = hyps[0]
            if options.ids:
                text = " ".join(map(str, best.tokens))
            else:  # a target vocabulary may hold a newline; it must not split an output line
                text = manifest.tgt_vocab.decode(best.tokens).replace("\r", " ").replace("\n", " ")
            out[offset] = f"{best.score:.4f}\t{text}" if options.scores else text
        if on_pending:
            done = Pending(number + 1, {**done.lines, **{offset: out[offset] for offset, _ in batch}})
            on_pending(done)
        if on_batch:
            on_batch(len(batch))
    return ChunkResult("".join(f"{line}\n" for line in out).encode("utf-8"),
                       Counts(len(raw), blank, truncated, skipped))


def _source_ids(text: str, number: int, vocab: Vocabulary, ids: bool) -> list[int]:
    if not ids:
        return vocab.encode(text)
    return check_ids([parse_ids(text, number)], len(vocab), first_number=number)[0]


def _decode(line: bytes, number: int, errors: str) -> str:
    if line.endswith(b"\r"):
        line = line[:-1]
    try:
        return line.decode("utf-8-sig" if number == 1 else "utf-8", errors=errors)
    except UnicodeDecodeError as exc:
        raise S2SError(f"input line {number} is not valid UTF-8 (byte {exc.start + 1} of the line): "
                       "pass --errors replace to substitute U+FFFD") from exc


def count_lines(path: str | Path) -> int:
    """Lines as this module counts them, at disk speed: for the progress bar's ETA."""
    count, last = 0, b"\n"
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def model_identity(manifest: Manifest) -> dict[str, str]:
    """Hashes of the manifest and graphs: resuming with another export would mix two models' output."""
    return {"manifest": sha256_of(manifest.directory / MANIFEST_NAME),
            "encoder": manifest.encoder.sha256, "decoder": manifest.decoder.sha256}


class FileJob:
    """The input stream, the partial output and its sidecar: where a run stands, safe after every chunk.

    Open it with ``file_job``; read chunks with ``read_chunk``, hand each result to ``commit`` in
    input order, and ``finish`` renames the part file over the output.
    """

    def __init__(self, source: IO[bytes], input_path: str, output_path: str, options: FileOptions,
                 model: dict[str, str], resume: bool) -> None:
        self.source = source
        self.options = options
        self.output = output_path
        self.to_stdout = output_path == "-"
        self.part = Path(f"{output_path}.part")
        self.sidecar = Path(f"{output_path}.part.json")
        self.identity = {"input": input_path if input_path == "-" else str(Path(input_path).resolve()),
                         "model": model, "options": options.record()}
        self.counts = Counts()
        self.resumed = 0
        self.input_bytes = 0
        self.output_bytes = 0
        self.digest = hashlib.sha256()
        self.pending: Pending | None = None
        self.pending_sha256 = ""
        self.pending_saved = 0
        self.saved_at = time.monotonic()
        self.sink: IO[bytes] | None = None
        self.bar: Any = None
        if self.to_stdout:
            if resume:
                raise S2SError("--resume needs an output file; output to stdout cannot be resumed")
            self.sink = sys.stdout.buffer
            return
        if not Path(output_path).parent.is_dir():
            raise S2SError(f"cannot write {output_path}: folder {Path(output_path).parent} does not exist")
        refuse_same_file(input_path, output_path, self.part, self.sidecar)
        self.sink = _open_locked(self.part, output_path)
        try:
            self._open(resume)
        except BaseException:
            self.close()
            raise

    def _open(self, resume: bool) -> None:
        assert self.sink is not None
        state = self._load_state()
        if state is not None and not resume:
            raise S2SError(f"{self.part} holds {state['counts']['lines']} lines from an earlier run: pass --resume "
                           "to continue it, or delete it to start over")
        if state is None:
            if resume:
                raise S2SError(f"--resume: no interrupted run to continue ({self.sidecar} not found); run without "
                               "--resume to start")
            self.sidecar.unlink(missing_ok=True)
            self.sink.truncate(0)
        else:
            self._take_over(state)

    @property
    def lines(self) -> int:
        return self.counts.lines

    def start_progress(self, show: bool | None, total: int | None) -> None:
        """tqdm on stderr; ``show=None`` shows it only on a terminal."""
        from tqdm import tqdm

        visible = sys.stderr.isatty() if show is None else show
        self.bar = tqdm(total=total, initial=self.lines, unit=" lines", dynamic_ncols=True, file=sys.stderr,
                        disable=not visible, smoothing=0.1, desc="translate")

    def advance(self, lines: int) -> None:
        if self.bar is not None:
            self.bar.update(lines)

    def read_chunk(self) -> bytes:
        """The next ``chunk_lines`` lines as raw bytes; empty at the end of the input."""
        return b"".join(islice(self.source, self.options.chunk_lines))

    def resume_point(self, data: bytes) -> Pending | None:
        """What an interrupted run finished of this chunk, if the chunk is the one it was working on."""
        pending, self.pending = self.pending, None
        if pending is None or hashlib.sha256(data).hexdigest() != self.pending_sha256:
            return None
        lines = data.count(b"\n") + (not data.endswith(b"\n"))
        return pending if all(0 <= offset < lines for offset in pending.lines) else None

    def save_pending(self, data: bytes, pending: Pending) -> None:
        """Record the chunk's finished batches, at most every SAVE_SECONDS: a time-based resume point."""
        if self.to_stdout or time.monotonic() - self.saved_at < SAVE_SECONDS:
            return
        self._save_state({"batches": pending.batches, "sha256": hashlib.sha256(data).hexdigest(),
                          "lines": {str(k): v for k, v in pending.lines.items()}})
        self.pending_saved = len(pending.lines)

    def commit(self, data: bytes, result: ChunkResult) -> None:
        """Append one chunk's output (the chunk after the last committed one) and record it durably."""
        assert self.sink is not None
        self.sink.write(result.text)
        self.sink.flush()
        self.digest.update(data)
        self.input_bytes += len(data)
        self.output_bytes += len(result.text)
        self.counts += result.counts
        self.pending_saved = 0
        if not self.to_stdout:
            os.fsync(self.sink.fileno())
            self._save_state()

    def finish(self, started: float) -> FileSummary:
        if not self.to_stdout:
            assert self.sink is not None
            os.replace(self.part, self.output)  # still holding the lock
            self.sink.close()
            self.sidecar.unlink(missing_ok=True)
        self.close()
        return FileSummary(self.output, self.counts, self.resumed, time.perf_counter() - started)

    def close(self) -> None:
        """Leave a resumable part file, or none at all when not even one chunk was recorded."""
        if self.bar is not None:
            self.bar.close()
        if self.sink is not None and not self.to_stdout and not self.sink.closed:
            if self.part.exists() and not self.sidecar.exists():
                self.part.unlink()  # before the lock goes with the close
            self.sink.close()

    def interrupted(self) -> str:
        if self.to_stdout:
            return f"interrupted after {self.lines} lines; output to stdout cannot be resumed"
        if not self.sidecar.exists():
            return f"interrupted before the first {self.options.chunk_lines} lines were done; nothing to resume"
        kept = f"{self.lines} lines" + (f" (and {self.pending_saved} of the next chunk)" if self.pending_saved else "")
        return f"interrupted: {kept} are safe in {self.part}; run the same command with --resume to continue"

    def _load_state(self) -> dict[str, Any] | None:
        if not (self.sidecar.is_file() and self.part.is_file()):
            return None
        import jsonschema

        try:
            if self.sidecar.is_symlink() or self.sidecar.stat().st_size > 1 << 20:
                raise ValueError("not a plain sidecar file")
            state = json.loads(self.sidecar.read_text(encoding="utf-8"))
            jsonschema.validate(state, _SIDECAR)
            return state
        except (ValueError, UnicodeDecodeError, RecursionError, jsonschema.ValidationError) as exc:
            reason = getattr(exc, "message", None) or str(exc)
            raise S2SError(f"{self.sidecar} is corrupt ({' '.join(reason.split())[:120]}); delete it and {self.part} "
                           "to start over") from exc

    def _take_over(self, state: dict[str, Any]) -> None:
        done = state["counts"]["lines"]
        refuse = f"cannot resume from {self.part} ({done} lines): "
        if state["input"] != self.identity["input"]:
            raise S2SError(f"{refuse}it was made from {state['input']}, not {self.identity['input']}")
        if state["model"] != self.identity["model"]:
            raise S2SError(f"{refuse}it was made with a different model export")
        for key, value in self.identity["options"].items():
            before = state["options"].get(key)
            if before != value and before != _LENIENT.get(key):
                raise S2SError(f"{refuse}it was made with {key}={_shown(before)}, not {key}={_shown(value)}")
        remaining = state["input_bytes"]
        while remaining:
            block = self.source.read(min(remaining, 1 << 20))
            if not block:
                break
            self.digest.update(block)
            remaining -= len(block)
        if remaining or self.digest.hexdigest() != state["input_sha256"]:
            raise S2SError(f"{refuse}the first {done} lines of the input changed since; delete it to start over")
        if self.part.stat().st_size < state["output_bytes"]:
            raise S2SError(f"{refuse}it is shorter than its sidecar records; delete it to start over")
        self.counts = Counts(**state["counts"])
        if "pending" in state:
            lines = state["pending"]["lines"]
            self.pending = Pending(state["pending"]["batches"], {int(k): v for k, v in lines.items()})
            self.pending_sha256 = state["pending"]["sha256"]
            done += len(lines)
        self.resumed = done
        self.input_bytes = state["input_bytes"]
        self.output_bytes = state["output_bytes"]
        assert self.sink is not None
        self.sink.truncate(self.output_bytes)
        self.sink.seek(self.output_bytes)

    def _save_state(self, pending: dict[str, Any] | None = None) -> None:
        state = {"format": STATE_FORMAT, **self.identity, "counts": asdict(self.counts),
                 "input_bytes": self.input_bytes, "input_sha256": self.digest.hexdigest(),
                 "output_bytes": self.output_bytes}
        if pending is not None:
            state["pending"] = pending
        self.saved_at = time.monotonic()
        write_atomically(self.sidecar, (json.dumps(state, indent=1) + "\n").encode("utf-8"))


_COUNT = {"type": "integer", "minimum": 0}
_SIDECAR = {
    "type": "object",
    "required": ["format", "input", "model", "options", "counts", "input_bytes", "input_sha256", "output_bytes"],
    "properties": {
        "format": {"const": STATE_FORMAT}, "input": {"type": "string"}, "model": {"type": "object"},
        "options": {"type": "object"}, "input_bytes": _COUNT, "output_bytes": _COUNT,
        "input_sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        "counts": {"type": "object", "required": [f.name for f in fields(Counts)], "additionalProperties": False,
                   "properties": {f.name: _COUNT for f in fields(Counts)}},
        "pending": {"type": "object", "required": ["batches", "sha256", "lines"], "properties": {
            "batches": _COUNT, "sha256": {"type": "string"},
            "lines": {"type": "object", "propertyNames": {"pattern": "^[0-9]{1,9}$"},
                      "additionalProperties": {"type": "string"}}}},
    },
}


def refuse_same_file(input_path: str, output_path: str, *others: Path) -> None:
    """The output, its part file and sidecar must never be the input (hard or symbolic links included)."""
    if input_path == "-":
        return
    source = Path(input_path)
    for target in (Path(output_path), *others):
        same = source.resolve() == target.resolve()
        with contextlib.suppress(OSError):
            same = same or os.path.samefile(source, target)
        if same:
            raise S2SError(f"--output {output_path} would overwrite the input {input_path}; choose another file")


def _open_locked(part: Path, output_path: str) -> IO[bytes]:
    """Open the part file without following a symlink planted there, and lock it: a second run
    writing the same output stops at once instead of interleaving its lines."""
    import fcntl

    try:
        fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise S2SError(f"{part} is a symbolic link; refusing to write through it") from exc
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        raise S2SError(f"another run is writing {output_path} (its {part} is locked)") from exc
    return os.fdopen(fd, "r+b")


def _shown(value: object) -> str:
    return "default" if value is None else str(value)


@contextlib.contextmanager
def file_job(input_path: str, output_path: str, options: FileOptions, manifest: Manifest, *,
             resume: bool = False) -> Iterator[FileJob]:
    """A ``FileJob`` whose Ctrl-C becomes ``TranslationInterrupted`` with a resumable part file left behind."""
    with contextlib.ExitStack() as stack:
        source = sys.stdin.buffer if input_path == "-" else stack.enter_context(open(input_path, "rb"))
        job = FileJob(source, input_path, output_path, options, model_identity(manifest), resume)
        stack.callback(job.close)
        try:
            yield job
        except KeyboardInterrupt as exc:
            raise TranslationInterrupted(job.interrupted()) from exc


def translate_file(translator: Translator, input_path: str, output_path: str, options: FileOptions | None = None,
                   *, resume: bool = False, progress: bool | None = None) -> FileSummary:
    """Translate ``input_path`` line by line into ``output_path`` ('-' for stdin/stdout) on this machine."""
    started = time.perf_counter()
    options = (options or FileOptions()).resolved(translator.manifest)
    with file_job(input_path, output_path, options, translator.manifest, resume=resume) as job:
        visible = sys.stderr.isatty() if progress is None else progress
        job.start_progress(visible, count_lines(input_path) if visible and input_path != "-" else None)
        while data := job.read_chunk():
            result = translate_chunk(translator, data, job.lines + 1, options, job.advance, job.resume_point(data),
                                     lambda pending, data=data: job.save_pending(data, pending))
            job.commit(data, result)
        return job.finish(started)
