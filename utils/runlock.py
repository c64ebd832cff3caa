"""One training process per run folder: an OS lock on `<run>/.lock`.

    with RunLock(run_dir, log) as lock:     # raises RunLocked if another live process holds it
        ...

fcntl.flock is released by the kernel when its holder exits however it exits (kill -9 included), so a lock
left by a dead process is never in the way: the next run takes it, and logs whose it was (the file keeps
the holder's PID until a clean release empties it). The file itself is never deleted while in use, since a
process that opened it just before the deletion would lock a file nobody else sees. Readers of a run folder
(eval/perplexity.py, plots) do not take the lock.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Callable

from utils.errors import UserError, WriteError, write_error

LOCK_FILE = ".lock"


class RunLocked(UserError, RuntimeError):
    pass


def _holder(text: str) -> str:
    try:
        h = json.loads(text)
        return f"PID {h['pid']} on {h['host']}, since {h['since']}"
    except (ValueError, TypeError, KeyError):
        return f"PID {text.strip() or 'unknown'}"


class RunLock:
    """Hold `<run_dir>/.lock` (creating run_dir if needed) from __enter__/acquire() to __exit__/release().
    If this lock created run_dir and nothing but the lock file is in it at release, run_dir is removed again:
    a run that stopped at a check before writing anything leaves no empty folder behind."""

    def __init__(self, run_dir: str | Path, log: Callable[[str], None] = print):
        self.run_dir, self.log = Path(run_dir), log
        self.path = self.run_dir / LOCK_FILE
        self.fd: int | None = None
        self.created = False

    def acquire(self) -> "RunLock":
        try:
            self.created = not self.run_dir.is_dir()
            self.run_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            self.created = False
            if isinstance(e, FileExistsError) or (self.run_dir.exists() and not self.run_dir.is_dir()):
                e = OSError(errno.EEXIST, os.strerror(errno.EEXIST), str(self.run_dir))
            raise write_error(e, f"the run folder {self.run_dir}",
                              "choose a writable --train.out_dir (or another --train.name)") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(fd, 4096, 0).decode(errors="replace")
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise RunLocked(f"{self.run_dir} is in use by another training run ({_holder(holder)}; lock file "
                                f"{self.path}): pass another --train.name, or wait for that run to finish") from None
            raise WriteError(f"cannot lock {self.path}: {e.strerror}; use an --train.out_dir on a local file "
                             "system") from None
        self.fd = fd
        previous = os.pread(fd, 4096, 0).decode(errors="replace")
        if previous.strip():
            self.log(f"{self.path}: took over the lock of a run that is no longer running ({_holder(previous)}; "
                     "it ended without releasing it, e.g. killed)")
        info = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                           "since": time.strftime("%Y-%m-%d %H:%M:%S")})
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, info.encode() + b"\n", 0)
        except OSError as e:
            self.release()
            raise write_error(e, self.path, "free space or choose another --train.out_dir") from None
        return self

    def release(self) -> None:
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        try:
            os.ftruncate(fd, 0)         # a clean exit: the next holder has nothing to take over
        except OSError:
            pass
        if self.created:
            try:
                if [p.name for p in self.run_dir.iterdir()] == [LOCK_FILE]:
                    self.path.unlink()
                    self.run_dir.rmdir()
            except OSError:
                pass
        os.close(fd)                    # releases the flock

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def take_run_folder(run_dir: Path, accelerator, stack: ExitStack, log) -> None:
    """Rank 0 locks the run folder (creating it) for as long as `stack` is open; every rank raises if it could
    not (another live run holds it, or the folder cannot be written), so none waits on a collective alone."""
    from accelerate.utils import broadcast_object_list

    error = None
    if accelerator.is_main_process:
        try:
            stack.enter_context(RunLock(run_dir, log))
        except UserError as e:
            error = e
    message = broadcast_object_list([str(error) if error else None])[0]
    if error is not None:
        raise error
    if message:
        raise UserError(message)
