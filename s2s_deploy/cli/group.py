"""The ``s2s-deploy`` group and what its command modules share. Expected failures print one line and exit 1;
usage errors exit 2."""

from __future__ import annotations

import sys

import click

from s2s_deploy.cli.extras import conflicting_runtimes, explain_missing_module
from s2s_deploy.errors import S2SError

CUDA_PROVIDER = "CUDAExecutionProvider"


class Group(click.Group):
    """Turns every S2SError and OS error (read-only, full disk, missing file) into one line on
    stderr; ``--debug`` adds the full trace before it."""

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except ModuleNotFoundError as exc:
            _trace(ctx)
            click.echo(f"error: {explain_missing_module(ctx.invoked_subcommand or '', exc)}", err=True)
            sys.exit(1)
        except S2SError as exc:
            _trace(ctx)
            click.echo(f"error: {_one_line(str(exc))}", err=True)
            sys.exit(1)
        except OSError as exc:
            _trace(ctx)
            where = f": {exc.filename}" if exc.filename else ""
            click.echo(f"error: {exc.strerror or _one_line(str(exc))}{where}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)


def _trace(ctx: click.Context) -> None:
    if ctx.find_root().params.get("debug"):
        import traceback

        traceback.print_exc()


def _one_line(message: str) -> str:
    return " ".join(message.split())


def load_plugin_files(paths: tuple[str, ...]) -> None:
    """Register ``--plugin`` files; without any, import nothing (the registry needs torch)."""
    if not paths:
        return
    from s2s_deploy.export.registry import REGISTRY

    for path in paths:
        REGISTRY.load_file(path)


plugin_option = click.option(
    "--plugin", "plugin_files", multiple=True, type=click.Path(dir_okay=False),
    help="Register an extra architecture plugin from a Python file (repeatable).",
)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="s2s-deploy")
@click.option("--verbose", is_flag=True, help="Also say which ONNX Runtime provider runs, when it is the CPU.")
@click.option("--debug", is_flag=True, help="Print the full trace before an error's one line.")
def main(verbose: bool, debug: bool) -> None:
    """Export PyTorch seq2seq models to ONNX, decode them, and prove parity."""
    if click.get_current_context().invoked_subcommand != "list" and (conflict := conflicting_runtimes()):
        raise S2SError(conflict)


def echo_device(notice: str, provider: str) -> None:
    """The provider line goes to stderr only when CUDA runs or with ``--verbose``: a CPU-only
    install prints nothing extra."""
    root = click.get_current_context().find_root()
    if provider == CUDA_PROVIDER or root.params.get("verbose"):
        click.echo(notice, err=True)
