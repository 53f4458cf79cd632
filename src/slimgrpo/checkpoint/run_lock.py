"""One writer per run folder: an exclusive lock file held for the whole run.

``OUTPUT_DIR/.slimgrpo.lock`` is locked with ``flock(LOCK_EX | LOCK_NB)`` and records who holds it
(pid, host, start time, command) as JSON. The kernel drops the lock when the holder exits in any way
(return, exception, SIGKILL, power cut of the process), so a lock file left by a dead process does
not block the next run: it is taken over with a warning naming the dead holder. Only rank 0 of a
torchrun job takes the lock; the other ranks learn the outcome through the usual collective vote, so
none of them waits for a lock it will never get.

On file systems without ``flock`` (some network mounts) the recorded pid is checked instead: a lock of
a live process on this host, or of any process on another host, is respected; the record of a dead
process on this host is taken over.
"""

from __future__ import annotations

import datetime as _dt
import errno
import json
import logging
import os
import socket
import sys
from pathlib import Path

from slimgrpo.config.errors import ConfigError

log = logging.getLogger("slimgrpo")

LOCK_NAME = ".slimgrpo.lock"

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


class RunFolderError(ConfigError):
    """The run folder cannot be used: held by another run, not a folder, not writable, or holding a run
    that this configuration would overwrite or cannot continue."""


class RunLockedError(RunFolderError):
    """Another live process holds the run folder's lock."""

    def __init__(self, message: str, holder: dict):
        super().__init__(message)
        self.holder = holder


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return False
    return True


def _read_holder(path: Path) -> dict:
    try:
        data = json.loads(path.read_text() or "{}")
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def describe_holder(holder: dict) -> str:
    pid, host, since = holder.get("pid", "?"), holder.get("host", "?"), holder.get("started", "?")
    text = f"pid {pid} on host {host}, started {since}"
    if holder.get("command"):
        text += f" ({holder['command']})"
    return text


class RunLock:
    """``RunLock(folder).acquire()``; ``release()`` (idempotent; also run when the object is collected)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> "RunLock":
        if self._fd is not None:
            return self
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise folder_error(self.folder, e) from None
        previous = _read_holder(self.path)
        try:
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = _read_holder(self.path)
                    raise RunLockedError(_locked_message(self.folder, holder), holder) from None
                except OSError as e:  # ENOLCK etc.: no flock on this file system; fall back to the record
                    if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                        raise
                    self._check_record(previous)
            else:  # pragma: no cover
                self._check_record(previous)
            if previous.get("pid") and previous.get("pid") != os.getpid():
                log.warning("run folder %s: taking over the lock left by %s, which is no longer running",
                            self.folder, describe_holder(previous))
            record = {
                "pid": os.getpid(), "host": socket.gethostname(),
                "started": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
                "command": " ".join(Path(sys.argv[0]).name.split() + sys.argv[1:])[:300] if sys.argv else "",
            }
            from slimgrpo.redact import scrub_text

            record["command"] = scrub_text(record["command"])
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(record).encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def _check_record(self, holder: dict) -> None:
        pid, host = holder.get("pid"), holder.get("host")
        if not pid or pid == os.getpid():
            return
        if host != socket.gethostname() or _pid_alive(int(pid)):
            raise RunLockedError(_locked_message(self.folder, holder), holder)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)  # no holder recorded: nothing for the next run to warn about
        except OSError:
            pass
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError:
            pass
        os.close(fd)

    def __del__(self):  # a Trainer dropped without finishing still frees the folder
        try:
            self.release()
        except Exception:
            pass

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _locked_message(folder: Path, holder: dict) -> str:
    who = describe_holder(holder) if holder else "another process (its record is unreadable)"
    return (f"run folder {folder} is in use by {who}: two runs writing one folder corrupt each other's "
            "checkpoints and metrics. Wait for that run to finish (or stop it), or give this run another "
            "run.output_dir.")


def folder_error(folder: Path, e: OSError) -> RunFolderError:
    """An OSError met while preparing the run folder, as a message naming the folder and the fix."""
    if e.errno in (errno.EROFS,):
        why = "it is on a read-only file system"
    elif e.errno in (errno.EACCES, errno.EPERM):
        why = "permission denied"
    elif e.errno in (errno.ENOSPC, errno.EDQUOT):
        why = "the disk is full"
    elif e.errno == errno.ENOTDIR:
        why = "a part of the path is a file, not a folder"
    else:
        why = e.strerror or str(e)
    return RunFolderError(f"cannot write to the run folder {folder} (run.output_dir): {why}. "
                          "Choose a writable folder with run.output_dir=PATH.")
