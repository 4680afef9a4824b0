"""``s2s-deploy list`` without importing torch: a plugin's class attributes are read from its source.

Plugin modules import torch at the top, which costs seconds. The facts ``list`` prints (name,
version, description, presets, exporter) are literal class attributes, so they are read with
``ast`` from the plugin's file, following base classes through ``from X import Y`` to their own
files. Anything not literal there makes ``entries`` return None, and ``list`` imports as before.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import click

from s2s_deploy.cli.group import load_plugin_files, main, plugin_option
from s2s_deploy.errors import S2SError

CONTRACT_MODULE = "s2s_deploy.export.contract"
BASE_CLASS = "ArchitecturePlugin"
FIELDS = ("name", "version", "description", "presets", "default_preset", "exporter")


@dataclass(frozen=True)
class PluginFacts:
    name: str
    version: str
    description: str
    presets: tuple[str, ...]
    default_preset: str
    exporter: str
    source: str


def entries(plugin_files: tuple[str, ...], group: str) -> list[PluginFacts] | None:
    """Every plugin's facts sorted by name, or None when one of them cannot be read statically."""
    found: list[PluginFacts] = []
    for ep in entry_points(group=group):
        facts = _facts(_module_file(ep.module), ep.attr, f"entry point {ep.value}")
        if facts is None:
            return None
        found.append(facts)
    for path in plugin_files:
        if not Path(path).is_file():
            return None  # the registry gives the one-line error
        facts = _facts(Path(path), "PLUGIN", f"file {path}")
        if facts is None:
            return None
        found.append(facts)
    names = [f.name for f in found]
    if len(set(names)) != len(names):
        return None  # a name taken twice: the registry says by whom
    return sorted(found, key=lambda f: f.name)


def _module_file(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


def _facts(path: Path | None, attr: str | None, source: str) -> PluginFacts | None:
    if path is None or not attr:
        return None
    tree = _parse(path)
    class_name = None
    for node in tree.body if tree else ():
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr for t in node.targets):
            value = node.value.func if isinstance(node.value, ast.Call) and not node.value.args else node.value
            class_name = value.id if isinstance(value, ast.Name) else None
    attrs = _class_attrs(path, class_name, 0) if class_name else None
    if attrs is None or not all(isinstance(attrs.get(f), str) for f in FIELDS if f != "presets"):
        return None
    if not isinstance(attrs.get("presets"), tuple):
        return None
    return PluginFacts(**{f: attrs[f] for f in FIELDS}, source=source)


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None


def _class_attrs(path: Path, class_name: str, depth: int) -> dict[str, Any] | None:
    """The listed attributes of ``class_name`` as defined in or imported into ``path``, bases first."""
    tree = _parse(path)
    if tree is None or depth > 8:
        return None
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                if (alias.asname or alias.name) == class_name:
                    target = _module_file(node.module)
                    if node.module == CONTRACT_MODULE and alias.name == BASE_CLASS:
                        return _own_attrs(target, BASE_CLASS)
                    return _class_attrs(target, alias.name, depth + 1) if target else None
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name), None)
    if cls is None:
        return None
    attrs: dict[str, Any] = {}
    for base in reversed(cls.bases):  # the first base wins, as in the method resolution order
        if not isinstance(base, ast.Name):
            return None
        inherited = _class_attrs(path, base.id, depth + 1)
        if inherited is None:
            return None
        attrs.update(inherited)
    own = _own_attrs(path, class_name)
    return None if own is None else attrs | own


def _own_attrs(path: Path | None, class_name: str) -> dict[str, Any] | None:
    tree = _parse(path) if path else None
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name), None) if tree else None
    if cls is None:
        return None
    attrs: dict[str, Any] = {}
    for node in cls.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if not (isinstance(target, ast.Name) and target.id in FIELDS):
            continue
        attrs[target.id] = _value(target.id, value)
    return attrs


def _value(field: str, node: ast.expr) -> Any:
    """A literal, or the preset names of a dict display; anything else is unreadable (None)."""
    try:
        if field == "presets":
            if not isinstance(node, ast.Dict) or any(key is None for key in node.keys):
                return None
            return tuple(ast.literal_eval(key) for key in node.keys if key is not None)
        return ast.literal_eval(node)
    except ValueError:
        return None


@main.command("list")
@plugin_option
def list_command(plugin_files: tuple[str, ...]) -> None:
    """List architectures and where each comes from."""
    found = entries(plugin_files, "s2s_deploy.plugins")  # from the plugins' source: no torch import
    disabled: list[str] = []
    if found is None:
        from s2s_deploy.export.registry import REGISTRY

        load_plugin_files(plugin_files)
        found = [PluginFacts(e.plugin.name, e.plugin.version, e.plugin.description, tuple(e.plugin.presets),
                             e.plugin.default_preset, e.plugin.exporter, e.source) for e in REGISTRY.entries()]
        disabled = REGISTRY.disabled
    for p in found:
        click.echo(f"{p.name:<12} v{p.version:<5} {p.description}")
        click.echo(f"{'':<12} presets: {', '.join(p.presets)} (default {p.default_preset}); exporter: {p.exporter}; "
                   f"from {p.source}")
    if disabled:
        raise S2SError(f"{len(disabled)} plugin entry point(s) disabled: {disabled[0]}")
