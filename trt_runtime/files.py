"""Opening and replacing files safely: the one guarded open, temp names, stale temp cleanup.

Every engine file, ``.pte`` program and cache file trt-runtime reads is opened through
:func:`open_regular`: non-blocking, then refused unless it is a regular file, so a FIFO,
a character device or a socket given as an engine never blocks the caller. Writers
(:func:`trt_runtime.formats.atomic_writer`, the runtime cache's ``atomic_write``) name
their temp files with :func:`temp_name`, which records the writer's pid, and call
:func:`clean_stray_temps` before each write, so temp files of writers that were killed
are removed by the next write to the same path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
import time
from pathlib import Path

from trt_runtime.errors import StorageError

__all__ = [
    "STALE_TEMP_SECONDS",
    "clean_stray_temps",
    "describe_os_error",
    "open_regular",
    "storage_error",
    "temp_name",
]

#: Temp files of writers that died are removed by the next write once their pid is gone,
#: or once they are older than this (a pid may have been reused).
STALE_TEMP_SECONDS = 3600.0

_TEMP_SUFFIX = ".tmp"
_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def describe_os_error(exc: OSError) -> str:
    """``errno N (NAME): message``, for messages that name what the system said."""
    code = exc.errno
    name = errno.errorcode.get(code, "?") if isinstance(code, int) else "?"
    return f"errno {code} ({name}): {exc.strerror or exc}"


def storage_error(action: str, path: str | os.PathLike[str], exc: OSError) -> StorageError:
    """A :class:`StorageError` saying ``could not ACTION PATH: errno N (NAME): ...``."""
    error = StorageError(f"could not {action} {os.fspath(path)}: {describe_os_error(exc)}")
    error.errno, error.strerror, error.filename = exc.errno, exc.strerror, os.fspath(path)
    return error


def open_regular(
    path: str | os.PathLike[str], *, what: str, error: type[Exception], follow_symlinks: bool = True
) -> int:
    """A read-only descriptor of ``path``, refused with ``error`` unless it is a regular file.

    The open never blocks (``O_NONBLOCK``: a FIFO without a writer would block a plain
    ``open``); the caller owns the descriptor. ``OSError`` of the open itself (missing
    file, permissions, ``ELOOP`` with ``follow_symlinks=False``) is raised as is, for the
    caller to translate into its layer's class.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "a special file")
            raise error(f"{what} {os.fspath(path)!r}: it is {kind}, not a regular file")
        with contextlib.suppress(OSError, AttributeError):  # reads of a regular file never block
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def temp_name(path: Path) -> str:
    """A fresh temp file name beside ``path``, recording this process's pid."""
    return f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}{_TEMP_SUFFIX}"


def _temp_pattern(path: Path) -> re.Pattern[str]:
    return re.compile(rf"^\.{re.escape(path.name)}\.(\d+)\.[0-9a-f]+{re.escape(_TEMP_SUFFIX)}$")


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, another user's
        return True
    return True


def clean_stray_temps(path: Path) -> None:
    """Remove temp files of writers of ``path`` that died (their pid is gone, or they are old)."""
    pattern = _temp_pattern(path)
    try:
        names = os.listdir(path.parent)
    except OSError:
        return
    now = time.time()
    for name in names:
        match = pattern.match(name)
        if match is None:
            continue
        candidate = path.parent / name
        try:
            old = now - os.lstat(candidate).st_mtime > STALE_TEMP_SECONDS
            if old or not _pid_alive(int(match.group(1))):
                os.unlink(candidate)  # unlink never follows a symlink
        except OSError:
            continue
