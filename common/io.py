"""One way to write a file so that a reader never sees half of it: write a temporary file beside it (named after
this process, so two writers never share one), flush it to disk, rename it over the target. A crash at any moment
leaves the old file or the new one. Leftover temporaries match `*.tmp.*`. A folder (atomic_dir) the same way, its
temporary hidden: `.<name>.tmp.<pid>`."""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path, suffix: str = ""):
    """Yield a temporary path to write `path` through (`suffix` keeps an extension a writer needs, e.g. '.png' for
    savefig); when the block ends without an error the temporary replaces `path`, otherwise it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}{suffix}")
    try:
        yield tmp
        with open(tmp, "rb+") as f:  # on disk before the rename, so the rename never exposes an empty file
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        if e.filename is None:  # a write that failed (a full disk) says which file: errors name their path
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_open(path, mode: str = "w"):
    """An open file ('w' or 'wb') that becomes `path` when the block ends without an error."""
    with atomic_path(path) as tmp, open(tmp, mode) as f:
        yield f


def write_atomic(path, data: str | bytes) -> Path:
    """Replace `path` with `data` (text or bytes) whole or not at all."""
    with atomic_open(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    return Path(path)


@contextmanager
def atomic_dir(path):
    """Yield a temporary folder to write `path` through; when the block ends without an error it replaces `path` (an
    earlier folder there is moved aside first and deleted only after), otherwise it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp, old = (path.with_name(f".{path.name}.{kind}.{os.getpid()}") for kind in ("tmp", "old"))
    for stale in path.parent.glob(f".{path.name}.*.*"):  # left by a writer that was killed: nothing else removes them
        kind, _, pid = stale.name[len(path.name) + 2:].partition(".")
        if kind in ("tmp", "old") and pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def pid_alive(pid: int) -> bool:
    """Whether a process of this pid runs on this machine (a writer on another host of a shared disk looks dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
