"""``s2s-deploy translate``: one command, four modes chosen up front from its flags: text to the
terminal, token ids, a stream of pieces, and a file (here or on Ray) with ``--output``."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from s2s_deploy.cli.group import (
    decoding_options,
    device_option,
    echo_device,
    given_decoding,
    main,
    read_lines,
    threads_option,
)
from s2s_deploy.errors import S2SError

if TYPE_CHECKING:
    from s2s_deploy.runtime.decoding import SearchConfig
    from s2s_deploy.runtime.translator import Translator


@dataclass(frozen=True)
class Request:
    """What ``translate`` was asked, flags by name; ``decoding`` holds only the options given."""

    export_dir: str
    texts: tuple[str, ...]
    input_path: str | None
    output_path: str | None
    batch_size: int
    max_batch_tokens: int | None
    scores: bool
    ids: bool
    stream: bool
    quiet: bool
    engine: str
    device: str
    threads: int | None
    on_long: str | None
    utf8_errors: str | None
    resume: bool
    ray_address: str | None
    actors: int
    chunk_lines: int | None
    vmap: str | None
    decoding: Mapping[str, Any]

    def translator(self) -> Translator:
        from s2s_deploy.runtime.translator import Translator

        return Translator(self.export_dir, device=self.device, threads=self.threads, engine=self.engine,
                          vmap=self.vmap)


@main.command("translate")
@click.argument("export_dir", type=click.Path())
@click.argument("texts", nargs=-1)
@click.option("--input", "input_path", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="Read sentences from a file, one per line ('-' for stdin); a blank line gives a blank line.")
@click.option("--batch-size", type=click.IntRange(1), default=32, show_default=True,
              help="Sentences decoded together (sorted by length first).")
@click.option("--max-batch-tokens", type=click.IntRange(1), default=None,
              help="Also cap a batch at this many source tokens (rows x longest).")
@click.option("--scores", is_flag=True, help="Print each hypothesis's score before it, tab-separated.")
@click.option("--ids", is_flag=True,
              help="Inputs and outputs are whitespace-separated token ids: an input is the encoder's row as it "
                   "stands (EOS included), an output the target ids without the start token and EOS.")
@click.option("--stream", is_flag=True, help="Print each sentence's translation piece by piece as it is produced "
              "(greedy or sampling).")
@click.option("--output", "output_path", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="Stream --input into this file ('-' for stdout), one line per input line, in order.")
@click.option("--on-long", type=click.Choice(["truncate", "skip", "error"]), default=None,
              help="With --output: a line over the model's source limit [default: truncate; skip leaves it blank].")
@click.option("--errors", "utf8_errors", type=click.Choice(["strict", "replace"]), default=None,
              help="With --output: invalid UTF-8 stops with its line number, or becomes U+FFFD [default: strict].")
@click.option("--resume", is_flag=True, help="With --output: continue an interrupted run from its .part file.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="", default=None, metavar="[ADDRESS]",
              help="With --output: translate on Ray (a local one, or the cluster at ADDRESS, e.g. auto).")
@click.option("--actors", type=click.IntRange(1), default=None,
              help="With --ray: translator actors, each holding its own model [default: 2].")
@click.option("--chunk-lines", type=click.IntRange(1), default=None,
              help="With --output: lines read, sorted, translated and saved at a time; on Ray, the unit each actor "
                   "takes [default: 10000].")
@click.option("--vmap", type=click.Path(dir_okay=False), default=None,
              help="A vocabulary shortlist in CTranslate2's vmap format: each sentence ranks only the target tokens "
                   "its source tokens allow (opt-in, not exact; docs/decoding.md).")
@click.option("--quiet", is_flag=True, help="No progress bar and no device notice.")
@click.option("--engine", type=click.Choice(["loop", "graph"]), default="loop", show_default=True,
              help="loop: the search in Python over the step decoder; graph: one call per batch to the fused "
                   "generate.onnx (run `s2s-deploy fuse DIR` first).")
@functools.partial(decoding_options, timed=False)
@device_option
@threads_option
def translate_command(export_dir: str, texts: tuple[str, ...], **flags: Any) -> None:
    """Translate text with an export (no PyTorch needed).

    Translates TEXTS, or the lines of --input.

    Decoding options left out take the export's own defaults (its manifest's search block), then
    the built-in ones. With --output, --input is streamed in chunks of 10,000 lines: memory stays
    flat, output line N belongs to input line N, and Ctrl-C leaves a part file that --resume continues.
    """
    from s2s_deploy.format.decoding import BY_NAME

    decoding = given_decoding({name: flags.pop(name) for name in list(flags) if name in BY_NAME})
    actors = flags.pop("actors")
    if actors is not None and flags["ray_address"] is None:
        raise S2SError("--actors needs --ray")
    request = Request(export_dir, texts, actors=actors or 2, decoding=decoding, **flags)
    choose_mode(request)(request)


def choose_mode(request: Request) -> Callable[[Request], None]:
    """The mode the flags ask for, after refusing flags that mean nothing in it."""
    if request.output_path is not None:
        if request.texts or request.input_path is None:
            raise S2SError("--output translates --input FILE ('-' for stdin), not TEXTS")
        if request.decoding.get("n_best", 1) > 1:
            raise S2SError("--output writes one line per input line: --n-best needs output to the terminal")
        if request.stream or request.max_batch_tokens:
            raise S2SError("--output decodes whole batches: no --stream or --max-batch-tokens")
        if request.vmap is not None:
            raise S2SError("--vmap applies to output on the terminal, not --output files")
        return to_file
    file_only = {"--on-long": request.on_long, "--errors": request.utf8_errors, "--resume": request.resume or None,
                 "--ray": request.ray_address, "--chunk-lines": request.chunk_lines}
    given = [name for name, value in file_only.items() if value is not None]
    if given:
        raise S2SError(f"{given[0]} needs --output")
    if request.ids:
        if request.stream or request.max_batch_tokens:
            raise S2SError("--ids decodes rows of ids as they stand: no --stream or --max-batch-tokens")
        return ids_to_terminal
    if request.stream:
        if request.max_batch_tokens:
            raise S2SError("--stream decodes one sentence at a time: no --max-batch-tokens")
        if request.decoding.get("beam_size", 1) > 1 or request.decoding.get("n_best", 1) > 1 or request.scores:
            raise S2SError("--stream prints one greedy or sampled translation: no --beam, --n-best or --scores")
        return stream_to_terminal
    return text_to_terminal


def _lines(request: Request) -> list[str]:
    """TEXTS, then the lines of --input (blank lines kept: each gives a blank output line)."""
    from s2s_deploy.runtime.translator import check_inputs

    lines = list(request.texts) + (read_lines(request.input_path, keep_blank=True) if request.input_path else [])
    folder = Path(request.export_dir)
    if not folder.exists():
        if not lines:  # most likely the text, with the export folder forgotten
            raise S2SError(f"export folder not found: {request.export_dir!r} is not an export folder: run "
                           "`s2s-deploy translate DIR TEXT...`, e.g. `s2s-deploy translate exported/transformer "
                           "\"some text\"`")
        raise S2SError(f"export folder not found: {request.export_dir!r} (usage: s2s-deploy translate DIR TEXT...)")
    if not folder.is_dir():
        from s2s_deploy.format.manifest import not_an_export

        raise S2SError(not_an_export(folder))
    if not request.texts and request.input_path is None:
        raise S2SError("nothing to translate: give TEXTS or --input")
    if request.texts:
        check_inputs(list(request.texts))  # a blank TEXT is a mistake; a blank line of a file stays blank
    return lines


def _ready(request: Request, **fixed: int) -> tuple[Translator, SearchConfig]:
    """The translator and the one config every batch decodes with (``fixed`` over the options
    given); bad options fail here, before the device notice."""
    translator = request.translator()
    config = translator.search_config(**{**request.decoding, **fixed})
    if not request.quiet:
        echo_device(translator.notice, translator.provider)
    return translator, config


def text_to_terminal(request: Request) -> None:
    lines = _lines(request)
    translator, config = _ready(request)
    sentences = [line for line in lines if line.strip()]
    results = iter(translator(sentences, batch_size=request.batch_size, max_batch_tokens=request.max_batch_tokens,
                              config=config) if sentences else [])
    if translator.unknown_notice():
        click.echo(translator.unknown_notice(), err=True)
    for line in lines:  # a blank input line stays a blank output line, as with --output
        if not line.strip():
            click.echo("")
            continue
        for text, score in next(results).hypotheses:
            click.echo(f"{score:.4f}\t{text}" if request.scores else text)


def ids_to_terminal(request: Request) -> None:
    """Every n-best hypothesis of every line, as target ids, each with its score under --scores."""
    from s2s_deploy.runtime.translator import check_ids, parse_ids

    lines = [line for line in _lines(request) if line.strip()]
    translator = request.translator()
    source = translator.manifest.src_vocab  # bad ids are refused before the notice
    rows = check_ids([parse_ids(line, number) for number, line in enumerate(lines, 1)], len(source),
                     translator.manifest.max_source_length) if lines else []
    config = translator.search_config(**request.decoding)
    if not request.quiet:
        echo_device(translator.notice, translator.provider)
    for hyps in translator.translate_ids(rows, batch_size=request.batch_size, config=config) if rows else []:
        for hyp in hyps:
            line = " ".join(map(str, hyp.tokens))
            click.echo(f"{hyp.score:.4f}\t{line}" if request.scores else line)


def stream_to_terminal(request: Request) -> None:
    """Greedy (or sampled) whatever the export's default beam: a stream has one hypothesis."""
    lines = _lines(request)
    translator, config = _ready(request, beam_size=1, n_best=1)
    for line in lines:
        if line.strip():
            for piece in translator.stream(line, config=config):
                click.echo(piece, nl=False)
        click.echo()


def to_file(request: Request) -> None:
    """--output: here or on Ray, with the options resolved once for the whole job; the summary line
    always, Ctrl-C as one line and exit 130."""
    import sys

    from s2s_deploy.jobs.files import CHUNK_LINES, FileOptions, TranslationInterrupted, refuse_same_file, translate_file

    assert request.input_path is not None and request.output_path is not None
    options = FileOptions(None, request.batch_size, request.on_long or "truncate", request.utf8_errors or "strict",
                          request.scores, request.chunk_lines or CHUNK_LINES, request.ids)
    progress = False if request.quiet else None
    try:
        if request.ray_address is not None:
            from s2s_deploy.format.manifest import load_manifest
            from s2s_deploy.jobs.distributed import translate_dataset
            from s2s_deploy.runtime.decoding import resolve

            # bad options fail before Ray starts; the graphs are hashed by the actors that load them
            search = resolve(load_manifest(request.export_dir, verify_hashes=False), request.decoding)
            summary = translate_dataset(request.export_dir, request.input_path, request.output_path,
                                        replace(options, search=search), actors=request.actors,
                                        address=request.ray_address or None, resume=request.resume, progress=progress,
                                        device=request.device, threads=request.threads or 1, engine=request.engine)
        else:
            refuse_same_file(request.input_path, request.output_path, Path(f"{request.output_path}.part"))
            translator, search = _ready(request)
            summary = translate_file(translator, request.input_path, request.output_path,
                                     replace(options, search=search), resume=request.resume, progress=progress)
            if translator.unknown_notice():
                click.echo(translator.unknown_notice(), err=True)
    except TranslationInterrupted as exc:
        click.echo(str(exc), err=True)
        sys.exit(130)
    click.echo(summary.describe(), err=True)
