"""The ``s2s-deploy`` command: the group, and the modules that each add one group of commands to it.

They import heavy libraries only when a command runs."""

from s2s_deploy.cli import attention, bench, decode, export, fuse, listing, quantize, serve, train, web  # noqa: F401
from s2s_deploy.cli.group import main

__all__ = ["main"]
