"""The serialized format of memory-backend engines: ``b"TRTMEM1\\0"`` and JSON.

The JSON names the engine, its inputs (:class:`~trt_runtime.TensorSpec` fields, with
optimization profiles for dynamic dimensions) and one :class:`AffineOutput` per output.
:func:`build_engine` writes it and :func:`parse_engine` reads it back, refusing anything
malformed with :class:`~trt_runtime.FormatError` naming the problem.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from trt_runtime.dtypes import DTYPE_NAMES, normalize_dtype
from trt_runtime.errors import FormatError
from trt_runtime.protocols import TensorSpec

__all__ = ["ENGINE_MAGIC", "AffineOutput", "build_engine", "parse_engine"]

ENGINE_MAGIC = b"TRTMEM1\0"


@dataclasses.dataclass(frozen=True, slots=True)
class AffineOutput:
    """One output of a memory engine: ``scale * inputs[input] + bias``.

    ``dtype`` defaults to the input's dtype. ``data_dependent`` keeps only the
    elements whose input value is > 0, flattened to 1-D.
    """

    name: str
    input: str
    scale: float = 1.0
    bias: float = 0.0
    dtype: str | None = None
    data_dependent: bool = False


def build_engine(
    inputs: Sequence[TensorSpec], outputs: Sequence[AffineOutput], *, name: str = "memory_engine"
) -> bytes:
    """Serialize an engine; the bytes load with ``MemoryBackend.load_engine`` (validated both ways)."""
    doc = {
        "name": name,
        "inputs": [
            {
                "name": s.name,
                "dtype": s.dtype,
                "shape": list(s.shape),
                "profiles": [[list(lo), list(opt), list(hi)] for lo, opt, hi in s.profiles],
            }
            for s in inputs
        ],
        "outputs": [dataclasses.asdict(op) for op in outputs],
    }
    data = ENGINE_MAGIC + json.dumps(doc).encode()
    parse_engine(data)  # refuse to write what cannot be read back
    return data


def json_after_magic(data: bytes | bytearray | memoryview, magic: bytes, error: type[Exception],
                     bad_magic: str, what: str) -> Any:
    """The JSON document that follows ``magic`` in ``data``; ``error`` (``bad_magic``, then the
    first bytes found, when the magic is missing; ``what`` is malformed, when the JSON is)."""
    raw = bytes(data)
    if not raw.startswith(magic):
        raise error(f"{bad_magic}; got {raw[:8]!r}")
    try:
        return json.loads(raw[len(magic) :].decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{what} is malformed: {exc}") from exc


def parse_engine(data: bytes | bytearray | memoryview) -> tuple[str, list[TensorSpec], list[AffineOutput]]:
    """``(name, inputs, outputs)`` of serialized engine bytes; ``FormatError`` if malformed."""
    doc = json_after_magic(data, ENGINE_MAGIC, FormatError,
                           f"not a memory engine: expected magic {ENGINE_MAGIC!r}", "memory engine JSON")
    if not isinstance(doc, dict):
        raise FormatError(f"memory engine JSON must be an object; got {type(doc).__name__}")
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise FormatError(f"memory engine 'name' must be a non-empty string; got {name!r}")
    raw_inputs = _field(doc, "inputs", list)
    raw_outputs = _field(doc, "outputs", list)
    if not raw_inputs or not raw_outputs:
        raise FormatError(
            f"memory engine needs at least one input and one output; got "
            f"{len(raw_inputs)} input(s), {len(raw_outputs)} output(s)"
        )
    inputs = [_parse_input(item) for item in raw_inputs]
    input_names = [s.name for s in inputs]
    ops = [_parse_output(item, input_names) for item in raw_outputs]
    all_names = input_names + [op.name for op in ops]
    duplicates = sorted({n for n in all_names if all_names.count(n) > 1})
    if duplicates:
        raise FormatError(f"memory engine tensor names must be unique; repeated: {duplicates}")
    return name, inputs, ops


def _field(doc: Mapping[str, Any], key: str, kind: type) -> Any:
    value = doc.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise FormatError(f"memory engine field {key!r} must be a {kind.__name__}; got {value!r}")
    return value


def _dtype(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise FormatError(f"{where} dtype must be a string; got {value!r}")
    try:
        return normalize_dtype(value)
    except ValueError:
        raise FormatError(
            f"{where} dtype {value!r} is unknown; expected one of {', '.join(DTYPE_NAMES)}"
        ) from None


def _shape(value: Any, where: str, *, dynamic: bool) -> tuple[int, ...]:
    lowest = -1 if dynamic else 0
    if not isinstance(value, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= lowest for d in value
    ):
        raise FormatError(f"{where} must be a list of integers >= {lowest}; got {value!r}")
    return tuple(value)


def _item_name(item: Any, kind: str) -> str:
    """The name of an engine ``kind`` (``input``/``output``) entry, checked."""
    if not isinstance(item, dict):
        raise FormatError(f"memory engine {kind} must be an object; got {item!r}")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise FormatError(f"memory engine {kind} name must be a non-empty string; got {name!r}")
    return name


def _parse_input(item: Any) -> TensorSpec:
    name = _item_name(item, "input")
    where = f"input {name!r}"
    dtype = _dtype(item.get("dtype"), where)
    shape = _shape(item.get("shape"), f"{where} shape", dynamic=True)
    raw_profiles = item.get("profiles", [])
    if not isinstance(raw_profiles, list):
        raise FormatError(f"{where} profiles must be a list; got {raw_profiles!r}")
    profiles = []
    for triple in raw_profiles:
        if not isinstance(triple, list) or len(triple) != 3:
            raise FormatError(f"{where} profile must be [min, opt, max]; got {triple!r}")
        lo, opt, hi = (_shape(s, f"{where} profile shape", dynamic=False) for s in triple)
        if not len(lo) == len(opt) == len(hi) == len(shape):
            raise FormatError(f"{where} profile {triple!r} must have rank {len(shape)}")
        for d, a, o, b in zip(shape, lo, opt, hi, strict=True):
            if not a <= o <= b or (d >= 0 and not a == o == b == d):
                raise FormatError(
                    f"{where} profile {triple!r} must satisfy min <= opt <= max and match "
                    f"the static dims of {list(shape)}"
                )
        profiles.append((lo, opt, hi))
    if any(d < 0 for d in shape) and not profiles:
        raise FormatError(f"{where} has dynamic shape {list(shape)} but no optimization profile")
    return TensorSpec(name=name, dtype=dtype, shape=shape, is_input=True, profiles=tuple(profiles))


def _parse_output(item: Any, input_names: list[str]) -> AffineOutput:
    name = _item_name(item, "output")
    where = f"output {name!r}"
    source = item.get("input")
    if source not in input_names:
        raise FormatError(f"{where} reads input {source!r}; the engine's inputs are {input_names}")
    numbers = {}
    for key, default in (("scale", 1.0), ("bias", 0.0)):
        value = item.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise FormatError(f"{where} {key} must be a number; got {value!r}")
        numbers[key] = float(value)
    dtype = item.get("dtype")
    flag = item.get("data_dependent", False)
    if not isinstance(flag, bool):
        raise FormatError(f"{where} data_dependent must be true or false; got {flag!r}")
    return AffineOutput(
        name=name,
        input=source,
        scale=numbers["scale"],
        bias=numbers["bias"],
        dtype=None if dtype is None else _dtype(dtype, where),
        data_dependent=flag,
    )
