"""``s2s-deploy export``."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from s2s_deploy.cli import load_plugin_files, main, plugin_option


@main.command("export")
@click.option("--arch", default=None, help="Registered architecture name (see `s2s-deploy list`).")
@click.option("--checkpoint", type=click.Path(), default=None,
              help="A .safetensors checkpoint, or a local Hugging Face model folder; default: the bundled one.")
@click.option("--hf", "hf_dir", type=click.Path(file_okay=False), default=None,
              help="A local Hugging Face model folder; the architecture comes from its config.json.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Output folder [default: exported/<arch>].")
@click.option("--preset", default=None, help="Config preset, only for seeded random weights (no checkpoint).")
@click.option("--exporter", type=click.Choice(["dynamo", "torchscript"]), default=None,
              help="torch.onnx exporter [default: the plugin's choice].")
@click.option("--opset", type=click.IntRange(17, 23), default=18, show_default=True)
@click.option("--with-attention", is_flag=True, help="Add the cross-attention weights as a decoder output.")
@click.option("--optimize", is_flag=True, help="Store the graphs already optimised by ONNX Runtime (extended level).")
@click.option("--ort-format", is_flag=True, help="Also write .ort files for ONNX Runtime mobile/minimal builds.")
@click.option("--force", is_flag=True, help="Replace an existing output folder.")
@plugin_option
def export_command(arch: str | None, checkpoint: str | None, hf_dir: str | None, out_dir: str | None,
                   preset: str | None, exporter: str | None, opset: int, with_attention: bool, optimize: bool,
                   ort_format: bool,
                   force: bool, plugin_files: tuple[str, ...]) -> None:
    """Export an encoder graph and a step-wise decoder graph, then validate them against PyTorch."""
    from s2s_deploy.export.exporter import export_model
    from s2s_deploy.export.registry import get_plugin
    from s2s_deploy.export.sources import load_source
    from s2s_deploy.runtime.errors import S2SError

    load_plugin_files(plugin_files)
    if hf_dir is not None:
        from s2s_deploy.export.hf import plugin_for, read_config

        if checkpoint:
            raise S2SError("--hf DIR is the checkpoint: give --hf or --checkpoint, not both")
        found = plugin_for(read_config(hf_dir))
        if arch and arch != found.name:
            raise S2SError(f"{hf_dir} holds a {found.name} model, not {arch}")
        arch, checkpoint = found.name, hf_dir
    if arch is None:
        raise S2SError("give --arch NAME or --hf DIR")
    plugin = get_plugin(arch)
    destination = Path(out_dir or Path("exported") / arch)
    if destination.exists() and not force:
        raise S2SError(f"{destination} already exists; pass --force to replace it")
    if preset and checkpoint:
        raise S2SError("--preset applies only without --checkpoint (a checkpoint carries its config)")
    with tempfile.TemporaryDirectory(prefix="s2s-export-") as scratch:
        source = load_source(plugin, checkpoint, preset, Path(scratch))
        click.echo(f"exporting {plugin.name} v{plugin.version} from {source.description}", err=True)
        report = export_model(
            plugin, source.model, source.config, source.src_vocab, source.tgt_vocab, destination,
            checkpoint_path=source.checkpoint_path, source=source.description, samples=source.samples,
            training=source.info, search=source.search,
            exporter=exporter, opset=opset, with_attention=with_attention, optimize=optimize,
            ort_format=ort_format, force=force,
        )
    worst = max(report.max_abs_diff.items(), key=lambda item: item[1])
    sizes = ", ".join(f"{name} {size / 1e6:.2f} MB" for name, size in report.graph_bytes.items())
    click.echo(f"wrote {report.directory}/ ({sizes}; exporter {report.exporter})")
    click.echo(f"checked: onnx checker, shape inference, ONNX Runtime vs PyTorch max |diff| {worst[1]:.2e} "
               f"({worst[0]}; atol {plugin.parity_atol:g})")


@main.command("inspect")
@click.argument("export_dir", type=click.Path())
def inspect_command(export_dir: str) -> None:
    """Inputs, outputs, opset, node and parameter counts, and sizes of each graph."""
    import onnxruntime

    from s2s_deploy.runtime.inspect import shared_parameter_bytes, summarise
    from s2s_deploy.runtime.manifest import load_manifest

    manifest = load_manifest(export_dir)
    click.echo(f"{manifest.directory}: {manifest.plugin} v{manifest.plugin_version}, "
               f"exporter {manifest.raw['exporter']}, source: {manifest.raw['source']}")
    for g in summarise(manifest):
        click.echo(f"\n{g.role} ({g.file}): opset {g.opset}, {g.nodes} nodes, {g.parameters:,} parameters")
        click.echo(f"  file {g.file_bytes / 1e6:.2f} MB = {g.size_ratio:.3f} x parameter bytes "
                   f"({g.parameter_bytes / 1e6:.2f} MB)")
        click.echo("  ops: " + ", ".join(f"{op} {n}" for op, n in g.top_ops))
        for name in g.inputs:
            click.echo(f"  in   {name}")
        for name in g.outputs:
            click.echo(f"  out  {name}")
    click.echo(f"\nweights stored in both graphs: {shared_parameter_bytes(manifest) / 1e6:.2f} MB")
    click.echo(f"execution providers in this onnxruntime build: {', '.join(onnxruntime.get_available_providers())}")
