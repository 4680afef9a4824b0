"""``s2s-deploy caption``: image files in, one line of text each out."""

from __future__ import annotations

import click

from s2s_deploy.cli.group import main
from s2s_deploy.cli.media import decode_files, file_options
from s2s_deploy.frontends.media import IMAGE


@main.command("caption")
@click.argument("export_dir", type=click.Path())
@click.argument("images", nargs=-1, required=True, type=click.Path())
@file_options(IMAGE)
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
