"""``s2s-deploy export``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import click

from s2s_deploy.cli.extras import require
from s2s_deploy.cli.group import load_plugin_files, main, plugin_option


@main.command("export")
@click.option("--arch", default=None, help="Registered architecture name (see `s2s-deploy list`).")
@click.option("--checkpoint", type=click.Path(), default=None,
              help="A .safetensors checkpoint, or a local Hugging Face model folder; default: the bundled one.")
@click.option("--hf", "hf_dir", type=click.Path(file_okay=False), default=None,
              help="A local Hugging Face model folder; the architecture comes from its config.json.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Output folder [default: exported/<arch>].")
@click.option("--no-checkpoint", "no_checkpoint", is_flag=True,
              help="Leave the PyTorch checkpoint out of the folder: only what a deployment loads (parity then needs "
              "--checkpoint).")
@click.option("--preset", default=None,
              help="Config preset: seeded random weights of it instead of the bundled checkpoint.")
@click.option("--exporter", type=click.Choice(["dynamo", "torchscript"]), default=None,
              help="torch.onnx exporter [default: the plugin's choice].")
@click.option("--opset", type=click.IntRange(17, 23), default=18, show_default=True, help="ONNX opset version.")
@click.option("--with-attention", is_flag=True, help="Add the cross-attention weights as a decoder output.")
@click.option("--word-timestamps", is_flag=True,
              help="Add the cross-attention of the model's alignment heads as a decoder output, for transcribe "
                   "--word-timestamps (with --hf: Whisper's generation_config.json alignment_heads, else the last "
                   "half of its decoder layers).")
@click.option("--multi-step", is_flag=True,
              help="Add the k-position decoder step (decoder_multi.onnx) that translate --speculative K verifies "
                   "drafts with (models whose plugin declares multi_step: the Transformer and the BART-style "
                   "Hugging Face families).")
@click.option("--optimize", is_flag=True, help="Store the graphs already optimised by ONNX Runtime (extended level).")
@click.option("--ort-format", is_flag=True, help="Also write .ort files for ONNX Runtime mobile/minimal builds.")
@click.option("--force", is_flag=True, help="Replace an existing output folder.")
@plugin_option
def export_command(arch: str | None, checkpoint: str | None, hf_dir: str | None, out_dir: str | None,
                   preset: str | None, exporter: str | None, opset: int, with_attention: bool, word_timestamps: bool,
                   multi_step: bool, optimize: bool, ort_format: bool, force: bool, no_checkpoint: bool,
                   plugin_files: tuple[str, ...]) -> None:
    """Export a model to ONNX and validate it.

    Writes an encoder graph and a step-wise decoder graph, then checks them against PyTorch.
    Exporting the same checkpoint with the same options over an earlier export says it is up to date.
    """
    require("export", "export")
    from s2s_deploy.architecture.registry import get_plugin
    from s2s_deploy.errors import S2SError
    from s2s_deploy.export.exporter import export_model
    from s2s_deploy.export.sources import load_source
    from s2s_deploy.format.files import check_replaceable, remove_leftovers
    from s2s_deploy.format.manifest import sha256_of

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
    if force or not destination.exists() or destination.is_symlink():  # an existing one may be up to date
        check_replaceable(destination, force)
    if preset and checkpoint:
        raise S2SError("--preset applies only without --checkpoint (a checkpoint carries its config)")
    remove_leftovers(Path(tempfile.gettempdir()), "s2s-export-")  # scratch of killed runs
    with tempfile.TemporaryDirectory(prefix=f"s2s-export-{os.getpid()}-") as scratch:
        source = load_source(plugin, checkpoint, preset, Path(scratch))
        if word_timestamps and not source.alignment_heads:
            raise S2SError(f"--word-timestamps: {source.description} names no alignment heads (an --hf export of a "
                           "family that has them, such as Whisper, does)")
        heads = source.alignment_heads if word_timestamps else ()
        if destination.exists() and not force:
            wanted = {"plugin": f"{plugin.name} v{plugin.version}",
                      "checkpoint sha256": sha256_of(source.checkpoint_path),
                      "exporter": exporter or plugin.exporter, "opset": opset, "with-attention": with_attention,
                      "word-timestamps": word_timestamps, "multi-step": multi_step, "optimize": optimize,
                      "ort-format": ort_format,
                      "checkpoint included": not no_checkpoint}
            difference = _difference(destination, wanted, source.checkpoint_path)
            if difference is None:
                click.echo(f"{destination} is up to date: same {plugin.name} export of the same checkpoint "
                           f"(sha256 {wanted['checkpoint sha256'][:12]}) and options; nothing to do")
                return
            raise S2SError(f"{destination} already exists and holds another export ({difference}); "
                           "pass --force to replace it")
        click.echo(f"exporting {plugin.name} v{plugin.version} from {source.description}", err=True)
        report = export_model(
            plugin, source.model, source.config, source.src_vocab, source.tgt_vocab, destination,
            checkpoint_path=source.checkpoint_path, source=source.description, samples=source.samples,
            training=source.info, search=source.search,
            exporter=exporter, opset=opset, with_attention=with_attention, alignment_heads=heads, multi_step=multi_step,
            optimize=optimize,
            ort_format=ort_format, force=force, include_checkpoint=not no_checkpoint,
        )
    worst = max(report.max_abs_diff.items(), key=lambda item: item[1])
    sizes = ", ".join(f"{name} {size / 1e6:.2f} MB" for name, size in report.graph_bytes.items())
    click.echo(f"wrote {report.directory}/ ({sizes}; exporter {report.exporter})")
    click.echo(f"checked: onnx checker, shape inference, ONNX Runtime vs PyTorch max |diff| {worst[1]:.2e} "
               f"({worst[0]}; atol {plugin.parity_atol:g})")


def _difference(folder: Path, wanted: dict[str, object], checkpoint_path: Path) -> str | None:
    """What differs between the export in ``folder`` and the one asked for; None when nothing does.
    A folder that is not a valid, intact export differs in every way. A checkpoint copy whose
    bytes differ from ``checkpoint_path``'s but whose content does not (seeded random weights,
    saved again) is the same checkpoint."""
    from s2s_deploy.errors import S2SError
    from s2s_deploy.format.manifest import load_manifest
    from s2s_deploy.modeling.checkpoint import content_digest

    try:
        manifest = load_manifest(folder)
        checkpoint = manifest.checkpoint
        if checkpoint is None:
            return "it records no checkpoint"
        if checkpoint.included and manifest.verify()[checkpoint.file] != "ok":
            return "its checkpoint copy is missing or modified"
        found = {"checkpoint included": checkpoint.included, "plugin": f"{manifest.plugin} v{manifest.plugin_version}",
                 "checkpoint sha256": checkpoint.sha256, "exporter": manifest.exporter,
                 "opset": manifest.opset,
                 "with-attention": manifest.has_attention_output and not manifest.alignment_heads,
                 "word-timestamps": bool(manifest.alignment_heads), "multi-step": manifest.decoder_multi is not None,
                 "optimize": manifest.ort_optimized, "ort-format": manifest.encoder.ort_file is not None}
        if (checkpoint.included and checkpoint.sha256 != wanted["checkpoint sha256"]
                and content_digest(folder / checkpoint.file) == content_digest(checkpoint_path)):
            found["checkpoint sha256"] = wanted["checkpoint sha256"]
    except S2SError as exc:
        return f"not a valid export: {exc}"
    for key, value in wanted.items():
        if found[key] != value:
            return f"{key} {found[key]}, not {value}"
    return None


@main.command("inspect")
@click.argument("export_dir", type=click.Path())
@click.option("--verify", is_flag=True, help="Re-hash every file the manifest lists and report each; exit 1 on any "
              "missing or modified file.")
def inspect_command(export_dir: str, verify: bool) -> None:
    """Show what an export folder holds.

    Inputs, outputs, opset, node and parameter counts, and sizes of each graph.
    """
    from s2s_deploy.errors import S2SError
    from s2s_deploy.format.manifest import load_manifest
    from s2s_deploy.transforms.inspect import deployable_files, shared_parameter_bytes, startable_providers, summarise

    if verify:
        found = load_manifest(export_dir, verify_hashes=False).verify()
        for name, status in found.items():
            click.echo(f"{status:<12} {name}")
        bad = [f"{name} {status}" for name, status in found.items() if status in ("missing", "modified")]
        if bad:
            raise S2SError(f"{len(bad)} of {len(found)} listed files do not match the manifest: {', '.join(bad)}")
        return
    manifest = load_manifest(export_dir)
    click.echo(f"{manifest.directory}: {manifest.plugin} v{manifest.plugin_version}, "
               f"exporter {manifest.exporter}, source: {manifest.source}")
    for g in summarise(manifest):
        click.echo(f"\n{g.role} ({g.file}): opset {g.opset}, {g.nodes} nodes, {g.parameters:,} parameters")
        click.echo(f"  file {g.file_bytes / 1e6:.2f} MB = {g.size_ratio:.3f} x parameter bytes "
                   f"({g.parameter_bytes / 1e6:.2f} MB)")
        click.echo("  ops: " + ", ".join(f"{op} {n}" for op, n in g.top_ops))
        for name in g.inputs:
            click.echo(f"  in   {name}")
        for name in g.outputs:
            click.echo(f"  out  {name}")
    stored_once = any(graph.external_data for graph in (manifest.encoder, manifest.decoder))
    click.echo(f"\nweights both graphs use: {shared_parameter_bytes(manifest) / 1e6:.2f} MB, "
               f"{'stored once (external data)' if stored_once else 'stored in each graph'}")
    files = deployable_files(manifest)
    click.echo(f"deployable: {sum(files.values()) / 1e6:.2f} MB in {len(files)} files ("
               + ", ".join(f"{name} {size / 1e6:.2f} MB" for name, size in files.items()) + ")")
    works, fails = startable_providers(manifest)
    failing = f" (installed but cannot start here: {', '.join(fails)})" if fails else ""
    click.echo(f"execution providers that start here: {', '.join(works)}{failing}")
