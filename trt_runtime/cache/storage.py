"""Safe storage of a runtime cache file: where it lives, its lock, and atomic replacement.

Everything here is about the file system, not about what the bytes mean: the per-user
cache directory, refusing unsafe locations (symbolic links, directories other users can
write), reading without following links, one file lock per path in a process, and
writing through a temp file that is fsynced and renamed over the cache, so a reader
sees the old file or the new one, never a torn one. Temp files of savers that died are
cleaned up by the next save.

:func:`checkpoint` and :func:`temp_name` are looked up at call time so that tests can
replace them (see ``docs/cache.md``, "Testing hooks").
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trt_runtime.cache.key import CacheKey
from trt_runtime.errors import CacheError, CacheLockTimeout
from trt_runtime.files import (
    STALE_TEMP_SECONDS,
    clean_stray_temps,
    describe_os_error,
    open_regular,
    temp_name,
)
from trt_runtime.validation import path_text

__all__ = [
    "STALE_TEMP_SECONDS",
    "absolute_path",
    "atomic_write",
    "check_directory",
    "checkpoint",
    "clean_stray_temps",
    "default_cache_dir",
    "default_cache_path",
    "describe_os_error",
    "file_name",
    "lock_path",
    "locked",
    "read_file",
    "refuse_symlink",
    "temp_name",
]



# -- default location ---------------------------------------------------------------------
def default_cache_dir(*, create: bool = True) -> Path:
    """The per-user cache directory of trt-runtime (created with mode 0700 if missing,
    unless ``create`` is false: read-only callers such as ``trt-runtime cache info``).

    ``TRT_RUNTIME_CACHE_DIR`` overrides the platform's user cache directory.
    """
    import platformdirs

    override = os.environ.get("TRT_RUNTIME_CACHE_DIR")
    if override:
        directory = Path(override)
    else:
        directory = Path(platformdirs.user_cache_dir("trt-runtime", appauthor=False))
    if create:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return directory


def default_cache_path(key: CacheKey) -> Path:
    """``default_cache_dir() / "runtime-cache-<slug>.bin"``: one file per TensorRT build,
    GPU architecture and driver, so a cache of another stack is never fed to TensorRT."""
    return default_cache_dir() / file_name(key)


def file_name(key: CacheKey) -> str:
    """``runtime-cache-<slug>.bin``: the name of the cache file of ``key``'s stack and GPU
    model in a cache directory (the default one, or one given to ``runtime_cache``)."""
    if not isinstance(key, CacheKey):
        raise TypeError(f"key must be a CacheKey; got {type(key).__name__}")
    return f"runtime-cache-{key.slug()}.bin"


# -- paths and checks ---------------------------------------------------------------------
def checkpoint(point: str, path: Path) -> None:
    """Test hook called at named points of a save ("locked", "written", "replaced")."""


def absolute_path(path: str | os.PathLike[str]) -> Path:
    """``path`` made absolute (``~`` expanded) without resolving symbolic links."""
    text = path_text(path, "runtime cache path")
    # abspath, not resolve(): a symlink at the cache path must stay visible to be refused.
    return Path(os.path.abspath(os.path.expanduser(text)))


def lock_path(path: Path) -> Path:
    """The lock file of the cache at ``path``: ``<path>.lock``."""
    return path.with_name(path.name + ".lock")


def check_directory(directory: Path, path: Path) -> None:
    """Refuse (:class:`CacheError`) a cache directory that is not ours or that others can write."""
    st = os.stat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise CacheError(f"refusing runtime cache {path}: {directory} is not a directory")
    euid = os.geteuid()
    if st.st_uid not in (euid, 0):
        raise CacheError(
            f"refusing runtime cache {path}: its directory {directory} is owned by uid {st.st_uid}, "
            f"expected this user (uid {euid}) or root"
        )
    # World-writable directories (0777, and /tmp's 1777) let any user plant files or links
    # next to the cache. Group-writable ones are allowed: with per-user private groups
    # (umask 002, the default on many Linux distributions) every project directory is 0775.
    if st.st_mode & stat.S_IWOTH:
        raise CacheError(
            f"refusing runtime cache {path}: its directory {directory} is writable by others "
            f"(mode {stat.S_IMODE(st.st_mode):04o}); expected a directory other users cannot write"
        )


def refuse_symlink(path: Path, candidate: Path, what: str) -> None:
    """Refuse (:class:`CacheError`) the cache at ``path`` if ``candidate`` is a symbolic link."""
    if os.path.islink(candidate):
        raise CacheError(f"refusing runtime cache {path}: the {what} {candidate} is a symbolic link")


def read_file(path: Path) -> bytes | None:
    """The bytes of ``path`` (never following a symlink), ``None`` if it does not exist."""
    try:
        fd = open_regular(path, what="refusing runtime cache", error=CacheError, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CacheError(f"refusing runtime cache {path}: the cache path is a symbolic link") from exc
        raise
    with os.fdopen(fd, "rb") as f:
        return f.read()


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):  # some file systems cannot
            raise
    finally:
        os.close(fd)


def atomic_write(path: Path, blob: bytes) -> None:
    """Write ``blob`` to a fresh temp file beside ``path``, fsync it, replace ``path``, fsync the dir."""
    temp = path.parent / temp_name(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(temp, flags, 0o600)
    except FileExistsError as exc:
        if os.path.islink(temp):
            raise CacheError(
                f"refusing runtime cache {path}: the temp path {temp} is a symbolic link"
            ) from exc
        raise CacheError(f"could not save runtime cache to {path}: temp file {temp} already exists") from exc
    except OSError as exc:
        raise CacheError(f"could not save runtime cache to {path}: {describe_os_error(exc)}") from exc
    try:
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        checkpoint("written", path)
        # os.replace would replace a link rather than follow it; refuse anyway, so that a
        # link swapped in during the save is noticed rather than silently overwritten.
        refuse_symlink(path, path, "cache path")
        os.replace(temp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        if isinstance(exc, OSError):
            raise CacheError(f"could not save runtime cache to {path}: {describe_os_error(exc)}") from exc
        raise
    checkpoint("replaced", path)
    try:
        _fsync_directory(path.parent)
    except OSError as exc:
        raise CacheError(
            f"saved runtime cache to {path} but could not fsync its directory: {describe_os_error(exc)}"
        ) from exc


_LOCKS: dict[tuple[int, str], Any] = {}
_LOCKS_GUARD = threading.Lock()


def _forget_locks_after_fork() -> None:
    """In a forked child: the parent's locks (and their guard) are not this process's."""
    global _LOCKS_GUARD
    _LOCKS_GUARD = threading.Lock()
    _LOCKS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_locks_after_fork)


def _file_lock(lock_file: Path) -> Any:
    """One ``FileLock`` per lock path and process, so re-entry from a thread never deadlocks.

    Keyed by pid as well as path, and forgotten in a forked child: a lock object made
    by the parent must never be used by the child (filelock refuses an inherited one).
    """
    import filelock

    key = (os.getpid(), str(lock_file))
    with _LOCKS_GUARD:
        lock = _LOCKS.get(key)
        if lock is None:
            lock = filelock.FileLock(str(lock_file), mode=0o600)
            _LOCKS[key] = lock
        return lock


@contextlib.contextmanager
def locked(path: Path, timeout: float) -> Iterator[None]:
    """Hold the file lock of the cache at ``path`` (re-entrant in one thread).

    Raises :class:`CacheLockTimeout` naming the lock file after ``timeout`` seconds and
    :class:`CacheError` if the lock path is a symbolic link or cannot be opened.
    """
    import filelock

    lock_file = lock_path(path)
    refuse_symlink(path, lock_file, "lock path")
    lock = _file_lock(lock_file)
    try:
        lock.acquire(timeout=timeout)
    except filelock.Timeout as exc:
        raise CacheLockTimeout(
            f"could not lock runtime cache {path}: the lock file {lock_file} was held by another "
            f"process for more than {timeout:g} s; the cache stays in memory, retry later"
        ) from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CacheError(
                f"refusing runtime cache {path}: the lock path {lock_file} is a symbolic link"
            ) from exc
        raise CacheError(
            f"could not lock runtime cache {path} ({lock_file}): {describe_os_error(exc)}"
        ) from exc
    try:
        yield
    finally:
        lock.release()

