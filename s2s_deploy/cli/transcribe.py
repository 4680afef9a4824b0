"""``s2s-deploy transcribe``: audio files in, one line of text each out."""

from __future__ import annotations

import click

from s2s_deploy.cli.group import decoding_options, device_option, main, threads_option
from s2s_deploy.cli.media import decode_files


@main.command("transcribe")
@click.argument("export_dir", type=click.Path())
@click.argument("audio", nargs=-1, required=True, type=click.Path())
@click.option("--batch-size", type=click.IntRange(1), default=16, show_default=True, help="Files decoded together.")
@click.option("--scores", is_flag=True, help="Print each hypothesis's score before it, tab-separated.")
@click.option("--output", "output_path", type=click.Path(dir_okay=False), default=None,
              help="Write out.txt (one line per file) or out.json (file, text, score, language, hypotheses) instead.")
@click.option("--quiet", is_flag=True, help="No device notice.")
@decoding_options
@device_option
@threads_option
def transcribe_command(export_dir: str, audio: tuple[str, ...], batch_size: int, scores: bool,
                       output_path: str | None, quiet: bool, device: str, threads: int | None,
                       **decoding: object) -> None:
    """Transcribe audio files with an export that reads audio.

    The export names the task (transcription or speech translation) and the front end.

    AUDIO: WAV, FLAC, OGG or any file soundfile reads, at any sampling rate (resampled to the
    model's). One line per file, in order; no PyTorch needed.
    """
    from s2s_deploy.runtime.transcriber import Transcriber

    decode_files(Transcriber, export_dir, audio, "audio", batch_size, scores, output_path, quiet, device, threads,
                 decoding)
