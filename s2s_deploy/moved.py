"""Modules that moved, importable from their old names for one release (with a DeprecationWarning).

Third-party plugins written against 0.1's layout import ``s2s_deploy.export.contract`` and friends;
this table keeps them working while they update, and ``moved_module_hint`` names the new home of a
module that is gone for good. The finder resolves an old name to the very module object of its new
home, so classes compare identical whichever name a plugin used.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

MOVED: dict[str, str] = {
    "s2s_deploy.export.contract": "s2s_deploy.modeling.contract",
    "s2s_deploy.export.parts": "s2s_deploy.modeling.parts",
    "s2s_deploy.export.graphs": "s2s_deploy.modeling.graphs",
    "s2s_deploy.export.torch_backend": "s2s_deploy.modeling.torch_backend",
    "s2s_deploy.export.checkpoint": "s2s_deploy.modeling.checkpoint",
    "s2s_deploy.export.plugin_errors": "s2s_deploy.modeling.plugin_errors",
    "s2s_deploy.export.checks": "s2s_deploy.verify.checks",
    "s2s_deploy.export.parity": "s2s_deploy.verify.parity",
    "s2s_deploy.export.tolerance": "s2s_deploy.verify.tolerance",
    "s2s_deploy.export.timestamp_parity": "s2s_deploy.verify.timestamps",
    "s2s_deploy.export.hf_reference": "s2s_deploy.verify.reference",
}
"""Old module name → new module name (0.1 → 0.2)."""


class _MovedLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The new module has run already; only its spec, which the import system overwrote, is put back."""
        module.__spec__ = self._own_spec


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds an old module name only: every other import falls through to Python's own finders."""

    def find_spec(self, fullname: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _MovedLoader())


def install() -> None:
    if not any(isinstance(finder, MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())


def new_home(module: str) -> str | None:
    """The module that now holds what ``module`` held, where the table knows it."""
    return MOVED.get(module)
