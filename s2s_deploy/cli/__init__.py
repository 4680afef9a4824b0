"""The ``s2s-deploy`` command. Expected failures print one line and exit 1; usage errors exit 2."""

from __future__ import annotations

import sys

import click

from s2s_deploy.runtime.errors import S2SError


class Group(click.Group):
    """Turns every S2SError (and a few OS errors users cause) into one line on stderr."""

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except S2SError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)
        except (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError) as exc:
            click.echo(f"error: {exc.strerror or exc}: {exc.filename}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)


def load_plugin_files(paths: tuple[str, ...]) -> None:
    from s2s_deploy.export.registry import REGISTRY

    for path in paths:
        REGISTRY.load_file(path)


plugin_option = click.option(
    "--plugin", "plugin_files", multiple=True, type=click.Path(dir_okay=False),
    help="Register an extra architecture plugin from a Python file (repeatable).",
)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="s2s-deploy")
def main() -> None:
    """Export PyTorch seq2seq models to ONNX, decode them, and prove parity."""


@main.command("list")
@plugin_option
def list_command(plugin_files: tuple[str, ...]) -> None:
    """List registered architectures and where each comes from."""
    from s2s_deploy.export.registry import REGISTRY

    load_plugin_files(plugin_files)
    for entry in REGISTRY.entries():
        p = entry.plugin
        presets = ", ".join(p.presets)
        click.echo(f"{p.name:<12} v{p.version:<5} {p.description}")
        click.echo(f"{'':<12} presets: {presets} (default {p.default_preset}); exporter: {p.exporter}; "
                   f"from {entry.source}")


# Each module adds its commands to ``main``; they import heavy libraries only when a command runs.
from s2s_deploy.cli import attention, bench, decode, export, fuse, quantize, serve, train, web  # noqa: E402, F401
