"""The Open Inference Protocol (KServe v2) infer request and response, with binary tensors.

A request body is JSON, or JSON followed by raw tensor bytes (the binary tensor data
extension): the ``Inference-Header-Content-Length`` header says how long the JSON is,
and each input carrying ``"parameters": {"binary_data_size": n}`` takes the next ``n``
bytes, in the order of ``"inputs"``. Outputs come back as JSON ``data`` or, when asked
for (``binary_data_output`` on the request, ``binary_data`` on an output), as raw bytes
after the JSON in the same way. Every refusal is a :class:`~trt_runtime.RequestError`
with status 400 naming the bad value (KServe answers bad requests with 400).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from typing import Any

from trt_runtime.errors import RequestError
from trt_runtime.serve.model import DATATYPES, ModelInfo, datatype_of, dtype_of

__all__ = ["HEADER_LENGTH", "InferRequest", "decode_infer", "encode_infer"]

#: The header giving the JSON part's length in a binary request or response.
HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclasses.dataclass(frozen=True, slots=True)
class InferRequest:
    """A decoded infer request: arrays in the model's input order and the outputs to answer."""

    id: str | None
    arrays: tuple[Any, ...]
    #: ``(output index, binary)`` for each output to answer, in answer order.
    outputs: tuple[tuple[int, bool], ...]


#: ``{(JSON part, body size): _Layout}`` of requests whose tensors are all binary.
Layouts = dict[tuple[bytes, int], "_Layout"]
#: ``{(outputs asked, request id, output dtypes and shapes): JSON part}`` of all-binary answers.
Heads = dict[tuple[Any, ...], bytes]
_CACHED_MAX = 256  # entries of each cache: clients send the same few request forms again and again
_CACHED_HEAD_BYTES = 4096


@dataclasses.dataclass(frozen=True, slots=True)
class _Layout:
    """Where each input's bytes lie in a request of one JSON part and size (all binary)."""

    id: str | None
    inputs: tuple[tuple[str, Any, int, tuple[int, ...], int], ...]  # name, dtype, count, shape, offset
    outputs: tuple[tuple[int, bool], ...]


def decode_infer(body: bytes, header_length: str | None, model: ModelInfo,
                 layouts: Layouts | None = None) -> InferRequest:
    """Decode an infer request for ``model``; ``RequestError`` (400) naming what is wrong.

    ``layouts`` (one dict per model, kept by the caller) remembers the JSON parts of the
    all-binary requests decoded before: one seen again is not parsed again.
    """
    size = len(body)
    if header_length is None:
        split = size
    elif not header_length.isdigit() or int(header_length) > size:
        raise RequestError(
            f"{HEADER_LENGTH} {header_length!r} must be a number of bytes <= the body's {size}", 400
        )
    else:
        split = int(header_length)
    head = bytes(memoryview(body)[:split])
    layout = None if layouts is None else layouts.get((head, size))
    if layout is not None:
        import numpy as np

        placed_before = {name: np.frombuffer(body, dtype=dtype, count=count, offset=offset).reshape(shape)
                         for name, dtype, count, shape, offset in layout.inputs}
        return InferRequest(layout.id, _checked(model, placed_before), layout.outputs)
    try:
        doc = json.loads(head)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(f"infer request is not valid JSON: {exc}", 400) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise RequestError(f"infer request must be a JSON object with an 'inputs' list; got {doc!r:.60}", 400)
    request_id = doc.get("id")
    named: dict[str, Any] = {}
    placed = []
    offset = split
    specs = {s.name: s for s in model.inputs}
    for entry in doc["inputs"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise RequestError(f"each input must be an object with a 'name'; got {entry!r:.60}", 400)
        name = entry["name"]
        spec = specs.get(name)
        if spec is None:
            raise RequestError(
                f"unknown input {name!r}; model {model.name!r} takes inputs {model.input_names}", 400
            )
        if name in named:
            raise RequestError(f"input {name!r} is given twice", 400)
        start = offset
        array, offset, binary = _input_array(entry, spec.dtype, body, offset, model.name)
        named[name] = array
        if binary:
            placed.append((name, array.dtype, array.size, array.shape, start))
    if offset != size:
        raise RequestError(
            f"the binary part has {size - split} bytes; "
            f"the inputs' binary_data_size add up to {offset - split}",
            400,
        )
    missing = [n for n in model.input_names if n not in named]
    if missing:
        raise RequestError(
            f"model {model.name!r} takes {len(model.inputs)} input(s) {model.input_names}; "
            f"missing {missing}",
            400,
        )
    request = InferRequest(None if request_id is None else str(request_id), _checked(model, named),
                           _requested_outputs(doc, model))
    if (layouts is not None and len(placed) == len(named) and len(head) <= _CACHED_HEAD_BYTES
            and len(layouts) < _CACHED_MAX):
        layouts[head, size] = _Layout(request.id, tuple(placed), request.outputs)
    return request


def _checked(model: ModelInfo, named: dict[str, Any]) -> tuple[Any, ...]:
    """``named`` through the model's checker; a misfit is a 400, as every refusal here."""
    try:
        return model.checker.check((), named)
    except RequestError as exc:
        raise RequestError(str(exc), 400 if exc.status == 422 else exc.status) from None


def _input_array(entry: dict[str, Any], dtype: str, body: bytes, offset: int,
                 model: str) -> tuple[Any, int, bool]:
    """``(array, offset after it, whether it came from the binary part)``."""
    import numpy as np

    name = entry["name"]
    where = f"input {name!r} of model {model!r}"
    datatype = entry.get("datatype")
    expected = datatype_of(dtype)
    if datatype != expected:
        if isinstance(datatype, str):
            dtype_of(datatype)  # an unknown datatype is named as such
        raise RequestError(f"{where} has datatype {expected}; got {datatype!r}", 400)
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        raise RequestError(f"{where}: shape must be a list of integers >= 0; got {shape!r}", 400)
    count = math.prod(shape)
    target = _numpy_dtype(dtype)
    parameters = entry.get("parameters") or {}
    binary = parameters.get("binary_data_size") if isinstance(parameters, dict) else None
    if binary is not None:
        want = count * target.itemsize
        if binary != want:
            raise RequestError(
                f"{where}: binary_data_size {binary!r} does not match shape {shape} "
                f"of {expected} ({want} bytes)",
                400,
            )
        if offset + want > len(body):
            raise RequestError(f"{where}: the body ends before its {want} binary bytes", 400)
        array = np.frombuffer(body, dtype=target, count=count, offset=offset).reshape(shape)
        return array, offset + want, True
    if "data" not in entry:
        raise RequestError(f"{where} has neither 'data' nor parameters.binary_data_size", 400)
    return _json_data(entry["data"], target, shape, where), offset, False


_NUMPY: dict[str, Any] = {}


def _numpy_dtype(dtype: str) -> Any:
    found = _NUMPY.get(dtype)
    if found is None:
        from trt_runtime.dtypes import to_numpy

        found = _NUMPY[dtype] = to_numpy(dtype)
    return found


def _json_data(data: Any, target: Any, shape: list[int], where: str) -> Any:
    import numpy as np

    try:
        raw = np.asarray(data)
    except ValueError as exc:
        raise RequestError(f"{where}: 'data' is not a rectangular array ({exc})", 400) from None
    allowed = {"b": "b", "i": "biu", "u": "biu", "f": "biuf"}[target.kind]
    wrong = None
    if raw.size and raw.dtype.kind not in allowed:
        integral = raw.dtype.kind == "f" and target.kind in "iu"
        wrong = raw[np.mod(raw, 1) != 0] if integral else raw
    if wrong is not None and wrong.size:
        first = wrong.flat[0]
        raise RequestError(
            f"{where}: 'data' must hold {target} values; got {getattr(first, 'item', lambda: first)()!r}", 400
        )
    if raw.size != math.prod(shape):
        raise RequestError(
            f"{where}: 'data' has {raw.size} values; shape {shape} needs {math.prod(shape)}", 400
        )
    with np.errstate(over="ignore", invalid="ignore"):
        array = raw.astype(target).reshape(shape)
    back = array.reshape(raw.shape).astype(raw.dtype)
    if target.kind in "iu" and raw.size and not np.array_equal(back, raw):
        raise RequestError(f"{where}: a value of 'data' is out of the range of {target}", 400)
    return array


def _requested_outputs(doc: dict[str, Any], model: ModelInfo) -> tuple[tuple[int, bool], ...]:
    parameters = doc.get("parameters") or {}
    default = bool(parameters.get("binary_data_output", False)) if isinstance(parameters, dict) else False
    requested = doc.get("outputs")
    if requested is None:
        return tuple((i, default) for i in range(len(model.outputs)))
    if not isinstance(requested, list):
        raise RequestError(f"'outputs' must be a list; got {requested!r:.60}", 400)
    index = {n: i for i, n in enumerate(model.output_names)}
    chosen = []
    for entry in requested:
        name = entry.get("name") if isinstance(entry, dict) else None
        if name not in index:
            raise RequestError(
                f"unknown output {name!r}; model {model.name!r} has outputs {model.output_names}", 400
            )
        params = entry.get("parameters") or {}
        binary = params.get("binary_data", default) if isinstance(params, dict) else default
        chosen.append((index[name], bool(binary)))
    return tuple(chosen)


def encode_infer(
    model: ModelInfo, request: InferRequest, outputs: Sequence[Any], heads: Heads | None = None
) -> tuple[bytes, str, int | None]:
    """``(body, media type, JSON length or None)`` of the answer; the length goes in
    :data:`HEADER_LENGTH` when binary outputs follow the JSON. ``heads`` (one dict per model,
    kept by the caller) remembers the JSON parts of all-binary answers by what they hold."""
    key = None
    if heads is not None and all(binary for _index, binary in request.outputs):
        key = (request.outputs, request.id, *((a.dtype, a.shape) for a in outputs))
        header = heads.get(key)
        if header is not None:
            blobs = [outputs[index].tobytes() for index, _binary in request.outputs]
            return b"".join([header, *blobs]), "application/octet-stream", len(header)
    entries = []
    blobs = []
    for index, binary in request.outputs:
        array = outputs[index]
        spec = model.outputs[index]
        entry: dict[str, Any] = {
            "name": spec.name,
            "datatype": DATATYPES.get(spec.dtype) or datatype_of(str(array.dtype)),
            "shape": list(array.shape),
        }
        if binary:
            blob = array.tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = array.ravel().tolist()
        entries.append(entry)
    doc: dict[str, Any] = {"model_name": model.name, "model_version": model.version, "outputs": entries}
    if request.id is not None:
        doc["id"] = request.id
    header = json.dumps(doc, separators=(",", ":")).encode()
    if key is not None and heads is not None and blobs and len(heads) < _CACHED_MAX:
        heads[key] = header
    if not blobs:
        return header, "application/json", None
    return b"".join([header, *blobs]), "application/octet-stream", len(header)
