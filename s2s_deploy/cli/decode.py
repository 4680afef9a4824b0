"""``s2s-deploy translate`` and ``s2s-deploy parity``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from s2s_deploy.cli import load_plugin_files, main, plugin_option

if TYPE_CHECKING:
    from s2s_deploy.runtime.files import FileOptions

device_option = click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
                             show_default=True, help="ONNX Runtime device; auto uses CUDA only if it works.")
threads_option = click.option("--threads", type=click.IntRange(1), default=None,
                              help="ONNX Runtime intra-op threads [default: available cores].")


def read_lines(path: str) -> list[str]:
    from s2s_deploy.runtime.errors import S2SError

    try:
        text = Path(path).read_text(encoding="utf-8") if path != "-" else click.get_text_stream("stdin").read()
    except UnicodeDecodeError as exc:
        raise S2SError(f"{path} is not valid UTF-8 (byte {exc.start})") from exc
    except OSError as exc:
        raise S2SError(f"cannot read {path}: {exc.strerror}") from exc
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise S2SError(f"{path} has no non-empty lines")
    return lines


@main.command("translate")
@click.argument("export_dir", type=click.Path())
@click.argument("texts", nargs=-1)
@click.option("--input", "input_path", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="Read sentences from a file, one per line ('-' for stdin).")
@click.option("--beam", type=click.IntRange(1), default=None,
              help="Beam size; 1 is greedy [default: the manifest's search.beam_size, else 1].")
@click.option("--n-best", type=click.IntRange(1), default=1, show_default=True)
@click.option("--alpha", type=float, default=None, help="Length penalty: score = log P / L**alpha [default: 0.75].")
@click.option("--max-len", type=click.IntRange(1), default=None, help="Most target tokens [default: model limit].")
@click.option("--batch-size", type=click.IntRange(1), default=32, show_default=True)
@click.option("--scores", is_flag=True, help="Print each hypothesis's score before it, tab-separated.")
@click.option("--output", "output_path", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="Stream --input into this file ('-' for stdout), one line per input line, in order.")
@click.option("--on-long", type=click.Choice(["truncate", "skip", "error"]), default=None,
              help="With --output: a line over the model's source limit [default: truncate; skip leaves it blank].")
@click.option("--errors", "utf8_errors", type=click.Choice(["strict", "replace"]), default=None,
              help="With --output: invalid UTF-8 stops with its line number, or becomes U+FFFD [default: strict].")
@click.option("--resume", is_flag=True, help="With --output: continue an interrupted run from its .part file.")
@click.option("--quiet", is_flag=True, help="With --output: no progress bar or device notice.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="", default=None, metavar="[ADDRESS]",
              help="With --output: translate on Ray (a local one, or the cluster at ADDRESS, e.g. auto).")
@click.option("--actors", type=click.IntRange(1), default=2, show_default=True,
              help="With --ray: translator actors, each holding its own model.")
@click.option("--chunk-lines", type=click.IntRange(1), default=None,
              help="With --output: lines read, sorted, translated and saved at a time; on Ray, the unit each actor "
                   "takes [default: 10000].")
@click.option("--engine", type=click.Choice(["loop", "graph"]), default="loop", show_default=True,
              help="loop: the search in Python over the step decoder; graph: one call per batch to the fused "
                   "generate.onnx (run `s2s-deploy fuse DIR` first).")
@device_option
@threads_option
def translate_command(export_dir: str, texts: tuple[str, ...], input_path: str | None, beam: int | None,
                      n_best: int,
                      alpha: float | None, max_len: int | None, batch_size: int, scores: bool,
                      output_path: str | None, on_long: str | None, utf8_errors: str | None, resume: bool,
                      quiet: bool, ray_address: str | None, actors: int, chunk_lines: int | None, engine: str,
                      device: str, threads: int | None) -> None:
    """Translate TEXTS (or --input) with an exported model; needs no PyTorch.

    With --output, --input is streamed in chunks of 10,000 lines: memory stays flat, output
    line N belongs to input line N, and Ctrl-C leaves a part file that --resume continues.
    """
    from s2s_deploy.runtime.errors import S2SError
    from s2s_deploy.runtime.files import CHUNK_LINES, FileOptions
    from s2s_deploy.runtime.translator import Translator, check_inputs

    file_only = {"--on-long": on_long, "--errors": utf8_errors, "--resume": resume or None, "--quiet": quiet or None,
                 "--ray": ray_address, "--chunk-lines": chunk_lines}
    if output_path is not None:
        if texts or input_path is None:
            raise S2SError("--output translates --input FILE ('-' for stdin), not TEXTS")
        if n_best > 1:
            raise S2SError("--output writes one line per input line: --n-best needs output to the terminal")
        options = FileOptions(beam=beam or 1, batch_size=batch_size, max_len=max_len, alpha=alpha,
                              on_long=on_long or "truncate", errors=utf8_errors or "strict", scores=scores,
                              chunk_lines=chunk_lines or CHUNK_LINES)
        _translate_file(export_dir, input_path, output_path, options, resume, quiet, ray_address, actors, engine,
                        device, threads)
        return
    given = [name for name, value in file_only.items() if value is not None]
    if given:
        raise S2SError(f"{given[0]} needs --output")
    sentences = list(texts) + (read_lines(input_path) if input_path else [])
    if not sentences:
        raise S2SError("nothing to translate: give TEXTS or --input")
    check_inputs(sentences)
    translator = Translator(export_dir, device=device, threads=threads, engine=engine)
    translator.search_config(beam, n_best, max_len, alpha)  # reject bad options before the notice
    click.echo(translator.notice, err=True)
    for result in translator(sentences, beam, n_best, max_len, alpha, batch_size):
        for text, score in result.hypotheses:
            click.echo(f"{score:.4f}\t{text}" if scores else text)


def _translate_file(export_dir: str, input_path: str, output_path: str, options: FileOptions, resume: bool,
                    quiet: bool, ray_address: str | None, actors: int, engine: str, device: str,
                    threads: int | None) -> None:
    """translate --output: here or on Ray; the summary line always, Ctrl-C as one line and exit 130."""
    import sys
    from dataclasses import asdict

    from s2s_deploy.runtime.files import FileSummary, TranslationInterrupted, translate_file
    from s2s_deploy.runtime.translator import Translator

    progress = False if quiet else None
    summary: FileSummary
    try:
        if ray_address is not None:
            from s2s_deploy.distributed import translate_dataset

            summary = translate_dataset(export_dir, input_path, output_path, actors=actors, address=ray_address or None,
                                        resume=resume, progress=progress, device=device, threads=threads or 1,
                                        engine=engine, **asdict(options))
        else:
            translator = Translator(export_dir, device=device, threads=threads, engine=engine)
            translator.search_config(options.beam, 1, options.max_len, options.alpha)
            if not quiet:
                click.echo(translator.notice, err=True)
            summary = translate_file(translator, input_path, output_path, options, resume=resume, progress=progress)
    except TranslationInterrupted as exc:
        click.echo(str(exc), err=True)
        sys.exit(130)
    click.echo(summary.describe(), err=True)


@main.command("parity")
@click.argument("export_dir", type=click.Path())
@click.option("--input", "input_path", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="Sentences to check, one per line [default: the samples stored at export].")
@click.option("--beam", type=click.IntRange(2), default=4, show_default=True)
@click.option("--max-len", type=click.IntRange(1), default=64, show_default=True)
@click.option("--atol", type=float, default=None, help="Log-prob tolerance [default: the plugin's, from the manifest].")
@click.option("--checkpoint", type=click.Path(dir_okay=False), default=None,
              help="The PyTorch original [default: the checkpoint stored in the export].")
@click.option("--reference", "reference_dir", type=click.Path(file_okay=False), default=None,
              help="A Hugging Face model folder: compare against transformers' own model instead (needs [hf]).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--ort-format", is_flag=True, help="Check the .ort graphs instead of the .onnx ones.")
@device_option
@plugin_option
def parity_command(export_dir: str, input_path: str | None, beam: int, max_len: int, atol: float | None,
                   checkpoint: str | None, reference_dir: str | None, as_json: bool, ort_format: bool,
                   device: str, plugin_files: tuple[str, ...]) -> None:
    """Decode with PyTorch and ONNX Runtime, greedy and beam; exit 1 unless they agree."""
    import sys

    from s2s_deploy.export.parity import check_parity, torch_backend_for
    from s2s_deploy.runtime.errors import S2SError
    from s2s_deploy.runtime.manifest import load_manifest
    from s2s_deploy.runtime.ort_backend import OrtBackend

    load_plugin_files(plugin_files)
    manifest = load_manifest(export_dir)
    sources = read_lines(input_path) if input_path else list(manifest.samples)
    if not sources:
        raise S2SError(f"{export_dir} stores no sample inputs; pass --input FILE")
    if reference_dir is not None:
        from s2s_deploy.export.hf_reference import HFBackend, load_transformers_model

        if checkpoint:
            raise S2SError("--reference and --checkpoint name two originals: give one")
        reference = HFBackend(load_transformers_model(reference_dir), manifest.decoder_start_id, manifest.eos_id)
    else:
        reference = torch_backend_for(manifest, checkpoint)
    candidate = OrtBackend(manifest, device=device, graph_format="ort" if ort_format else "onnx")
    click.echo(candidate.choice.notice(), err=True)
    report = check_parity(manifest, reference, candidate, sources, beam_size=beam, max_len=max_len, atol=atol)
    if as_json:
        click.echo(json.dumps({
            "passed": report.passed, "inputs": report.inputs, "atol": report.atol,
            "min_token_agreement": report.min_token_agreement,
            "step_max_abs_diff": report.step_max_abs_diff,
            "searches": [{"mode": s.mode, "identical": s.identical, "total": s.total,
                          "agreement": s.agreement, "max_score_diff": s.max_score_diff,
                          "mismatches": [dict(zip(("source", "pytorch", "onnx"), m, strict=True))
                                         for m in s.mismatches]} for s in report.searches],
        }, indent=2, ensure_ascii=False))
    else:
        if report.atol is None:
            click.echo(f"per-step log-prob max |diff| {report.step_max_abs_diff:.2e} (quantised: informative; "
                       f"tokens must agree on >= {report.min_token_agreement:.0%} of inputs)")
        else:
            ok = "ok" if report.log_probs_ok else "FAIL"
            click.echo(f"per-step log-prob max |diff| {report.step_max_abs_diff:.2e} (atol {report.atol:g}) {ok}")
        for s in report.searches:
            verdict = "ok" if s.agreement >= report.min_token_agreement else "FAIL"
            click.echo(f"{s.mode:<8} tokens identical {s.identical}/{s.total} ({s.agreement:.1%}), "
                       f"score max |diff| {s.max_score_diff:.2e} {verdict}")
            for source, want, got in s.mismatches[:5]:
                click.echo(f"  {source!r}: pytorch {want!r} onnx {got!r}")
        click.echo("parity: PASS" if report.passed else "parity: FAIL")
    if not report.passed:
        sys.exit(1)


@main.command("evaluate")
@click.argument("export_dir", type=click.Path())
@click.option("--task", default=None, help="Task name or TSV file [default: the one the model was trained on].")
@click.option("--split", type=click.Choice(["train", "valid", "test"]), default="test", show_default=True)
@click.option("--beam", type=click.IntRange(2), default=4, show_default=True)
@click.option("--limit", type=click.IntRange(1), default=None, help="Evaluate only the first N pairs.")
@click.option("--backends", type=click.Choice(["both", "onnxruntime", "pytorch"]), default="both", show_default=True)
@device_option
@plugin_option
def evaluate_command(export_dir: str, task: str | None, split: str, beam: int, limit: int | None, backends: str,
                     device: str, plugin_files: tuple[str, ...]) -> None:
    """BLEU and exact match of an export on its task, PyTorch and ONNX Runtime side by side."""
    from s2s_deploy.runtime.manifest import load_manifest
    from s2s_deploy.runtime.ort_backend import OrtBackend
    from s2s_deploy.train.evaluate import evaluate, markdown, task_of

    load_plugin_files(plugin_files)
    manifest = load_manifest(export_dir)
    task_of(manifest, task)
    chosen = []
    if backends in ("both", "pytorch"):
        from s2s_deploy.export.parity import torch_backend_for

        chosen.append(torch_backend_for(manifest))
    if backends in ("both", "onnxruntime"):
        ort_backend = OrtBackend(manifest, device=device)
        click.echo(ort_backend.choice.notice(), err=True)
        chosen.append(ort_backend)
    click.echo(markdown(evaluate(manifest, chosen, task, split, beam, limit)))
