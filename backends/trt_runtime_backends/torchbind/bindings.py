"""IO metadata (names, dtypes, shapes, profiles) of an engine for the torchbind backend.

``torch.classes.tensorrt.Engine`` needs the input and output binding names in order
but exposes no dtypes or shapes. They come from the engine's container when it has
them (``EngineSource.bindings``, e.g. a TR01/TR02 blob); otherwise the engine is
deserialized once more with the TensorRT-RTX Python bindings (a dependency of
torch-tensorrt-rtx), read, and dropped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from trt_runtime.dtypes import DTYPE_NAMES, normalize_dtype
from trt_runtime.errors import EngineError
from trt_runtime.protocols import EngineSource, TensorSpec

__all__ = ["io_from_source", "io_from_tensorrt", "merge_container_flags"]


def io_from_source(source: EngineSource) -> tuple[list[TensorSpec], list[TensorSpec]] | None:
    """Inputs and outputs from the container's bindings, or None if it has none or they are
    incomplete (no dtypes, as torch-tensorrt's TR01 writer leaves them, or a dynamic input
    without optimization-profile ranges, which TR01 never records)."""
    if not source.bindings:
        return None
    if source.metadata.get("dtypes_recorded") is False:
        return None
    if any(s.dtype not in DTYPE_NAMES for s in source.bindings):
        return None
    if any(s.is_input and s.is_dynamic and not s.profiles for s in source.bindings):
        return None
    inputs = [s for s in source.bindings if s.is_input]
    outputs = [s for s in source.bindings if not s.is_input]
    if not outputs:
        raise EngineError(f"engine {source.name!r}: its container lists no output bindings")
    return inputs, outputs


def merge_container_flags(
    source: EngineSource, io: tuple[list[TensorSpec], list[TensorSpec]]
) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Outputs the container marks data-dependent stay so when IO was read from the engine."""
    marked = {s.name for s in source.bindings if not s.is_input and s.data_dependent}
    inputs, outputs = io
    if not marked:
        return inputs, outputs
    return inputs, [dataclasses.replace(o, data_dependent=True) if o.name in marked else o for o in outputs]


def io_from_tensorrt(
    data: Any,
    *,
    flavour: str,
    device_scope: Callable[[], AbstractContextManager[Any]],
    name: str,
) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Deserialize ``data`` with ``tensorrt_rtx`` (or ``tensorrt``) and read its IO tensors."""
    module = "tensorrt_rtx" if flavour == "tensorrt_rtx" else "tensorrt"
    try:
        trt = __import__(module)
    except ImportError as exc:
        raise EngineError(
            f"engine {name!r}: its container has no IO bindings and {module} is not importable "
            f"to read them from the engine ({exc}); load it from a TR01/TR02 blob or install {module}"
        ) from exc
    logger = trt.Logger(trt.Logger.ERROR)
    with device_scope():
        runtime = trt.Runtime(logger)
        engine = runtime.deserialize_cuda_engine(data)
        if engine is None:
            raise EngineError(
                f"engine {name!r}: {module} {getattr(trt, '__version__', '?')} could not deserialize it "
                "(built for another TensorRT version or GPU, or not an engine)"
            )
        try:
            return _read_io(trt, engine)
        finally:
            del engine, runtime


def _read_io(trt: Any, engine: Any) -> tuple[list[TensorSpec], list[TensorSpec]]:
    inputs: list[TensorSpec] = []
    outputs: list[TensorSpec] = []
    profiles = int(getattr(engine, "num_optimization_profiles", 1))
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
        dtype = normalize_dtype(engine.get_tensor_dtype(name))
        shape = tuple(int(d) for d in engine.get_tensor_shape(name))
        if is_input:
            triples = []
            if any(d < 0 for d in shape):
                for p in range(profiles):
                    lo, opt, hi = engine.get_tensor_profile_shape(name, p)
                    triples.append((_dims(lo), _dims(opt), _dims(hi)))
            inputs.append(TensorSpec(name, dtype, shape, True, tuple(triples)))
        else:
            outputs.append(TensorSpec(name, dtype, shape, False))
    return inputs, _mark_data_dependent(inputs, outputs)


def _dims(value: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(d) for d in value)


def _mark_data_dependent(inputs: list[TensorSpec], outputs: list[TensorSpec]) -> list[TensorSpec]:
    """An output with a dynamic dimension while every input is static can only get its
    shape from the data (a heuristic; containers that know say so in their bindings)."""
    if any(s.is_dynamic for s in inputs):
        return outputs
    return [
        TensorSpec(o.name, o.dtype, o.shape, False, o.profiles, data_dependent=o.is_dynamic)
        for o in outputs
    ]
