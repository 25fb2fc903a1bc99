"""Reading an engine container: :func:`read_engine_source`, what :func:`trt_runtime.load` calls.

It detects the format, validates it completely (bad input raises
:class:`~trt_runtime.FormatError` before any byte reaches TensorRT) and returns an
:class:`~trt_runtime.EngineSource` whose ``data`` is a ``memoryview`` over the input (a
read-only ``mmap`` for paths), never a copy.
"""

from __future__ import annotations

import os
from typing import IO, Any

from trt_runtime.errors import FormatError, SettingsError
from trt_runtime.formats.detect import detect_format
from trt_runtime.formats.plan import inspect_plan
from trt_runtime.formats.pte import BACKEND_ID, Delegate, Program, parse_pte
from trt_runtime.formats.source import EngineInput, open_buffer
from trt_runtime.formats.tr01 import parse_tr01
from trt_runtime.protocols import EngineSource

__all__ = ["FORMAT_OPTIONS", "Source", "read_engine_source"]

#: Keyword options :func:`read_engine_source` (and so :func:`trt_runtime.load`) accepts.
FORMAT_OPTIONS = ("delegate_index", "method")

Source = EngineInput | str | os.PathLike[str] | IO[bytes]


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
