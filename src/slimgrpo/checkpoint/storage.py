"""Writing a folder of weights safely: into a hidden temporary folder, renamed into place when complete,
and a full disk reported as the storage error it is.

safetensors reports a failed write as ``SafetensorError`` (not ``OSError``) whose text carries the OS
message ("No space left on device (os error 28)"); :func:`as_os_error` turns that back into an
``OSError`` with its errno and the folder being written, so the CLI prints one sentence and exits 2
instead of calling it an internal error.
"""

from __future__ import annotations

import errno
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

# Text of the OS errors safetensors (and other libraries) wrap, and the errno each one stands for.
_WRAPPED = (
    (("no space left on device", "os error 28"), errno.ENOSPC),
    (("disk quota exceeded", "os error 122"), errno.EDQUOT),
    (("read-only file system", "os error 30"), errno.EROFS),
    (("permission denied", "os error 13"), errno.EACCES),
)


def as_os_error(e: BaseException, folder: Path) -> OSError | None:
    """The storage error behind ``e`` while writing ``folder``, or None when ``e`` is not one.

    Either way the result names ``folder`` (the file inside the temporary folder is gone by the time
    the user reads the message): ``OSError(errno, strerror, folder)``."""
    if isinstance(e, OSError) and e.errno is not None:
        return OSError(e.errno, e.strerror or os.strerror(e.errno), str(folder))
    text = str(e).lower()
    for needles, code in _WRAPPED:
        if any(n in text for n in needles):
            return OSError(code, os.strerror(code), str(folder))
    return None


@contextmanager
def write_folder_atomically(final: Path, install: Callable[[Path, Path], None] | None = None) -> Iterator[Path]:
    """Yield a hidden temporary folder beside ``final``; once the body finishes, ``install(tmp, final)``
    puts it in place (default ``replace_folder``: a rename; checkpoints add their marker and pruning).

    If the body fails, the temporary folder is removed and ``final`` (an older copy, if any) is left as
    it was; a storage failure is re-raised as an ``OSError`` naming ``final``. ``final`` is a folder
    slimgrpo owns (a run's ``final/``, a checkpoint): an older copy there is replaced as a whole."""
    final = Path(final)
    tmp = final.parent / f".tmp-{final.name}"
    if tmp.exists():  # left by a run killed while writing: never a complete copy
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        storage = as_os_error(e, final) if isinstance(e, Exception) else None
        if storage is not None:
            raise storage from e
        raise
    (install or replace_folder)(tmp, final)


def replace_folder(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` to ``final``; an existing ``final`` is moved aside first and removed last."""
    if final.exists():
        old = final.parent / f".old-{final.name}"
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
