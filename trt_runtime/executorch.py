"""ExecuTorch ``.pte`` helpers: write a program around a prebuilt engine, list its delegates.

Nothing here needs the ``executorch`` package: the program flatbuffer is read by
:mod:`trt_runtime.formats.pte` and written by :mod:`trt_runtime.formats.pte_writer`.
:func:`load_program` hands a file to ExecuTorch's own deserializer for inspection
(``executorch`` and torch needed).

The delegate blob :func:`to_pte` writes is the TR01/TR02 blob of torch-tensorrt's
ExecuTorch backend (id ``"TensorRTBackend"``), so torch-tensorrt's C++ runtime
backend can load it; the program around it is what ExecuTorch's own exporter writes
for a CUDA delegate (see docs/formats.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import IO, Any

from typing_extensions import Unpack

from trt_runtime.dtypes import normalize_dtype
from trt_runtime.errors import DataDependentShapeError, SettingsError
from trt_runtime.extras import install_hint
from trt_runtime.formats.blob_options import BlobKeywords, BlobOptions
from trt_runtime.formats.pte import (
    BACKEND_ID,
    SCALAR_TYPES,
    TARGET_DEVICE_KEY,
    Delegate,
    Program,
    parse_pte,
)
from trt_runtime.formats.pte_writer import (
    LOCATIONS,
    MAX_DEVICE_INDEX,
    check_target_device,
    default_target_device,
    write_program,
)
from trt_runtime.formats.source import EngineData, open_buffer, open_engine_file, output_stream
from trt_runtime.formats.tr01 import blob_parts
from trt_runtime.protocols import TensorSpec

__all__ = [
    "BACKEND_ID",
    "TARGET_DEVICE_KEY",
    "delegates",
    "executorch_available",
    "load_program",
    "read_program",
    "to_pte",
]


def executorch_available() -> bool:
    """Whether ExecuTorch's deserializer imports (``executorch`` with torch)."""
    try:
        import executorch.exir._serialize._program  # noqa: F401
    except ImportError:
        return False
    return True


def to_pte(
    engine: EngineData,
    bindings: Sequence[TensorSpec],
    path: str | os.PathLike[str] | IO[bytes],
    *,
    options: BlobOptions | Mapping[str, Any] | None = None,
    target_device: str | None = None,
    upper_bounds: Mapping[str, Sequence[int]] | None = None,
    method: str = "forward",
    location: str = "segment",
    allow_data_dependent: bool = False,
    **keywords: Unpack[BlobKeywords],
) -> int:
    """Write a ``.pte`` whose method ``method`` is one call of a TensorRT delegate.

    ``engine`` is bytes-like or the path of a plan (streamed, never copied whole);
    ``bindings`` are the engine's inputs and outputs with dtypes and shapes (inputs
    become the method's inputs, outputs its outputs, in order). A path is written
    atomically. ``location`` is where the blob goes: ``"segment"`` (default, like
    ExecuTorch's exporter), ``"inline"`` or ``"named_data"``. Returns the file size.

    ``options`` and ``keywords`` are the blob's :class:`~trt_runtime.formats.BlobOptions`
    (``aliased_io``, ``device_id``, ``hardware_compatible``, ``serialized_metadata``,
    ``target_platform``, ``record_profiles``), as :func:`trt_runtime.formats.write_tr01` takes them.
    ``device_id`` goes into the blob and decides where the engine runs. The delegate's
    ``target_device`` compile spec (and the device recorded on its tensors) is
    ``f"cuda:{device_id}"`` unless ``target_device`` is given, which is written
    verbatim after validation (``"cuda"`` or ``"cuda:N"``); a reader warns when the
    two disagree. ``upper_bounds`` maps binding names to the largest shape a dynamic
    binding takes (see :func:`trt_runtime.formats.pte_writer.resolve_bounds` for the
    bounds found without it).

    Engines with data-dependent outputs raise :class:`DataDependentShapeError` naming
    them, as torch-tensorrt's exporter refuses them: the ExecuTorch runtime cannot
    allocate their outputs. ``allow_data_dependent=True`` writes them anyway.

    The blob records the inputs' optimization profiles (``record_profiles=False`` leaves
    them out, as torch-tensorrt's exporter does; see :func:`trt_runtime.formats.encode_metadata`).
    """
    blob = BlobOptions.coerce(options, **keywords)
    device_id = blob.device_id
    specs = list(bindings)
    dependent = [s.name for s in specs if s.data_dependent and not s.is_input]
    if dependent and not allow_data_dependent:
        raise DataDependentShapeError(
            f"the engine has data-dependent output(s) {dependent}; ExecuTorch cannot allocate them "
            "and torch-tensorrt's runtime refuses such engines. Pass allow_data_dependent=True to "
            "write the .pte anyway"
        )
    if not any(s.is_input for s in specs) or not any(not s.is_input for s in specs):
        raise SettingsError(
            f"a delegate needs at least one input and one output binding; got {[s.name for s in specs]}"
        )
    untyped = [s.name for s in specs if not s.dtype]
    if untyped:
        raise SettingsError(f"bindings {untyped} have no dtype; a .pte records every tensor's dtype")
    for spec in specs:
        if normalize_dtype(spec.dtype) not in SCALAR_TYPES:
            raise SettingsError(
                f"binding {spec.name!r} has dtype {spec.dtype!r}, which ExecuTorch cannot express"
            )
    if location not in LOCATIONS:
        raise SettingsError(f"location must be one of {', '.join(map(repr, LOCATIONS))}; got {location!r}")
    if target_device is None:
        valid = isinstance(device_id, int) and not isinstance(device_id, bool)
        if not valid or not 0 <= device_id <= MAX_DEVICE_INDEX:
            raise SettingsError(
                f"device_id {device_id!r} cannot be a target_device: ExecuTorch records CUDA device "
                f"indices 0..{MAX_DEVICE_INDEX}; pass target_device= to write another one"
            )
        target_device = default_target_device([device_id])
    check_target_device(target_device)
    # Bindings go into the blob in delegate-argument order: inputs, then outputs.
    ordered = [s for s in specs if s.is_input] + [s for s in specs if not s.is_input]
    with blob_parts(engine, ordered, blob) as (prefix, view), output_stream(path) as out:
        return write_program(
            out,
            [prefix, view],
            ordered,
            method=method,
            location=location,
            target_device=target_device,
            upper_bounds=upper_bounds,
        )


def read_program(source: Any) -> Program:
    """Parse a ``.pte`` (bytes, path or binary file) and validate its TensorRT delegates."""
    view, name = open_buffer(source)
    return parse_pte(view, what=f".pte program {name!r}")


def delegates(source: Any) -> tuple[Delegate, ...]:
    """The TensorRT delegates of a ``.pte``, each with its own blob and ``device_id``."""
    return read_program(source).delegates


def load_program(path: str | os.PathLike[str]) -> Any:
    """ExecuTorch's own ``Program`` dataclass for ``path`` (needs ``executorch`` and torch).

    Segments are moved back into the program, as ExecuTorch's
    ``deserialize_pte_binary`` does. It copies the whole file into Python objects: use
    it to inspect small programs, not to load engines (use :func:`trt_runtime.load`).
    """
    try:
        from executorch.exir._serialize._program import deserialize_pte_binary
    except ImportError as exc:
        raise ImportError(
            "load_program needs ExecuTorch's deserializer, which imports torch "
            f"({exc}): {install_hint('executorch')}"
        ) from exc
    with os.fdopen(open_engine_file(path), "rb") as f:
        data = f.read()
    result = deserialize_pte_binary(data)
    return getattr(result, "program", result)
