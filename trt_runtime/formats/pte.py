"""ExecuTorch ``.pte`` programs: find TensorRT delegates and what the program says about them.

A ``.pte`` file is an ExecuTorch ``Program`` flatbuffer (file identifier ``ET12``,
schema ``schema/program.fbs`` in pytorch/executorch), optionally with an extended
header ``eh00`` right after the identifier that points at data segments appended to
the flatbuffer. A delegate's blob lives inline (``Program.backend_delegate_data``),
in a segment (``Program.segments``), or in a named-data entry whose key the delegate
names. This module reads the flatbuffer directly with bounds checks on every offset,
so no ``executorch`` install is needed and blobs stay slices of the mapped file. The
writer is :mod:`trt_runtime.formats.pte_writer`.

Besides the blob, each delegate reports its compile specs (``target_device`` among
them), how the program records its argument tensors (sizes, dynamism, device,
memory planning) and warnings where those disagree with the blob: the blob's
``device_id`` decides where the engine runs.
"""

from __future__ import annotations

import dataclasses
import re
import struct
from typing import Any

from trt_runtime.errors import FormatError
from trt_runtime.formats.flatbuffer import WORK_BASE, WORK_PER_BYTE, Reader, TableView
from trt_runtime.formats.tr01 import MAGIC_TR01, MAGIC_TR02, Tr01Blob, parse_tr01
from trt_runtime.validation import python_limits, show

__all__ = [
    "BACKEND_ID",
    "DEVICE_TYPES",
    "DYNAMISM",
    "SCALAR_TYPES",
    "TARGET_DEVICE_KEY",
    "Delegate",
    "Program",
    "ProgramTensor",
    "cuda_index",
    "is_pte",
    "parse_pte",
    "spec_text",
]

#: The id torch-tensorrt's ExecuTorch backend registers (``TensorRTBackend.cpp``).
BACKEND_ID = "TensorRTBackend"
#: The compile spec ExecuTorch's ``PropagateDevicePass`` reads to tag a delegate's
#: tensors with a device, and torch-tensorrt's partitioner writes (``b"cuda:N"``).
TARGET_DEVICE_KEY = "target_device"
_IDENT = re.compile(rb"ET[0-9a-zA-Z]{2}")
# At most 9 digits: a device index of 5,000 digits names no device (and int() of it fails).
_CUDA_DEVICE = re.compile(r"cuda(?::([0-9]{1,9}))?", re.IGNORECASE)
EH_MAGIC = b"eh00"
EH_LENGTH = 32
EH_MIN_LENGTH = 24
#: Reading units a delegate entry costs beyond its tables (a Delegate, its warnings): a
#: delegate table takes 20 bytes or more, so a real program stays within the budget.
DELEGATE_WORK = 6
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
#: ``TensorShapeDynamism`` codes, by the names :class:`ProgramTensor` uses.
DYNAMISM: dict[str, int] = {"static": 0, "dynamic_bound": 1, "dynamic_unbound": 2}
_DYNAMISM_NAME = {code: name for name, code in DYNAMISM.items()}
#: ``DeviceType`` codes of ``ExtraTensorInfo`` (ExecuTorch 1.5+).
DEVICE_TYPES: dict[str, int] = {"cpu": 0, "cuda": 1}
_DEVICE_NAME = {code: name for name, code in DEVICE_TYPES.items()}


def is_pte(view: memoryview) -> bool:
    """Whether ``view`` starts like an ExecuTorch program (``ET??`` at bytes 4..8)."""
    return len(view) >= 8 and _IDENT.fullmatch(bytes(view[4:8])) is not None


def cuda_index(target_device: str) -> int | None:
    """The CUDA device a ``target_device`` value names, or ``None`` if it names none.

    ``"cuda"`` and ``"cuda:N"`` (any case, surrounding blanks ignored) are what
    torch-tensorrt's partitioner accepts; ``"cuda"`` is device 0, as ExecuTorch reads it.
    """
    match = _CUDA_DEVICE.fullmatch(target_device.strip())
    if match is None:
        return None
    return int(match.group(1) or 0)


def spec_text(value: bytes) -> str:
    """A compile spec value as text: its UTF-8 if printable, else ``0x`` and hex digits."""
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + value.hex()
    return text if text.isprintable() else "0x" + value.hex()


@dataclasses.dataclass(frozen=True)
class ProgramTensor:
    """How a program records one argument tensor of a delegate call.

    ``device`` is ``"cpu"`` or ``"cuda:N"`` from ``ExtraTensorInfo``; a tensor without
    that table is on the CPU as ExecuTorch reads it (``device_recorded`` is then false).
    ``planned`` says the tensor has ``allocation_info`` (memory planned by the program).
    """

    dtype: str | None  # None for a scalar type TensorRT bindings cannot have
    scalar_type: int
    sizes: tuple[int, ...]
    dynamism: str
    device: str
    device_recorded: bool
    planned: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "sizes": list(self.sizes),
            "dynamism": self.dynamism,
            "device": self.device,
            "device_recorded": self.device_recorded,
            "planned": self.planned,
        }


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
    #: The call's argument tensors (inputs then outputs), when a call was found.
    tensors: tuple[ProgramTensor, ...] = ()
    #: Where the program disagrees with the blob, or ExecuTorch would refuse it.
    warnings: tuple[str, ...] = ()

    @property
    def device_id(self) -> int:
        return self.blob.device_id

    @property
    def target_device(self) -> str | None:
        """The ``target_device`` compile spec as written, or ``None``."""
        value = self.compile_specs.get(TARGET_DEVICE_KEY)
        return None if value is None else spec_text(value)

    def metadata(self) -> dict[str, Any]:
        """The ``.pte`` facts an :class:`~trt_runtime.EngineSource` carries for this delegate.

        ``compile_specs`` maps each key to its value as text (:func:`spec_text`);
        ``warnings`` is a list of sentences (empty when the program is consistent).
        """
        return {
            "blob_magic": self.blob.magic,
            "method": self.method,
            "delegate_index": self.index,
            "method_delegate_index": self.method_delegate_index,
            "location": self.location,
            "fully_delegated": self.fully_delegated,
            "compile_specs": {key: spec_text(value) for key, value in self.compile_specs.items()},
            "target_device": self.target_device,
            "program_tensors": [t.as_dict() for t in self.tensors],
            "warnings": list(self.warnings),
        }


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
    """Parse an ExecuTorch program and validate every TensorRT delegate blob in it.

    Time and memory are linear in the input: each table is read once per use, each
    blob parsed once however many delegates name it, and a program whose offsets alias
    the same data so often that reading it would multiply the work is refused (see
    :class:`~trt_runtime.formats.flatbuffer.Reader`). Every failure is a FormatError.
    """
    with python_limits(FormatError, what):
        return _parse_pte(data, what)


def _parse_pte(view: memoryview, what: str) -> Program:
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
    reader = Reader(view, limit, budget=int(WORK_PER_BYTE * size) + WORK_BASE)
    root = reader.table(reader.uoffset(0, "root offset"), "Program")
    version = root.scalar(0, "<I")
    plans = root.tables(1, "Program.execution_plan")
    inline_data = root.tables(3, "Program.backend_delegate_data")
    segments = root.tables(4, "Program.segments")
    named = root.tables(7, "Program.named_data")
    spans = [_segment_span(seg, i, base, size, eh is not None, what) for i, seg in enumerate(segments)]
    _check_tail(root, len(segments), what)

    def segment(index: int, where: str) -> tuple[int, int]:
        if index >= len(spans):
            raise FormatError(f"{where} refers to segment {index}; the program has {len(spans)}")
        start, end = spans[index]
        if eh is None and end > start:
            raise FormatError(f"{where} refers to segment {index} but the program has no extended header")
        return start, end

    named_keys: dict[str, int] = {}
    for i, entry in enumerate(named):
        key = entry.string(0, f"Program.named_data[{i}].key")
        if key is not None:
            named_keys[key] = entry.scalar(1, "<I")

    blobs: dict[tuple[int, int], Tr01Blob] = {}  # parsed once per byte range

    def blob_at(span: tuple[int, int], where: str) -> Tr01Blob:
        blob = blobs.get(span)
        if blob is None:
            blob = parse_tr01(view[span[0] : span[1]], what=f"{where} blob")
            reader.charge(blob.metadata_size // 8 + 1, f"{where} blob metadata")
            blobs[span] = blob
        return blob

    def read_delegate(
        delegate: TableView, where: str
    ) -> tuple[str, str, tuple[int, int], dict[str, bytes]]:
        """(backend id, location, blob byte range, compile specs) of one delegate table."""
        backend_id = delegate.string(0, f"{where} id") or ""
        if backend_id != BACKEND_ID:
            return backend_id, "", (0, 0), {}
        ref = delegate.child(1, f"{where} processed")
        if ref is None:
            raise FormatError(f"{where} ({BACKEND_ID}) has no processed data reference")
        location_code, index = ref.scalar(0, "<B"), ref.scalar(1, "<I")
        if location_code == INLINE:
            if index >= len(inline_data):
                raise FormatError(
                    f"{where} refers to inline data {index}; the program has {len(inline_data)}"
                )
            span = inline_data[index].bytes_span(0, f"{where} inline data") or (0, 0)
            location = "inline"
        elif location_code == SEGMENT:
            span = segment(index, where)
            location = "segment"
        else:
            raise FormatError(f"{where} has unknown data location {location_code}; expected 0 or 1")
        specs = {}
        for s, spec in enumerate(delegate.tables(2, f"{where} compile_specs")):
            key = spec.string(0, f"{where} compile_specs[{s}].key") or ""
            value = spec.bytes_view(1, f"{where} compile_specs[{s}].value") or b""
            reader.charge(len(value) // 64 + 1, f"{where} compile_specs[{s}].value")
            specs[key] = bytes(value)
        raw = view[span[0] : span[1]]
        if bytes(raw[:4]) not in (MAGIC_TR01, MAGIC_TR02):
            # Our convention for a blob kept in named data: the processed bytes name its key.
            reader.charge(min(len(raw), 4096) // 64 + 1, f"{where} named-data key")
            data_key = _as_key(raw)
            if data_key is None or data_key not in named_keys:
                raise FormatError(
                    f"{where} ({BACKEND_ID}, {location}) holds {len(raw)} bytes that are neither a "
                    f"TR01/TR02 blob (magic {bytes(raw[:4])!r}) nor a named-data key "
                    f"({len(named_keys)} keys{': ' + show(sorted(named_keys)) if named_keys else ''})"
                )
            span = segment(named_keys[data_key], f"{where} named data {data_key!r}")
            location = "named_data"
        return backend_id, location, span, specs

    seen: dict[int, tuple[str, str, tuple[int, int], dict[str, bytes]]] = {}
    warnings_of: dict[tuple[int, int, int, int], tuple[str, ...]] = {}
    delegates: list[Delegate] = []
    others: list[str] = []
    methods: list[str] = []
    for p, plan in enumerate(plans):
        method = plan.string(0, f"execution_plan[{p}].name") or f"plan{p}"
        methods.append(method)
        plan_delegates = plan.tables(7, f"{method}.delegates")
        calls = _PlanCalls(plan, method)
        prefix = f"{what} method {method!r} delegate "
        for d, delegate in enumerate(plan_delegates):
            where = prefix + str(d)
            found = seen.get(delegate.pos)  # delegates aliasing one table are read once
            if found is None:
                found = seen[delegate.pos] = read_delegate(delegate, where)
            backend_id, location, span, specs = found
            reader.charge(DELEGATE_WORK + len(specs), where)
            if backend_id != BACKEND_ID:
                others.append(backend_id)
                continue
            blob = blob_at(span, where)
            reader.charge(len(blob.bindings) + 1, f"{where} bindings")
            fully = calls.order == [d] and len(plan_delegates) == 1
            tensors = calls.tensors(d)
            if fully:
                blob = _with_program_types(blob, tensors)
            # Delegates aliasing one table, blob and call arguments share their warnings.
            warn_key = (id(blob), delegate.pos, id(calls), d if d in calls.first_args else -1)
            warned = warnings_of.get(warn_key)
            if warned is None:
                warned = warnings_of[warn_key] = _warnings(blob, specs, tensors, calls, d)
            delegates.append(
                Delegate(
                    index=len(delegates),
                    method=method,
                    method_delegate_index=d,
                    location=location,
                    blob=blob,
                    compile_specs=dict(specs),
                    fully_delegated=fully,
                    tensors=tensors,
                    warnings=warned,
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


def _segment_span(
    seg: TableView, index: int, base: int, size: int, has_header: bool, what: str
) -> tuple[int, int]:
    """Where ``Program.segments[index]`` lies in the file; past its end is truncation."""
    offset, length = seg.scalar(0, "<Q"), seg.scalar(1, "<Q")
    start = base + offset
    end = start + length
    if has_header and end > size:
        raise FormatError(
            f"{what} segment {index} (offset {start} + size {length} = {end}) runs past the end "
            f"of the file; truncated or corrupt: expected {end} bytes, got {size}"
        )
    return start, end


def _check_tail(root: TableView, segment_count: int, what: str) -> None:
    """Read what no delegate needs but a truncated file loses: the constant and mutable segments."""
    constant = root.child(5, "Program.constant_segment")
    tables = [constant] if constant is not None else []
    tables.extend(root.tables(6, "Program.mutable_data_segments"))
    for i, sub in enumerate(tables):
        index = sub.scalar(0, "<I")
        sub.scalars(1, "<Q", f"Program segment offsets {i}")
        if index and index >= segment_count:
            raise FormatError(
                f"{what} constant or mutable data refers to segment {index}; the program has {segment_count}"
            )


def _as_key(raw: memoryview) -> str | None:
    if not 0 < len(raw) <= 4096:
        return None
    try:
        return str(raw, "utf-8")
    except UnicodeDecodeError:
        return None


class _PlanCalls:
    """A method's delegate calls, from one scan of its instructions, and its values."""

    def __init__(self, plan: TableView, method: str) -> None:
        self.plan, self.method = plan, method
        #: Delegate indices the method calls, in order; None if it also runs kernels.
        self.order: list[int] | None = []
        #: The value indices the first call of each delegate passes.
        self.first_args: dict[int, list[int]] = {}
        self._inputs: set[int] | None = None
        self._tensors: dict[int, ProgramTensor | None] = {}  # by value index, read once
        for c, chain in enumerate(plan.tables(5, f"{method}.chains")):
            for i, instruction in enumerate(chain.tables(2, f"{method}.chains[{c}].instructions")):
                call = None
                if instruction.scalar(0, "<B") == _DELEGATE_CALL:
                    call = instruction.child(1, f"{method} instruction {i}")
                if call is None:
                    self.order = None
                    continue
                delegate = call.scalar(0, "<i")
                if self.order is not None:
                    self.order.append(delegate)
                if delegate not in self.first_args:
                    self.first_args[delegate] = call.scalars(
                        1, "<i", f"{method} instruction {i} DelegateCall.args"
                    )
        self.values = plan.tables(2, f"{method}.values")

    @property
    def inputs(self) -> set[int]:
        if self._inputs is None:
            self._inputs = set(self.plan.scalars(3, "<i", f"{self.method}.inputs"))
        return self._inputs

    def tensors(self, delegate: int) -> tuple[ProgramTensor, ...]:
        """How the program records the tensors a delegate call passes (non-tensors skipped)."""
        args = self.first_args.get(delegate)
        if args is None:
            return ()
        method, values = self.method, self.values
        result = []
        for arg in args:
            if arg not in self._tensors:
                if not 0 <= arg < len(values):
                    raise FormatError(
                        f".pte method {method!r} delegate {delegate} argument {arg} is not a value index "
                        f"(the method has {len(values)} values)"
                    )
                value = values[arg]
                tensor = (
                    value.child(1, f"{method}.values[{arg}] Tensor")
                    if value.scalar(0, "<B") == _TENSOR
                    else None
                )
                self._tensors[arg] = (
                    None if tensor is None else _program_tensor(tensor, f"{method}.values[{arg}]")
                )
            found = self._tensors[arg]
            if found is not None:
                result.append(found)
        return tuple(result)


def _program_tensor(tensor: TableView, where: str) -> ProgramTensor:
    code = tensor.scalar(0, "<b")
    extra = tensor.child(9, f"{where} ExtraTensorInfo")
    device = "cpu"
    if extra is not None:
        kind = _DEVICE_NAME.get(extra.scalar(3, "<b"), f"device_type {extra.scalar(3, '<b')}")
        device = kind if kind == "cpu" else f"{kind}:{extra.scalar(4, '<b')}"
    return ProgramTensor(
        dtype=_DTYPE_OF_SCALAR.get(code),
        scalar_type=code,
        sizes=tuple(tensor.scalars(2, "<i", f"{where} Tensor.sizes")),
        dynamism=_DYNAMISM_NAME.get(tensor.scalar(8, "<b"), f"unknown {tensor.scalar(8, '<b')}"),
        device=device,
        device_recorded=extra is not None,
        planned=tensor.field(6) is not None,
    )


def _warnings(
    blob: Tr01Blob,
    specs: dict[str, bytes],
    tensors: tuple[ProgramTensor, ...],
    calls: _PlanCalls,
    delegate: int,
) -> tuple[str, ...]:
    """Sentences for what a reader should know: the blob's device_id decides at run time."""
    found = []
    expected = f"cuda:{blob.device_id}"
    decides = (
        f"the blob's device_id {blob.device_id} decides where the engine runs "
        "(load(..., device=N) overrides it)"
    )
    if TARGET_DEVICE_KEY in specs:
        text = spec_text(specs[TARGET_DEVICE_KEY])
        index = cuda_index(text)
        if index is None:
            found.append(f"compile spec target_device {text!r} names no CUDA device; {decides}")
        elif index != blob.device_id:
            found.append(f"compile spec target_device {text!r} disagrees with the blob; {decides}")
    names = [s.name for s in blob.bindings] if len(blob.bindings) == len(tensors) else []

    def label(i: int) -> str:
        return repr(names[i]) if names else f"argument {i}"

    devices = sorted({t.device for t in tensors if t.device_recorded})
    if devices and devices != [expected]:
        found.append(
            f"the program records this delegate's tensors on {', '.join(devices)} (ExtraTensorInfo); "
            f"{decides}"
        )
    unbound = [label(i) for i, t in enumerate(tensors) if t.dynamism == "dynamic_unbound"]
    if unbound:
        found.append(
            f"tensor(s) {', '.join(unbound)} are DYNAMIC_UNBOUND: ExecuTorch's runtime refuses to load "
            "the method ('Fully dynamic tensor shapes not yet supported'); trt-runtime reads it"
        )
    inputs = calls.inputs if tensors else set()
    args = calls.first_args.get(delegate) or []
    planned_device_inputs = [
        label(i)
        for i, (arg, t) in enumerate(zip(args, tensors, strict=False))
        if arg in inputs and t.planned and t.device != "cpu"
    ]
    if planned_device_inputs:
        found.append(
            f"method input(s) {', '.join(planned_device_inputs)} are memory-planned and recorded on a "
            "CUDA device: ExecuTorch's set_input refuses to copy into them ('Planned-buffer copy needs "
            "host memory on both sides')"
        )
    return tuple(found)


def _with_program_types(blob: Tr01Blob, tensors: tuple[ProgramTensor, ...]) -> Tr01Blob:
    """Fill bindings whose dtype the blob leaves empty from the program's tensors.

    torch-tensorrt writes ``"dtype":""`` and ``"shape":[]``; in a fully delegated
    method the delegate's arguments are its inputs then its outputs, in binding order.
    """
    if blob.dtypes_recorded or len(tensors) != len(blob.bindings):
        return blob
    specs = []
    for spec, tensor in zip(blob.bindings, tensors, strict=True):
        if spec.dtype:
            specs.append(spec)
            continue
        if tensor.dtype is None:
            raise FormatError(
                f".pte tensor for binding {spec.name!r} has ExecuTorch scalar type "
                f"{tensor.scalar_type}, which TensorRT bindings do not support"
            )
        static = tensor.dynamism == "static"
        shape = spec.shape or (tensor.sizes if static else tuple(-1 for _ in tensor.sizes))
        specs.append(dataclasses.replace(spec, dtype=tensor.dtype, shape=shape))
    return dataclasses.replace(blob, bindings=tuple(specs), dtypes_recorded=all(s.dtype for s in specs))
