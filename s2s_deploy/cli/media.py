"""What ``transcribe`` and ``caption`` share: files in, one line of text each out (or a .txt/.json file),
through the Python API that reads the export's medium."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from s2s_deploy.cli.group import decoding_options, device_option, echo_device, given_decoding, threads_option

OUTPUT_KINDS = (".txt", ".json")
F = TypeVar("F", bound=Callable[..., Any])


def file_options(command: F) -> F:
    """The options every files-in, text-out command takes: batching, scores, ``--output``, quiet,
    every decoding option, the device and threads (``decode_files`` reads them)."""
    for decorator in reversed((
        click.option("--batch-size", type=click.IntRange(1), default=16, show_default=True,
                     help="Files decoded together."),
        click.option("--scores", is_flag=True, help="Print each hypothesis's score before it, tab-separated."),
        click.option("--output", "output_path", type=click.Path(dir_okay=False), default=None,
                     help="Write out.txt (one line per file) or out.json (file, text, score, language, hypotheses) "
                          "instead."),
        click.option("--quiet", is_flag=True, help="No device notice."),
        decoding_options, device_option, threads_option,
    )):
        command = decorator(command)
    return command


def decode_files(reader_type: type, export_dir: str, files: tuple[str, ...], what: str, batch_size: int,
                 scores: bool, output_path: str | None, quiet: bool, device: str, threads: int | None,
                 decoding: dict[str, Any]) -> None:
    """Every check before any work (the folder, --output's kind, each file, the options), then
    ``reader_type`` (``Transcriber``, ``Captioner``) over ``files``; ``what`` names a file in messages."""
    from s2s_deploy.errors import S2SError
    from s2s_deploy.format.manifest import not_an_export

    if not Path(export_dir).is_dir():
        raise S2SError(not_an_export(Path(export_dir)))
    if output_path is not None and Path(output_path).suffix not in OUTPUT_KINDS:
        raise S2SError(f"--output {output_path}: write a {' or a '.join(OUTPUT_KINDS)} file")
    for path in files:
        if not Path(path).is_file():
            raise S2SError(f"{what} file not found: {path}")
    options = given_decoding(decoding)
    reader = reader_type(export_dir, device=device, threads=threads)
    reader.translator.search_config(**options)  # bad options before any work
    if not quiet:
        echo_device(reader.notice, reader.provider)
    found = reader(list(files), batch_size=batch_size, **options)
    lines = [f"{score:.4f}\t{text}" if scores else text for t in found for text, score in t.hypotheses]
    if output_path is None:
        for line in lines:
            click.echo(line)
        return
    if output_path.endswith(".json"):
        rows = [{"file": t.source, "text": t.text, "score": t.score, "language": t.language,
                 "hypotheses": [{"text": text, "score": score} for text, score in t.hypotheses]} for t in found]
        data = json.dumps(rows, ensure_ascii=False, indent=1) + "\n"
    else:
        data = "".join(line + "\n" for line in lines)
    try:
        Path(output_path).write_text(data, encoding="utf-8")
    except OSError as exc:
        raise S2SError(f"cannot write {output_path}: {exc.strerror}") from exc
