"""``s2s-deploy list``: every registered plugin, read from the registry like every other command.

Registration imports a plugin's declaration only (``s2s_deploy/architecture/declaration.py``):
the built-ins keep their torch models in ``s2s_deploy_plugins.models`` and name them by
``model = "module:Class"``, so listing them never imports torch and works in the runtime-only
install. A plugin whose own module imports torch (a one-file plugin) is imported with it.
"""

from __future__ import annotations

import click

from s2s_deploy.cli.group import load_plugin_files, main, plugin_option
from s2s_deploy.errors import S2SError


@main.command("list")
@plugin_option
def list_command(plugin_files: tuple[str, ...]) -> None:
    """List architectures and where each comes from."""
    from s2s_deploy.architecture.registry import REGISTRY

    load_plugin_files(plugin_files)
    for entry in REGISTRY.entries():
        p = entry.plugin
        click.echo(f"{p.name:<12} v{p.version:<5} {p.description}")
        click.echo(f"{'':<12} presets: {', '.join(p.presets)} (default {p.default_preset}); exporter: {p.exporter}; "
                   f"from {entry.source}")
    if REGISTRY.disabled:
        raise S2SError(f"{len(REGISTRY.disabled)} plugin entry point(s) disabled: {REGISTRY.disabled[0]}")
