"""HTTP bodies of a served engine: JSON, ``.npy`` and ``.npz`` in, the same form out.

A request is one of:

* ``application/json``: a nested array (an engine with one input) or an object keyed by
  input name; numbers are converted to each input's dtype, refusing lossy conversions;
* ``application/x-npy`` (or ``application/npy``, ``application/octet-stream``): one
  ``.npy`` array (an engine with one input);
* ``application/x-npz`` (or ``application/zip``): an ``.npz`` archive keyed by input name.

The answer has the request's form: a bare array (JSON array or ``.npy``) when the
request was bare and the engine has one output, else keyed by output name (JSON object
or ``.npz``). Nothing is unpickled, and an ``.npy`` header must match its data size
before any array is made. Every refusal is a :class:`~trt_runtime.RequestError` with
status 400 (malformed), 413 (too large) or 415 (unknown content type).
"""

from __future__ import annotations

import dataclasses
import io
import json
import zipfile
from collections.abc import Sequence
from typing import Any

from trt_runtime.errors import RequestError
from trt_runtime.protocols import TensorSpec

__all__ = ["CONTENT_TYPES", "Decoded", "decode_body", "encode_result", "read_npy"]

_JSON = "application/json"
_NPY = "application/x-npy"
_NPZ = "application/x-npz"
#: Accepted Content-Type values and the form each one is read as.
CONTENT_TYPES = {
    _JSON: "json",
    _NPY: "npy",
    "application/npy": "npy",
    "application/octet-stream": "npy",
    _NPZ: "npz",
    "application/zip": "npz",
}


@dataclasses.dataclass(frozen=True, slots=True)
class Decoded:
    """A decoded body: arrays by position or by name, and how to answer."""

    args: tuple[Any, ...]
    named: dict[str, Any]
    encoding: str  # "json", "npy" or "npz"

    @property
    def bare(self) -> bool:
        return not self.named


def decode_body(content_type: str, body: bytes, inputs: Sequence[TensorSpec], max_bytes: int) -> Decoded:
    """Decode a request body for an engine with ``inputs``; ``RequestError`` if malformed."""
    media = content_type.split(";", 1)[0].strip().lower()
    encoding = CONTENT_TYPES.get(media)
    if encoding is None:
        raise RequestError(
            f"Content-Type {content_type!r} is not supported; expected one of {sorted(CONTENT_TYPES)}", 415
        )
    if len(body) > max_bytes:
        raise RequestError(f"request body of {len(body)} bytes exceeds the limit of {max_bytes} bytes", 413)
    if encoding == "json":
        return _decode_json(body, inputs)
    if encoding == "npy":
        return Decoded((read_npy(body, "the request body"),), {}, "npy")
    return Decoded((), _read_npz(body, max_bytes), "npz")


def _decode_json(body: bytes, inputs: Sequence[TensorSpec]) -> Decoded:
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(f"request body is not valid JSON: {exc}", 400) from None
    by_name = {s.name: s for s in inputs}
    if isinstance(doc, dict):
        named = {}
        for key, value in doc.items():
            spec = by_name.get(key)
            named[key] = value if spec is None else _json_array(value, spec)
        return Decoded((), named, "json")
    if isinstance(doc, list):
        value = _json_array(doc, inputs[0]) if len(inputs) == 1 else doc
        return Decoded((value,), {}, "json")
    raise RequestError(
        f"JSON request must be an array or an object keyed by input name; got {doc!r:.40}", 400
    )


def _json_array(value: Any, spec: TensorSpec) -> Any:
    import numpy as np

    from trt_runtime.dtypes import to_numpy

    where = f"input {spec.name!r}"
    try:
        raw = np.asarray(value)
    except ValueError as exc:  # ragged nesting
        raise RequestError(f"{where}: JSON value is not a rectangular array ({exc})", 400) from None
    if raw.dtype.kind not in "biuf" or raw.dtype.hasobject:
        raise RequestError(f"{where}: JSON array must hold numbers; got {_first(raw)!r}", 400)
    target = to_numpy(spec.dtype)
    if raw.dtype.kind == "f" and target.kind in "biu" and raw.size and not np.all(np.mod(raw, 1) == 0):
        bad = raw[np.mod(raw, 1) != 0].flat[0].item()
        raise RequestError(f"{where} has dtype {spec.dtype}; got the non-integer JSON number {bad!r}", 422)
    with np.errstate(over="ignore", invalid="ignore"):
        converted = raw.astype(target)
    if target.kind in "iu" and raw.size and not np.array_equal(converted.astype(raw.dtype), raw):
        raise RequestError(f"{where} has dtype {spec.dtype}; a JSON number is out of its range", 422)
    return converted


def _first(raw: Any) -> Any:
    return raw.flat[0].item() if raw.size else raw.tolist()


def read_npy(data: bytes, what: str) -> Any:
    """The array of ``.npy`` bytes, refusing pickles and headers that disagree with the data size."""
    import numpy as np
    from numpy.lib import format as npy

    stream = io.BytesIO(data)
    try:
        version = npy.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = npy.read_array_header_1_0(stream)
        else:
            shape, fortran, dtype = npy.read_array_header_2_0(stream)
    except (ValueError, OSError, SyntaxError, TypeError) as exc:
        raise RequestError(f"{what} is not a valid .npy array: {exc}", 400) from None
    if dtype.hasobject:
        raise RequestError(f"{what}: .npy arrays of Python objects are refused (dtype {dtype})", 400)
    count = 1
    for dim in shape:
        count *= dim
    payload = memoryview(data)[stream.tell():]
    if count * dtype.itemsize != len(payload):
        raise RequestError(
            f"{what}: .npy header says shape {list(shape)} of {dtype} ({count * dtype.itemsize} bytes); "
            f"the data has {len(payload)} bytes",
            400,
        )
    array = np.frombuffer(payload, dtype=dtype, count=count)
    array = array.reshape(shape[::-1]).T if fortran else array.reshape(shape)
    return array.astype(dtype.newbyteorder("="), copy=False) if not dtype.isnative else array


def _read_npz(data: bytes, max_bytes: int) -> dict[str, Any]:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        members = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise RequestError(f"request body is not a valid .npz archive: {exc}", 400) from None
    total = sum(m.file_size for m in members)
    if total > max_bytes:
        raise RequestError(f".npz archive unpacks to {total} bytes, over the limit of {max_bytes} bytes", 413)
    arrays = {}
    for member in members:
        if not member.filename.endswith(".npy"):
            raise RequestError(f".npz member {member.filename!r} is not a .npy file", 400)
        try:
            raw = archive.read(member)
        except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
            raise RequestError(f".npz member {member.filename!r} cannot be read: {exc}", 400) from None
        name = member.filename[: -len(".npy")]
        arrays[name] = read_npy(raw, f".npz member {member.filename!r}")
    return arrays


def encode_result(
    outputs: Sequence[Any], names: Sequence[str], encoding: str, bare: bool
) -> tuple[bytes, str]:
    """``(body, media type)`` answering a request read as ``encoding`` (bare or keyed)."""
    import numpy as np

    single = bare and len(outputs) == 1
    if encoding == "json":
        doc: Any = (
            outputs[0].tolist() if single else {n: o.tolist() for n, o in zip(names, outputs, strict=True)}
        )
        return json.dumps(doc).encode(), _JSON
    buffer = io.BytesIO()
    if single:
        np.save(buffer, outputs[0], allow_pickle=False)
        return buffer.getvalue(), _NPY
    np.savez(buffer, **dict(zip(names, outputs, strict=True)))
    return buffer.getvalue(), _NPZ

