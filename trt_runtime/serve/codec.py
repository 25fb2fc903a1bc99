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
before any array is made (:mod:`trt_runtime.arrays_io`: an ``.npz`` member is inflated
only after its header is checked); JSON is parsed within limits
(:mod:`trt_runtime.serve.json_body`). Every refusal is a
:class:`~trt_runtime.RequestError` with status 400 (malformed), 413 (too large), 415
(unknown content type) or 422 (does not fit the engine): no body raises anything else.
:func:`read_body_limited` reads a streamed body and stops at the size limit.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from trt_runtime.errors import ArraySizeError, FormatError, RequestError
from trt_runtime.protocols import TensorSpec

__all__ = ["CONTENT_TYPES", "Decoded", "decode_body", "encode_result", "read_body_limited", "read_npy"]

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


async def read_body_limited(chunks: AsyncIterator[bytes], max_bytes: int) -> bytes:
    """The body of ``chunks``; ``RequestError`` (413) as soon as it passes ``max_bytes``.

    Chunks are kept as they come and joined once at the end, so a body over the limit
    never holds more than ``max_bytes`` plus one chunk (a growing ``bytearray`` would
    hold up to twice that while it reallocates).
    """
    pieces: list[bytes] = []
    total = 0
    async for chunk in chunks:
        total += len(chunk)
        if total > max_bytes:
            pieces.clear()
            raise RequestError(f"request body exceeds the limit of {max_bytes} bytes", 413)
        if chunk:
            pieces.append(bytes(chunk))
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def decode_body(content_type: str, body: bytes, inputs: Sequence[TensorSpec], max_bytes: int) -> Decoded:
    """Decode a request body for an engine with ``inputs``; ``RequestError`` if malformed."""
    encoding = CONTENT_TYPES.get(content_type)  # as clients send it, most often
    if encoding is None:
        encoding = CONTENT_TYPES.get(content_type.split(";", 1)[0].strip().lower())
    if encoding is None:
        raise RequestError(
            f"Content-Type {content_type!r} is not supported; expected one of {sorted(CONTENT_TYPES)}", 415
        )
    if len(body) > max_bytes:
        raise RequestError(f"request body of {len(body)} bytes exceeds the limit of {max_bytes} bytes", 413)
    try:
        if encoding == "json":
            return _decode_json(body, inputs)
        if encoding == "npy":
            return Decoded((read_npy(body, "the request body"),), {}, "npy")
        return Decoded((), _read_npz(body, inputs, max_bytes), "npz")
    except RequestError:
        raise
    except MemoryError:
        raise RequestError("request body is too large to decode in this replica's memory", 413) from None
    except Exception as exc:  # whatever a hostile body meets is the client's error, never a 500
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        raise RequestError(f"request body could not be decoded: {detail}", 400) from None


def _decode_json(body: bytes, inputs: Sequence[TensorSpec]) -> Decoded:
    from trt_runtime.serve.json_body import parse_json_body

    doc = parse_json_body(body)
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
    except (ValueError, OverflowError) as exc:  # ragged nesting
        raise RequestError(f"{where}: JSON value is not a rectangular array ({exc})", 400) from None
    if raw.dtype.hasobject:  # only integers past 64 bits get here: the scan refused non-numbers
        raise RequestError(f"{where}: JSON numbers must fit in 64 bits; got {str(_first(raw))[:40]}", 400)
    if raw.dtype.kind not in "iuf":
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
    if not raw.size:
        return raw.tolist()
    first = raw.flat[0]
    return first.item() if hasattr(first, "item") else first


def read_npy(data: bytes, what: str) -> Any:
    """The array of ``.npy`` bytes, refusing pickles and headers that disagree with the data size."""
    from trt_runtime.arrays_io import read_npy as read

    try:
        return read(data, what)
    except FormatError as exc:
        raise RequestError(str(exc), 400) from None


def _read_npz(data: bytes, inputs: Sequence[TensorSpec], max_bytes: int) -> dict[str, Any]:
    """Members named like ``inputs``, within ``max_bytes`` inflated; others are refused unread."""
    from trt_runtime.arrays_io import NpyHeader, npz_members, open_npz, read_npz
    from trt_runtime.dtypes import to_numpy

    what = "request body"
    by_name = {s.name: s for s in inputs}

    def check(name: str, header: NpyHeader) -> None:
        expected = to_numpy(by_name[name].dtype)
        if header.dtype != expected:
            raise RequestError(
                f"input {name!r} must have dtype {by_name[name].dtype}; got {header.dtype}", 422
            )

    try:
        with open_npz(data, what) as archive:
            unknown = sorted(set(npz_members(archive, what)) - set(by_name))
        if unknown:
            raise RequestError(f"{what} has members {unknown}, which are not inputs of the engine; "
                               f"its inputs are {list(by_name)}", 422)
        return read_npz(data, what, names=list(by_name), check=check, max_bytes=max_bytes)
    except ArraySizeError as exc:
        raise RequestError(str(exc), 413) from None
    except FormatError as exc:
        raise RequestError(str(exc), 400) from None


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
    if single:
        from trt_runtime.arrays_io import npy_bytes

        return npy_bytes(outputs[0]), _NPY
    buffer = io.BytesIO()
    np.savez(buffer, **dict(zip(names, outputs, strict=True)))
    return buffer.getvalue(), _NPZ

