"""Moving tensors between a front process and an engine process: shared memory plus small frames.

Each front owns one :class:`Slab`, a file in ``/dev/shm`` (the temporary directory when that
is missing or small)
mapped by the front and by every engine process it talks to, cut into fixed-size slots.
A request's input arrays are written once into a free slot; the engine process answers
into the same slot. What crosses the unix socket is only a :data:`HEADER` (payload length,
request id, slot, status) and a few bytes describing the arrays (dtype, shape, size):
nothing is pickled. An array set that does not fit a slot, or a request that finds every
slot taken, travels inline after the description instead.

Status 0 is an answer (or a request); any other status is the HTTP status of a refusal
and the payload is its UTF-8 message. :data:`HELLO` opens a connection: its payload is
the slab's path and slot geometry.

Frames are gathered both ways: a :class:`FrameWriter` queues the frames of one pass of the
event loop and sends them with one write (the answers of a whole batch to one front, the
requests a front took in one pass), and a :class:`FrameProtocol` (a front's, or an engine
process's :class:`~trt_runtime.serve.local.engine_process.FrontLink`) hands over every complete
frame of what the socket held, from the loop's read callback. Per request, the hop costs no
syscall of its own.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trt_runtime.errors import InputError, SettingsError

__all__ = [
    "HEADER",
    "HELLO",
    "NO_SLOT",
    "Layout",
    "FrameProtocol",
    "FrameWriter",
    "Slab",
    "decode_arrays",
    "describe",
    "encode_arrays",
    "gather",
    "scatter",
    "shm_dir",
    "slot_layout",
    "split_frames",
]

#: ``(payload bytes, request id, slot, status)`` before every payload.
HEADER = struct.Struct("<IIIi")
#: The slot of a message whose arrays travel inline.
NO_SLOT = 0xFFFFFFFF
#: The status of the first frame a front sends on a connection (payload: :meth:`Slab.hello`).
HELLO = -1
_META = struct.Struct("<B8sQ")  # per array: ndim, dtype string ("<f2"), bytes; then ndim int64 dims
_DIMS = [struct.Struct(f"<{n}q") for n in range(33)]  # numpy arrays have at most 32 (64 on numpy 2) dims
_DTYPES: dict[bytes, Any] = {}
# One array's description by (dtype, shape), and what a description read says, by its bytes: a
# server moves arrays of the same few dtypes and shapes again and again.
_DESCRIBED: dict[tuple[Any, tuple[int, ...]], bytes] = {}
_READ: dict[bytes, tuple[Any, tuple[int, ...], int]] = {}
_KEPT = 256
_ALIGN = 64
_HELLO = struct.Struct("<II")  # slots, slot bytes; then the path


#: ``/dev/shm`` must have this much room, else slabs go to the temporary directory: a page
#: written past a full tmpfs kills the writer with SIGBUS (containers often give it 64 MiB).
SHM_MIN_FREE = 256 * 1024 * 1024


def shm_dir() -> Path:
    """Where slabs live: ``/dev/shm`` (memory, never disk) when it is writable and roomy, else
    the temporary directory."""
    import tempfile

    shm = Path("/dev/shm")
    try:
        stat = os.statvfs(shm)
        roomy = stat.f_bavail * stat.f_frsize >= SHM_MIN_FREE and os.access(shm, os.W_OK)
    except OSError:
        roomy = False
    return shm if roomy else Path(tempfile.gettempdir())


class Slab:
    """``slots`` slots of ``slot_bytes`` each in one shared file; the owner hands slots out.

    The creating process (``create``) owns the file and removes it in :meth:`close`; an
    attaching process (``attach``) only maps it. Slot bookkeeping is the owner's, on one
    event loop (not thread-safe).
    """

    def __init__(self, path: Path, slots: int, slot_bytes: int, *, owner: bool) -> None:
        self.path = path
        self.slots = slots
        self.slot_bytes = slot_bytes
        self._owner = owner
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), slots * slot_bytes)
        self.view = memoryview(self._map)
        self._rows: Any = None  # rows(), made on first use
        self._free = list(range(slots - 1, -1, -1)) if owner else []

    @classmethod
    def create(cls, path: Path, slots: int = 256, slot_bytes: int = 64 * 1024) -> Slab:
        if slots < 1 or slot_bytes < _ALIGN or slot_bytes % _ALIGN:
            raise SettingsError(f"a slab needs slots >= 1 and slot_bytes a multiple of {_ALIGN}; "
                             f"got {slots} slots of {slot_bytes} bytes")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, slots * slot_bytes)  # sparse: pages exist once written
        finally:
            os.close(fd)
        return cls(path, slots, slot_bytes, owner=True)

    @classmethod
    def attach(cls, hello: bytes) -> Slab:
        """Map the slab a :meth:`hello` payload names."""
        slots, slot_bytes = _HELLO.unpack_from(hello)
        return cls(Path(bytes(hello[_HELLO.size:]).decode()), slots, slot_bytes, owner=False)

    def hello(self) -> bytes:
        return _HELLO.pack(self.slots, self.slot_bytes) + os.fsencode(self.path)

    def take(self) -> int:
        """A free slot, or :data:`NO_SLOT` when every slot is in use."""
        return self._free.pop() if self._free else NO_SLOT

    def give(self, slot: int) -> None:
        if slot != NO_SLOT:
            self._free.append(slot)

    def slot(self, index: int) -> memoryview:
        start = index * self.slot_bytes
        return self.view[start:start + self.slot_bytes]

    def rows(self) -> Any:
        """The slab as a writable ``numpy.uint8`` array of ``(slots, slot_bytes)``: one slot per
        row, so a list of slots is read or written in one indexing (:func:`gather`, :func:`scatter`)."""
        if self._rows is None:
            import numpy as np

            self._rows = np.frombuffer(self._map, np.uint8).reshape(self.slots, self.slot_bytes)
        return self._rows

    def close(self) -> None:
        """Unmap; the owner also removes the file. Idempotent."""
        if self._map.closed:
            return
        self._rows = None
        self.view.release()
        try:
            self._map.close()
        except BufferError:  # an array still views the map: leave it to the process's exit
            pass
        if self._owner:
            self.path.unlink(missing_ok=True)


def _padded(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def describe(arrays: Sequence[Any]) -> tuple[bytes, list[Any], int]:
    """``(description, the arrays C-contiguous, the bytes they take in a slot)``; ``InputError``
    for an array that cannot cross (not numeric)."""
    import numpy as np

    parts = [bytes((len(arrays),))]
    total = 0
    contiguous = []
    for array in arrays:
        a = array
        if type(a) is not np.ndarray or not a.flags.c_contiguous:
            a = np.asarray(array, order="C")  # ascontiguousarray would make a 0-d array 1-d
        key = (a.dtype, a.shape)
        meta = _DESCRIBED.get(key)
        if meta is None:
            code = a.dtype.str.encode()
            if len(code) > 8 or a.dtype.hasobject:
                raise InputError(f"arrays of dtype {a.dtype} cannot be shared; expected a numeric dtype")
            meta = _META.pack(a.ndim, code, a.nbytes) + _DIMS[a.ndim].pack(*a.shape)
            if len(_DESCRIBED) < _KEPT:
                _DESCRIBED[key] = meta
        contiguous.append(a)
        parts.append(meta)
        total += _padded(a.nbytes)
    return b"".join(parts), contiguous, total


def encode_arrays(arrays: Sequence[Any], slot: memoryview | None) -> tuple[bytes, list[Any]]:
    """``(description, inline buffers)``: the arrays go into ``slot`` when it holds them all.

    Returns no inline buffers when the data went into the slot; else the buffers to send
    after the description, in order.
    """
    description, contiguous, total = describe(arrays)
    if slot is None or total > len(slot):
        return description, [memoryview(a).cast("B") for a in contiguous if a.nbytes]  # type: ignore[arg-type]
    offset = 0
    for a in contiguous:
        if a.nbytes:
            slot[offset:offset + a.nbytes] = memoryview(a).cast("B")  # type: ignore[arg-type]
        offset += _padded(a.nbytes)
    return description, []


def _dtype(code: bytes) -> Any:
    dtype = _DTYPES.get(code)
    if dtype is None:
        import numpy as np

        dtype = _DTYPES[code] = np.dtype(code.rstrip(b"\0").decode())
    return dtype


def _read_metas(payload: bytes | memoryview) -> tuple[list[tuple[Any, tuple[int, ...], int]], int]:
    """Each array's ``(dtype, shape, bytes)`` from a description, and where the description ends."""
    count = payload[0]
    pos = 1
    metas = []
    for _ in range(count):
        ndim = payload[pos]
        end = pos + _META.size + 8 * ndim
        key = bytes(payload[pos:end])
        meta = _READ.get(key)
        if meta is None:
            _ndim, code, nbytes = _META.unpack_from(payload, pos)
            meta = (_dtype(code), _DIMS[ndim].unpack_from(payload, pos + _META.size), nbytes)
            if len(_READ) < _KEPT:
                _READ[key] = meta
        metas.append(meta)
        pos = end
    return metas, pos


def decode_arrays(payload: bytes | memoryview, slot: memoryview | None) -> list[Any]:
    """The arrays a payload describes, copied out of ``slot`` or out of the inline bytes."""
    import numpy as np

    metas, pos = _read_metas(payload)
    arrays = []
    inline = slot is None
    source = payload if inline else slot
    offset = pos if inline else 0
    assert source is not None
    for dtype, shape, nbytes in metas:
        if nbytes:
            flat = np.frombuffer(source, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset)
            arrays.append(flat.reshape(shape).copy())
        else:
            arrays.append(np.empty(shape, dtype))
        offset += nbytes if inline else _padded(nbytes)
    return arrays


#: Where each array of a request sits in its slot: ``(dtype, shape, bytes, offset)`` per array.
Layout = tuple[tuple[Any, tuple[int, ...], int, int], ...]


def slot_layout(description: bytes | memoryview, slot_bytes: int) -> Layout | None:
    """The layout of a description's arrays in a slot, for :func:`gather`; ``None`` when they
    cannot be gathered by rows: an array with no rows or no batch axis, or arrays whose row counts
    differ, or that do not fit ``slot_bytes``."""
    metas, _end = _read_metas(memoryview(description))
    layout = []
    offset = 0
    for dtype, shape, nbytes in metas:
        if not shape or not nbytes or shape[0] != metas[0][1][0]:
            return None
        layout.append((dtype, shape, nbytes, offset))
        offset += _padded(nbytes)
    return tuple(layout) if layout and offset <= slot_bytes else None


def gather(rows: Any, slots: Any, layout: Layout) -> tuple[Any, ...]:
    """The arrays of the requests in ``slots`` (an index array into :meth:`Slab.rows`), all laid out
    as ``layout`` says, packed along the batch axis: one copy per array for all of them. One
    request (``slots`` a slot number) gets views of its slot, no copy: a batch of several copies
    them together, and a call of that request alone reads them before its answer goes into the
    same slot."""
    if isinstance(slots, int):
        row = rows[slots]
        return tuple([row[offset:offset + nbytes].view(dtype).reshape(shape)
                      for dtype, shape, nbytes, offset in layout])
    count = len(slots)
    return tuple(
        rows[slots, offset:offset + nbytes].view(dtype).reshape((count * shape[0], *shape[1:]))
        for dtype, shape, nbytes, offset in layout
    )


#: One request's answer described, by its outputs' ``(dtype, shape)``: ``(description, bytes in a slot)``.
_ANSWERS: dict[tuple[tuple[Any, tuple[int, ...]], ...], tuple[bytes, int]] = {}


def scatter(rows: Any, slots: Any, outputs: Sequence[Any], slot_bytes: int) -> bytes | None:
    """Write ``outputs`` (each of ``len(slots)`` equal parts along its first axis, one per request)
    into the requests' slots, one copy per output; the description of one request's part (the same
    for each), or ``None`` when a part does not fit a slot (nothing written). ``slots`` a slot
    number: one request, whose outputs are all of it. ``InputError`` for an output that cannot
    cross."""
    import numpy as np

    one = isinstance(slots, int)
    parts = outputs if one else [o[:o.shape[0] // len(slots)] for o in outputs]
    key = tuple([(o.dtype, o.shape) for o in parts])
    known = _ANSWERS.get(key)
    if known is None:
        description, _contiguous, total = describe(parts)  # (checks each output can cross)
        known = (description, total)
        if len(_ANSWERS) >= _KEPT:
            _ANSWERS.clear()
        _ANSWERS[key] = known
    description, total = known
    if total > slot_bytes:
        return None
    offset = 0
    row: Any = rows[slots] if one else None
    for o, part in zip(outputs, parts, strict=True):
        n = part.nbytes
        if n:
            flat = np.ascontiguousarray(o).view(np.uint8)
            if one:
                row[offset:offset + n] = flat.reshape(-1)
            else:
                rows[slots, offset:offset + n] = flat.reshape(len(slots), -1)
        offset += _padded(n)
    return description


#: One frame as read: ``(request id, slot, status, payload)``.
Frame = tuple[int, int, int, bytes]


def split_frames(buffer: bytes | bytearray) -> tuple[list[Frame], int]:
    """The complete frames at the start of ``buffer`` (payloads copied out of it) and how many
    bytes they take."""
    frames: list[Frame] = []
    pos, end = 0, len(buffer)
    while end - pos >= HEADER.size:
        length, request_id, slot, status = HEADER.unpack_from(buffer, pos)
        if end - pos - HEADER.size < length:
            break
        start = pos + HEADER.size
        payload = buffer[start:start + length]
        frames.append((request_id, slot, status, payload if type(payload) is bytes else bytes(payload)))
        pos = start + length
    return frames, pos


class FrameProtocol(asyncio.Protocol):
    """A connection's frames handed to ``on_frames`` as they arrive, from the loop's read callback:
    no stream, no task and no future between the socket and the requests waiting for answers.
    ``closed`` is done once the connection is lost."""

    def __init__(self, on_frames: Callable[[list[Frame]], None]) -> None:
        self._on_frames = on_frames
        self._buffer = bytearray()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        if buffer:
            buffer += data
            frames, used = split_frames(buffer)
            del buffer[:used]
        else:  # the usual case: whole frames in one read, split without a copy into the buffer
            frames, used = split_frames(data)
            buffer += memoryview(data)[used:]
        if frames:
            self._on_frames(frames)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


class FrameWriter:
    """Queues frames for ``writer`` and sends all those of one event-loop pass with one write.

    A frame queued while the connection is closing is dropped (its reader is gone); a write
    that fails closes the connection, so its reader sees the end of stream.
    """

    def __init__(self, writer: asyncio.StreamWriter | asyncio.WriteTransport) -> None:
        self._writer = writer
        self._abort = writer.transport.abort if isinstance(writer, asyncio.StreamWriter) else writer.abort
        self._parts: list[Any] = []
        self._loop = asyncio.get_running_loop()

    def frame(self, request_id: int, slot: int, status: int, payload: bytes,
              extra: Sequence[Any] = ()) -> None:
        parts = self._parts
        if not parts:
            self._loop.call_soon(self.flush)
        length = len(payload) + sum(len(b) for b in extra)
        parts.append(HEADER.pack(length, request_id, slot, status) + payload)
        parts.extend(extra)

    def frames(self, request_ids: Sequence[int], slots: Sequence[int], status: int, payload: bytes) -> None:
        """:meth:`frame` for each request id and slot, with the same status and payload."""
        parts = self._parts
        if not parts:
            self._loop.call_soon(self.flush)
        pack, length = HEADER.pack, len(payload)
        parts.extend([pack(length, rid, slot, status) + payload
                      for rid, slot in zip(request_ids, slots, strict=True)])

    def flush(self) -> None:
        """Send what is queued now (also called by the loop once per pass)."""
        parts, self._parts = self._parts, []
        writer = self._writer
        if not parts or writer.is_closing():
            return
        try:
            writer.write(parts[0] if len(parts) == 1 else b"".join(parts))
        except (RuntimeError, OSError):  # uvloop raises on a broken connection
            self._abort()
