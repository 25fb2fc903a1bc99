"""Writing an ExecuTorch ``.pte`` whose one method is one call of a TensorRT delegate.

The program matches, field for field, what ExecuTorch 1.5.1's exporter writes for a
fully delegated CUDA method exported with the configuration ExecuTorch documents for
device delegates that take the caller's memory (``PropagateDeviceConfig(
skip_h2d_for_method_inputs=True, skip_d2h_for_method_outputs=True)`` with
``MemoryPlanningPass(alloc_graph_input=False, alloc_graph_output=False)``); the
interop tests compare our files with such files produced by ExecuTorch itself:

* the delegate carries ``CompileSpec("target_device", b"cuda:N")``;
* every argument tensor (the method's inputs, then its outputs) carries
  ``ExtraTensorInfo(device_type=CUDA, device_index=N)``;
* sizes are the shape, or for dynamic tensors the upper bound with
  ``DYNAMIC_BOUND``; a dynamic tensor without a known bound is ``DYNAMIC_UNBOUND``
  (ExecuTorch's runtime refuses those, so :func:`resolve_bounds` looks hard for one);
* no tensor is memory planned (no ``allocation_info``, ``non_const_buffer_sizes``
  ``[0, 0]``): ExecuTorch's ``Method::set_input`` refuses to copy a caller's tensor
  into a planned tensor that is recorded on a CUDA device ("Planned-buffer copy needs
  host memory on both sides"), so device tensors at the method boundary must share
  the caller's memory (``set_input``) and outputs take the caller's buffers
  (``set_output_data_ptr``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import IO, Any

from trt_runtime.dtypes import normalize_dtype
from trt_runtime.errors import FormatError, SettingsError
from trt_runtime.formats.flatbuffer import Bytes, String, Table, Vector, Writer
from trt_runtime.formats.pte import (
    BACKEND_ID,
    DEVICE_TYPES,
    DYNAMISM,
    EH_LENGTH,
    EH_MAGIC,
    INLINE,
    SCALAR_TYPES,
    SEGMENT,
    TARGET_DEVICE_KEY,
    cuda_index,
)
from trt_runtime.formats.source import write_chunks
from trt_runtime.protocols import TensorSpec

__all__ = [
    "LOCATIONS",
    "MAX_DEVICE_INDEX",
    "check_target_device",
    "default_target_device",
    "resolve_bounds",
    "write_program",
]

_log = logging.getLogger("trt_runtime.formats")

#: Where :func:`write_program` can put the blob.
LOCATIONS = ("segment", "inline", "named_data")
#: ``ExtraTensorInfo.device_index`` is a signed byte.
MAX_DEVICE_INDEX = 127
_DELEGATE_CALL = 2
_TENSOR = 5
_LEAF: dict[str, Any] = {"type": None, "context": None, "children_spec": []}

Bound = tuple[int, ...]


def check_target_device(target_device: str) -> int:
    """Validate a ``target_device`` compile spec value; return the CUDA index it names.

    Accepted: ``"cuda"`` or ``"cuda:N"`` (any case), as torch-tensorrt's partitioner
    accepts: a TensorRT engine runs on a CUDA device, never ``"cpu"``. ``N`` must fit
    ExecuTorch's ``ExtraTensorInfo.device_index`` (0..127).
    """
    if not isinstance(target_device, str):
        raise TypeError(f"target_device must be a str such as 'cuda:0'; got {type(target_device).__name__}")
    index = cuda_index(target_device)
    if index is None:
        raise SettingsError(
            f"target_device must be 'cuda' or 'cuda:N', the devices a TensorRT delegate runs on; "
            f"got {target_device!r}"
        )
    if index > MAX_DEVICE_INDEX:
        raise SettingsError(
            f"target_device {target_device!r} names CUDA device {index}; ExecuTorch records device "
            f"indices as a signed byte (0..{MAX_DEVICE_INDEX})"
        )
    return index


def default_target_device(device_ids: Sequence[int]) -> str:
    """``"cuda:N"`` for a program of exactly one engine on device N, else ``"cuda:0"``.

    The rule torch-tensorrt's partitioner follows when the caller names no device.
    """
    if len(device_ids) == 1:
        return f"cuda:{device_ids[0]}"
    return "cuda:0"


def resolve_bounds(
    bindings: Sequence[TensorSpec], upper_bounds: Mapping[str, Sequence[int]] | None = None
) -> list[Bound | None]:
    """The size each binding records in a ``.pte``: its shape, its upper bound, or None.

    Static bindings record their shape. A dynamic binding's upper bound comes from, in
    order: ``upper_bounds[name]``; for inputs, the largest ``max`` shape of their
    profiles; for outputs whose only dynamic dimension is the first, when every dynamic
    input is dynamic only in its first dimension and has profiles, the largest batch
    of those profiles (the output batch is the input batch, as in a dynamic-batch
    engine; pass ``upper_bounds`` for engines that change the batch). Data-dependent
    outputs and bindings without a bound get ``None`` (``DYNAMIC_UNBOUND``).
    """
    explicit = dict(upper_bounds or {})
    names = [s.name for s in bindings]
    unknown = sorted(set(explicit) - set(names))
    if unknown:
        raise SettingsError(f"upper_bounds names {unknown}, which are not bindings; bindings: {names}")
    batch = _batch_bound(bindings)
    result: list[Bound | None] = []
    for spec in bindings:
        if spec.name in explicit:
            result.append(_checked_bound(spec, explicit[spec.name]))
        elif not spec.is_dynamic:
            result.append(tuple(spec.shape))
        elif spec.is_input and spec.profiles:
            result.append(tuple(max(p[2][i] for p in spec.profiles) for i in range(len(spec.shape))))
        elif (
            not spec.is_input
            and not spec.data_dependent
            and batch is not None
            and spec.shape[0] < 0
            and all(d >= 0 for d in spec.shape[1:])
        ):
            result.append((batch, *spec.shape[1:]))
        else:
            result.append(None)
    return result


def _batch_bound(bindings: Sequence[TensorSpec]) -> int | None:
    dynamic = [s for s in bindings if s.is_input and s.is_dynamic]
    if not dynamic:
        return None
    for spec in dynamic:
        if not spec.profiles or spec.shape[0] >= 0 or any(d < 0 for d in spec.shape[1:]):
            return None
    return max(p[2][0] for spec in dynamic for p in spec.profiles)


def _checked_bound(spec: TensorSpec, bound: Sequence[int]) -> Bound:
    values = tuple(bound)
    if len(values) != len(spec.shape) or any(
        isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in values
    ):
        raise SettingsError(
            f"upper bound for {spec.name!r} must be {len(spec.shape)} non-negative ints "
            f"(shape {list(spec.shape)}); got {list(bound)}"
        )
    fixed = [i for i, d in enumerate(spec.shape) if d >= 0 and values[i] != d]
    if fixed:
        raise SettingsError(
            f"upper bound {list(values)} for {spec.name!r} changes its static dimension(s) {fixed} "
            f"(shape {list(spec.shape)})"
        )
    if spec.profiles:
        ceiling = [max(p[2][i] for p in spec.profiles) for i in range(len(spec.shape))]
        if any(v > c for v, c in zip(values, ceiling, strict=True)):
            raise SettingsError(
                f"upper bound {list(values)} for input {spec.name!r} exceeds its profiles' maximum {ceiling}"
            )
    return values


def _tensor(spec: TensorSpec, bound: Bound | None, device_index: int) -> Table:
    dtype = normalize_dtype(spec.dtype)
    if dtype not in SCALAR_TYPES:
        raise SettingsError(f"binding {spec.name!r} has dtype {dtype!r}, which ExecuTorch cannot express")
    if bound is None:
        sizes, dynamism = [max(d, 1) for d in spec.shape], DYNAMISM["dynamic_unbound"]
    else:
        sizes = list(bound)
        dynamism = DYNAMISM["dynamic_bound"] if spec.is_dynamic else DYNAMISM["static"]
    extra = Table([None, None, None, ("<b", DEVICE_TYPES["cuda"]), ("<b", device_index)])
    return Table(
        [
            ("<b", SCALAR_TYPES[dtype]),  # scalar_type
            ("<i", 0),  # storage_offset
            ("off", Vector("<i", sizes)),  # sizes
            ("off", Vector("<B", list(range(len(sizes))))),  # dim_order
            ("<B", 0),  # requires_grad
            ("<I", 0),  # data_buffer_idx: not a constant
            None,  # allocation_info: the caller's memory (see the module docstring)
            ("<b", 0),  # layout
            ("<b", dynamism),  # shape_dynamism
            ("off", extra),  # extra_tensor_info: the delegate's device
        ]
    )


def _pytree(inputs: int, outputs: int) -> tuple[str, str]:
    """ContainerMetadata strings: torch's pytree JSON of ``(args, kwargs)`` and the result."""
    tuple_of = lambda n: {"type": "builtins.tuple", "context": "null", "children_spec": [_LEAF] * n}  # noqa: E731
    kwargs = {"type": "builtins.dict", "context": "[]", "children_spec": []}
    args = {"type": "builtins.tuple", "context": "null", "children_spec": [tuple_of(inputs), kwargs]}
    result = _LEAF if outputs == 1 else tuple_of(outputs)
    return json.dumps([1, args]), json.dumps([1, result])


def write_program(
    out: IO[bytes],
    blob_parts: Sequence[bytes | memoryview],
    bindings: Sequence[TensorSpec],
    *,
    method: str = "forward",
    location: str = "segment",
    target_device: str = "cuda:0",
    upper_bounds: Mapping[str, Sequence[int]] | None = None,
    segment_alignment: int = 128,
) -> int:
    """Write a one-method program whose only instruction calls one TensorRT delegate.

    ``blob_parts`` concatenated are the TR01/TR02 blob; ``bindings`` are its inputs
    then outputs. ``location`` says where the blob goes: ``"segment"`` (the default,
    what ExecuTorch's exporter does) appends it after the flatbuffer as a data segment,
    streamed, so its size is not limited by the flatbuffer's 32-bit offsets;
    ``"inline"`` stores it in ``backend_delegate_data`` (under 2 GiB only);
    ``"named_data"`` puts it in a segment named by ``Program.named_data`` and stores
    that key as the delegate's processed bytes. ``target_device`` is written verbatim
    as the delegate's compile spec and tags every tensor (see
    :func:`check_target_device`); ``upper_bounds`` as in :func:`resolve_bounds`.
    Returns the number of bytes written.
    """
    if location not in LOCATIONS:
        raise SettingsError(f"location must be one of {', '.join(map(repr, LOCATIONS))}; got {location!r}")
    device_index = check_target_device(target_device)
    blob_size = sum(len(p) for p in blob_parts)
    specs = [s for s in bindings if s.is_input] + [s for s in bindings if not s.is_input]
    n_inputs = sum(1 for s in specs if s.is_input)
    bounds = resolve_bounds(specs, upper_bounds)
    unbound = [s.name for s, b in zip(specs, bounds, strict=True) if b is None]
    if unbound:
        _log.warning(
            "writing %s as DYNAMIC_UNBOUND: no upper bound is known (pass upper_bounds=); "
            "ExecuTorch's runtime will refuse to load the method",
            unbound,
        )
    values = [
        Table([("<B", _TENSOR), ("off", _tensor(s, b, device_index))])
        for s, b in zip(specs, bounds, strict=True)
    ]
    value_ids = list(range(len(specs)))
    in_ids, out_ids = value_ids[:n_inputs], value_ids[n_inputs:]
    call = Table([("<i", 0), ("off", Vector("<i", value_ids))])
    # ExecuTorch leaves Chain.inputs/outputs empty; the plan's inputs/outputs name them.
    chain = Table(
        [
            ("off", Vector("<i", [])),
            ("off", Vector("<i", [])),
            ("off", Vector("off", [Table([("<B", _DELEGATE_CALL), ("off", call)])])),
            None,
        ]
    )
    inline = location == "inline"
    if inline and blob_size >= 2**31:
        raise FormatError(f"a {blob_size}-byte blob cannot be inline; flatbuffer offsets are 32-bit")
    # Segment 0 is the (empty) constant segment, as ExecuTorch writes it; the blob is segment 1.
    in_segment = location == "segment"
    processed = Table([("<B", SEGMENT if in_segment else INLINE), ("<I", 1 if in_segment else 0)])
    spec_value = Bytes(memoryview(target_device.encode("utf-8")), 1)
    compile_specs = [Table([("off", String(TARGET_DEVICE_KEY)), ("off", spec_value)])]
    delegate = Table([("off", String(BACKEND_ID)), ("off", processed), ("off", Vector("off", compile_specs))])
    encoded_in, encoded_out = _pytree(n_inputs, len(specs) - n_inputs)
    container = Table([("off", String(encoded_in)), ("off", String(encoded_out))])
    plan = Table(
        [
            ("off", String(method)),  # name
            ("off", container),  # container_meta_type
            ("off", Vector("off", values)),  # values
            ("off", Vector("<i", in_ids)),  # inputs
            ("off", Vector("<i", out_ids)),  # outputs
            ("off", Vector("off", [chain])),  # chains
            ("off", Vector("off", [])),  # operators
            ("off", Vector("off", [delegate])),  # delegates
            ("off", Vector("<q", [0, 0])),  # non_const_buffer_sizes: nothing planned
        ]
    )
    inline_data = []
    named_data = None
    if inline:
        inline_data = [Table([("off", Bytes(memoryview(b"".join(blob_parts)), 16))])]
    elif location == "named_data":
        key = f"{BACKEND_ID}/{method}/0"
        inline_data = [Table([("off", Bytes(memoryview(key.encode("utf-8")), 16))])]
        named_data = ("off", Vector("off", [Table([("off", String(key)), ("<I", 1)])]))
    segments = [Table([("<Q", 0), ("<Q", 0)])]
    if not inline:
        segments.append(Table([("<Q", 0), ("<Q", blob_size)]))
    root = Table(
        [
            ("<I", 0),  # version
            ("off", Vector("off", [plan])),  # execution_plan
            ("off", Vector("off", [])),  # constant_buffer: empty, as ExecuTorch writes it
            ("off", Vector("off", inline_data)),  # backend_delegate_data
            ("off", Vector("off", segments)),  # segments
            ("off", Table([("<I", 0), ("off", Vector("<Q", [0]))])),  # constant_segment: no constants
            None,  # mutable_data_segments
            named_data,
        ]
    )
    header = b"\x00" * EH_LENGTH if not inline else b""
    writer = Writer(b"\x00\x00\x00\x00ET12" + header)
    writer.buf[0:4] = writer.place(root).to_bytes(4, "little")
    writer.pad(16)
    program_size = len(writer.buf)
    if inline:
        out.write(writer.buf)
        return program_size
    base = (program_size + segment_alignment - 1) // segment_alignment * segment_alignment
    writer.buf[8:40] = (
        EH_MAGIC
        + EH_LENGTH.to_bytes(4, "little")
        + program_size.to_bytes(8, "little")
        + base.to_bytes(8, "little")
        + blob_size.to_bytes(8, "little")
    )
    out.write(writer.buf)
    out.write(b"\x00" * (base - program_size))
    for part in blob_parts:
        write_chunks(out, memoryview(part))
    return base + blob_size
