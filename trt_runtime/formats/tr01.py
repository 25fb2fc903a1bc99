"""The ExecuTorch TensorRT delegate blob (magic ``TR01``, or ``TR02`` with aliased IO).

Layout (all integers little-endian)::

    offset  size  field
    0       4     magic            b"TR01" or b"TR02" (TR02 iff aliased_io is non-empty)
    4       4     metadata_offset  uint32, >= 32
    8       4     metadata_size    uint32
    12      4     engine_offset    uint32, multiple of 16, after the metadata
    16      8     engine_size      uint64
    24      8     reserved         the writer puts b"\\x01" + 7 zero bytes
    32      ...   metadata         compact UTF-8 JSON
    ...     ...   zero padding     up to engine_offset
    ...     ...   engine           engine_size bytes of serialized TensorRT plan

The writer here produces the same bytes as torch-tensorrt's
``py/torch_tensorrt/executorch/serialization.py`` for the same values (see
docs/formats.md for what was checked).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any

from typing_extensions import Unpack

from trt_runtime.dtypes import DTYPE_NAMES, normalize_dtype
from trt_runtime.errors import FormatError, SettingsError
from trt_runtime.formats.blob_options import AliasedIO, BlobKeywords, BlobOptions
from trt_runtime.formats.source import EngineData, engine_view, output_stream, write_chunks
from trt_runtime.protocols import TensorSpec
from trt_runtime.validation import python_limits, show

__all__ = [
    "ALIAS_KINDS",
    "AliasedIO",
    "BlobOptions",
    "ENGINE_ALIGNMENT",
    "HEADER_FORMAT",
    "HEADER_SIZE",
    "MAGIC_TR01",
    "MAGIC_TR02",
    "MAX_METADATA_ITEMS",
    "MAX_METADATA_SIZE",
    "Tr01Blob",
    "blob_parts",
    "current_platform",
    "encode_metadata",
    "pack_tr01",
    "parse_tr01",
    "write_tr01",
]

MAGIC_TR01 = b"TR01"
MAGIC_TR02 = b"TR02"
HEADER_FORMAT = "<4sIIIQ8s"
HEADER_SIZE = struct.calcsize(HEADER_FORMAT)  # 32
ENGINE_ALIGNMENT = 16
#: What torch-tensorrt's writer puts in the reserved bytes.
RESERVED = b"\x01" + b"\x00" * 7
#: Metadata larger than this is taken for corruption (real metadata is a few KiB).
MAX_METADATA_SIZE = 64 * 1024 * 1024
#: Most JSON values (counted by separators) metadata may hold: ~100 per binding for 20K
#: bindings; bounds the decoded document to ~200 MB whatever the metadata holds.
MAX_METADATA_ITEMS = 2 * 1024 * 1024
#: Kinds of aliased output->input bindings the C++ runtime knows.
ALIAS_KINDS = ("kv_cache_update", "user")
_U32_MAX = 2**32 - 1


@dataclasses.dataclass(frozen=True)
class Tr01Blob:
    """A parsed TR01/TR02 blob. ``engine`` is a slice of the input (no copy)."""

    magic: str
    engine: memoryview
    bindings: tuple[TensorSpec, ...]
    aliased_io: tuple[tuple[str, str, str], ...]  # (output, input, kind)
    hardware_compatible: bool
    device_id: int
    serialized_metadata: str
    target_platform: str
    metadata_offset: int
    metadata_size: int
    engine_offset: int
    engine_size: int
    #: Whether every binding records its dtype (torch-tensorrt's writer leaves them "").
    dtypes_recorded: bool

    def metadata(self) -> dict[str, Any]:
        """The container facts an :class:`~trt_runtime.EngineSource` carries."""
        return {
            "aliased_io": [list(a) for a in self.aliased_io],
            "hardware_compatible": self.hardware_compatible,
            "serialized_metadata": self.serialized_metadata,
            "target_platform": self.target_platform,
            "engine_offset": self.engine_offset,
            "engine_size": self.engine_size,
            "dtypes_recorded": self.dtypes_recorded,
        }


def current_platform() -> str:
    """This machine as torch-tensorrt names platforms: ``linux_x86_64``, ``win_arm64``, ..."""
    system = platform.system().lower()
    machine = platform.machine().lower()
    if system.startswith("linux"):
        if machine.startswith("aarch64"):
            return "linux_aarch64"
        if machine.startswith(("x86_64", "amd64")):
            return "linux_x86_64"
    elif system.startswith("windows"):
        if machine.startswith(("arm64", "aarch64")):
            return "win_arm64"
        if machine.startswith(("amd64", "x86_64")):
            return "win_x86_64"
    return "unknown"


def _align(value: int, alignment: int = ENGINE_ALIGNMENT) -> int:
    return (value + alignment - 1) // alignment * alignment


# ----------------------------------------------------------------------------- reading


def parse_tr01(data: bytes | bytearray | memoryview, *, what: str = "TR01 blob") -> Tr01Blob:
    """Validate a TR01/TR02 blob completely and return its parts.

    Every inconsistency raises :class:`FormatError` naming the field and its value;
    nothing is handed on before the header, the regions and the JSON are checked.
    Memory stays bounded: metadata with more than :data:`MAX_METADATA_ITEMS` JSON
    values is refused before it is decoded.
    """
    with python_limits(FormatError, what):
        return _parse_tr01(data, what)


def _parse_tr01(data: bytes | bytearray | memoryview, what: str) -> Tr01Blob:
    view = memoryview(data)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    size = len(view)
    if size < HEADER_SIZE:
        raise FormatError(
            f"{what} is too small: {size} bytes; expected at least {HEADER_SIZE} bytes (the header)"
        )
    magic_b, meta_off, meta_size, eng_off, eng_size, _reserved = struct.unpack_from(HEADER_FORMAT, view, 0)
    if magic_b not in (MAGIC_TR01, MAGIC_TR02):
        raise FormatError(f"{what} has unknown magic {magic_b!r}; expected b'TR01' or b'TR02'")
    magic = magic_b.decode("ascii")
    # Errors name the container ("blob 'model.pte' delegate 1: ...") unless it is bare.
    prefix = "" if what == "TR01 blob" else f"{what}: "
    tag = f"{prefix}{magic} "
    if meta_off < HEADER_SIZE:
        raise FormatError(
            f"{tag}metadata_offset {meta_off} is inside the {HEADER_SIZE}-byte header "
            f"(expected >= {HEADER_SIZE})"
        )
    if meta_size == 0:
        raise FormatError(f"{tag}metadata_size is 0; expected the JSON metadata")
    if meta_size > MAX_METADATA_SIZE:
        raise FormatError(
            f"{tag}metadata_size {meta_size} is absurd (limit {MAX_METADATA_SIZE} bytes); the blob is corrupt"
        )
    if eng_off < HEADER_SIZE:
        raise FormatError(
            f"{tag}engine_offset {eng_off} is inside the {HEADER_SIZE}-byte header "
            f"(expected >= {HEADER_SIZE})"
        )
    if eng_off % ENGINE_ALIGNMENT:
        raise FormatError(
            f"{tag}engine_offset {eng_off} is not {ENGINE_ALIGNMENT}-byte aligned "
            f"(remainder {eng_off % ENGINE_ALIGNMENT})"
        )
    if eng_size == 0:
        raise FormatError(f"{tag}engine_size is 0; expected a serialized engine")
    meta_end = meta_off + meta_size
    if meta_end > size:
        raise FormatError(
            f"{tag}metadata_size {meta_size} runs past the end of the blob (offset {meta_off} + size "
            f"{meta_size} = {meta_end} > {size} bytes); truncated or corrupt: expected "
            f"{meta_end} bytes, got {size}"
        )
    eng_end = eng_off + eng_size
    if eng_end > size:
        raise FormatError(
            f"{tag}engine_size {eng_size} runs past the end of the blob (offset {eng_off} + size "
            f"{eng_size} = {eng_end} > {size} bytes); truncated or corrupt: expected "
            f"{eng_end} bytes, got {size}"
        )
    if meta_end > eng_off:
        raise FormatError(
            f"{tag}metadata (offset {meta_off} + size {meta_size} = {meta_end}) overlaps the engine "
            f"at engine_offset {eng_off}; expected the metadata to end at or before the engine"
        )
    if eng_end < size:
        raise FormatError(
            f"{tag}blob has {size - eng_end} trailing bytes after the engine (engine ends at "
            f"{eng_end}, blob is {size} bytes)"
        )
    fields = _parse_metadata(view[meta_off:meta_end], magic, prefix)
    return Tr01Blob(
        magic=magic,
        engine=view[eng_off:eng_end],
        metadata_offset=meta_off,
        metadata_size=meta_size,
        engine_offset=eng_off,
        engine_size=eng_size,
        **fields,
    )


def _parse_metadata(raw: memoryview, magic: str, prefix: str = "") -> dict[str, Any]:
    tag = f"{prefix}{magic} metadata"
    try:
        text = str(raw, "utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"{tag} is not valid UTF-8: byte {exc.start} is {raw[exc.start]:#04x}") from exc
    # Decoded JSON costs up to ~100 bytes per value ([] is 3 bytes of text, a 56-byte list):
    # bound the values (at most one per ',', '[' or '{', strings included) before decoding.
    items = text.count(",") + text.count("[") + text.count("{")
    if items > MAX_METADATA_ITEMS:
        raise FormatError(
            f"{tag} holds up to {items:,} JSON values; the limit is {MAX_METADATA_ITEMS:,} "
            "(real metadata holds a few per binding); the blob is corrupt or hostile"
        )
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise FormatError(f"{tag} is not valid JSON: {show(str(exc))}") from exc
    if not isinstance(doc, dict):
        raise FormatError(f"{tag} must be a JSON object; got {type(doc).__name__}")
    missing = [key for key in ("io_bindings", "device_id") if key not in doc]
    if missing:
        raise FormatError(f"{tag} lacks required key(s) {missing}; has {sorted(doc)}")

    raw_bindings = doc["io_bindings"]
    if not isinstance(raw_bindings, list):
        raise FormatError(f"{tag} io_bindings must be a list; got {type(raw_bindings).__name__}")
    bindings: list[TensorSpec] = []
    dtypes_recorded = True
    seen: set[str] = set()
    for i, entry in enumerate(raw_bindings):
        where = f"{tag} io_bindings[{i}]"
        if not isinstance(entry, dict):
            raise FormatError(f"{where} must be an object; got {type(entry).__name__}")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise FormatError(f"{where} needs a non-empty string 'name'; got {show(name)}")
        if name in seen:
            raise FormatError(f"{where} repeats binding name {show(name)}")
        seen.add(name)
        is_input = entry.get("is_input")
        if not isinstance(is_input, bool):
            raise FormatError(f"{where} ({show(name)}) needs a boolean 'is_input'; got {show(is_input)}")
        dtype = entry.get("dtype", "")
        if not isinstance(dtype, str):
            raise FormatError(f"{where} ({show(name)}) dtype must be a string; got {show(dtype)}")
        if dtype:
            try:
                dtype = normalize_dtype(dtype)
            except ValueError:
                raise FormatError(
                    f"{where} ({show(name)}) has unknown dtype {show(dtype)}; expected one of "
                    f"{', '.join(DTYPE_NAMES)}"
                ) from None
        else:
            dtypes_recorded = False
        shape = entry.get("shape", [])
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and -1 <= d < 2**63 for d in shape
        ):
            raise FormatError(
                f"{where} ({show(name)}) shape must be a list of integers >= -1; got {show(shape)}"
            )
        data_dependent = entry.get("data_dependent", False)
        if not isinstance(data_dependent, bool):
            raise FormatError(
                f"{where} ({show(name)}) data_dependent must be a boolean; got {show(data_dependent)}"
            )
        bindings.append(
            TensorSpec(
                name=name,
                dtype=dtype,
                shape=tuple(shape),
                is_input=is_input,
                profiles=_parse_profiles(entry.get("profiles", []), len(shape), f"{where} ({name!r})"),
                data_dependent=data_dependent and not is_input,
            )
        )

    aliased = _parse_aliased(doc.get("aliased_io", []), bindings, tag)
    if aliased and magic == "TR01":
        raise FormatError(
            f"{prefix}TR01 blob carries aliased_io {[a[0] for a in aliased]}; a blob with aliased IO must "
            "use magic TR02 (a TR01 reader would ignore the aliasing and compute wrong results)"
        )

    hardware_compatible = doc.get("hardware_compatible", False)
    if not isinstance(hardware_compatible, bool):
        raise FormatError(f"{tag} hardware_compatible must be a boolean; got {show(hardware_compatible)}")
    device_id = doc["device_id"]
    if not isinstance(device_id, int) or isinstance(device_id, bool) or not 0 <= device_id < 2**31:
        raise FormatError(f"{tag} device_id must be an integer in [0, 2**31); got {show(device_id)}")
    strings = {}
    for key in ("serialized_metadata", "target_platform"):
        value = doc.get(key, "")
        if not isinstance(value, str):
            raise FormatError(f"{tag} {key} must be a string; got {type(value).__name__}")
        strings[key] = value
    return {
        "bindings": tuple(bindings),
        "aliased_io": aliased,
        "hardware_compatible": hardware_compatible,
        "device_id": device_id,
        "dtypes_recorded": dtypes_recorded,
        **strings,
    }


def _parse_profiles(
    raw: Any, rank: int, where: str
) -> tuple[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]], ...]:
    """An input's ``profiles``: ``[[min, opt, max], ...]``, each a shape of the binding's rank."""
    if not isinstance(raw, list):
        raise FormatError(f"{where} profiles must be a list of [min, opt, max] shapes; got {raw!r}")
    profiles = []
    for i, triple in enumerate(raw):
        ok = (
            isinstance(triple, list)
            and len(triple) == 3
            and all(
                isinstance(s, list)
                and len(s) == rank
                and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**63 for d in s)
                for s in triple
            )
        )
        if not ok or not all(a <= b <= c for a, b, c in zip(*triple, strict=True)):
            raise FormatError(
                f"{where} profiles[{i}] must be [min, opt, max] shapes of rank {rank} with "
                f"0 <= min <= opt <= max; got {triple!r}"
            )
        lo, opt, hi = (tuple(s) for s in triple)
        profiles.append((lo, opt, hi))
    return tuple(profiles)


def _parse_aliased(raw: Any, bindings: Sequence[TensorSpec], tag: str) -> tuple[tuple[str, str, str], ...]:
    if not isinstance(raw, list):
        raise FormatError(f"{tag} aliased_io must be a list; got {type(raw).__name__}")
    inputs = {b.name for b in bindings if b.is_input}
    outputs = {b.name for b in bindings if not b.is_input}
    result = []
    for i, entry in enumerate(raw):
        where = f"{tag} aliased_io[{i}]"
        if not isinstance(entry, dict):
            raise FormatError(f"{where} must be an object; got {type(entry).__name__}")
        out, inp, kind = entry.get("output"), entry.get("input"), entry.get("kind", "kv_cache_update")
        if not isinstance(out, str) or out not in outputs:
            raise FormatError(
                f"{where} output {show(out)} is not an output binding; outputs: {show(sorted(outputs))}"
            )
        if not isinstance(inp, str) or inp not in inputs:
            raise FormatError(
                f"{where} input {show(inp)} is not an input binding; inputs: {show(sorted(inputs))}"
            )
        if not isinstance(kind, str) or kind not in ALIAS_KINDS:
            raise FormatError(
                f"{where} kind {show(kind)} is unknown; expected one of {', '.join(ALIAS_KINDS)}"
            )
        result.append((out, inp, kind))
    return tuple(result)


# ----------------------------------------------------------------------------- writing


def _normalize_aliased(aliased_io: AliasedIO, bindings: Sequence[TensorSpec]) -> list[tuple[str, str, str]]:
    if isinstance(aliased_io, Mapping):
        items = []
        for out, value in aliased_io.items():
            if isinstance(value, str):
                items.append((out, value, "kv_cache_update"))
            else:
                inp, kind = value
                items.append((out, inp, kind))
    else:
        items = [tuple(a) for a in aliased_io]  # type: ignore[misc]
    # Reuse the reader's checks so a writer cannot produce a blob the reader rejects.
    raw = [{"output": o, "input": i, "kind": k} for o, i, k in items]
    return list(_parse_aliased(raw, bindings, "aliased_io"))


def _check_bindings(bindings: Sequence[TensorSpec]) -> list[TensorSpec]:
    specs = list(bindings)
    for spec in specs:
        if not isinstance(spec, TensorSpec):
            raise TypeError(f"bindings must be TensorSpec instances; got {type(spec).__name__}")
        if not spec.name:
            raise SettingsError("binding names must be non-empty")
        if spec.dtype:
            normalize_dtype(spec.dtype)
    names = [s.name for s in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SettingsError(f"binding names must be unique; repeated: {duplicates}")
    return specs


def encode_metadata(
    bindings: Sequence[TensorSpec],
    options: BlobOptions | Mapping[str, Any] | None = None,
    **keywords: Unpack[BlobKeywords],
) -> bytes:
    """The metadata JSON, with torch-tensorrt's key order and compact separators.

    ``options`` and ``keywords`` are the blob's :class:`BlobOptions` (an instance, a mapping
    or its fields as keyword arguments). Bindings are written in the order given; a
    data-dependent output gets an extra ``"data_dependent":true`` and an input with
    optimization profiles an extra ``"profiles":[[min,opt,max],...]`` (the C++ parser skips
    binding keys it does not know). ``record_profiles=False`` leaves the profiles out:
    torch-tensorrt's own writer does.
    """
    return _encode(bindings, BlobOptions.coerce(options, **keywords))[0]


def _encode(bindings: Sequence[TensorSpec], options: BlobOptions) -> tuple[bytes, bool]:
    specs = _check_bindings(bindings)
    aliased = _normalize_aliased(options.aliased_io, specs)
    record_profiles = options.record_profiles
    entries = []
    for spec in specs:
        entry: dict[str, Any] = {
            "name": spec.name,
            "dtype": normalize_dtype(spec.dtype) if spec.dtype else "",
            "shape": [int(d) for d in spec.shape],
            "is_input": bool(spec.is_input),
        }
        if spec.data_dependent and not spec.is_input:
            entry["data_dependent"] = True
        if record_profiles and spec.is_input and spec.profiles:
            # An extra key, like data_dependent: torch-tensorrt's C++ parser skips it.
            entry["profiles"] = [[[int(d) for d in shape] for shape in triple] for triple in spec.profiles]
            _parse_profiles(entry["profiles"], len(spec.shape), f"binding {spec.name!r}")  # as read back
        entries.append(entry)
    platform_name = options.target_platform
    doc = {
        "io_bindings": entries,
        "aliased_io": [{"output": o, "input": i, "kind": k} for o, i, k in aliased],
        "hardware_compatible": options.hardware_compatible,
        "device_id": options.device_id,
        "serialized_metadata": options.serialized_metadata,
        "target_platform": current_platform() if platform_name is None else platform_name,
    }
    return json.dumps(doc, separators=(",", ":")).encode("utf-8"), bool(aliased)


def _header(metadata: bytes, engine_size: int, aliased: bool) -> tuple[bytes, bytes]:
    """Header and the zero padding between metadata and engine."""
    if engine_size == 0:
        raise FormatError("engine is empty (0 bytes); expected a serialized engine")
    engine_offset = _align(HEADER_SIZE + len(metadata))
    if engine_offset > _U32_MAX:
        raise FormatError(f"metadata of {len(metadata)} bytes does not fit a uint32 engine_offset")
    header = struct.pack(
        HEADER_FORMAT,
        MAGIC_TR02 if aliased else MAGIC_TR01,
        HEADER_SIZE,
        len(metadata),
        engine_offset,
        engine_size,
        RESERVED,
    )
    return header, b"\x00" * (engine_offset - HEADER_SIZE - len(metadata))


@contextlib.contextmanager
def blob_parts(
    engine: EngineData,
    bindings: Sequence[TensorSpec],
    options: BlobOptions | Mapping[str, Any] | None = None,
    **keywords: Unpack[BlobKeywords],
) -> Iterator[tuple[bytes, memoryview]]:
    """The blob's prefix (header, metadata, padding) and a view of the engine bytes.

    The blob is the prefix followed by the engine; writers stream the view after the
    prefix instead of building the blob in memory. ``engine`` is bytes-like or the path
    of a plan (then mapped, not read); the view is valid inside the ``with`` block.
    ``options`` and ``keywords``: the blob's :class:`BlobOptions`, checked before the
    engine is opened.
    """
    chosen = BlobOptions.coerce(options, **keywords)
    with engine_view(engine) as view:
        metadata, aliased = _encode(bindings, chosen)
        header, padding = _header(metadata, len(view), aliased)
        yield header + metadata + padding, view


def write_tr01(
    target: str | os.PathLike[str] | IO[bytes],
    engine: EngineData,
    bindings: Sequence[TensorSpec],
    options: BlobOptions | Mapping[str, Any] | None = None,
    **keywords: Unpack[BlobKeywords],
) -> int:
    """Write a TR01/TR02 blob to a path (atomically) or a binary file; return its size.

    ``engine`` is bytes-like or the path of a plan; it is streamed in slices, so an
    engine of any size is written without a copy in memory. ``options`` and ``keywords``
    are the blob's :class:`BlobOptions`: TR02 is written exactly when ``aliased_io`` is
    non-empty, and inputs' optimization profiles are recorded unless
    ``record_profiles=False`` (see :func:`encode_metadata`).
    """
    with blob_parts(engine, bindings, options, **keywords) as (prefix, view), output_stream(target) as out:
        out.write(prefix)
        write_chunks(out, view)
        return len(prefix) + len(view)


def pack_tr01(
    engine_bytes: EngineData,
    bindings: Sequence[TensorSpec],
    options: BlobOptions | Mapping[str, Any] | None = None,
    **keywords: Unpack[BlobKeywords],
) -> bytes:
    """Pack an engine into one TR01 blob in memory (TR02 when ``aliased_io`` is given).

    Takes the same options as :func:`write_tr01`; ``target_platform`` defaults to this
    machine (``linux_x86_64``, ...). For engines of more than a few hundred MiB use
    :func:`write_tr01`, which streams.
    """
    with blob_parts(engine_bytes, bindings, options, **keywords) as (prefix, view):
        return b"".join((prefix, view))
