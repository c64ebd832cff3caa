"""The one base class of errors in what a user asked for (a config value, a path, a backend this machine
cannot run, a data file): the command-line entry points print them as `error: ...` without a traceback,
since the message already says what to do. Anything else is a bug and keeps its traceback."""
from __future__ import annotations

import errno
import os
from pathlib import Path


class UserError(Exception):
    pass


class WriteError(UserError, OSError):
    """A file or folder that could not be written (read-only, not a folder, disk full): one line with the path,
    the reason and the remedy. An OSError too, so code that handles OSError still does."""


_REASONS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
            errno.EACCES: "permission denied", errno.EPERM: "permission denied",
            errno.EROFS: "the file system is read-only", errno.ENOTDIR: "a part of the path is a file, not a folder",
            errno.EEXIST: "a file is in the way", errno.EISDIR: "a folder is in the way"}


def os_reason(e: BaseException) -> str:
    """What went wrong, in words, with the path the error names (if any)."""
    if isinstance(e, OSError):
        reason = _REASONS.get(e.errno, e.strerror or str(e))
        return f"{reason} ({e.filename})" if e.filename else reason
    return f"{type(e).__name__}: {e}"


def write_error(e: OSError, what: str | Path, remedy: str) -> WriteError:
    """WriteError for `e`, raised while writing `what`: 'cannot write WHAT: REASON (PATH); REMEDY'."""
    err = WriteError(f"cannot write {what}: {os_reason(e)}; {remedy}")
    err.errno = e.errno
    return err


def free_bytes(path: str | Path) -> int | None:
    """Free bytes on the file system holding `path` (its nearest existing parent), or None if unknown."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        st = os.statvfs(p)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize
