"""``s2s-deploy train``."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from s2s_deploy.cli.extras import require
from s2s_deploy.cli.group import load_plugin_files, main, plugin_option


@main.command("train")
@click.option("--arch", required=True, help="Registered architecture name (see `s2s-deploy list`).")
@click.option("--task", default="en-fr", show_default=True,
              help="Built-in task (en-fr, en-zh), a source<TAB>target file, a folder with train/valid/test.tsv, or "
                   "speech:DIR, a speech dataset (python -m s2s_deploy.train.speech_data DIR).")
@click.option("--preset", default=None, help="Model config preset [default: the plugin's]; not with --resume.")
@click.option("--epochs", type=click.IntRange(min=1), default=20, show_default=True,
              help="Total epochs (a resumed run continues up to this many).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds the task split, init and batches.")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=1e-3, show_default=True,
              help="Peak Adam learning rate.")
@click.option("--batch-size", type=click.IntRange(min=1), default=128, show_default=True,
              help="Sentence pairs per training step.")
@click.option("--warmup", "warmup_steps", type=click.IntRange(min=0), default=300, show_default=True,
              help="Linear warmup steps before cosine decay.")
@click.option("--clip", "clip_norm", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="Gradient norm clipping threshold.")
@click.option("--level", type=click.Choice(["char", "word"]), default="char", show_default=True,
              help="Tokenisation of new vocabularies.")
@click.option("--max-train", type=click.IntRange(min=1), default=None, help="Use only the first N training pairs.")
@click.option("--max-valid", type=click.IntRange(min=1), default=None,
              help="Validate on only the first N valid pairs.")
@click.option("--train-size", type=click.IntRange(min=1), default=None,
              help="Pairs the built-in task generates for training [default: 20000].")
@click.option("--patience", type=click.IntRange(min=1), default=None,
              help="Stop after this many epochs without a better valid exact match.")
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True,
              help="torch CPU threads (results depend on it).")
@click.option("--device", default="cpu", show_default=True, help="torch device, e.g. cpu or cuda.")
@click.option("--resume", type=click.Path(dir_okay=False), default=None,
              help="Continue from a checkpoint (and its .train-state, when present).")
@click.option("--init", type=click.Path(dir_okay=False), default=None,
              help="speech:DIR only: start from this checkpoint's weights (same architecture and vocabularies) "
                   "with the preset's config and a fresh schedule.")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Best checkpoint path [default: runs/<arch>-<task>.safetensors].")
@click.option("--no-progress", is_flag=True, help="No progress bar (none either when stderr is no terminal).")
@plugin_option
def train_command(arch: str, task: str, preset: str | None, epochs: int, seed: int, lr: float, batch_size: int,
                  warmup_steps: int, clip_norm: float, level: str, max_train: int | None, max_valid: int | None,
                  train_size: int | None, patience: int | None,
                  threads: int, device: str, resume: str | None, init: str | None, out: str | None,
                  no_progress: bool,
                  plugin_files: tuple[str, ...]) -> None:
    """Train a model on a task.

    Teacher forcing; keeps the checkpoint with the best valid exact match.
    """
    require("train", "export", "eval", bundle="train")
    from s2s_deploy.architecture.registry import get_plugin
    from s2s_deploy.errors import S2SError
    from s2s_deploy.train.speech import train_speech
    from s2s_deploy.train.speech_data import dataset_folder
    from s2s_deploy.train.tasks import SplitSizes, load_task
    from s2s_deploy.train.trainer import TrainConfig, train

    load_plugin_files(plugin_files)
    plugin = get_plugin(arch)
    if preset and resume:
        raise S2SError("--preset applies only without --resume (the checkpoint carries its config)")
    preset_name = None if resume else (preset or plugin.default_preset)
    config = plugin.preset(preset_name) if preset_name else None
    cfg = TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, warmup_steps=warmup_steps, clip_norm=clip_norm,
                      seed=seed, threads=threads, level=level, max_train=max_train, max_valid=max_valid,
                      device=device, patience=patience)
    destination = Path(out or Path("runs") / f"{arch}-{Path(task.removeprefix('speech:')).stem}.safetensors")
    args = ["s2s-deploy", "train", "--arch", arch, "--task", task]
    args += ["--preset", preset_name] if preset_name else ["--resume", str(resume)]
    args += ["--epochs", str(epochs), "--seed", str(seed), "--lr", repr(lr), "--batch-size", str(batch_size),
             "--warmup", str(warmup_steps), "--clip", repr(clip_norm), "--level", level,
             "--threads", str(threads), "--device", device]
    args += ["--max-train", str(max_train)] if max_train else []
    args += ["--max-valid", str(max_valid)] if max_valid else []
    args += ["--train-size", str(train_size)] if train_size else []
    args += ["--patience", str(patience)] if patience else []
    args += ["--init", str(init)] if init else []
    args += [arg for path in plugin_files for arg in ("--plugin", path)]
    args += ["--out", str(destination)]
    info = {"command": shlex.join(args), "preset": preset_name, "resumed_from": resume}
    speech = dataset_folder(task)
    if speech is not None:
        if resume or train_size:
            raise S2SError("a speech dataset trains from scratch on the utterances it holds: no --resume or "
                           "--train-size")
        result = train_speech(plugin, config, speech, cfg, destination, info=info, init=init,
                              log=lambda line: click.echo(line, err=True))
        click.echo(f"wrote {result.checkpoint} (epoch {result.best_epoch}: valid {result.best.summary()})")
        if result.test is not None:
            click.echo(f"test (held-out voices): {result.test.summary()}")
        return
    if init:
        raise S2SError("--init starts a speech dataset's run from a checkpoint; a text task does that with --resume")
    splits = load_task(task, seed, SplitSizes(train=train_size)) if train_size else load_task(task, seed)
    bar = not no_progress and sys.stderr.isatty()  # a bar in a log file is litter
    if resume:  # a fine-tune is reproducible from the checkpoint it started from, and that one's recipe
        from s2s_deploy.format.manifest import sha256_of
        from s2s_deploy.modeling.checkpoint import load_checkpoint

        started = load_checkpoint(resume).info
        info |= {"resumed_sha256": sha256_of(Path(resume)), "resumed_command": started.get("command"),
                 "resumed_info": {k: v for k, v in started.items() if k not in ("history", "samples")}}
    result = train(plugin, config, splits, cfg, destination, resume=resume, info=info, progress=bar,
                   log=lambda line: click.echo(line, err=True))
    click.echo(f"wrote {result.checkpoint} (epoch {result.best_epoch}: valid {result.best.summary()})")
    if result.test is not None:
        click.echo(f"test: {result.test.summary()}")
