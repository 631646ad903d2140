"""The errors that end a run with one `error: ...` line (common/cli.py) instead of a traceback: each names what is
wrong and, where there is a choice, the valid choices."""

import errno


class ConfigError(ValueError):
    """A bad config, checkpoint or option: raised before any work starts, with the valid choices in the message."""


class ShardError(ValueError):
    """Data that cannot be read or prepared: a corrupt or foreign shard, too little data for one batch."""


class HubUnavailable(ShardError, RuntimeError):
    """Data or a tokenizer that needs the Hugging Face hub, which cannot be reached (offline)."""


class NonFinite(RuntimeError):
    """The loss or the weights stopped being finite: the run stops without checkpointing that state."""


class StorageError(RuntimeError):
    """A file or folder that could not be written or made (disk full, read-only, no permission, a file in a folder's
    place), with the path, the cause and what was kept."""


# the operating system's answers that mean "this place cannot be written", not a bug
STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EEXIST, errno.ENOTDIR,
                  errno.EISDIR}


def storage_cause(exc: BaseException) -> OSError | None:
    """The OSError of STORAGE_ERRNOS behind exc, if any: itself, or one it was raised from or during (torch.save
    reports a full disk as `RuntimeError: [enforce fail at inline_container.cc] unexpected pos`, the ENOSPC inside)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def describe_storage(err: OSError) -> str:
    """`PATH: No space left on device (ENOSPC)`."""
    where = f"{err.filename}: " if err.filename else ""
    return f"{where}{err.strerror or 'cannot be written'} ({errno.errorcode.get(err.errno, err.errno)})"


USER_ERRORS = (ConfigError, ShardError, FileNotFoundError, NonFinite, StorageError)
