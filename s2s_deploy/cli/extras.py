"""Which optional extra each heavy import belongs to, so a missing one is named in one line.

The base install is the torch-free runtime; a command that needs more says which
``pip install "s2s-deploy[EXTRA]"`` brings it, before it starts work rather than after.
"""

from __future__ import annotations

import importlib.util
from importlib import metadata

from s2s_deploy.errors import S2SError

EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "export": ("torch", "onnxscript", "safetensors"),
    "eval": ("sacrebleu", "babel", "num2words"),
    "hf": ("transformers",),
    "moses": ("sacremoses",),
    "plot": ("matplotlib",),
    "ray": ("ray",),
    "serve": ("starlette", "uvicorn", "python_multipart"),
}
"""Top-level modules of each extra (``train`` is ``export`` plus ``eval``)."""

_EXTRA_OF_MODULE = {module: extra for extra, modules in EXTRA_MODULES.items() for module in modules}


class MissingExtra(S2SError):
    """A command was run without the optional dependencies it needs."""


def install_hint(extra: str) -> str:
    return f'pip install "s2s-deploy[{extra}]"'


def missing_extras(*extras: str) -> list[str]:
    """The extras among ``extras`` of which some module is not installed, in order."""
    return [extra for extra in extras
            if any(importlib.util.find_spec(module) is None for module in EXTRA_MODULES[extra])]


def require(command: str, *extras: str, bundle: str | None = None) -> None:
    """Refuse ``command`` up front, in one line that names everything missing at once: the
    ``bundle`` extra when one covers them all (``train`` is ``export`` plus ``eval``), else each."""
    missing = missing_extras(*extras)
    if not missing:
        return
    modules = [m for extra in missing for m in EXTRA_MODULES[extra] if importlib.util.find_spec(m) is None]
    verb = "is" if len(modules) == 1 else "are"
    raise MissingExtra(f"`s2s-deploy {command}` needs {', '.join(modules)}, which {verb} not installed: "
                       f"{install_hint(bundle or ','.join(missing))}")


def explain_missing_module(command: str, exc: ModuleNotFoundError) -> str:
    """The one line for a ModuleNotFoundError that got past ``require``."""
    top = (exc.name or "").split(".")[0]
    extra = _EXTRA_OF_MODULE.get(top)
    if extra is None:
        return f"`s2s-deploy {command}` needs the Python module {top or exc.name!r}, which is not installed"
    return f"`s2s-deploy {command}` needs {top}, which is not installed: {install_hint(extra)}"


def conflicting_runtimes() -> str | None:
    """Both ONNX Runtime wheels in one environment overwrite each other's files; say how to switch."""
    installed = []
    for name in ("onnxruntime", "onnxruntime-gpu"):
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        installed.append(name)
    if len(installed) < 2:
        return None
    return ("onnxruntime and onnxruntime-gpu are both installed and overwrite each other; keep one: "
            "pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu  "
            "(or onnxruntime for CPU only)")
