"""``s2s-deploy caption``: image files in, one line of text each out."""

from __future__ import annotations

import click

from s2s_deploy.cli.group import decoding_options, device_option, main, threads_option
from s2s_deploy.cli.media import decode_files


@main.command("caption")
@click.argument("export_dir", type=click.Path())
@click.argument("images", nargs=-1, required=True, type=click.Path())
@click.option("--batch-size", type=click.IntRange(1), default=16, show_default=True, help="Files decoded together.")
@click.option("--scores", is_flag=True, help="Print each hypothesis's score before it, tab-separated.")
@click.option("--output", "output_path", type=click.Path(dir_okay=False), default=None,
              help="Write out.txt (one line per file) or out.json (file, text, score, language, hypotheses) instead.")
@click.option("--quiet", is_flag=True, help="No device notice.")
@decoding_options
@device_option
@threads_option
def caption_command(export_dir: str, images: tuple[str, ...], batch_size: int, scores: bool,
                    output_path: str | None, quiet: bool, device: str, threads: int | None,
                    **decoding: object) -> None:
    """Caption images, or read the text in them (OCR).

    IMAGES: PNG, JPEG or any file Pillow reads (grey, palette and transparent images become RGB,
    transparency on white), at any size (resized as the model's image processor does). One line
    per file, in order; no PyTorch needed.
    """
    from s2s_deploy.runtime.captioner import Captioner

    decode_files(Captioner, export_dir, images, "image", batch_size, scores, output_path, quiet, device, threads,
                 decoding)
