"""``s2s-deploy fuse``."""

from __future__ import annotations

import click

from s2s_deploy.cli.group import main


@main.command("fuse")
@click.argument("export_dir", type=click.Path())
@click.option("--greedy-only", is_flag=True, help="Fuse greedy search only (a smaller loop body, no beam inputs).")
@click.option("--options", "with_options", is_flag=True,
              help="Also carry the decoding options a Loop can: suppressed tokens, a shared prefix, forced EOS "
                   "(three more inputs; docs/generate.md).")
def fuse_command(export_dir: str, greedy_only: bool, with_options: bool) -> None:
    """Write generate.onnx: the whole search in one graph.

    The encoder, then greedy or beam search in an ONNX Loop.
    """
    from s2s_deploy.format.manifest import load_manifest
    from s2s_deploy.transforms.fuse import GENERATE_FILE, add_to_manifest, fuse_generate

    manifest = load_manifest(export_dir)
    beam = not greedy_only
    path = fuse_generate(manifest, manifest.directory / GENERATE_FILE, beam=beam, options=with_options)
    add_to_manifest(manifest, path, beam=beam, options=with_options)
    click.echo(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB, {'beam' if beam else 'greedy'} search); "
               f"checked: onnx checker (full), default-domain ops only; manifest graphs.generate updated")
