"""The front ends' optional libraries, imported only when a front end runs.

The base install reads no audio or images, so ``soundfile``, ``soxr`` and ``Pillow`` are
extras; a missing one is named in one line with the extra that brings it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from s2s_deploy.errors import S2SError

_EXTRA_OF = {"soundfile": ("soundfile", "audio"), "soxr": ("soxr", "audio"), "PIL": ("Pillow", "image")}


def optional_module(module: str, purpose: str) -> ModuleType:
    """``module`` imported, or a one-line S2SError naming its package and extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package, extra = _EXTRA_OF[module.split(".")[0]]
        raise S2SError(f'{purpose} needs {package}, which is not installed: pip install "s2s-deploy[{extra}]"') from exc
