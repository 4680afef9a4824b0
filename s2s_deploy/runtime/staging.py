"""Output folders appear whole or not at all: build beside the target, then swap it in."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from s2s_deploy.runtime.errors import S2SError


@contextmanager
def staged_directory(out_dir: Path, force: bool) -> Iterator[Path]:
    """Yield an empty folder on the same filesystem as ``out_dir``. If the block succeeds it
    replaces ``out_dir`` (which must not exist unless ``force``); if it fails it is removed."""
    if out_dir.exists() and not force:
        raise S2SError(f"{out_dir} already exists; pass --force to replace it")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.tmp-"))
    try:
        yield work
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            out_dir.rename(old)
            work.rename(out_dir)
            shutil.rmtree(old)
        else:
            work.rename(out_dir)
    finally:
        if work.exists():
            shutil.rmtree(work)
