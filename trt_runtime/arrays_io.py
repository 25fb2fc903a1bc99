"""``.npy`` and ``.npz`` arrays read without inflating blindly: headers first, data last.

Shared by the command line (``--input``, ``--load-inputs``, ``--compare``) and the HTTP
codec of :mod:`trt_runtime.serve`. Nothing is unpickled. For an ``.npy`` the header
(dtype, shape, order) is read and must agree with the data's size before an array is
made. For an ``.npz``, only the zip directory is read up front: member names (each must
be ``NAME.npy``), declared sizes and compression ratios are checked against a byte
budget, members the caller does not want are never decompressed, and each wanted
member's header is read (a few hundred bytes inflated) and handed to the caller's check
before its data is inflated, in 1 MiB pieces straight into the array.

Errors: :class:`~trt_runtime.FormatError` for a malformed file or member and its
subclass :class:`~trt_runtime.ArraySizeError` for one over the budget, each one line
naming the file (``what``) and the member. numpy is imported when called.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import zipfile
from collections.abc import Callable, Collection
from typing import IO, Any

from trt_runtime.errors import ArraySizeError, FormatError
from trt_runtime.files import open_regular

__all__ = [
    "DEFAULT_MAX_BYTES",
    "MAX_COMPRESSION_RATIO",
    "NPY_MAGIC",
    "NpyHeader",
    "npy_bytes",
    "npz_members",
    "open_npz",
    "read_npy",
    "read_npy_file",
    "read_npz",
]

NPY_MAGIC = b"\x93NUMPY"
#: Budget of an archive's wanted members, in inflated bytes, unless the caller gives one.
DEFAULT_MAX_BYTES = 8 * 2**30
#: Deflate (what ``numpy.savez_compressed`` writes) cannot exceed about 1032:1; a member
#: claiming more is a bomb of another compression method or a lie.
MAX_COMPRESSION_RATIO = 1100
_HEADER_LIMIT = 10_000  # numpy's own default bound on an .npy header
_PIECE = 1 << 20

#: ``check(member name without .npy, header)``: raise to refuse a member before its data is read.
HeaderCheck = Callable[[str, "NpyHeader"], None]


@dataclasses.dataclass(frozen=True, slots=True)
class NpyHeader:
    """What an ``.npy`` header says: dtype, shape, Fortran order and where the data starts."""

    dtype: Any  # numpy.dtype
    shape: tuple[int, ...]
    fortran: bool
    offset: int

    @property
    def count(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.count * int(self.dtype.itemsize)


def _read_header(stream: IO[bytes], what: str) -> NpyHeader:
    from numpy.lib import format as npy

    start = stream.tell() if stream.seekable() else 0
    try:
        version = npy.read_magic(stream)
        reader = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
        shape, fortran, dtype = reader(stream, max_header_size=_HEADER_LIMIT)
    except Exception as exc:  # ValueError, SyntaxError, TypeError, RecursionError of a hostile header
        detail = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise FormatError(f"{what} is not a valid .npy array: {detail}") from None
    if dtype.hasobject:
        raise FormatError(f"{what}: .npy arrays of Python objects are refused (dtype {dtype})")
    offset = (stream.tell() - start) if stream.seekable() else len(NPY_MAGIC) + 2
    return NpyHeader(dtype, tuple(int(d) for d in shape), bool(fortran), offset)


def _empty(header: NpyHeader) -> Any:
    import numpy as np

    return np.empty(header.shape, dtype=header.dtype, order="F" if header.fortran else "C")


def _native(array: Any) -> Any:
    return array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))


#: Parsed ``.npy`` headers by their exact bytes, and ``.npy`` headers written, by (dtype, shape):
#: a server reads and writes the same few headers again and again, and numpy parses each with
#: ``ast.literal_eval`` (a third of a small request's decode). Bounded; only good headers enter.
_READ_HEADERS: dict[bytes, NpyHeader] = {}
_WRITTEN_HEADERS: dict[tuple[str, tuple[int, ...]], bytes] = {}
_HEADERS_KEPT = 256
_LENGTHS = {1: (8, 2), 2: (8, 4), 3: (8, 4)}  # major version: where the header length is, its size


def _header_end(data: bytes | memoryview) -> int:
    """Where the header of well-formed ``.npy`` bytes ends; 0 when unsure (the full parse decides)."""
    if len(data) < 12 or bytes(data[:6]) != NPY_MAGIC or data[6] not in _LENGTHS:
        return 0
    at, size = _LENGTHS[data[6]]
    end = at + size + int.from_bytes(data[at:at + size], "little")
    return end if end <= min(len(data), _HEADER_LIMIT + 12) else 0


def _remember(cache: dict[Any, Any], key: Any, value: Any) -> None:
    if len(cache) >= _HEADERS_KEPT:
        cache.clear()
    cache[key] = value


def read_npy(data: bytes | memoryview, what: str) -> Any:
    """The array of ``.npy`` bytes (a view of them when native), header checked against the size."""
    import numpy as np

    end = _header_end(data)
    key = bytes(data[:end]) if end else b""
    header = _READ_HEADERS.get(key) if end else None
    if header is None:
        stream = io.BytesIO(data)
        header = _read_header(stream, what)
        if end and stream.tell() == end == header.offset:
            _remember(_READ_HEADERS, key, header)
    payload = memoryview(data)[header.offset:]
    if header.nbytes != len(payload):
        raise FormatError(
            f"{what}: .npy header says shape {list(header.shape)} of {header.dtype} ({header.nbytes} bytes); "
            f"the data has {len(payload)} bytes"
        )
    array = np.frombuffer(payload, dtype=header.dtype, count=header.count)
    array = array.reshape(header.shape[::-1]).T if header.fortran else array.reshape(header.shape)
    return _native(array)


def npy_bytes(array: Any) -> bytes:
    """``numpy.save``'s bytes of ``array`` (no pickles), with the header of a (dtype, shape) seen
    before taken from a small cache."""
    import numpy as np

    dtype = array.dtype
    plain = (dtype.names is None and dtype.subdtype is None and not dtype.hasobject and dtype.metadata is None
             and isinstance(array, np.ndarray) and array.flags.c_contiguous)
    key = (dtype.str, array.shape)
    header = _WRITTEN_HEADERS.get(key) if plain else None
    if header is not None:
        return header + array.tobytes()
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    data = buffer.getvalue()
    end = _header_end(data)
    if plain and end and len(data) - end == array.nbytes:
        _remember(_WRITTEN_HEADERS, key, data[:end])
    return data


def read_npy_file(path: str | os.PathLike[str], what: str, check: HeaderCheck | None = None) -> Any:
    """The array of an ``.npy`` file (never a FIFO), its header checked before the data is read."""
    fd = open_regular(path, what=what, error=FormatError)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(fd).st_size
        header = _read_header(f, what)
        if header.nbytes != size - f.tell():
            raise FormatError(
                f"{what}: .npy header says shape {list(header.shape)} of {header.dtype} "
                f"({header.nbytes} bytes); the file holds {size - f.tell()} bytes of data"
            )
        if check is not None:
            check(os.path.basename(os.fspath(path)), header)
        return _fill(f, header, what)


def _fill(stream: IO[bytes], header: NpyHeader, what: str) -> Any:
    import numpy as np

    array = _empty(header)
    view = memoryview(array.reshape(-1, order="A").view(np.uint8)) if header.nbytes else memoryview(b"")
    done = 0
    while done < header.nbytes:
        piece = stream.read(min(_PIECE, header.nbytes - done))
        if not piece:
            raise FormatError(f"{what}: the data ends after {done} of {header.nbytes} bytes")
        view[done:done + len(piece)] = piece
        done += len(piece)
    return _native(array)


def open_npz(source: str | os.PathLike[str] | bytes, what: str) -> zipfile.ZipFile:
    """The zip directory of an ``.npz`` (a path, never a FIFO, or bytes); nothing is inflated."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        stream: IO[bytes] = io.BytesIO(source)
    else:
        stream = os.fdopen(open_regular(source, what=what, error=FormatError), "rb")
    head = stream.read(len(NPY_MAGIC))
    stream.seek(0)
    if head == NPY_MAGIC:
        stream.close()
        raise FormatError(f"{what} is not an .npz file of named arrays (numpy.savez): it holds one array")
    try:
        return zipfile.ZipFile(stream)
    except Exception as exc:  # BadZipFile, ValueError, OSError, EOFError of a broken directory
        stream.close()
        raise FormatError(f"{what} is not a valid .npz archive (numpy.savez): {exc}") from None


def npz_members(archive: zipfile.ZipFile, what: str) -> dict[str, zipfile.ZipInfo]:
    """The members of an ``.npz`` by array name; one line naming a member that is not ``NAME.npy``."""
    members: dict[str, zipfile.ZipInfo] = {}
    for info in archive.infolist():
        if not info.filename.endswith(".npy") or info.is_dir():
            raise FormatError(f"{what}: member {info.filename!r} is not an .npy array (expected NAME.npy)")
        members[info.filename[: -len(".npy")]] = info
    return members


def read_npz(
    source: str | os.PathLike[str] | bytes,
    what: str,
    *,
    names: Collection[str] | None = None,
    check: HeaderCheck | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> dict[str, Any]:
    """The arrays of an ``.npz`` (a path or bytes) by name: only those in ``names`` (all if
    ``None``), within ``max_bytes`` inflated; ``check`` sees each header before its data."""
    with open_npz(source, what) as archive:
        members = npz_members(archive, what)
        wanted = {n: i for n, i in members.items() if names is None or n in names}
        total = sum(i.file_size for i in wanted.values())
        if total > max_bytes:
            raise ArraySizeError(f"{what} unpacks to {total} bytes, over the limit of {max_bytes} bytes")
        arrays = {}
        for name, info in wanted.items():
            member = f"{what}: member {info.filename!r}"
            ratio_limit = MAX_COMPRESSION_RATIO * max(info.compress_size, 1)
            if info.file_size > _PIECE and info.file_size > ratio_limit:
                raise ArraySizeError(f"{member} claims {info.file_size} bytes from {info.compress_size} "
                                     f"compressed, a ratio over {MAX_COMPRESSION_RATIO}:1")
            try:
                with archive.open(info) as stream:
                    header = _read_header(stream, member)
                    if header.offset + header.nbytes != info.file_size:
                        raise FormatError(
                            f"{member}: .npy header says shape {list(header.shape)} of {header.dtype} "
                            f"({header.nbytes} bytes); the member holds {info.file_size - header.offset}"
                        )
                    if check is not None:
                        check(name, header)
                    arrays[name] = _fill(stream, header, member)
            except (zipfile.BadZipFile, NotImplementedError, OSError, EOFError, RuntimeError) as exc:
                raise FormatError(f"{member} cannot be read: {exc}") from None
        return arrays
