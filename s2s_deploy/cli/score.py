"""``s2s-deploy score``: the log-prob of given translations."""

from __future__ import annotations

import click

from s2s_deploy.cli.group import device_option, echo_device, main, read_lines, threads_option


@main.command("score")
@click.argument("export_dir", type=click.Path())
@click.option("--source", "source_path", type=click.Path(dir_okay=False, allow_dash=True), required=True,
              help="Source sentences, one per line.")
@click.option("--target", "target_path", type=click.Path(dir_okay=False, allow_dash=True), required=True,
              help="Target sentences, line N the translation of source line N.")
@click.option("--tokens", "per_token", is_flag=True, help="Also print each token's log-prob (EOS last).")
@click.option("--batch-size", type=click.IntRange(1), default=32, show_default=True,
              help="Pairs scored together.")
@device_option
@threads_option
def score_command(export_dir: str, source_path: str, target_path: str, per_token: bool, batch_size: int,
                  device: str, threads: int | None) -> None:
    """Score given translations: log-prob of each target.

    Teacher-forced through the step decoder: one line per pair, the total, then (with --tokens)
    each token's, tab-separated."""
    from s2s_deploy.errors import S2SError
    from s2s_deploy.runtime.translator import Translator

    sources, targets = read_lines(source_path), read_lines(target_path)
    if len(sources) != len(targets):
        raise S2SError(f"{source_path} has {len(sources)} non-empty lines but {target_path} has {len(targets)}")
    translator = Translator(export_dir, device=device, threads=threads)
    echo_device(translator.notice, translator.provider)  # a CPU-only run prints nothing extra
    for scored in translator.score(sources, targets, batch_size):
        values = "\t" + " ".join(f"{v:.4f}" for v in scored.token_log_probs) if per_token else ""
        click.echo(f"{scored.log_prob:.4f}{values}")
