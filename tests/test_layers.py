"""The package's floors: every import runs down or sideways within its floor, never up, and no
two modules import each other, directly or round a longer circle (lazy imports count too)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "s2s_deploy"

# Lowest first. A module may import its own floor and the floors below it.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("errors", "moved"),
    ("format",),
    ("frontends", "runtime", "architecture"),
    ("transforms", "jobs", "pictures", "modeling"),
    ("verify", "train"),
    ("export",),
    ("bench",),
    ("serve", "web"),
    ("cli", "__main__"),
)
FLOOR_OF = {room: level for level, rooms in enumerate(FLOORS) for room in rooms}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every s2s_deploy module the file imports, at the top, in functions or for type checking."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in names if name.split(".")[0] == "s2s_deploy"}


def graph() -> dict[str, set[str]]:
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: {imported for imported in imports_of(path) if imported in modules and imported != name}
            for name, path in modules.items()}


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_room_has_a_floor() -> None:
    rooms = {room(name) for name in graph()} - {"__init__"}
    assert rooms <= set(FLOOR_OF), f"rooms without a floor: {sorted(rooms - set(FLOOR_OF))}"


def test_no_import_runs_up_a_floor() -> None:
    upward = sorted(
        f"{name} -> {imported}"
        for name, imported_names in graph().items()
        if room(name) != "__init__"
        for imported in imported_names
        if FLOOR_OF[room(imported)] > FLOOR_OF[room(name)]
    )
    assert not upward


def test_no_import_circle() -> None:
    edges = graph()
    circles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for imported in sorted(edges[name]):
            if state.get(imported) == 1:
                circles.append([*path[path.index(imported):], imported])
            elif imported not in state:
                visit(imported, [*path, imported])
        state[name] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])
    assert not circles, "\n".join(" -> ".join(circle) for circle in circles)


def test_moved_modules_import_from_their_old_names_with_a_warning() -> None:
    import importlib
    import sys
    import warnings

    from s2s_deploy.moved import MOVED

    for old, new in MOVED.items():
        assert (PACKAGE / (new.split(".", 1)[1].replace(".", "/") + ".py")).is_file()
        assert not (PACKAGE / (old.split(".", 1)[1].replace(".", "/") + ".py")).exists()
        module = importlib.import_module(new)
        sys.modules.pop(old, None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert importlib.import_module(old) is module
        assert module.__spec__.name == new
        assert [str(w.message) for w in caught if w.category is DeprecationWarning] == [
            f"{old} moved to {new}; import it from there"]
