"""Files of an export, written whole or not at all, readable by others, hashed and kept inside their folder.

Output folders are built beside the target, then swapped in. A staging folder's name carries the
id of the process that made it, so the next run finds the leftovers of a killed one (its process
gone) and removes them. ``--force`` replaces only an earlier output of ours, recognised by its
manifest, never an arbitrary folder. A single file is written to a temporary name beside it and
renamed over it; every file and folder gets the mode the user's umask gives a new file
(``FILE_MODE``), never the owner-only 0600 of ``mkstemp``, so a server running as another user
can read an export.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from s2s_deploy.errors import S2SError

MANIFEST_NAME = "manifest.json"
FILE_MODE = 0o666
"""A written file's mode before the umask, as ``open()`` gives it: 0644 under the usual 022."""
DIR_MODE = 0o777


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` for a writer that wants a file name (ONNX, safetensors);
    when the block succeeds it becomes ``path``, readable as ``FILE_MODE`` and the umask allow;
    when it fails ``path`` is untouched and the temporary file is gone."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    try:
        yield Path(temporary)
        os.chmod(temporary, FILE_MODE & ~umask())  # mkstemp's 0600 would hide the file from other users
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def write_atomically(path: Path, data: bytes) -> Path:
    """``path`` holds ``data`` whole, or keeps what it held: a crash never leaves half a file."""
    with atomic_path(path) as temporary:
        temporary.write_bytes(data)
    return Path(path)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def inside(directory: Path, name: str, error: type[S2SError] = S2SError, what: str = "file",
           folder: str = "export folder") -> Path:
    """``directory / name``, refused (as ``error``) unless it resolves inside ``directory``, links
    included: the one containment check for untrusted folders, exports and model folders alike."""
    path = directory / name
    root = directory.resolve()
    target = path.resolve()
    if not target.is_relative_to(root) or target == root:
        raise error(f"{what} {name!r} resolves to {target}, outside the {folder} {directory}; refused")
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_leftovers(parent: Path, prefix: str) -> None:
    """Remove ``prefix<pid>-*`` folders in ``parent`` whose process no longer runs."""
    try:
        candidates = list(parent.iterdir())
    except OSError:
        return
    for path in candidates:
        if not path.name.startswith(prefix) or path.is_symlink() or not path.is_dir():
            continue
        pid = path.name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def staging_prefix(name: str) -> str:
    return f".{name}.tmp-"


def check_replaceable(out_dir: Path, force: bool) -> None:
    """Refuse what --force must never delete: a symlink, the current folder or one above it,
    a file, or a non-empty folder that holds no manifest of ours."""
    if out_dir.is_symlink():
        raise S2SError(f"{out_dir} is a symbolic link; give the folder it points to, or another name")
    if not out_dir.exists():
        return
    if not force:
        raise S2SError(f"{out_dir} already exists; pass --force to replace it")
    here = Path.cwd().resolve()
    resolved = out_dir.resolve()
    if resolved == here or resolved in here.parents:
        raise S2SError(f"{out_dir} is the current folder or holds it; refusing to replace it")
    if not out_dir.is_dir():
        raise S2SError(f"{out_dir} is a file, not an earlier export; refusing to replace it")
    if any(out_dir.iterdir()) and not (out_dir / MANIFEST_NAME).is_file():
        raise S2SError(f"{out_dir} is not an earlier s2s-deploy output (no {MANIFEST_NAME}); refusing to replace it "
                       "with --force: remove it yourself or choose another --out")


@contextmanager
def staged_directory(out_dir: Path, force: bool) -> Iterator[Path]:
    """Yield an empty folder on the same filesystem as ``out_dir``. If the block succeeds it
    replaces ``out_dir`` (which must not exist unless ``force``); if it fails it is removed."""
    out_dir = Path(os.path.abspath(out_dir))
    check_replaceable(out_dir, force)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    prefix = staging_prefix(out_dir.name)
    remove_leftovers(out_dir.parent, prefix)
    work = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f"{prefix}{os.getpid()}-"))
    try:
        os.chmod(work, DIR_MODE & ~umask())  # mkdtemp's 0700 would ignore the user's umask
        yield work
        if out_dir.exists():
            check_replaceable(out_dir, force)  # it may have appeared while we worked
            old = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f"{prefix}{os.getpid()}-old-"))
            os.rmdir(old)
            out_dir.rename(old)
            work.rename(out_dir)
            shutil.rmtree(old)
        else:
            work.rename(out_dir)
    finally:
        if work.exists():
            shutil.rmtree(work)
