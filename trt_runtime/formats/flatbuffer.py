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
from typing import Any, overload

from trt_runtime.errors import FormatError

__all__ = [
    "WORK_BASE",
    "WORK_PER_BYTE",
    "Bytes",
    "Obj",
    "Reader",
    "String",
    "Table",
    "TableVector",
    "TableView",
    "Vector",
    "Writer",
]

# ----------------------------------------------------------------------------- reading


class Reader:
    """Bounds-checked access to a flatbuffer; every failure is a FormatError.

    Reading is metered: each table opened, vector element read and 64 bytes of string
    decoded spends one unit of a budget proportional to the buffer's size
    (:data:`WORK_PER_BYTE` units per byte plus :data:`WORK_BASE`). A flatbuffer read
    once costs at most a quarter unit per byte (every element takes 4 bytes or more),
    so only a buffer whose offsets point at the same tables over and over (aliasing that
    multiplies work) runs out, and is refused with :class:`FormatError` instead of
    taking quadratic time and memory.
    """

    def __init__(self, view: memoryview, limit: int, *, budget: int | None = None) -> None:
        self.view = view
        self.limit = limit  # the flatbuffer occupies [0, limit)
        self.budget = int(WORK_PER_BYTE * limit) + WORK_BASE if budget is None else budget
        self.spent = 0

    def charge(self, units: int, what: str) -> None:
        """Spend ``units`` of the reading budget; :class:`FormatError` once it is exhausted."""
        self.spent += units
        if self.spent > self.budget:
            raise FormatError(
                f"{what}: reading this .pte program needs more than {self.budget:,} table and element "
                f"reads for its {self.limit:,} bytes: its offsets point at the same data over and over "
                "(aliasing that multiplies work); refusing a hostile or corrupt program"
            )

    def _unpack(self, fmt: str, pos: int, what: str) -> Any:
        layout = _STRUCTS.get(fmt) or _STRUCTS.setdefault(fmt, struct.Struct(fmt))
        if pos < 0 or pos + layout.size > self.limit:
            raise FormatError(
                f".pte {what} at offset {pos} lies outside the program flatbuffer (0..{self.limit})"
            )
        return layout.unpack_from(self.view, pos)[0]

    def uoffset(self, pos: int, what: str) -> int:
        return pos + self._unpack("<I", pos, what)

    def table(self, pos: int, what: str) -> TableView:
        self.charge(1, what)
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


_STRUCTS: dict[str, struct.Struct] = {}

#: Reading budget of :class:`Reader`: units per byte of flatbuffer, and a constant.
WORK_PER_BYTE = 0.5
WORK_BASE = 4096


class TableVector(Sequence["TableView"]):
    """A vector of tables, opened on access (each access spends one unit of the budget)."""

    def __init__(self, reader: Reader, first: int, count: int, what: str) -> None:
        self._r, self._first, self._count, self._what = reader, first, count, what

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> TableView: ...
    @overload
    def __getitem__(self, index: slice) -> list[TableView]: ...
    def __getitem__(self, index: int | slice) -> TableView | list[TableView]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if not -self._count <= index < self._count:
            raise IndexError(f"{self._what} index {index} out of range (0..{self._count - 1})")
        index %= self._count
        slot = self._first + 4 * index
        return self._r.table(self._r.uoffset(slot, self._what), f"{self._what}[{index}]")


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

    def tables(self, index: int, what: str) -> TableVector:
        pos = self.field(index)
        if pos is None:
            return TableVector(self.r, 0, 0, what)
        first, count = self.r.vector(pos, 4, what)
        return TableVector(self.r, first, count, what)

    def scalars(self, index: int, fmt: str, what: str) -> list[Any]:
        pos = self.field(index)
        if pos is None:
            return []
        width = struct.calcsize(fmt)
        first, count = self.r.vector(pos, width, what)
        self.r.charge(count, what)
        return [item[0] for item in struct.iter_unpack(fmt, self.r.view[first : first + width * count])]

    def bytes_span(self, index: int, what: str) -> tuple[int, int] | None:
        """``(start, end)`` of a ``[ubyte]`` field in the buffer, or ``None`` if absent."""
        pos = self.field(index)
        if pos is None:
            return None
        first, count = self.r.vector(pos, 1, what)
        return first, first + count

    def bytes_view(self, index: int, what: str) -> memoryview | None:
        span = self.bytes_span(index, what)
        return None if span is None else self.r.view[span[0] : span[1]]

    def string(self, index: int, what: str) -> str | None:
        pos = self.field(index)
        if pos is None:
            return None
        first, count = self.r.vector(pos, 1, what)
        # A string ends with a NUL after its bytes: a file cut right there is truncated.
        if self.r._unpack("<B", first + count, f"{what} terminator") != 0:
            raise FormatError(f".pte {what} at offset {first - 4} lacks its NUL terminator")
        self.r.charge(count // 64 + 1, what)
        try:
            return str(self.r.view[first : first + count], "utf-8")
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

