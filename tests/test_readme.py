"""Every ```python block of README.md runs, as a reader would paste it.

The convention a snippet follows (whatever the README says, so this test needs no edit when it is
rewritten):
- Each block is a whole script: it runs alone, in its own Python process (this interpreter), with
  nothing from the blocks before it.
- It runs as from the clone's root: its working directory is a fresh temporary folder that holds
  ``tests/`` (the repository's, so ``tests/data/speech_16000hz.flac`` is a clip) and ``exported/``.
- ``exported/<plugin>`` (``exported/transformer``, ``exported/speech``, ...) is that plugin's export as
  ``s2s-deploy export <plugin>`` writes it, built once per session by the ``exports`` fixture
  (tests/conftest.py) for every ``exported/<name>`` a block names. A name that is no plugin fails
  here in one line: a block that needs another folder makes it itself.
- A block passes when it exits with 0 and prints something if it calls ``print``. A block that names
  an export is marked slow (exports take seconds); the others are in the fast tier.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from s2s_deploy.architecture.registry import REGISTRY

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
EXPORT = re.compile(r"exported/([A-Za-z0-9_]+)")


def blocks() -> list[tuple[int, str]]:
    """README.md's python blocks with the line each starts on."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in BLOCK.finditer(text)]


def test_the_readme_has_python_blocks() -> None:
    """The pattern finds the README's blocks: an empty parametrisation would pass whatever they say."""
    assert blocks()


@pytest.mark.parametrize("code", [
    pytest.param(code, id=f"README.md:{line}", marks=[pytest.mark.slow] if EXPORT.search(code) else [])
    for line, code in blocks()])
def test_readme_python_block_runs(code: str, exports, tmp_path: Path) -> None:
    names = sorted(set(EXPORT.findall(code)))
    plugins = {entry.plugin.name for entry in REGISTRY.entries()}
    unknown = [name for name in names if name not in plugins]
    assert not unknown, f"the block names exported/{unknown[0]}, which is no plugin: this test builds plugins' exports"
    (tmp_path / "exported").mkdir()
    for name in names:
        exports.get(name)
        (tmp_path / "exported" / name).symlink_to(exports.root / name, target_is_directory=True)
    (tmp_path / "tests").symlink_to(ROOT / "tests", target_is_directory=True)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    if re.search(r"\bprint\(", code):
        assert done.stdout.strip(), "the block prints nothing"
