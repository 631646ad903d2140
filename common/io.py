"""One way to write a file so that a reader never sees half of it: write a temporary file beside it (named after
this process, so two writers never share one), flush it to disk, rename it over the target. A crash at any moment
leaves the old file or the new one. Leftover temporaries match `*.tmp.*`."""

from __future__ import annotations

import os
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
