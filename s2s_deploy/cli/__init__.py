"""The ``s2s-deploy`` command: the group, and the modules that each add one group of commands to it.

They import heavy libraries only when a command runs."""

from s2s_deploy.cli import (  # noqa: F401
    attention,
    bench,
    caption,
    evaluate,
    export,
    fuse,
    listing,
    parity,
    quantize,
    score,
    serve,
    train,
    transcribe,
    translate,
    web,
)
from s2s_deploy.cli.group import main

__all__ = ["main"]
