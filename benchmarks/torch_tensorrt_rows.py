"""torch-tensorrt's own Python runtime on the same plan, for comparison.

Up to 2.12 that is ``PythonTorchTensorRTModule(plan, inputs, outputs)``; from 2.13 the
Python ``TRTEngine`` (fed by ``TorchTensorRTModule._pack_engine_info``), called as
``engine.execute([x])``. ``import torch_tensorrt`` needs ``packaging``, ``psutil``,
``dllist`` and ``typing_extensions`` at import time (``filelock`` for path runtime
caches); an offline host gets them with ``--wheels`` (docs/benchmarks.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from .device import stream_handle
from .environment import one_line
from .row_base import Bench, RowSkip, Workbench

__all__ = ["python_runtime"]


def python_runtime(wb: Workbench) -> Bench:
    """``torch-tensorrt-python``: torch-tensorrt's Python runtime, ``execute([x])`` per call."""
    try:
        import torch_tensorrt
        from torch_tensorrt.dynamo import CompilationSettings
    except Exception as exc:  # also a clash with an already loaded runtime library
        raise RowSkip(f"torch_tensorrt does not import: {type(exc).__name__}: {one_line(exc)}") from exc
    built, tensors = wb.built, wb.tensors
    in_names = [s.name for s in built.inputs]
    out_names = [s.name for s in built.outputs]
    name = f"{wb.workload.key}-torch-tensorrt"
    version = getattr(torch_tensorrt, "__version__", "?")
    runtime = torch_tensorrt.dynamo.runtime
    handle = stream_handle(wb.device.current_stream())
    info: dict[str, Any] = {"version": version, "stream": "torch's current stream"}
    legacy = getattr(runtime, "PythonTorchTensorRTModule", None)
    if legacy is not None:  # torch-tensorrt <= 2.12
        module = legacy(built.plan, in_names, out_names, name=name, settings=CompilationSettings())
        calls: list[Callable[[], Any]] = [functools.partial(module, x) for x in tensors.inputs]
        info["call"] = "PythonTorchTensorRTModule(x)"
    else:
        try:
            from torch_tensorrt.dynamo.runtime._TorchTensorRTModule import TorchTensorRTModule
            from torch_tensorrt.dynamo.runtime._TRTEngine import TRTEngine
        except ImportError as exc:
            raise RowSkip(f"torch-tensorrt {version} has neither PythonTorchTensorRTModule nor the "
                          f"Python TRTEngine: {one_line(exc)}") from exc
        # The module only packs the engine description; TRTEngine is the Python runtime.
        packer = TorchTensorRTModule(
            built.plan, in_names, out_names, name=name, settings=CompilationSettings(lazy_engine_init=True)
        )
        engine = TRTEngine(packer._pack_engine_info())
        calls = [functools.partial(engine.execute, [x]) for x in tensors.inputs]
        info["call"] = "TRTEngine.execute([x])"
        try:
            calls[0]()
            wb.device.synchronize()
            info["resources"] = "static (the default)"
        except Exception as exc:
            # Engines built with REQUIRE_USER_ALLOCATION may refuse a STATIC context:
            # torch-tensorrt then needs its per-call (dynamic) workspace.
            if not hasattr(engine, "use_dynamically_allocated_resources"):
                raise
            engine.use_dynamically_allocated_resources(True)
            info["resources"] = f"dynamically allocated per call (static failed: {one_line(exc, 120)})"

    def check() -> Any:
        out = calls[0]()
        wb.device.synchronize()
        return out[0] if isinstance(out, (list, tuple)) else out

    return Bench(calls, handle, check=check, info=info)
