"""``s2s-deploy evaluate``: BLEU and exact match of an export on its task."""

from __future__ import annotations

import click

from s2s_deploy.cli.extras import require
from s2s_deploy.cli.group import device_option, echo_device, load_plugin_files, main, plugin_option


@main.command("evaluate")
@click.argument("export_dir", type=click.Path())
@click.option("--task", default=None, help="Task name or TSV file [default: the one the model was trained on].")
@click.option("--split", "splits", type=click.Choice(["train", "valid", "test", "ood"]), multiple=True,
              default=("test", "ood"), show_default=True,
              help="Split to score (repeatable); ood holds years and numbers never trained on (built-in tasks).")
@click.option("--beam", type=click.IntRange(2), default=4, show_default=True,
              help="Beam size of the beam rows (greedy is always scored too).")
@click.option("--limit", type=click.IntRange(1), default=None, help="Evaluate only the first N pairs.")
@click.option("--backends", type=click.Choice(["both", "onnxruntime", "pytorch"]), default="both", show_default=True,
              help="Which backends to score (pytorch needs the checkpoint in the export).")
@device_option
@plugin_option
def evaluate_command(export_dir: str, task: str | None, splits: tuple[str, ...], beam: int, limit: int | None,
                     backends: str, device: str, plugin_files: tuple[str, ...]) -> None:
    """Score an export on its task: BLEU and exact match.

    PyTorch and ONNX Runtime side by side, greedy and beam.
    """
    require("evaluate", "eval", *(("export",) if backends != "onnxruntime" else ()))
    from s2s_deploy.errors import S2SError
    from s2s_deploy.format.manifest import load_manifest
    from s2s_deploy.runtime.ort.backend import OrtBackend
    from s2s_deploy.train.evaluate import evaluate, markdown, task_of
    from s2s_deploy.train.speech_data import SPEECH_TASK, dataset_folder
    from s2s_deploy.train.tasks import load_task

    load_plugin_files(plugin_files)
    manifest = load_manifest(export_dir)
    speech = dataset_folder(task_of(manifest, task)[0])
    trained_on = manifest.training.get("task")
    # a speech model records its dataset by folder name (train writes speech:NAME)
    named = f"{SPEECH_TASK}{speech.name}" if speech is not None else task
    if task and trained_on and named != trained_on:
        click.echo(f"warning: {export_dir} was trained on {trained_on}, not {task}: expect low scores", err=True)
    chosen = []
    if backends in ("both", "pytorch"):
        from s2s_deploy.modeling.torch_backend import torch_backend_for

        chosen.append(torch_backend_for(manifest))
    if backends in ("both", "onnxruntime"):
        ort_backend = OrtBackend(manifest, device=device)
        echo_device(ort_backend.choice.notice(), ort_backend.choice.provider)
        chosen.append(ort_backend)
    rows = []
    for split in splits:
        if split == "ood" and (speech is not None or not load_task(*task_of(manifest, task)).ood):
            if len(splits) > 1:
                continue  # a user's TSV task has no held-out split; score what it has
            raise S2SError("this task has no ood split (only the built-in tasks do)")
        rows += evaluate(manifest, chosen, task, split, beam, limit, progress=True)  # a bar with an ETA
    click.echo(markdown(rows))
