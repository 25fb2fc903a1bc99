"""Engine container formats: raw plans, ExecuTorch TR01/TR02 blobs, ``.pte`` programs.

:func:`read_engine_source` is what :func:`trt_runtime.load` calls: it detects the
format, validates it completely (bad input raises :class:`~trt_runtime.FormatError`
before any byte reaches TensorRT) and returns an :class:`~trt_runtime.EngineSource`
whose ``data`` is a ``memoryview`` over the input (a read-only ``mmap`` for paths),
never a copy. This module is the front: each concept lives in a module named after it.
"""

from __future__ import annotations

from trt_runtime.formats.blob_options import BlobOptions
from trt_runtime.formats.describe import describe
from trt_runtime.formats.detect import detect_format, known_magics, unknown_magic
from trt_runtime.formats.device import resolve_device
from trt_runtime.formats.plan import MIN_PLAN_SIZE, PLAN_MAGICS, write_plan
from trt_runtime.formats.pte import BACKEND_ID, Delegate, Program, parse_pte
from trt_runtime.formats.read import FORMAT_OPTIONS, read_engine_source
from trt_runtime.formats.source import EngineData, EngineInput, atomic_writer
from trt_runtime.formats.tr01 import (
    HEADER_SIZE,
    Tr01Blob,
    encode_metadata,
    pack_tr01,
    parse_tr01,
    write_tr01,
)

__all__ = [
    "BACKEND_ID",
    "FORMAT_OPTIONS",
    "HEADER_SIZE",
    "MIN_PLAN_SIZE",
    "PLAN_MAGICS",
    "BlobOptions",
    "Delegate",
    "EngineData",
    "EngineInput",
    "Program",
    "Tr01Blob",
    "atomic_writer",
    "describe",
    "detect_format",
    "encode_metadata",
    "known_magics",
    "pack_tr01",
    "parse_pte",
    "parse_tr01",
    "read_engine_source",
    "resolve_device",
    "unknown_magic",
    "write_plan",
    "write_tr01",
]
