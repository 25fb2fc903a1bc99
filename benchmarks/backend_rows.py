"""Rows that call this project's backends, and the bare ``execute_engine`` op.

Engines load with default settings. The python backend's natural and pre-bound rows
share one engine; each outer-graph row has its own (the wrap is per engine); the
torchbind row and the bare op share one torchbind engine. Rows that run on "torch's
current stream" use whatever stream is current when the run starts: the legacy default
stream unless the caller changed it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from .device import stream_handle
from .row_base import Bench, RowSkip, Workbench

__all__ = [
    "execute_engine_op",
    "python_natural",
    "python_outer_copy",
    "python_outer_replay",
    "python_prebound",
    "torchbind",
    "torchbind_outer_copy",
    "torchbind_outer_replay",
]


def _load(wb: Workbench, backend_name: str, label: str) -> Any:
    from trt_runtime import EngineSource, get_backend

    backend: Any = get_backend(backend_name)
    return backend.load_engine(EngineSource(wb.built.plan, name=f"{wb.workload.key}-{label}"))


def _engine(wb: Workbench, backend_name: str, label: str) -> Any:
    """A workload-wide engine of ``backend_name`` (shared by the rows asking for ``label``)."""

    def make() -> tuple[Any, Callable[[], None]]:
        engine = _load(wb, backend_name, label)
        return engine, engine.close

    return wb.shared(f"{backend_name}:{label}", make)


def _current(wb: Workbench) -> tuple[int, str]:
    stream = wb.device.current_stream()
    handle = stream_handle(stream)
    return handle, "torch's current stream" + (" (legacy default)" if handle == 0 else "")


def _natural_check(wb: Workbench, call: Callable[[], Any]) -> Callable[[], Any]:
    def check() -> Any:
        out = call()
        wb.device.synchronize()
        return out[0] if isinstance(out, (list, tuple)) else out

    return check


def python_natural(wb: Workbench) -> Bench:
    """``engine(x)``: a torch CUDA tensor on torch's current stream, default options."""
    engine = _engine(wb, "python", "shared")
    calls: list[Callable[[], Any]] = [functools.partial(engine, x) for x in wb.tensors.inputs]
    handle, where = _current(wb)
    return Bench(calls, handle, check=_natural_check(wb, calls[0]), info={"stream": where})


def python_prebound(wb: Workbench) -> Bench:
    """``engine.execute(x, outputs=[y], stream=engine.stream)``: no allocation, no ordering."""
    engine = _engine(wb, "python", "shared")
    if not engine.backend.capabilities.supports_preallocated_outputs:
        raise RowSkip("the python backend does not declare supports_preallocated_outputs")
    own = getattr(engine, "stream", None)
    if own is None:
        raise RowSkip("the python engine exposes no .stream")
    execute = engine.execute
    tensors = wb.tensors

    def bound(x: Any, ys: list[Any]) -> Callable[[], Any]:
        # a closure, as the raw rows' calls are (a functools.partial with keywords would
        # add its own dict-based call to this row alone)
        def call() -> Any:
            return execute(x, outputs=ys, stream=own)

        return call

    pairs = zip(tensors.inputs, tensors.outputs, strict=True)
    calls: list[Callable[[], Any]] = [bound(x, [y]) for x, y in pairs]

    def check() -> Any:
        calls[0]()
        wb.device.synchronize()
        return tensors.outputs[0].clone()

    return Bench(calls, stream_handle(own), check=check, info={"stream": "engine.stream"})


def _outer_engine(wb: Workbench, mode: str, backend_name: str = "python") -> Any:
    """An engine of its own under ``enable_cudagraphs(engine, outer=mode)``."""
    import trt_runtime

    def make() -> tuple[Any, Callable[[], None]]:
        engine = _load(wb, backend_name, f"outer-{mode}")
        wrap = trt_runtime.enable_cudagraphs(engine, outer=mode)
        try:
            wrap.__enter__()
        except Exception:
            engine.close()
            raise

        def close() -> None:
            try:
                wrap.__exit__(None, None, None)
            finally:
                engine.close()

        return engine, close

    return wb.shared(f"{backend_name}:outer-{mode}", make)


def python_outer_copy(wb: Workbench) -> Bench:
    """``engine(x)`` under ``enable_cudagraphs(engine, outer=True)``: inputs copied into the
    engine's static buffers, outputs returned as new tensors, one graph launch."""
    return _outer_copy(wb, "python")


def torchbind_outer_copy(wb: Workbench) -> Bench:
    """The torchbind backend's ``engine(x)`` under the outer graph, called like ``python-outer-copy``."""
    return _outer_copy(wb, "torchbind")


def _outer_copy(wb: Workbench, backend_name: str) -> Bench:
    engine = _outer_engine(wb, "copy", backend_name)
    calls: list[Callable[[], Any]] = [functools.partial(engine, x) for x in wb.tensors.inputs]
    handle, where = _current(wb)
    info = {"stream": where, "wrap": "enable_cudagraphs(engine, outer='copy')"}
    return Bench(calls, handle, check=_natural_check(wb, calls[0]), info=info)


def python_outer_replay(wb: Workbench) -> Bench:
    """The replay floor: ``engine(s)`` in ``"view"`` mode where ``s`` is the engine's own
    static input buffer (``engine.static_inputs(shape, as_torch=True)``): no input copy,
    outputs are views of the static outputs; one graph launch per call."""
    return _outer_replay(wb, "python")


def torchbind_outer_replay(wb: Workbench) -> Bench:
    """The torchbind backend's replay floor, called like ``python-outer-replay``."""
    return _outer_replay(wb, "torchbind")


def _outer_replay(wb: Workbench, backend_name: str) -> Bench:
    engine = _outer_engine(wb, "view", backend_name)
    static_inputs = getattr(engine, "static_inputs", None)
    if static_inputs is None:
        raise RowSkip(f"the {backend_name} engine has no static_inputs() (the replay floor passes the "
                      "engine's own static input buffers back)")
    statics = []
    for x in wb.tensors.inputs:
        (buffer,) = static_inputs(tuple(x.shape), as_torch=True)
        buffer.copy_(x)
        statics.append(buffer)
    wb.device.synchronize()
    calls: list[Callable[[], Any]] = [functools.partial(engine, s) for s in statics]
    handle, where = _current(wb)
    info = {"stream": where, "wrap": "enable_cudagraphs(engine, outer='view')",
            "inputs": "engine.static_inputs(shape, as_torch=True)"}

    def check() -> Any:
        out = calls[0]()
        wb.device.synchronize()
        return (out[0] if isinstance(out, (list, tuple)) else out).clone()

    return Bench(calls, handle, check=check, info=info)


def torchbind(wb: Workbench) -> Bench:
    """The torchbind backend's ``engine(x)`` on torch's current stream."""
    engine = _engine(wb, "torchbind", "shared")
    calls: list[Callable[[], Any]] = [functools.partial(engine, x) for x in wb.tensors.inputs]
    handle, where = _current(wb)
    return Bench(calls, handle, check=_natural_check(wb, calls[0]), info={"stream": where})


def execute_engine_op(wb: Workbench) -> Bench:
    """``torch.ops.tensorrt.execute_engine([x], engine.native)`` on the torchbind engine of
    the ``torchbind`` row: torch-tensorrt's C++ runtime per call, without this project."""
    engine = _engine(wb, "torchbind", "shared")
    native = getattr(engine, "native", None)
    if native is None:
        raise RowSkip("the torchbind engine exposes no .native torch.classes.tensorrt.Engine")
    engine(wb.tensors.inputs[0])  # applies the runtime settings to the native engine
    wb.device.synchronize()
    op = wb.torch.ops.tensorrt.execute_engine
    calls: list[Callable[[], Any]] = [functools.partial(op, [x], native) for x in wb.tensors.inputs]
    handle, where = _current(wb)
    return Bench(calls, handle, check=_natural_check(wb, calls[0]), info={"stream": where})
