"""Flatbuffers without a schema compiler: a bounds-checked reader and a small writer.

The ``.pte`` reader and writer use these to walk and build ExecuTorch's ``Program``
flatbuffer field by field (field ids from ``schema/program.fbs``). Reading checks
every offset against the buffer, so corrupt input raises :class:`FormatError` and
never an ``IndexError`` or ``struct.error``; tables hand out ``memoryview`` slices,
never copies. The writer lays a tree of :class:`Table`, :class:`Vector`,
:class:`Bytes` and :class:`String` objects out front to back.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence
from typing import Any

from trt_runtime.errors import FormatError

__all__ = ["Bytes", "Obj", "Reader", "String", "Table", "TableView", "Vector", "Writer"]

# ----------------------------------------------------------------------------- reading


class Reader:
    """Bounds-checked access to a flatbuffer; every failure is a FormatError."""

    def __init__(self, view: memoryview, limit: int) -> None:
        self.view = view
        self.limit = limit  # the flatbuffer occupies [0, limit)

    def _unpack(self, fmt: str, pos: int, what: str) -> Any:
        width = struct.calcsize(fmt)
        if pos < 0 or pos + width > self.limit:
            raise FormatError(
                f".pte {what} at offset {pos} lies outside the program flatbuffer (0..{self.limit})"
            )
        return struct.unpack_from(fmt, self.view, pos)[0]

    def uoffset(self, pos: int, what: str) -> int:
        return pos + self._unpack("<I", pos, what)

    def table(self, pos: int, what: str) -> TableView:
        vtable = pos - self._unpack("<i", pos, what)
        vt_size = self._unpack("<H", vtable, f"{what} vtable")
        if vt_size < 4 or vt_size % 2:
            raise FormatError(f".pte {what} vtable at offset {vtable} has invalid size {vt_size}")
        self._unpack("<H", vtable + vt_size - 2, f"{what} vtable")
        return TableView(self, pos, vtable, vt_size, what)

    def vector(self, pos: int, elem_size: int, what: str) -> tuple[int, int]:
        """(first element position, count) of the vector referenced at ``pos``."""
        start = self.uoffset(pos, what)
        count = self._unpack("<I", start, what)
        end = start + 4 + count * elem_size
        if end > self.limit:
            raise FormatError(
                f".pte {what} of {count} elements ends at offset {end}, past the program "
                f"flatbuffer (0..{self.limit})"
            )
        return start + 4, count


@dataclasses.dataclass(frozen=True)
class TableView:
    """One table of a flatbuffer being read; fields are addressed by their schema id."""

    r: Reader
    pos: int
    vtable: int
    vt_size: int
    what: str

    def field(self, index: int) -> int | None:
        slot = 4 + 2 * index
        if slot + 2 > self.vt_size:
            return None
        offset = self.r._unpack("<H", self.vtable + slot, f"{self.what} vtable")
        return self.pos + offset if offset else None

    def scalar(self, index: int, fmt: str, default: Any = 0) -> Any:
        pos = self.field(index)
        return default if pos is None else self.r._unpack(fmt, pos, self.what)

    def child(self, index: int, what: str) -> TableView | None:
        pos = self.field(index)
        return None if pos is None else self.r.table(self.r.uoffset(pos, what), what)

    def tables(self, index: int, what: str) -> list[TableView]:
        pos = self.field(index)
        if pos is None:
            return []
        first, count = self.r.vector(pos, 4, what)
        return [self.r.table(self.r.uoffset(first + 4 * i, what), f"{what}[{i}]") for i in range(count)]

    def scalars(self, index: int, fmt: str, what: str) -> list[Any]:
        pos = self.field(index)
        if pos is None:
            return []
        width = struct.calcsize(fmt)
        first, count = self.r.vector(pos, width, what)
        return [struct.unpack_from(fmt, self.r.view, first + width * i)[0] for i in range(count)]

    def bytes_view(self, index: int, what: str) -> memoryview | None:
        pos = self.field(index)
        if pos is None:
            return None
        first, count = self.r.vector(pos, 1, what)
        return self.r.view[first : first + count]

    def string(self, index: int, what: str) -> str | None:
        raw = self.bytes_view(index, what)
        if raw is None:
            return None
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError as exc:
            raise FormatError(f".pte {what} is not valid UTF-8 (byte {exc.start})") from exc


# ----------------------------------------------------------------------------- writing


class Obj:
    """A flatbuffer object to place: a table, a vector or a string."""


@dataclasses.dataclass
class Table(Obj):
    """A table: one ``(struct format, value)`` per field id, ``None`` to leave it out.

    Format ``"off"`` holds a child object (table, vector, bytes or string).
    """

    fields: list[tuple[str, Any] | None]


@dataclasses.dataclass
class Vector(Obj):
    """A vector of scalars (a struct format) or of objects (``"off"``)."""

    fmt: str  # element format ("off" for objects)
    items: Sequence[Any]
    align: int = 4


@dataclasses.dataclass
class Bytes(Obj):
    """A ``[ubyte]`` vector written from a buffer, its first byte aligned to ``align``."""

    data: memoryview
    align: int = 16


@dataclasses.dataclass
class String(Obj):
    """A NUL-terminated UTF-8 string."""

    text: str


class Writer:
    """Lays out a flatbuffer front to back: every child follows its parent, so each
    uoffset is positive, as the format requires."""

    def __init__(self, prefix: bytes) -> None:
        self.buf = bytearray(prefix)

    def pad(self, alignment: int, extra: int = 0) -> None:
        """Append zeros until ``len(buf) + extra`` is a multiple of ``alignment``."""
        while (len(self.buf) + extra) % alignment:
            self.buf.append(0)

    def place(self, obj: Obj) -> int:
        if isinstance(obj, String):
            raw = obj.text.encode("utf-8")
            self.pad(4)
            pos = len(self.buf)
            self.buf += struct.pack("<I", len(raw)) + raw + b"\x00"
            return pos
        if isinstance(obj, Bytes):
            self.pad(max(obj.align, 4), 4)
            pos = len(self.buf)
            self.buf += struct.pack("<I", len(obj.data))
            self.buf += obj.data
            return pos
        if isinstance(obj, Vector):
            width = 4 if obj.fmt == "off" else struct.calcsize(obj.fmt)
            self.pad(max(obj.align, width, 4), 4)
            pos = len(self.buf)
            self.buf += struct.pack("<I", len(obj.items))
            if obj.fmt != "off":
                for item in obj.items:
                    self.buf += struct.pack(obj.fmt, item)
                return pos
            slots = []
            for _ in obj.items:
                slots.append(len(self.buf))
                self.buf += b"\x00\x00\x00\x00"
            for slot, item in zip(slots, obj.items, strict=True):
                self._patch(slot, self.place(item))
            return pos
        assert isinstance(obj, Table)
        return self._table(obj)

    def _patch(self, slot: int, target: int) -> None:
        struct.pack_into("<I", self.buf, slot, target - slot)

    def _table(self, table: Table) -> int:
        # Inline layout: soffset, then fields largest first so each is naturally aligned.
        present = [(i, f) for i, f in enumerate(table.fields) if f is not None]
        widths = {i: (4 if f[0] == "off" else struct.calcsize(f[0])) for i, f in present}
        order = sorted(present, key=lambda item: -widths[item[0]])
        offsets: dict[int, int] = {}
        cursor = 4
        for i, _ in order:
            cursor = (cursor + widths[i] - 1) // widths[i] * widths[i]
            offsets[i] = cursor
            cursor += widths[i]
        obj_size = cursor
        vt_size = 4 + 2 * len(table.fields)
        self.pad(2)
        vtable = len(self.buf)
        self.buf += struct.pack("<HH", vt_size, obj_size)
        for i in range(len(table.fields)):
            self.buf += struct.pack("<H", offsets.get(i, 0))
        self.pad(8)
        pos = len(self.buf)
        self.buf += b"\x00" * obj_size
        struct.pack_into("<i", self.buf, pos, pos - vtable)
        children = []
        for i, (fmt, value) in present:
            if fmt == "off":
                children.append((pos + offsets[i], value))
            else:
                struct.pack_into(fmt, self.buf, pos + offsets[i], value)
        for slot, child in children:
            self._patch(slot, self.place(child))
        return pos

