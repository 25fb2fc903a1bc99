"""ExecuTorch ``.pte`` programs: find TensorRT delegates, and write a one-delegate program.

A ``.pte`` file is an ExecuTorch ``Program`` flatbuffer (file identifier ``ET12``,
schema ``schema/program.fbs`` in pytorch/executorch), optionally with an extended
header ``eh00`` right after the identifier that points at data segments appended to
the flatbuffer. A delegate's blob lives inline (``Program.backend_delegate_data``),
in a segment (``Program.segments``), or in a named-data entry whose key the delegate
names. This module reads the flatbuffer directly with bounds checks on every offset,
so no ``executorch`` install is needed and blobs stay slices of the mapped file.
"""

from __future__ import annotations

import dataclasses
import re
import struct
from collections.abc import Sequence
from typing import IO, Any

from trt_runtime.dtypes import itemsize, normalize_dtype
from trt_runtime.errors import FormatError
from trt_runtime.formats.source import write_chunks
from trt_runtime.formats.tr01 import MAGIC_TR01, MAGIC_TR02, Tr01Blob, parse_tr01
from trt_runtime.protocols import TensorSpec

__all__ = [
    "BACKEND_ID",
    "Delegate",
    "Program",
    "is_pte",
    "parse_pte",
    "write_program",
]

#: The id torch-tensorrt's ExecuTorch backend registers (``TensorRTBackend.cpp``).
BACKEND_ID = "TensorRTBackend"
_IDENT = re.compile(rb"ET[0-9a-zA-Z]{2}")
EH_MAGIC = b"eh00"
EH_LENGTH = 32
EH_MIN_LENGTH = 24
#: ``DataLocation`` enum of program.fbs.
INLINE, SEGMENT = 0, 1
#: ``InstructionArguments`` union member of a ``DelegateCall``.
_DELEGATE_CALL, _KERNEL_CALL = 2, 1
#: ``KernelTypes`` union member of a ``Tensor``.
_TENSOR = 5
#: ExecuTorch ``ScalarType`` codes (schema/scalar_type.fbs) of the canonical dtypes.
SCALAR_TYPES: dict[str, int] = {
    "uint8": 0,
    "int8": 1,
    "int32": 3,
    "int64": 4,
    "float16": 5,
    "float32": 6,
    "bool": 11,
    "bfloat16": 15,
    "float8_e4m3fn": 24,
}
_DTYPE_OF_SCALAR = {code: name for name, code in SCALAR_TYPES.items()}
_STATIC, _DYNAMIC_BOUND, _DYNAMIC_UNBOUND = 0, 1, 2


def is_pte(view: memoryview) -> bool:
    """Whether ``view`` starts like an ExecuTorch program (``ET??`` at bytes 4..8)."""
    return len(view) >= 8 and _IDENT.fullmatch(bytes(view[4:8])) is not None


# ----------------------------------------------------------------------------- reading


class _Reader:
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

    def table(self, pos: int, what: str) -> _Table:
        vtable = pos - self._unpack("<i", pos, what)
        vt_size = self._unpack("<H", vtable, f"{what} vtable")
        if vt_size < 4 or vt_size % 2:
            raise FormatError(f".pte {what} vtable at offset {vtable} has invalid size {vt_size}")
        self._unpack("<H", vtable + vt_size - 2, f"{what} vtable")
        return _Table(self, pos, vtable, vt_size, what)

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
class _Table:
    r: _Reader
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

    def child(self, index: int, what: str) -> _Table | None:
        pos = self.field(index)
        return None if pos is None else self.r.table(self.r.uoffset(pos, what), what)

    def tables(self, index: int, what: str) -> list[_Table]:
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


@dataclasses.dataclass(frozen=True)
class Delegate:
    """One TensorRT delegate of a program; ``blob`` is its parsed TR01/TR02 blob."""

    index: int  # position among the program's TensorRT delegates
    method: str
    method_delegate_index: int  # index in ExecutionPlan.delegates
    location: str  # "inline", "segment" or "named_data"
    blob: Tr01Blob
    compile_specs: dict[str, bytes]
    fully_delegated: bool  # the method is exactly one call of this delegate

    @property
    def device_id(self) -> int:
        return self.blob.device_id


@dataclasses.dataclass(frozen=True)
class Program:
    """What :func:`parse_pte` found: TensorRT delegates and a summary of the rest."""

    size: int
    identifier: str
    version: int
    methods: tuple[str, ...]
    delegates: tuple[Delegate, ...]
    other_backends: tuple[str, ...]
    segment_base_offset: int
    has_extended_header: bool


def _extended_header(view: memoryview) -> tuple[int, int, int] | None:
    """(program_size, segment_base_offset, segment_data_size) of ``eh00``, if present."""
    if len(view) < 8 + EH_MIN_LENGTH or bytes(view[8:12]) != EH_MAGIC:
        return None
    length, program_size, base = struct.unpack_from("<IQQ", view, 12)
    if length < EH_MIN_LENGTH:
        raise FormatError(f".pte extended header length {length} is below the minimum {EH_MIN_LENGTH}")
    data_size = struct.unpack_from("<Q", view, 32)[0] if length >= EH_LENGTH and len(view) >= 40 else 0
    return program_size, base, data_size


def parse_pte(data: memoryview, *, what: str = ".pte program") -> Program:
    """Parse an ExecuTorch program and validate every TensorRT delegate blob in it."""
    view = data
    size = len(view)
    if not is_pte(view):
        raise FormatError(f"{what} lacks the ExecuTorch identifier 'ET??' at bytes 4..8")
    if size < 12:
        raise FormatError(f"{what} is too small: {size} bytes")
    eh = _extended_header(view)
    base = 0
    if eh is not None:
        program_size, base, data_size = eh
        expected = program_size if base == 0 else base + data_size
        if program_size < 8 + EH_MIN_LENGTH:
            raise FormatError(
                f"{what} extended header program_size {program_size} is smaller than its header"
            )
        if base and base < program_size:
            raise FormatError(
                f"{what} extended header segment_base_offset {base} lies inside the program "
                f"(program_size {program_size})"
            )
        if expected > size:
            raise FormatError(
                f"{what} is truncated: its extended header declares {expected} bytes; "
                f"expected {expected} bytes, got {size}"
            )
        limit = program_size
    else:
        limit = size
    reader = _Reader(view, limit)
    root = reader.table(reader.uoffset(0, "root offset"), "Program")
    version = root.scalar(0, "<I")
    plans = root.tables(1, "Program.execution_plan")
    inline_data = root.tables(3, "Program.backend_delegate_data")
    segments = root.tables(4, "Program.segments")
    named = root.tables(7, "Program.named_data")

    def segment(index: int, where: str) -> memoryview:
        if index >= len(segments):
            raise FormatError(f"{where} refers to segment {index}; the program has {len(segments)}")
        if eh is None:
            raise FormatError(f"{where} refers to segment {index} but the program has no extended header")
        seg = segments[index]
        offset, length = seg.scalar(0, "<Q"), seg.scalar(1, "<Q")
        start = base + offset
        end = start + length
        if end > size:
            raise FormatError(
                f"{where} segment {index} (offset {start} + size {length} = {end}) runs past the end "
                f"of the file; truncated or corrupt: expected {end} bytes, got {size}"
            )
        return view[start:end]

    named_keys: dict[str, int] = {}
    for i, entry in enumerate(named):
        key = entry.string(0, f"Program.named_data[{i}].key")
        if key is not None:
            named_keys[key] = entry.scalar(1, "<I")

    delegates: list[Delegate] = []
    others: list[str] = []
    methods: list[str] = []
    for p, plan in enumerate(plans):
        method = plan.string(0, f"execution_plan[{p}].name") or f"plan{p}"
        methods.append(method)
        plan_delegates = plan.tables(7, f"{method}.delegates")
        calls = _delegate_calls(plan, method)
        for d, delegate in enumerate(plan_delegates):
            where = f"{what} method {method!r} delegate {d}"
            backend_id = delegate.string(0, f"{where} id") or ""
            if backend_id != BACKEND_ID:
                others.append(backend_id)
                continue
            ref = delegate.child(1, f"{where} processed")
            if ref is None:
                raise FormatError(f"{where} ({BACKEND_ID}) has no processed data reference")
            location_code, index = ref.scalar(0, "<B"), ref.scalar(1, "<I")
            if location_code == INLINE:
                if index >= len(inline_data):
                    raise FormatError(
                        f"{where} refers to inline data {index}; the program has {len(inline_data)}"
                    )
                raw = inline_data[index].bytes_view(0, f"{where} inline data") or memoryview(b"")
                location = "inline"
            elif location_code == SEGMENT:
                raw = segment(index, where)
                location = "segment"
            else:
                raise FormatError(f"{where} has unknown data location {location_code}; expected 0 or 1")
            specs = {}
            for s, spec in enumerate(delegate.tables(2, f"{where} compile_specs")):
                key = spec.string(0, f"{where} compile_specs[{s}].key") or ""
                specs[key] = bytes(spec.bytes_view(1, f"{where} compile_specs[{s}].value") or b"")
            if bytes(raw[:4]) not in (MAGIC_TR01, MAGIC_TR02):
                # Our convention for a blob kept in named data: the processed bytes name its key.
                key = _as_key(raw)
                if key is None or key not in named_keys:
                    raise FormatError(
                        f"{where} ({BACKEND_ID}, {location}) holds {len(raw)} bytes that are neither a "
                        f"TR01/TR02 blob (magic {bytes(raw[:4])!r}) nor a named-data key "
                        f"(keys: {sorted(named_keys)})"
                    )
                raw = segment(named_keys[key], f"{where} named data {key!r}")
                location = "named_data"
            blob = parse_tr01(raw, what=f"{where} blob")
            fully = calls == [d] and len(plan_delegates) == 1
            delegates.append(
                Delegate(
                    index=len(delegates),
                    method=method,
                    method_delegate_index=d,
                    location=location,
                    blob=_with_program_types(blob, plan, d) if fully else blob,
                    compile_specs=specs,
                    fully_delegated=fully,
                )
            )
    return Program(
        size=size,
        identifier=bytes(view[4:8]).decode("ascii"),
        version=version,
        methods=tuple(methods),
        delegates=tuple(delegates),
        other_backends=tuple(others),
        segment_base_offset=base,
        has_extended_header=eh is not None,
    )


def _as_key(raw: memoryview) -> str | None:
    if not 0 < len(raw) <= 4096:
        return None
    try:
        return str(raw, "utf-8")
    except UnicodeDecodeError:
        return None


def _delegate_calls(plan: _Table, method: str) -> list[int] | None:
    """Delegate indices the method calls, in order; None if it also runs kernels."""
    result: list[int] = []
    for c, chain in enumerate(plan.tables(5, f"{method}.chains")):
        for i, instruction in enumerate(chain.tables(2, f"{method}.chains[{c}].instructions")):
            kind = instruction.scalar(0, "<B")
            if kind != _DELEGATE_CALL:
                return None
            call = instruction.child(1, f"{method}.chains[{c}].instructions[{i}]")
            if call is None:
                return None
            result.append(call.scalar(0, "<i"))
    return result


def _with_program_types(blob: Tr01Blob, plan: _Table, delegate: int) -> Tr01Blob:
    """Fill bindings whose dtype the blob leaves empty from the program's tensors.

    torch-tensorrt writes ``"dtype":""`` and ``"shape":[]``; in a fully delegated
    method the delegate's arguments are its inputs then its outputs, in binding order.
    """
    if blob.dtypes_recorded:
        return blob
    chain = plan.tables(5, "chains")[0]
    call = chain.tables(2, "instructions")[0].child(1, "DelegateCall")
    assert call is not None
    args = call.scalars(1, "<i", "DelegateCall.args")
    values = plan.tables(2, "values")
    if len(args) != len(blob.bindings):
        return blob
    specs = []
    for spec, arg in zip(blob.bindings, args, strict=True):
        if spec.dtype or not 0 <= arg < len(values) or values[arg].scalar(0, "<B") != _TENSOR:
            specs.append(spec)
            continue
        tensor = values[arg].child(1, "Tensor")
        if tensor is None:
            specs.append(spec)
            continue
        dtype = _DTYPE_OF_SCALAR.get(tensor.scalar(0, "<b"))
        if dtype is None:
            raise FormatError(
                f".pte tensor for binding {spec.name!r} has ExecuTorch scalar type "
                f"{tensor.scalar(0, '<b')}, which TensorRT bindings do not support"
            )
        sizes = tuple(tensor.scalars(2, "<i", "Tensor.sizes"))
        static = tensor.scalar(8, "<b") == _STATIC
        shape = spec.shape or (sizes if static else tuple(-1 for _ in sizes))
        specs.append(dataclasses.replace(spec, dtype=dtype, shape=shape))
    return dataclasses.replace(blob, bindings=tuple(specs), dtypes_recorded=all(s.dtype for s in specs))


# ----------------------------------------------------------------------------- writing


class _Obj:
    """A flatbuffer object to place: a table, a vector or a string."""


@dataclasses.dataclass
class _T(_Obj):
    # One (format, value) per field id; value None leaves the field out. Format "off"
    # holds a child object.
    fields: list[tuple[str, Any] | None]


@dataclasses.dataclass
class _V(_Obj):
    fmt: str  # element format ("off" for objects)
    items: Sequence[Any]
    align: int = 4


@dataclasses.dataclass
class _B(_Obj):
    """A [ubyte] vector written from a buffer; placed last when ``tail`` is set."""

    data: memoryview
    align: int = 16


@dataclasses.dataclass
class _S(_Obj):
    text: str


class _Writer:
    """Lays out a flatbuffer front to back: every child follows its parent, so each
    uoffset is positive, as the format requires."""

    def __init__(self, prefix: bytes) -> None:
        self.buf = bytearray(prefix)

    def _pad(self, alignment: int, extra: int = 0) -> None:
        while (len(self.buf) + extra) % alignment:
            self.buf.append(0)

    def place(self, obj: _Obj) -> int:
        if isinstance(obj, _S):
            raw = obj.text.encode("utf-8")
            self._pad(4)
            pos = len(self.buf)
            self.buf += struct.pack("<I", len(raw)) + raw + b"\x00"
            return pos
        if isinstance(obj, _B):
            self._pad(max(obj.align, 4), 4)
            pos = len(self.buf)
            self.buf += struct.pack("<I", len(obj.data))
            self.buf += obj.data
            return pos
        if isinstance(obj, _V):
            width = 4 if obj.fmt == "off" else struct.calcsize(obj.fmt)
            self._pad(max(obj.align, width, 4), 4)
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
        assert isinstance(obj, _T)
        return self._table(obj)

    def _patch(self, slot: int, target: int) -> None:
        struct.pack_into("<I", self.buf, slot, target - slot)

    def _table(self, table: _T) -> int:
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
        self._pad(2)
        vtable = len(self.buf)
        self.buf += struct.pack("<HH", vt_size, obj_size)
        for i in range(len(table.fields)):
            self.buf += struct.pack("<H", offsets.get(i, 0))
        self._pad(8)
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


def _tensor(spec: TensorSpec, planned: tuple[int, int] | None) -> _T:
    dtype = normalize_dtype(spec.dtype)
    if dtype not in SCALAR_TYPES:
        raise ValueError(f"binding {spec.name!r} has dtype {dtype!r}, which ExecuTorch cannot express")
    if not spec.is_dynamic:
        sizes, dynamism = list(spec.shape), _STATIC
    elif spec.profiles:
        sizes, dynamism = (
            [max(p[2][i] for p in spec.profiles) for i in range(len(spec.shape))],
            _DYNAMIC_BOUND,
        )
    else:
        sizes, dynamism = [max(d, 1) for d in spec.shape], _DYNAMIC_UNBOUND
    allocation = None
    if planned is not None:
        memory_id, offset = planned
        allocation = _T([("<I", memory_id), ("<I", offset & 0xFFFFFFFF), ("<I", offset >> 32)])
    return _T(
        [
            ("<b", SCALAR_TYPES[dtype]),  # scalar_type
            ("<i", 0),  # storage_offset
            ("off", _V("<i", sizes)),  # sizes
            ("off", _V("<B", list(range(len(sizes))))),  # dim_order
            ("<B", 0),  # requires_grad
            ("<I", 0),  # data_buffer_idx
            ("off", allocation) if allocation is not None else None,  # allocation_info
            ("<b", 0),  # layout
            ("<b", dynamism),  # shape_dynamism
            None,  # extra_tensor_info
        ]
    )


def write_program(
    out: IO[bytes],
    blob_parts: Sequence[bytes | memoryview],
    bindings: Sequence[TensorSpec],
    *,
    method: str = "forward",
    location: str = "segment",
    segment_alignment: int = 128,
) -> int:
    """Write a one-method program whose only instruction calls one TensorRT delegate.

    ``blob_parts`` concatenated are the TR01/TR02 blob. ``location`` says where it goes:
    ``"segment"`` (the default, what ExecuTorch's exporter does) appends it after the
    flatbuffer as a data segment, streamed, so its size is not limited by the
    flatbuffer's 32-bit offsets; ``"inline"`` stores it in ``backend_delegate_data``
    (under 2 GiB only); ``"named_data"`` puts it in a segment named by
    ``Program.named_data`` and stores that key as the delegate's processed bytes.
    Static-shape outputs are memory-planned in buffer 1; inputs come from the caller.
    Returns the number of bytes written.
    """
    blob_size = sum(len(p) for p in blob_parts)
    specs = list(bindings)
    inputs = [s for s in specs if s.is_input]
    outputs = [s for s in specs if not s.is_input]
    ordered = inputs + outputs
    planned_bytes = 0
    values = []
    for spec in ordered:
        plan_slot = None
        if not spec.is_input and not spec.is_dynamic:
            count = 1
            for d in spec.shape:
                count *= d
            plan_slot = (1, planned_bytes)
            planned_bytes += (count * itemsize(spec.dtype) + 15) // 16 * 16
        values.append(_T([("<B", _TENSOR), ("off", _tensor(spec, plan_slot))]))
    value_ids = list(range(len(ordered)))
    in_ids, out_ids = value_ids[: len(inputs)], value_ids[len(inputs) :]
    call = _T([("<i", 0), ("off", _V("<i", value_ids))])
    chain = _T(
        [
            ("off", _V("<i", in_ids)),
            ("off", _V("<i", out_ids)),
            ("off", _V("off", [_T([("<B", _DELEGATE_CALL), ("off", call)])])),
            None,
        ]
    )
    if location not in ("segment", "inline", "named_data"):
        raise ValueError(f"location must be one of 'segment', 'inline', 'named_data'; got {location!r}")
    inline = location == "inline"
    if inline and blob_size >= 2**31:
        raise FormatError(f"a {blob_size}-byte blob cannot be inline; flatbuffer offsets are 32-bit")
    processed = _T([("<B", SEGMENT if location == "segment" else INLINE), ("<I", 0)])
    delegate = _T([("off", _S(BACKEND_ID)), ("off", processed), ("off", _V("off", []))])
    plan = _T(
        [
            ("off", _S(method)),  # name
            ("off", _T([("off", _S("")), ("off", _S(""))])),  # container_meta_type
            ("off", _V("off", values)),  # values
            ("off", _V("<i", in_ids)),  # inputs
            ("off", _V("<i", out_ids)),  # outputs
            ("off", _V("off", [chain])),  # chains
            ("off", _V("off", [])),  # operators
            ("off", _V("off", [delegate])),  # delegates
            ("off", _V("<q", [0, planned_bytes] if planned_bytes else [0])),  # non_const_buffer_sizes
        ]
    )
    inline_data = []
    named_data = None
    if inline:
        inline_data = [_T([("off", _B(memoryview(b"".join(blob_parts)), 16))])]
    elif location == "named_data":
        key = f"{BACKEND_ID}/{method}/0"
        inline_data = [_T([("off", _B(memoryview(key.encode("utf-8")), 16))])]
        named_data = ("off", _V("off", [_T([("off", _S(key)), ("<I", 0)])]))
    root = _T(
        [
            ("<I", 0),  # version
            ("off", _V("off", [plan])),  # execution_plan
            None,  # constant_buffer
            ("off", _V("off", inline_data)),  # backend_delegate_data
            ("off", _V("off", [] if inline else [_T([("<Q", 0), ("<Q", blob_size)])])),  # segments
            ("off", _T([("<I", 0), ("off", _V("<Q", [0]))])),  # constant_segment: no constants
            None,  # mutable_data_segments
            named_data,
        ]
    )
    header = b"\x00" * EH_LENGTH if not inline else b""
    writer = _Writer(b"\x00\x00\x00\x00ET12" + header)
    struct.pack_into("<I", writer.buf, 0, writer.place(root))
    writer._pad(16)
    program_size = len(writer.buf)
    if inline:
        out.write(writer.buf)
        return program_size
    base = (program_size + segment_alignment - 1) // segment_alignment * segment_alignment
    struct.pack_into("<4sIQQQ", writer.buf, 8, EH_MAGIC, EH_LENGTH, program_size, base, blob_size)
    out.write(writer.buf)
    out.write(b"\x00" * (base - program_size))
    for part in blob_parts:
        write_chunks(out, memoryview(part))
    return base + blob_size
