"""An ONNX model checked before any parser sees it: its bytes, tensors and external data.

:func:`read_model` reads a model (a path or bytes) once, parses it with ``onnx``'s
protobuf classes and checks every tensor: dimensions non-negative, the data it holds as
large as its dimensions say. Tensors whose data lives in external files are resolved
against the model's folder with symbolic links followed; the file must stay inside that
folder, be a regular file (never a FIFO or device, opened without blocking) and hold
``offset + length`` bytes. Their bytes are read from the descriptor that was checked,
so a parser never opens a file by name: it gets the model's bytes and these buffers
(:meth:`CheckedModel.inline` for the float16 converter; ``load_initializer`` for
TensorRT's parser). Every refusal is a :class:`~trt_runtime.FormatError` of one line.

``onnx`` is imported when called (the ``onnx`` extra).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trt_runtime.errors import FormatError
from trt_runtime.extras import install_hint
from trt_runtime.files import open_regular

__all__ = ["MAX_MODEL_BYTES", "CheckedModel", "ExternalTensor", "read_model"]

#: Protobuf cannot hold a message of 2 GiB or more: larger weights must be external data.
MAX_MODEL_BYTES = 2**31 - 1
#: Bits per element of ONNX's ``TensorProto.DataType`` values with a fixed size.
_BITS = {1: 32, 2: 8, 3: 8, 4: 16, 5: 16, 6: 32, 7: 64, 9: 8, 10: 16, 11: 64, 12: 32, 13: 64,
         14: 64, 15: 128, 16: 16, 17: 8, 18: 8, 19: 8, 20: 8, 21: 4, 22: 4, 23: 4}
_STRING = 8
_EXTERNAL = 1  # TensorProto.EXTERNAL


@dataclasses.dataclass(frozen=True)
class ExternalTensor:
    """One tensor's external data, checked and read: its name, where it was and its bytes."""

    name: str
    location: str
    tensor: Any  # the onnx TensorProto in CheckedModel.proto
    data: bytearray  # exactly the checked range; its lifetime must exceed the parser's
    #: an initializer of the main graph (what TensorRT's ``load_initializer`` can take)
    top_level: bool


@dataclasses.dataclass(frozen=True)
class CheckedModel:
    """A parsed model whose tensors were checked; external data already read."""

    proto: Any  # onnx.ModelProto, external data not loaded into it
    data: bytes  # the serialized model as read
    external: tuple[ExternalTensor, ...]
    label: str

    def inline(self, *, nested_only: bool = False) -> Any:
        """The model with external tensors' bytes moved into it (``raw_data``): all of
        them, or only those that are not initializers of the main graph."""
        for item in self.external:
            if nested_only and item.top_level:
                continue
            tensor = item.tensor
            tensor.raw_data = bytes(item.data)
            del tensor.external_data[:]
            tensor.data_location = 0  # DEFAULT
        return self.proto


def read_model(
    source: Path | bytes, *, base_dir: str | os.PathLike[str] | None = None, label: str = "the ONNX model"
) -> CheckedModel:
    """``source`` parsed and checked (see the module docstring); ``FormatError`` if malformed.

    External data of a path is resolved against the model's folder; of bytes, against
    ``base_dir``, which such a model must name (a relative location is never resolved
    against the current directory).
    """
    onnx = _import_onnx()
    if isinstance(source, Path):
        data = _read_regular(source, label, limit=MAX_MODEL_BYTES)
        folder: str | None = os.path.dirname(os.path.abspath(source))
    else:
        data = bytes(source)
        if len(data) > MAX_MODEL_BYTES:
            raise FormatError(f"{label} has {len(data)} bytes; an ONNX model holds at most {MAX_MODEL_BYTES}")
        folder = None if base_dir is None else os.path.abspath(os.fspath(base_dir))
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as exc:  # protobuf's DecodeError, RecursionError, ValueError...
        raise FormatError(f"{label}: not an ONNX model ({_one_line(exc) or type(exc).__name__})") from None
    if not proto.HasField("graph") or not proto.graph.output:
        raise FormatError(f"{label}: the model has no graph outputs; is it an ONNX model?")
    external = []
    with _Folder(folder, label) as files:
        for where, tensor in _tensors(proto.graph, "initializer"):
            stored = _check_tensor(tensor, where, label)
            if tensor.data_location == _EXTERNAL:
                external.append(files.read(tensor, where, stored, where.startswith("initializer ")))
    return CheckedModel(proto, data, tuple(external), label)


def _import_onnx() -> Any:
    try:
        import onnx
    except ImportError as exc:
        raise ImportError(
            "building from ONNX checks the model with onnx: " + install_hint("onnx")
        ) from exc
    return onnx


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


def _read_regular(path: Path, label: str, *, limit: int) -> bytes:
    fd = open_regular(path, what="refusing ONNX model", error=FormatError)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise FormatError(f"{label} has {size} bytes; an ONNX model holds at most {limit} "
                              "(keep larger weights as external data)")
        return f.read(limit + 1)


def _tensors(graph: Any, kind: str, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every tensor of ``graph`` and its subgraphs, with a name saying where it is."""
    for tensor in graph.initializer:
        yield f"{prefix}{kind} {tensor.name!r}", tensor
    for sparse in graph.sparse_initializer:
        yield f"{prefix}sparse initializer {sparse.values.name!r} (values)", sparse.values
        yield f"{prefix}sparse initializer {sparse.values.name!r} (indices)", sparse.indices
    for node in graph.node:
        for attr in node.attribute:
            where = f"{prefix}node {node.name or node.op_type!r} attribute {attr.name!r}"
            if attr.HasField("t"):
                yield where, attr.t
            for tensor in attr.tensors:
                yield where, tensor
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _tensors(sub, "initializer", f"{where}: ")


def _check_tensor(tensor: Any, where: str, label: str) -> int | None:
    """The bytes ``tensor``'s dims need (``None`` if its type has no fixed size); refuse a
    negative dimension or inline data smaller than the dims say."""
    count = 1
    for dim in tensor.dims:
        if dim < 0:
            raise FormatError(f"{label}: {where} has the negative dimension {dim} (dims {list(tensor.dims)})")
        count *= dim
    bits = _BITS.get(tensor.data_type)
    if tensor.data_type == _STRING or bits is None:
        return None
    need = (count * bits + 7) // 8
    if tensor.data_location == _EXTERNAL:
        return need
    if tensor.HasField("raw_data"):
        held = len(tensor.raw_data)
    else:
        fields = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data")
        entries = sum(len(getattr(tensor, f)) for f in fields)
        held = need if entries * (2 if bits == 4 else 1) >= count else 0
        if held == 0 and entries == 0 and count == 0:
            held = need
    if held != need:
        raise FormatError(
            f"{label}: {where} has dims {list(tensor.dims)} ({need} bytes) but holds {held} bytes"
        )
    return need


class _Folder:
    """The model's folder: external files resolved inside it, opened once each, read by range."""

    def __init__(self, folder: str | None, label: str) -> None:
        self.folder = folder
        self.real = None if folder is None else os.path.realpath(folder)
        self.label = label
        self.fds: dict[str, int] = {}

    def __enter__(self) -> _Folder:
        return self

    def __exit__(self, *exc: object) -> None:
        for fd in self.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)

    def read(self, tensor: Any, where: str, need: int | None, top_level: bool) -> ExternalTensor:
        entries = {e.key: e.value for e in tensor.external_data}
        location = entries.get("location", "")
        offset = self._number(entries, "offset", where)
        length = self._number(entries, "length", where)
        fail = f"{self.label}: {where} has external data {location!r}"
        if not location:
            raise FormatError(f"{fail}: no location given")
        if "\0" in location or os.path.isabs(location) or ".." in Path(location).parts:
            raise FormatError(f"{fail}: a location must be a relative path inside the model's folder")
        if self.folder is None or self.real is None:
            raise FormatError(f"{fail}, but the model was given as bytes; pass base_dir= the folder "
                              "that holds its external data")
        real = os.path.realpath(os.path.join(self.folder, location))
        if os.path.commonpath([real, self.real]) != self.real:
            raise FormatError(f"{fail}: it resolves to {real}, outside the model's folder {self.real}")
        fd = self.fds.get(real)
        if fd is None:
            try:
                fd = open_regular(real, what=fail + ":", error=FormatError, follow_symlinks=False)
            except OSError as exc:
                raise FormatError(f"{fail}: {exc.strerror or exc}") from None
            self.fds[real] = fd
        size = os.fstat(fd).st_size
        if offset > size:
            raise FormatError(f"{fail}: offset {offset} is past the end of the file ({size} bytes)")
        length = size - offset if length is None else length
        if offset + length > size:
            raise FormatError(f"{fail}: offset {offset} + length {length} is past the end of the file "
                              f"({size} bytes)")
        if need is not None and length != need:
            raise FormatError(f"{fail}: length {length} bytes, but its dims {list(tensor.dims)} need {need}")
        return ExternalTensor(tensor.name, location, tensor, _pread(fd, offset, length, fail), top_level)

    def _number(self, entries: dict[str, str], key: str, where: str) -> Any:
        text = entries.get(key)
        if text is None:
            return 0 if key == "offset" else None
        if not (text.isascii() and text.isdigit() and len(text) <= 19):
            raise FormatError(f"{self.label}: {where} has external data {key} {text[:40]!r}; "
                              "expected a non-negative integer of at most 19 digits")
        return int(text)


def _pread(fd: int, offset: int, length: int, fail: str) -> bytearray:
    buffer = bytearray(length)
    view = memoryview(buffer)
    done = 0
    while done < length:
        got = os.preadv(fd, [view[done:done + (1 << 26)]], offset + done)
        if got == 0:
            raise FormatError(f"{fail}: the file shrank while it was read ({done} of {length} bytes)")
        done += got
    return buffer
