"""``s2s-deploy transcribe``: audio files in, one line of text each out."""

from __future__ import annotations

import click

from s2s_deploy.cli.group import main
from s2s_deploy.cli.media import decode_files, file_options
from s2s_deploy.frontends.media import AUDIO


@main.command("transcribe")
@click.argument("export_dir", type=click.Path())
@click.argument("audio", nargs=-1, required=True, type=click.Path())
@file_options(AUDIO)
@click.option("--max-duration", type=click.FloatRange(0, min_open=True), default=None,
              help="Refuse a file longer than this many seconds, judged from its header before it is decoded "
                   "[default: no limit; memory holds 32 KB of features per second at 80 mels].")
def transcribe_command(export_dir: str, audio: tuple[str, ...], batch_size: int, scores: bool,
                       output_path: str | None, quiet: bool, device: str, threads: int | None,
                       max_duration: float | None, **decoding: object) -> None:
    """Transcribe audio files with an export that reads audio.

    The export names the task (transcription or speech translation) and the front end.

    AUDIO: WAV, FLAC, OGG or any file soundfile reads, at any sampling rate (resampled to the
    model's). One line per file, in order; no PyTorch needed.
    """
    from s2s_deploy.runtime.transcriber import Transcriber

    decode_files(Transcriber, export_dir, audio, "audio", batch_size, scores, output_path, quiet, device, threads,
                 decoding, {"max_duration": max_duration})
