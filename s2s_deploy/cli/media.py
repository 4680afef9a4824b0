"""What ``transcribe`` and ``caption`` share: files in, one line of text each out (or a .txt/.json file),
through the Python API that reads the export's medium."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from s2s_deploy.cli.group import decoding_options, device_option, echo_device, given_decoding, threads_option
from s2s_deploy.format.subtitles import clock, subtitles
from s2s_deploy.frontends.media import MEDIA

OUTPUT_KINDS = (".txt", ".json", ".srt", ".vtt")
TIMED_KINDS = (".srt", ".vtt")
"""Subtitle files: one file's timed segments (``--timestamps``)."""
F = TypeVar("F", bound=Callable[..., Any])


def file_options(medium: str) -> Callable[[F], F]:
    """The options every files-in, text-out command takes: batching, scores, ``--output``, quiet,
    every decoding option, the device and threads (``decode_files`` reads them); the timed ones
    (``--timestamps``, subtitle files) only where ``medium`` has a time axis."""
    timed = MEDIA[medium].timed
    kinds = "out.txt (one line per file), out.json (file, text, score, language, hypotheses" + (
        ", segments) or, with --timestamps and one file, out.srt or out.vtt subtitles instead." if timed else ").")

    def decorate(command: F) -> F:
        for decorator in reversed((
            click.option("--batch-size", type=click.IntRange(1), default=16, show_default=True,
                         help="Files decoded together."),
            click.option("--scores", is_flag=True, help="Print each hypothesis's score before it, tab-separated."),
            click.option("--output", "output_path", type=click.Path(dir_okay=False), default=None,
                         help=f"Write {kinds}"),
            click.option("--quiet", is_flag=True, help="No device notice."),
            functools.partial(decoding_options, timed=timed), device_option, threads_option,
        )):
            command = decorator(command)
        return command

    return decorate


def decode_files(reader_type: type, export_dir: str, files: tuple[str, ...], what: str, batch_size: int,
                 scores: bool, output_path: str | None, quiet: bool, device: str, threads: int | None,
                 decoding: dict[str, Any], reader_options: dict[str, Any] | None = None,
                 reading: dict[str, Any] | None = None, doubtful: str | None = None) -> None:
    """Every check before any work (the folder, --output's kind, the options), then ``reader_type``
    (``Transcriber``, ``Captioner``, given ``reader_options``) over ``files``; ``what`` names a file in
    messages; ``reading``: options of the reader's call that are not decoding options (``vad``,
    ``word_timestamps``). A file that cannot be read (missing, a directory, broken) is one ``error:`` line on
    stderr as it is met; the others are decoded and printed, and the command fails at the end.
    ``doubtful`` (``flag`` or ``suppress``): a result whose text falls under the confidence thresholds
    (``Decoded.doubt``) gets one ``warning:`` line on stderr, and with ``suppress`` its text is left empty."""
    from s2s_deploy.errors import S2SError
    from s2s_deploy.format.files import write_atomically
    from s2s_deploy.format.manifest import not_an_export

    if not Path(export_dir).is_dir():
        raise S2SError(not_an_export(Path(export_dir)))
    kinds = OUTPUT_KINDS if reader_type.medium.timed else tuple(k for k in OUTPUT_KINDS if k not in TIMED_KINDS)
    if output_path is not None and Path(output_path).suffix not in kinds:
        raise S2SError(f"--output {output_path}: write a {' or a '.join(kinds)} file")
    if output_path is not None and any(Path(output_path).resolve() == Path(f).resolve() for f in files):
        raise S2SError(f"--output {output_path} is one of the {what} files: it would be overwritten")
    options = given_decoding(decoding)
    reader = reader_type(export_dir, device=device, threads=threads, **(reader_options or {}))
    config = reader.translator.search_config(**options)  # bad options before any work
    suffix = Path(output_path).suffix if output_path is not None else ""
    words = bool((reading or {}).get("word_timestamps"))
    if suffix in TIMED_KINDS and not config.timestamps and not words:
        raise S2SError(f"--output {Path(output_path or '').name} writes timed segments: pass --timestamps "
                       "(or --word-timestamps)")
    if suffix in TIMED_KINDS and len(files) != 1:
        raise S2SError(f"--output {Path(output_path or '').name} holds one file's segments: give one {what} file")
    if not quiet:
        echo_device(reader.notice, reader.provider)
    failed: list[str] = []

    def refused(line: str) -> None:
        failed.append(line)
        if len(files) > 1:  # one file's refusal is the command's one line
            click.echo(f"error: {line}", err=True)

    readable = []
    for path in files:
        if Path(path).is_dir():
            refused(f"{path} is a directory, not an {what} file")
        elif not Path(path).is_file():
            refused(f"{what} file not found: {path}")
        else:
            readable.append(path)
    found = (reader(readable, batch_size=batch_size, config=config, on_error=refused, **(reading or {}))
             if readable else [])
    if not found:
        _fail_if(failed, len(files), what)
    if doubtful is not None:
        found = [_judged(t, config, doubtful == "suppress") for t in found]
    grouped = len(files) > 1 and config.n_best > 1  # n-best over several files: each line names its file
    lines = [(f"{t.source}\t" if grouped else "") + (f"{score:.4f}\t{text}" if scores else text)
             for t in found for text, score in t.hypotheses]
    if output_path is None and (config.timestamps or words):  # one line per segment (word): [start --> end] text
        lines = [(f"{t.source}\t" if len(found) > 1 else "") + (f"{t.score:.4f}\t" if scores else "")
                 + f"[{clock(s.start, '.')} --> {clock(s.end, '.')}] {s.text}" for t in found
                 for s in (t.words if words else t.segments)]
    if output_path is None:
        for line in lines:
            click.echo(line)
        _fail_if(failed, len(files), what)
        return
    if suffix == ".json":
        rows = [{"file": t.source, **t.row(config), "language": t.language,
                 "hypotheses": [{"text": text, "score": score} for text, score in t.hypotheses]}
                | ({"segments": [s.row() for s in t.segments]} if config.timestamps else {})
                | ({"words": [{"start": w.start, "end": w.end, "word": w.text} for w in t.words]} if words else {})
                for t in found]
        data = json.dumps(rows, ensure_ascii=False, indent=1) + "\n"
    elif suffix in TIMED_KINDS:  # with word timestamps, a cue per word
        data = subtitles(found[0].words if words else found[0].segments, suffix)
    else:
        data = "".join(line + "\n" for line in lines)
    try:
        write_atomically(Path(output_path), data.encode("utf-8"))
    except OSError as exc:
        raise S2SError(f"cannot write {output_path}: {exc.strerror}") from exc
    _fail_if(failed, len(files), what)


def _judged(result: Any, config: Any, suppress: bool) -> Any:
    """``result``, told in one warning line when its text is doubtful, and emptied with ``suppress``."""
    from dataclasses import replace

    reason = result.doubt(config)
    if reason is None:
        return result
    click.echo(f"warning: {result.source}: {reason}: the text "
               + ("is left empty (--doubtful suppress)" if suppress else "may be wrong"), err=True)
    if not suppress:
        return result
    return replace(result, text="", hypotheses=tuple(("", score) for _, score in result.hypotheses),
                   segments=(), words=())


def _fail_if(failed: list[str], count: int, what: str) -> None:
    """The non-zero exit after the good files' output, when any file could not be read."""
    from s2s_deploy.errors import S2SError

    if failed:
        raise S2SError(failed[0] if count == 1 else
                       f"{len(failed)} of {count} {what} files could not be read (each named above)")

