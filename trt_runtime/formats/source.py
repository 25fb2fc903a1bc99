"""Opening engine inputs without copies, and writing files atomically.

Paths go through :func:`trt_runtime.files.open_regular`: a FIFO, device or socket is
refused with :class:`FormatError` instead of blocking. Paths and real files are
memory-mapped read-only: the returned ``memoryview`` keeps
the mapping alive, and slicing it never copies, so a multi-GiB engine costs address
space, not RAM. Bytes-like inputs are used as given; file objects that cannot be
mapped (no descriptor, or not at position 0) are read from their position.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, BinaryIO

from trt_runtime.errors import FormatError, StorageError
from trt_runtime.files import clean_stray_temps, open_regular, storage_error, temp_name

__all__ = [
    "CHUNK_SIZE",
    "EngineData",
    "EngineInput",
    "atomic_writer",
    "engine_view",
    "open_buffer",
    "open_engine_file",
    "output_stream",
    "write_chunks",
]

#: What :func:`trt_runtime.load` and :func:`~trt_runtime.formats.read_engine_source` accept
#: besides paths and binary file objects.
EngineInput = bytes | bytearray | memoryview

#: Engine bytes handed to a writer: bytes-like, or a path whose file is streamed.
EngineData = bytes | bytearray | memoryview | str | os.PathLike[str]

#: Writers stream large buffers in slices of this many bytes.
CHUNK_SIZE = 16 * 1024 * 1024


def _mmap_fd(fd: int, what: str) -> memoryview:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise FormatError(f"{what} is not a regular file; expected a serialized engine, blob or program")
    if st.st_size == 0:
        raise FormatError(f"{what} is empty (0 bytes); expected a serialized engine, blob or program")
    return memoryview(mmap.mmap(fd, 0, access=mmap.ACCESS_READ))


def open_engine_file(path: str | os.PathLike[str]) -> int:
    """A read-only descriptor of the engine file ``path``; the one way engine files are opened.

    Anything but a regular file (FIFO, device, socket, directory) and every ``OSError``
    raise :class:`FormatError` naming the path; the open never blocks.
    """
    text = os.fsdecode(os.fspath(path))
    try:
        return open_regular(text, what="cannot read engine file", error=FormatError)
    except FormatError:
        raise
    except OSError as exc:
        raise FormatError(f"cannot read engine file {text!r}: {exc.strerror or exc}") from exc
    except ValueError as exc:  # a NUL byte in the path
        raise FormatError(f"cannot read engine file {text!r}: {exc}") from exc


def open_buffer(source: Any) -> tuple[memoryview, str]:
    """A read-only byte view of ``source`` and a display name for it.

    ``source`` is bytes-like, a path (``str`` / ``os.PathLike``) or a binary file
    object. Paths and files with a descriptor are memory-mapped (no copy); other file
    objects are read from their current position.
    """
    if isinstance(source, (bytes, bytearray, memoryview, mmap.mmap)):
        view = memoryview(source)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        return view, "engine"
    if isinstance(source, (str, os.PathLike)):
        path = os.fsdecode(os.fspath(source))
        fd = open_engine_file(path)
        try:
            return _mmap_fd(fd, f"file {path!r}"), os.path.basename(path) or "engine"
        except OSError as exc:
            raise FormatError(f"cannot read engine file {path!r}: {exc.strerror or exc}") from exc
        finally:
            os.close(fd)  # the mapping holds its own reference
    read = getattr(source, "read", None)
    if read is None:
        raise FormatError(
            "engine source must be bytes, bytearray, memoryview, a path or a binary file object; "
            f"got {type(source).__name__}"
        )
    name = os.path.basename(str(getattr(source, "name", "") or "")) or "engine"
    fileno = None
    with contextlib.suppress(OSError, AttributeError, ValueError, io.UnsupportedOperation):
        fileno = source.fileno()
    if fileno is not None:
        with contextlib.suppress(OSError, AttributeError, ValueError, io.UnsupportedOperation):
            if source.tell() == 0:
                return _mmap_fd(fileno, f"file {name!r}"), name
    data = read()
    if isinstance(data, str):
        raise FormatError(f"file object {name!r} is in text mode; open it with 'rb'")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise FormatError(f"file object {name!r} read() returned {type(data).__name__}, not bytes")
    return memoryview(data).cast("B"), name


@contextlib.contextmanager
def engine_view(data: EngineData) -> Iterator[memoryview]:
    """A byte view of writer input ``data``; a path is memory-mapped while in use."""
    if isinstance(data, (str, os.PathLike)):
        with os.fdopen(open_engine_file(data), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                yield memoryview(b"")
                return
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                view = memoryview(mapped)
                try:
                    yield view
                finally:
                    view.release()
        return
    if isinstance(data, (bytes, bytearray, memoryview, mmap.mmap)):
        view = memoryview(data)
        yield view if (view.ndim == 1 and view.itemsize == 1) else view.cast("B")
        return
    raise TypeError(f"engine data must be bytes-like or a path; got {type(data).__name__}")


def write_chunks(out: IO[bytes] | BinaryIO, view: memoryview, chunk_size: int = CHUNK_SIZE) -> None:
    """Write ``view`` to ``out`` in slices (slicing a memoryview copies nothing)."""
    for start in range(0, len(view), chunk_size):
        out.write(view[start : start + chunk_size])


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Yield a temporary file next to ``path``; on success fsync it and ``os.replace`` it.

    Readers see either the old file or the complete new one, never a partial write.
    On error the temporary file is removed and ``path`` is untouched; a disk error
    (``ENOSPC``, ``EIO``, ...) raises :class:`StorageError` naming ``path`` and the errno.
    Temp files are named ``.NAME.PID.HEX.tmp``: those of writers that were killed are
    removed by the next write to ``path``.
    """
    target = Path(os.path.abspath(os.fspath(path)))
    clean_stray_temps(target)
    tmp = target.parent / temp_name(target)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, 0o644)
    except OSError as exc:
        raise storage_error("write", target, exc) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            yield f  # type: ignore[misc]
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, StorageError):
            raise storage_error("write", target, exc) from exc
        raise
    with contextlib.suppress(OSError):  # some filesystems refuse to open directories
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


@contextlib.contextmanager
def output_stream(target: str | os.PathLike[str] | IO[bytes]) -> Iterator[IO[bytes]]:
    """An atomic writer for a path, or ``target`` itself for a binary file object."""
    if isinstance(target, (str, os.PathLike)):
        with atomic_writer(target) as f:
            yield f
    else:
        if not hasattr(target, "write"):
            raise TypeError(f"expected a path or a binary file object; got {type(target).__name__}")
        yield target
