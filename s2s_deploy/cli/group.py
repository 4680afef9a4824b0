"""The ``s2s-deploy`` group and what its command modules share. Expected failures print one line and exit 1;
usage errors exit 2."""

from __future__ import annotations

import sys
from typing import Any, TypeVar

import click

from s2s_deploy.cli.extras import conflicting_runtimes, explain_missing_module
from s2s_deploy.errors import S2SError

CUDA_PROVIDER = "CUDAExecutionProvider"


ANYWHERE = ("--verbose", "--debug")
"""The group's flags, accepted after the subcommand too (``translate ... --verbose``), where users type them."""


class Group(click.Group):
    """Turns every S2SError and OS error (read-only, full disk, missing file) into one line on
    stderr; ``--debug`` adds the full trace before it."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """The ``ANYWHERE`` flags moved before the subcommand (never past a ``--``)."""
        end = args.index("--") if "--" in args else len(args)
        moved = [arg for arg in args[:end] if arg in ANYWHERE]
        return super().parse_args(ctx, moved + [arg for arg in args[:end] if arg not in ANYWHERE] + args[end:])

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
    """Register ``--plugin`` files; without any, import nothing."""
    if not paths:
        return
    from s2s_deploy.architecture.registry import REGISTRY

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


device_option = click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
                             show_default=True, help="ONNX Runtime device; auto uses CUDA only if it works.")
threads_option = click.option("--threads", type=click.IntRange(1), default=None,
                              help="ONNX Runtime intra-op threads [default: available cores].")
F = TypeVar("F")


def decoding_options(command: F, timed: bool = True) -> F:
    """Every decoding option of format/decoding.py's table that has a flag, as a click option whose
    value is None when not given (a switch has its ``--no-`` form, to turn off an export's default):
    the command passes them on by name to ``decoding.resolve``. ``timed=False``: a command whose
    inputs have no time axis, without the options that need one."""
    from s2s_deploy.format.decoding import OPTIONS, Code, Ids, OneOf, Reals, Switch, Whole

    for option in reversed(OPTIONS):
        flag, kind = option.cli_flag, option.kind
        if flag is None or (option.timed and not timed):
            continue
        shown = option.shown_default or ("none" if option.default == () else
                                         "off" if option.default is False else f"{option.default}")
        text = f"{option.help} [default: the export's search.{option.name}, else {shown}]"
        if isinstance(kind, Switch):
            decorator = click.option(f"{flag}/--no-{flag[2:]}", option.name, default=None, help=text)
        elif isinstance(kind, Ids):
            decorator = click.option(flag, option.name, multiple=kind.strings != "text", default=None, help=text)
        elif isinstance(kind, Code | Reals):  # a code; numbers comma-separated (resolve splits them)
            decorator = click.option(flag, *option.more_flags, option.name, default=None, help=text)
        elif isinstance(kind, OneOf):
            decorator = click.option(flag, option.name, type=click.Choice([str(v) for v in kind.values if v]),
                                     default=None, help=text)
        else:  # the range is the row's to check, in resolve: one line naming the option, exit 1
            decorator = click.option(flag, option.name, type=int if isinstance(kind, Whole) else float, default=None,
                                     help=text)
        command = decorator(command)
    return command


def given_decoding(values: dict[str, Any]) -> dict[str, Any]:
    """The decoding options a user gave, by name: an absent option (None, or no repeat of a
    repeatable one) is left out, and every given value is kept, 0 and False included."""
    return {name: value for name, value in values.items() if value is not None and value != ()}


def read_lines(path: str, keep_blank: bool = False) -> list[str]:
    """Lines split on ``\\n`` alone (a trailing ``\\r`` dropped), as ``--output`` splits them, so
    U+2028 or a form feed never makes two lines of one; blank lines kept when asked, else refused
    when there are only blank lines."""
    from pathlib import Path

    try:
        data = Path(path).read_bytes() if path != "-" else click.get_binary_stream("stdin").read()
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise S2SError(f"{path} is not valid UTF-8 (byte {exc.start})") from exc
    except OSError as exc:
        raise S2SError(f"cannot read {path}: {exc.strerror}") from exc
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    if not data or data.endswith(b"\n"):  # as --output counts: a BOM alone is one (blank) line
        lines.pop()
    if keep_blank:
        return lines
    if not any(line.strip() for line in lines):
        raise S2SError(f"{path} has no non-empty lines")
    return [line for line in lines if line.strip()]
