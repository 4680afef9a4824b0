"""``s2s-deploy quantize``."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

import click

from s2s_deploy.cli.extras import install_hint
from s2s_deploy.cli.group import main

# Largest exact-match loss (percentage points) we call acceptable for a quantised model.
MAX_EXACT_MATCH_DROP = 2.0


@main.command("quantize")
@click.argument("export_dir", type=click.Path())
@click.option("--int8", "kind", flag_value="int8", help="Dynamic int8 quantisation of MatMul/Gemm weights (CPU).")
@click.option("--int4", "kind", flag_value="int4", help="4-bit weight-only MatMulNBits (CPU; opt-in, never exact: "
              "docs/performance.md has its accuracy cost).")
@click.option("--int4-block-size", "block_size", type=click.Choice(["16", "32", "64", "128"]), default=None,
              help="With --int4: weights per block, each with its own scale [default: 32].")
@click.option("--int4-accuracy-level", "accuracy_level", type=click.IntRange(0, 4), default=None,
              help="With --int4: MatMulNBits' accuracy_level (4: int8 activations per block; 1: fp32) "
              "[default: 4].")
@click.option("--fp16", "kind", flag_value="fp16", help="float16 weights and compute, I/O and softmax/norms kept fp32 "
              "(for CUDA).")
@click.option("--int8-activations", "activations", type=click.Choice(["per-row", "per-tensor"]), default=None,
              help="With --int8: activation scales; per-row keeps a sentence's output independent of its "
              "batchmates; per-tensor is ONNX Runtime's default, batch-dependent [default: per-row].")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Output folder [default: EXPORT_DIR-int8, -int4 or -fp16].")
@click.option("--force", is_flag=True, help="Replace an existing output folder.")
@click.option("--limit", type=click.IntRange(1), default=None, help="Evaluate on the first N test pairs only.")
@click.option("--task", default=None,
              help="Task to evaluate on [default: the one recorded]; speech:DIR for a speech dataset folder.")
@click.option("--no-evaluate", is_flag=True, help="Skip the before/after BLEU and exact-match comparison.")
def quantize_command(export_dir: str, kind: str | None, block_size: str | None, accuracy_level: int | None,
                     activations: str | None, out_dir: str | None, force: bool, limit: int | None, task: str | None,
                     no_evaluate: bool) -> None:
    """Write an int8, int4 or fp16 copy of an export.

    Reports sizes and task accuracy before and after.
    """
    from s2s_deploy.errors import S2SError
    from s2s_deploy.format.manifest import load_manifest
    from s2s_deploy.transforms.quantize import Int4Config, quantize_export

    if kind is None:
        raise S2SError("choose --int8, --int4 or --fp16")
    if activations is not None and kind != "int8":
        raise S2SError("--int8-activations applies to --int8 only")
    if (block_size is not None or accuracy_level is not None) and kind != "int4":
        raise S2SError("--int4-block-size and --int4-accuracy-level apply to --int4 only")
    defaults = Int4Config()
    int4 = Int4Config(int(block_size) if block_size else defaults.block_size,
                      defaults.accuracy_level if accuracy_level is None else accuracy_level)
    if limit is not None and no_evaluate:
        raise S2SError("--limit sets how many pairs the comparison evaluates: not with --no-evaluate")
    activations = activations or "per-row"
    manifest = load_manifest(export_dir)
    destination = Path(out_dir) if out_dir else manifest.directory.with_name(f"{manifest.directory.name}-{kind}")
    source = manifest.directory.resolve()
    if destination.resolve() == source or source in destination.resolve().parents:
        raise S2SError(f"--out {destination} is the export being quantised (or inside it); choose another folder")
    report = quantize_export(manifest, kind, destination, force, activations, int4)
    click.echo(f"wrote {report.directory}/ ({kind})")
    for name in dict.fromkeys([*report.bytes_before, *report.bytes_after]):
        before, after = report.bytes_before.get(name, 0), report.bytes_after.get(name, 0)
        click.echo(f"  {name}: {before / 1e6:.2f} MB -> {after / 1e6:.2f} MB")
    total_before, total_after = sum(report.bytes_before.values()), sum(report.bytes_after.values())
    click.echo(f"  deployable: {total_before / 1e6:.2f} MB -> {total_after / 1e6:.2f} MB "
               f"({total_after / total_before:.0%})")
    for line in (report.generate, report.multi_step):
        if line:
            click.echo(f"  {line}")
    task = task or manifest.training.get("task")
    if no_evaluate or not task:
        if not no_evaluate:
            click.echo("no training task recorded: skipping the accuracy comparison (use `s2s-deploy evaluate`)")
        return
    if find_spec("sacrebleu") is None:
        click.echo(f"the accuracy comparison needs the eval extra: {install_hint('eval')}; skipped")
        return
    from s2s_deploy.train.speech_data import SPEECH_TASK, dataset_folder

    if task.startswith(SPEECH_TASK):
        try:
            dataset_folder(task)
        except S2SError:  # the dataset a speech model trained on stays on the machine that made it
            click.echo(f"the accuracy comparison needs the speech dataset {task[len(SPEECH_TASK):]!r} here (pass "
                       "--task speech:DIR); skipped")
            return
    _compare_accuracy(manifest, load_manifest(destination), limit, kind, task)


def _compare_accuracy(original, quantised, limit: int | None, kind: str, task: str) -> None:
    from s2s_deploy.runtime.ort.backend import OrtBackend
    from s2s_deploy.train.evaluate import evaluate

    device = "cuda" if kind == "fp16" else "cpu"
    rows = {}
    for label, manifest in (("fp32", original), (kind, quantised)):
        backend = OrtBackend(manifest, device="auto" if device == "cuda" else "cpu")
        for row in evaluate(manifest, [backend], task, limit=limit):
            rows[(label, row.mode)] = row
    click.echo("| model | search | BLEU | exact match | seconds |\n|---|---|---|---|---|")
    for (label, mode), row in rows.items():
        click.echo(f"| {label} | {mode} | {row.scores.bleu:.2f} | {100 * row.scores.exact_match:.1f}% | "
                   f"{row.seconds:.1f} |")
    for mode in {m for _, m in rows}:
        drop = 100 * (rows[("fp32", mode)].scores.exact_match - rows[(kind, mode)].scores.exact_match)
        if round(drop, 6) > MAX_EXACT_MATCH_DROP:
            click.echo(f"WARNING: {kind} loses {drop:.1f} points of exact match ({mode}), more than the "
                       f"{MAX_EXACT_MATCH_DROP:g} we accept: prefer the fp32 export for this model")
