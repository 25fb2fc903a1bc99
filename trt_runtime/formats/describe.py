"""A container summarized for people and tools: :func:`describe`, what ``trt-runtime inspect``
prints."""

from __future__ import annotations

from typing import Any

from trt_runtime.errors import FormatError
from trt_runtime.formats.detect import detect_format
from trt_runtime.formats.plan import inspect_plan
from trt_runtime.formats.pte import parse_pte
from trt_runtime.formats.read import Source
from trt_runtime.formats.source import open_buffer
from trt_runtime.formats.tr01 import Tr01Blob, parse_tr01
from trt_runtime.protocols import TensorSpec

__all__ = ["describe"]


def _spec_dict(spec: TensorSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "dtype": spec.dtype,
        "shape": list(spec.shape),
        "is_input": spec.is_input,
        "profiles": [[list(shape) for shape in triple] for triple in spec.profiles],
        "data_dependent": spec.data_dependent,
    }


def _blob_dict(blob: Tr01Blob) -> dict[str, Any]:
    try:
        plan: dict[str, Any] = dict(inspect_plan(blob.engine))
    except FormatError as exc:
        plan = {"error": str(exc)}
    return {
        "magic": blob.magic,
        "device_id": blob.device_id,
        "engine_size": blob.engine_size,
        "engine_offset": blob.engine_offset,
        "flavour": plan.get("flavour", "unknown"),
        "version": plan.get("version"),
        "plan": plan,
        "bindings": [_spec_dict(s) for s in blob.bindings],
        "dtypes_recorded": blob.dtypes_recorded,
        "data_dependent_outputs": [s.name for s in blob.bindings if s.data_dependent],
        "aliased_io": [list(a) for a in blob.aliased_io],
        "hardware_compatible": blob.hardware_compatible,
        "target_platform": blob.target_platform,
        "serialized_metadata_size": len(blob.serialized_metadata),
    }


def describe(source: Source) -> dict[str, Any]:
    """A JSON-ready summary of a container for ``trt-runtime inspect``.

    Keys: ``format``, ``name``, ``size``, ``device_id``, ``flavour``, ``version``,
    ``bindings``, ``data_dependent_outputs``; TR01/TR02 add the blob fields; ``.pte``
    adds ``methods``, ``other_backends`` and ``delegates`` (one entry per TensorRT
    delegate with its own ``device_id``; top-level fields describe delegate 0).
    Raises :class:`FormatError` like :func:`read_engine_source`. Data-dependent outputs
    of a raw plan are unknown without deserializing it (reported as ``None``).
    """
    view, name = open_buffer(source)
    kind = detect_format(view)
    result: dict[str, Any] = {"format": kind, "name": name, "size": len(view)}
    if kind in ("TR01", "TR02"):
        result.update(_blob_dict(parse_tr01(view, what=f"blob {name!r}")))
    elif kind == "pte":
        program = parse_pte(view, what=f".pte program {name!r}")
        delegates = []
        for d in program.delegates:
            entry = {"index": d.index, **d.metadata(), **_blob_dict(d.blob)}
            delegates.append(entry)
        result.update(
            {
                "identifier": program.identifier,
                "methods": list(program.methods),
                "other_backends": list(program.other_backends),
                "delegates": delegates,
                "device_id": delegates[0]["device_id"] if delegates else None,
                "flavour": delegates[0]["flavour"] if delegates else None,
                "version": delegates[0]["version"] if delegates else None,
                "bindings": delegates[0]["bindings"] if delegates else [],
                "data_dependent_outputs": delegates[0]["data_dependent_outputs"] if delegates else [],
            }
        )
    else:
        plan = dict(inspect_plan(view, what=f"plan {name!r}"))
        result.update(
            {
                "device_id": None,
                "flavour": plan["flavour"],
                "version": plan.get("version"),
                "plan": plan,
                "bindings": [],
                "data_dependent_outputs": None,
            }
        )
    return result
