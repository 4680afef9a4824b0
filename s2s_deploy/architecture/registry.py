"""One loading path for every plugin: built-ins and third parties both arrive as entry points
(group ``s2s_deploy.plugins``) or as a ``--plugin file.py``, and both go through ``register``.

Torch-free: registering imports a plugin's declaration, and a plugin that keeps its torch model in
another module (``model = "module:Class"``, as the built-ins do) registers and lists without torch."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

from s2s_deploy.architecture.declaration import ArchitecturePlugin, validate_plugin
from s2s_deploy.errors import ContractError, S2SError, UnknownNameError

ENTRY_POINT_GROUP = "s2s_deploy.plugins"
BUILTIN_MODULE = "s2s_deploy_plugins."


@dataclass(frozen=True)
class Registered:
    plugin: ArchitecturePlugin
    source: str
    origin: str | None = None
    """What a user installs or passes to get this plugin again: ``file NAME.py`` or ``distribution
    NAME``; recorded in each export's manifest, so that an export made with a plugin this machine
    lacks says which."""

    @property
    def builtin(self) -> bool:
        return self.source.startswith(f"entry point {BUILTIN_MODULE}")


class Registry:
    def __init__(self) -> None:
        self._plugins: dict[str, Registered] = {}
        self._entry_points_loaded = False
        self.disabled: list[str] = []
        """One line per third-party entry point that failed to load (``list`` then exits non-zero)."""

    def register(self, plugin: object, source: str, origin: str | None = None) -> ArchitecturePlugin:
        if isinstance(plugin, type) and issubclass(plugin, ArchitecturePlugin):
            plugin = plugin()
        validate_plugin(plugin)
        existing = self._plugins.get(plugin.name)
        if existing is not None and type(existing.plugin) is not type(plugin):
            raise ContractError(
                f"plugin name {plugin.name!r} from {source} is already registered by {existing.source}"
            )
        self._plugins[plugin.name] = Registered(plugin, source, origin)
        return plugin

    def unregister(self, name: str) -> None:
        """Forget ``name``, so that its file can be loaded again in this process."""
        self._plugins.pop(name, None)

    @contextmanager
    def scoped(self) -> Iterator[Registry]:
        """Registrations made inside are forgotten on leaving: a plugin file loaded for one job (or
        one test) does not outlive it."""
        plugins, loaded, disabled = dict(self._plugins), self._entry_points_loaded, list(self.disabled)
        try:
            yield self
        finally:
            self._plugins, self._entry_points_loaded, self.disabled = plugins, loaded, disabled

    def load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        # Built-ins first, so a third party reusing a name is the one refused; a broken or clashing
        # third-party plugin disables itself alone, with a warning, never every architecture.
        found = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: not ep.value.startswith(BUILTIN_MODULE))
        for ep in found:
            origin = f"distribution {ep.dist.name}" if ep.dist is not None else f"module {ep.module}"
            try:
                self.register(ep.load(), f"entry point {ep.value}", origin)
            except Exception as exc:  # any failure of foreign code disables that plugin only
                if ep.value.startswith(BUILTIN_MODULE):
                    raise ContractError(f"built-in plugin {ep.name!r} ({ep.value}) failed to load: {exc}") from exc
                line = (f"plugin entry point {ep.name!r} ({ep.value}) disabled: "
                        f"{' '.join(str(exc).split())[:200]}{moved_module_hint(exc)}")
                self.disabled.append(line)
                print(f"warning: {line}", file=sys.stderr)

    def load_file(self, path: str | Path) -> list[str]:
        """Import a plugin file and register every plugin instance or class it exposes as PLUGIN."""
        path = Path(path)
        if not path.is_file():
            raise S2SError(f"plugin file not found: {path}")
        module_name = f"s2s_deploy_user_plugin_{path.stem}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise S2SError(f"cannot import plugin file {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] not in ("", "s2s_deploy", "s2s_deploy_plugins"):
                raise  # a dependency (torch, for a plugin with its model beside it): the CLI names its extra
            raise S2SError(f"plugin file {path} failed to import: {exc}{moved_module_hint(exc)}") from exc
        except Exception as exc:
            raise S2SError(f"plugin file {path} failed to import: {exc}{moved_module_hint(exc)}") from exc
        if not hasattr(module, "PLUGIN"):
            raise ContractError(f"plugin file {path} defines no PLUGIN")
        return [self.register(module.PLUGIN, f"file {path}", f"file {path.name}").name]

    def get(self, name: str) -> ArchitecturePlugin:
        self.load_entry_points()
        if name not in self._plugins:
            raise UnknownNameError("architecture", name, list(self._plugins))
        return self._plugins[name].plugin

    def entries(self) -> list[Registered]:
        self.load_entry_points()
        return [self._plugins[n] for n in sorted(self._plugins)]

    def origin(self, plugin: ArchitecturePlugin) -> str | None:
        """Where ``plugin`` was registered from; None for an instance never registered (tests, scripts)."""
        entry = self._plugins.get(plugin.name)
        return entry.origin if entry is not None and entry.plugin is plugin else None


REGISTRY = Registry()


def get_plugin(name: str) -> ArchitecturePlugin:
    return REGISTRY.get(name)


def exported_plugin(name: str, origin: str | None) -> ArchitecturePlugin:
    """The plugin an export names; when it is not registered here, the error says how the export got it."""
    try:
        return REGISTRY.get(name)
    except UnknownNameError:
        kind, _, what = (origin or "").partition(" ")
        if kind == "file":
            raise S2SError(f"architecture {name!r} is not registered here: exported with plugin file {what}: pass "
                           f"--plugin {what}") from None
        if kind == "distribution":
            raise S2SError(f"architecture {name!r} is not registered here: exported with the plugin of distribution "
                           f"{what}: install it (pip install {what})") from None
        raise


def moved_module_hint(exc: BaseException) -> str:
    """For ``No module named 's2s_deploy.X'`` where X now lives elsewhere in the package: the import
    to write instead (plugins written for an older layout import the contract from its old place)."""
    missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
    if not missing or not missing.startswith("s2s_deploy."):
        return ""
    package = Path(__file__).resolve().parent.parent
    leaf = missing.rsplit(".", 1)[1]
    found = sorted(p for p in (*package.rglob(f"{leaf}.py"), *package.rglob(f"{leaf}/__init__.py")))
    if len(found) != 1:
        return ""
    parts = found[0].relative_to(package.parent).with_suffix("").parts
    module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return f"; it moved: from {module} import ..."
