"""``s2s-deploy attention``: heatmaps of what an exported model attends to."""

from __future__ import annotations

import click

from s2s_deploy.cli.extras import missing_extras, require
from s2s_deploy.cli.group import device_option, echo_device, load_plugin_files, main, plugin_option


@main.command("attention")
@click.argument("export_dir", type=click.Path())
@click.argument("text")
@click.option("--out", type=click.Path(dir_okay=False), default="attention.png", show_default=True,
              help="Image to write (PNG, SVG or PDF by extension).")
@click.option("--reduce", type=click.Choice(["none", "mean"]), default=None,
              help="none: one panel per layer and head; mean: their average [default: none; mean with --compare].")
@click.option("--compare", is_flag=True, help="Also run the PyTorch original and plot both side by side.")
@click.option("--max-len", type=click.IntRange(1), default=64, show_default=True, help="Most target tokens.")
@device_option
@plugin_option
def attention_command(export_dir: str, text: str, out: str, reduce: str | None, compare: bool, max_len: int,
                      device: str, plugin_files: tuple[str, ...]) -> None:
    """Plot what an export attends to, as a heatmap.

    Decodes TEXT greedily and draws its cross-attention (the export needs --with-attention).
    """
    from s2s_deploy.format.manifest import load_manifest

    load_plugin_files(plugin_files)
    manifest = load_manifest(export_dir)
    extras = ("plot", *(("export",) if compare else ()))
    if not manifest.has_attention_output:
        _explain_missing_attention(manifest.plugin, export_dir, missing_extras(*extras))
    require("attention", *extras)
    from s2s_deploy.pictures import plot
    from s2s_deploy.pictures.attention import attention_map, compare_attention
    from s2s_deploy.runtime.ort.backend import OrtBackend

    plot.require_matplotlib()
    backend = OrtBackend(manifest, device=device)
    echo_device(backend.choice.notice(), backend.choice.provider)
    if manifest.max_target_length:
        max_len = min(max_len, manifest.max_target_length)
    if compare:
        from s2s_deploy.modeling.torch_backend import torch_backend_for

        comparison = compare_attention(torch_backend_for(manifest), backend, manifest, text, max_len=max_len)
        amap = comparison.candidate
        reduce = reduce or "mean"  # 2 x layers x heads tiny panels are unreadable; --reduce none asks for them
        path = plot.plot_comparison(comparison, out, reduce)
        click.echo(f"max |diff| attention {comparison.reference.backend} vs {amap.backend}: "
                   f"{comparison.max_abs_diff:.2e}")
    else:
        amap = attention_map(backend, manifest, text, max_len=max_len)
        reduce = reduce or "none"
        path = plot.plot_attention(amap.reduce(reduce), out,
                                   title=f"{manifest.plugin}: {manifest.tgt_vocab.decode(amap.target_ids)}")
    drawn = amap.reduce(reduce).panels
    maps = drawn[0] if len(drawn) == 1 and len(amap.panels) > 1 else f"{len(drawn)} map{'s' if len(drawn) > 1 else ''}"
    click.echo(f"wrote {path}: {len(amap.target_tokens)} target x {len(amap.source_tokens)} source tokens, {maps}")


def _explain_missing_attention(architecture: str, export_dir: str, missing: list[str]) -> None:
    """Tell an architecture without attention from an export that merely left it out, and give
    the whole fix in one line: the re-export (over the folder, hence --force) and any extra."""
    from s2s_deploy.errors import S2SError

    if not missing_extras("export"):  # the plugin can say whether the architecture has attention at all
        from s2s_deploy.architecture.registry import get_plugin

        try:
            has_attention = get_plugin(architecture).has_attention
        except S2SError:  # a plugin not installed here: the export cannot tell us more
            has_attention = True
        if not has_attention:
            raise S2SError(f"the {architecture} architecture has no attention")
    extras = list(dict.fromkeys([*missing_extras("export"), *missing]))
    install = f'pip install "s2s-deploy[{",".join(extras)}]", then ' if extras else ""
    raise S2SError(f"{export_dir} was exported without attention weights; to draw them: {install}"
                   f"s2s-deploy export --arch {architecture} --with-attention --force --out {export_dir} "
                   "(plus the --checkpoint or --hf it came from, if any)")
