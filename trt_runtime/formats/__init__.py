"""Engine container formats: raw plans, ExecuTorch TR01/TR02 blobs, ``.pte`` programs.

:func:`read_engine_source` is what :func:`trt_runtime.load` calls: it detects the
format, validates it completely (bad input raises :class:`~trt_runtime.FormatError`
before any byte reaches TensorRT) and returns an :class:`~trt_runtime.EngineSource`
whose ``data`` is a ``memoryview`` over the input (a read-only ``mmap`` for paths),
never a copy.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import IO, Any

from trt_runtime.errors import EngineError, FormatError, SettingsError
from trt_runtime.formats.plan import MIN_PLAN_SIZE, PLAN_MAGICS, inspect_plan, write_plan
from trt_runtime.formats.pte import BACKEND_ID, Delegate, Program, is_pte, parse_pte
from trt_runtime.formats.source import EngineData, EngineInput, atomic_writer, open_buffer
from trt_runtime.formats.tr01 import (
    HEADER_SIZE,
    MAGIC_TR01,
    MAGIC_TR02,
    Tr01Blob,
    encode_metadata,
    pack_tr01,
    parse_tr01,
    write_tr01,
)
from trt_runtime.protocols import EngineSource, TensorSpec

__all__ = [
    "BACKEND_ID",
    "FORMAT_OPTIONS",
    "HEADER_SIZE",
    "MIN_PLAN_SIZE",
    "PLAN_MAGICS",
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

#: Keyword options :func:`read_engine_source` (and so :func:`trt_runtime.load`) accepts.
FORMAT_OPTIONS = ("delegate_index", "method")

_FUTURE_BLOB = re.compile(rb"TR[0-9]{2}")

Source = EngineInput | str | os.PathLike[str] | IO[bytes]


def detect_format(view: memoryview) -> str:
    """``"TR01"``, ``"TR02"``, ``"pte"`` or ``"plan"`` from the first bytes.

    A raw plan is the fallback: anything that is not a blob or a program is taken for
    a plan and must then pass the plan checks. ``TR`` and two digits is reported as a
    blob, so that an unknown blob version is rejected instead of sent to TensorRT.
    """
    magic = bytes(view[:4])
    if magic in (MAGIC_TR01, MAGIC_TR02):
        return magic.decode("ascii")
    if _FUTURE_BLOB.fullmatch(magic):
        # A later blob version: parse_tr01 rejects it by name rather than letting it
        # pass for a raw plan.
        return "TR01"
    if is_pte(view):
        return "pte"
    return "plan"


def known_magics(extra: Mapping[bytes, str] | None = None) -> str:
    """The first bytes an engine file may start with, as one human-readable list.

    ``extra`` maps further magics to what they are (the engine formats backends declare).
    """
    plans = [f"{magic.decode('ascii')!r} ({flavour} plan)" for magic, flavour in PLAN_MAGICS.items()]
    blobs = f"{MAGIC_TR01.decode('ascii')!r} / {MAGIC_TR02.decode('ascii')!r} (ExecuTorch TensorRT blob)"
    others = [f"{magic.decode('latin-1')!r} ({what})" for magic, what in (extra or {}).items()]
    return ", ".join([*plans, blobs, "'ET..' at byte 4 (.pte program)", *others])


def unknown_magic(data: EngineInput, name: str, extra: Mapping[bytes, str] | None = None) -> str:
    """Why ``data`` is not an engine file by its first bytes, or '' when it may be one.

    Blobs, programs, plans of a known flavour and the magics in ``extra`` pass; so does an
    empty input (the format checks say "empty"). Anything else, however short, is named
    with its first bytes and the magics that are known.
    """
    view = memoryview(data)
    head = bytes(view[:16])
    if not head or detect_format(view) != "plan" or head[:4] in PLAN_MAGICS:
        return ""
    if any(head.startswith(magic) for magic in extra or {}):
        return ""
    return (
        f"{name} is not an engine file (unknown magic {head[:4]!r}, hex {head[:4].hex()}); "
        f"known magics: {known_magics(extra)}"
    )


def _check_options(options: dict[str, Any]) -> tuple[int | None, str | None]:
    unknown = sorted(set(options) - set(FORMAT_OPTIONS))
    if unknown:
        raise TypeError(f"unknown format option(s) {unknown}; expected one of {', '.join(FORMAT_OPTIONS)}")
    index = options.get("delegate_index")
    if index is not None and (not isinstance(index, int) or isinstance(index, bool) or index < 0):
        raise SettingsError(f"delegate_index must be a non-negative integer; got {index!r}")
    method = options.get("method")
    if method is not None and not isinstance(method, str):
        raise SettingsError(f"method must be a string; got {method!r}")
    return index, method


def _select(program: Program, index: int | None, method: str | None, name: str) -> Delegate:
    delegates = [d for d in program.delegates if method is None or d.method == method]
    if not program.delegates:
        others = sorted(set(program.other_backends))
        raise FormatError(
            f"{name} has no {BACKEND_ID} delegate (methods {list(program.methods)}; "
            f"other delegates: {others or 'none'})"
        )
    if not delegates:
        raise FormatError(
            f"{name} has no {BACKEND_ID} delegate in method {method!r}; methods with one: "
            f"{sorted({d.method for d in program.delegates})}"
        )
    listing = ", ".join(
        f"{d.index}: {d.method}/{d.method_delegate_index} device {d.device_id}" for d in delegates
    )
    if index is None:
        if len(delegates) > 1:
            raise FormatError(
                f"{name} has {len(delegates)} {BACKEND_ID} delegates ({listing}); "
                "pass delegate_index=N to choose one"
            )
        return delegates[0]
    chosen = [d for d in delegates if d.index == index]
    if not chosen:
        raise FormatError(
            f"{name} has no {BACKEND_ID} delegate with delegate_index {index}; it has {listing}"
        )
    return chosen[0]


def _inner_plan(engine: memoryview, where: str) -> dict[str, Any]:
    return dict(inspect_plan(engine, what=f"engine in {where}"))


def read_engine_source(source: Source, **options: Any) -> EngineSource:
    """Detect, validate and open an engine container without copying the engine.

    ``source`` is bytes-like, a path or a binary file object. Options:
    ``delegate_index`` picks one of several TensorRT delegates of a ``.pte``
    (numbered across the program, see :func:`describe`), ``method`` restricts the
    choice to one method. ``device_id`` is the container's, unchanged (``None`` for a
    raw plan); the backend applies the device policy (:func:`resolve_device`).
    """
    index, method = _check_options(options)
    view, name = open_buffer(source)
    kind = detect_format(view)
    if kind != "pte" and (index is not None or method is not None):
        raise FormatError(f"delegate_index/method apply to .pte programs; {name!r} is a {kind} container")
    if kind in ("TR01", "TR02"):
        blob = parse_tr01(view, what=f"blob {name!r}")
        plan = _inner_plan(blob.engine, f"blob {name!r}")
        return EngineSource(
            data=blob.engine,
            name=name,
            device_id=blob.device_id,
            format=blob.magic,
            bindings=blob.bindings,
            metadata={**blob.metadata(), "plan": plan},
        )
    if kind == "pte":
        program = parse_pte(view, what=f".pte program {name!r}")
        delegate = _select(program, index, method, f".pte program {name!r}")
        blob = delegate.blob
        plan = _inner_plan(blob.engine, f".pte program {name!r} delegate {delegate.index}")
        return EngineSource(
            data=blob.engine,
            name=name,
            device_id=blob.device_id,
            format="pte",
            bindings=blob.bindings,
            metadata={
                **blob.metadata(),
                "plan": plan,
                # blob_magic, method, delegate_index, location, fully_delegated,
                # compile_specs (str -> str), target_device, program_tensors, warnings
                **delegate.metadata(),
                "delegate_count": len(program.delegates),
            },
        )
    plan = inspect_plan(view, what=f"plan {name!r}")
    return EngineSource(data=view, name=name, device_id=None, format="plan", metadata={"plan": plan})


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


def resolve_device(
    device_id: int | None,
    explicit: int | None,
    device_count: int,
    *,
    current: int = 0,
    name: str | None = None,
) -> int:
    """The CUDA device an engine runs on.

    Policy: an ``explicit`` device from the caller (``load(device=...)``) is used
    verbatim; otherwise the container's ``device_id``; otherwise (raw plans) the
    ``current`` device. Whichever is chosen must exist among the ``device_count``
    devices: a blob built on GPU 3 never silently runs on GPU 0. ``name`` (the engine's)
    starts the error messages.
    """
    who = f"engine {name!r}: " if name else ""
    if device_count <= 0:
        raise EngineError("no CUDA device is visible on this machine; cannot run a TensorRT engine")
    if explicit is not None:
        if isinstance(explicit, bool) or not isinstance(explicit, int) or not 0 <= explicit < device_count:
            raise EngineError(
                f"{who}device={explicit!r} does not exist: this machine has {device_count} CUDA device(s) "
                f"(0..{device_count - 1})"
            )
        return explicit
    if device_id is None:
        return current
    if isinstance(device_id, bool) or not isinstance(device_id, int) or not 0 <= device_id < device_count:
        raise EngineError(
            f"{who}the engine's container names device_id {device_id!r}, but this machine has "
            f"{device_count} CUDA device(s) (0..{device_count - 1}); pass device=N to load() "
            "to run it on another GPU"
        )
    return device_id
