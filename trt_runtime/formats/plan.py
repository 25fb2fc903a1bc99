"""Raw serialized TensorRT / TensorRT-RTX plans (what ``IHostMemory`` holds)."""

from __future__ import annotations

import os
import struct
from typing import IO, Any

from trt_runtime.errors import FormatError
from trt_runtime.formats.source import EngineData, engine_view, output_stream, write_chunks

__all__ = ["MIN_PLAN_SIZE", "PLAN_MAGICS", "inspect_plan", "write_plan"]

#: First four bytes of a plan, by flavour. Full TensorRT plans start with ``ftrt`` (what
#: torch-tensorrt's own loader tests for); ``ptrt`` is kept for plans written that way
#: by earlier releases of this project's tests.
PLAN_MAGICS: dict[bytes, str] = {b"vtrt": "tensorrt_rtx", b"ftrt": "tensorrt", b"ptrt": "tensorrt"}

#: Smaller inputs cannot be a plan: the smallest real TensorRT-RTX plan (one matmul)
#: is about 130 KiB; its fixed header alone is 32 bytes.
MIN_PLAN_SIZE = 64


def inspect_plan(view: memoryview, *, what: str = "plan") -> dict[str, Any]:
    """Check that ``view`` can be a plan; return ``flavour``, ``size``, maybe ``version``.

    A TensorRT-RTX plan (``vtrt``) records its total size as a little-endian uint64 at
    byte 16 and its builder version as four bytes at byte 24 (measured on plans from
    TensorRT-RTX 1.6.1.120); a declared size larger than the input means truncation.
    """
    size = len(view)
    if size == 0:
        raise FormatError(f"{what} is empty (0 bytes); expected a serialized engine")
    if size < MIN_PLAN_SIZE:
        raise FormatError(
            f"{what} is too small to be a serialized engine: {size} bytes "
            f"(expected at least {MIN_PLAN_SIZE} bytes); first bytes {bytes(view[:8])!r}"
        )
    magic = bytes(view[:4])
    info: dict[str, Any] = dict(flavour=PLAN_MAGICS.get(magic, "unknown"), size=size, magic=magic.hex())
    if magic == b"vtrt":
        (declared,) = struct.unpack_from("<Q", view, 16)
        if declared > size:
            raise FormatError(
                f"TensorRT-RTX {what} is truncated: its header declares {declared} bytes; "
                f"expected {declared} bytes, got {size}"
            )
        info["declared_size"] = declared
        major, minor, patch, build = struct.unpack_from("<4B", view, 24)
        info["version"] = f"{major}.{minor}.{patch}.{build}"
    return info


def write_plan(path: str | os.PathLike[str] | IO[bytes], data: EngineData) -> None:
    """Write a raw plan atomically (temp file in the same directory, fsync, ``os.replace``).

    ``data`` is bytes-like (``IHostMemory`` works through ``memoryview``) or the path of
    a plan to copy; it is streamed in slices, never copied whole. The bytes are
    validated first, so an empty or tiny buffer never lands on disk.
    """
    with engine_view(data) as view:
        inspect_plan(view)
        with output_stream(path) as out:
            write_chunks(out, view)
