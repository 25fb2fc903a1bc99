"""The two CUDA calls of an outer-graph replay, made with the GIL held: :class:`HeldRuntime`.

Shared by the backends' replay paths (no backend imports another; both import this).

A replay in ``"copy"`` mode points the memcpy node of each output at the call's new
output (``cudaGraphExecMemcpyNodeSetParams1D``, about 1 µs) and launches the graph
(``cudaGraphLaunch``, about 2.5 µs). Through cuda-python each call releases the GIL, and
with several caller threads every release is a thread switch: the waiting thread takes the
GIL, and the caller then waits to get it back. For calls this short the switch costs more
than the work it lets overlap. On an H100 a bare graph replay loop scaled from 1 to 8
threads at 1.25x when its launch held the GIL (``ctypes.PyDLL``), 0.62x through
cuda-python (``tools/gpu_gil_probe.py``, docs/gpu-results.md, 2026-11-24, fourth session).
Holding them was tried once before, and gave no more calls/s at 8 callers. Back then each
replay still made its output with ``torch.empty``, one more release per call. Now outputs come
from slabs (``trt_runtime.slabs``), so the caller's own synchronize is the only release left.

:class:`HeldRuntime` is cuda-python's runtime module with those two names made through the
CUDA driver (``libcuda.so.1`` through ``ctypes.PyDLL``: the GIL stays held); every other
name is the module's own. :func:`replay_runtime` gives it where it can be used (the
driver library loads and ``rt`` is cuda-python's module, not a test double), and while
:data:`HOLD_GIL` is on.

A held call blocks only while the stream's launch queue is full (thousands of operations
queued). A CUDA host function written in Python needs the GIL to run, so a full queue
waiting on one would never drain: a program that queues Python host functions sets
``TRT_RUNTIME_HOLD_GIL=0`` (or :data:`HOLD_GIL` to False before loading engines).
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["HOLD_GIL", "HeldRuntime", "Memcpy3D", "replay_runtime"]

#: Whether replays launch graphs and point memcpy nodes with the GIL held. Read when a lane's
#: graph calls are set up (python backend) or a graph's replay plan is made (torchbind): set
#: it before loading. ``TRT_RUNTIME_HOLD_GIL=0`` in the environment turns it off.
HOLD_GIL = os.environ.get("TRT_RUNTIME_HOLD_GIL", "1").strip() not in ("0", "false", "no", "off")

#: ``CUDA_ERROR_INVALID_CONTEXT``: this thread has no current CUDA context.
_INVALID_CONTEXT = 201
#: ``CU_MEMORYTYPE_DEVICE``.
_MEMORYTYPE_DEVICE = 2
_OK = (0,)


class Memcpy3D(ctypes.Structure):
    """The CUDA driver's ``CUDA_MEMCPY3D`` (200 bytes on 64-bit Linux; its layout is checked
    against cuda-python's own in tests/test_held_calls.py)."""

    _fields_ = [
        (f"{side}{name}", kind)
        for side in ("src", "dst")
        for name, kind in (
            ("XInBytes", ctypes.c_size_t), ("Y", ctypes.c_size_t), ("Z", ctypes.c_size_t),
            ("LOD", ctypes.c_size_t), ("MemoryType", ctypes.c_int), ("Host", ctypes.c_void_p),
            ("Device", ctypes.c_uint64), ("Array", ctypes.c_void_p), ("Reserved", ctypes.c_void_p),
            ("Pitch", ctypes.c_size_t), ("Height", ctypes.c_size_t),
        )
    ] + [("WidthInBytes", ctypes.c_size_t), ("Height", ctypes.c_size_t), ("Depth", ctypes.c_size_t)]


class HeldRuntime:
    """cuda-python's runtime module ``rt`` with ``cudaGraphLaunch`` and
    ``cudaGraphExecMemcpyNodeSetParams1D`` made through the CUDA driver ``library`` with the
    GIL held. Each returns what cuda-python's does: ``(0,)``, or ``(error,)`` with the error a
    driver ``CUresult`` (``driver``'s) when it can name it. A thread with no current context
    (``CUDA_ERROR_INVALID_CONTEXT``) gets the call made again through ``rt``, which makes the
    device's primary context current first. Thread-safe: each thread fills its own copy
    parameters."""

    held = True

    def __init__(self, rt: Any, library: Any, driver: Any = None) -> None:
        self._rt = rt
        rt_launch, rt_set = rt.cudaGraphLaunch, rt.cudaGraphExecMemcpyNodeSetParams1D
        d2d = rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        graph_launch = library.cuGraphLaunch
        graph_launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        graph_launch.restype = ctypes.c_int
        set_params = library.cuGraphExecMemcpyNodeSetParams
        set_params.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(Memcpy3D), ctypes.c_void_p]
        set_params.restype = ctypes.c_int
        get_current = library.cuCtxGetCurrent
        get_current.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        get_current.restype = ctypes.c_int
        local = threading.local()
        byref = ctypes.byref

        def failed(err: int, again: Callable[[], Any]) -> tuple[Any]:
            if err == _INVALID_CONTEXT:
                return again()  # type: ignore[no-any-return]
            if driver is not None:
                try:
                    return (driver.CUresult(err),)
                except ValueError:
                    pass
            return (err,)

        def launch(graph: Any, stream: Any) -> tuple[Any]:
            err = graph_launch(int(graph), stream)
            return failed(err, lambda: rt_launch(graph, stream)) if err else _OK

        def params() -> tuple[Memcpy3D, ctypes.c_void_p]:
            copy = Memcpy3D(srcMemoryType=_MEMORYTYPE_DEVICE, dstMemoryType=_MEMORYTYPE_DEVICE,
                            Height=1, Depth=1)
            made = local.made = (copy, ctypes.c_void_p())
            return made

        def set_1d(graph: Any, node: Any, dst: int, src: int, nbytes: int, kind: Any) -> tuple[Any]:
            if kind is not d2d:  # (replays copy device to device only)
                return rt_set(graph, node, dst, src, nbytes, kind)  # type: ignore[no-any-return]
            try:
                copy, context = local.made
            except AttributeError:
                copy, context = params()
            err = get_current(byref(context))
            if err or not context.value:
                return rt_set(graph, node, dst, src, nbytes, kind)  # type: ignore[no-any-return]
            copy.srcDevice = src
            copy.dstDevice = dst
            copy.WidthInBytes = nbytes
            err = set_params(int(graph), int(node), byref(copy), context)
            return failed(err, lambda: rt_set(graph, node, dst, src, nbytes, kind)) if err else _OK

        self.cudaGraphLaunch = launch
        self.cudaGraphExecMemcpyNodeSetParams1D = set_1d

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rt, name)

    def __repr__(self) -> str:
        return f"<HeldRuntime over {getattr(self._rt, '__name__', self._rt)!r}>"


def replay_runtime(rt: Any) -> Any:
    """What a replay calls for cuda-python's runtime module ``rt`` (or a test double): a
    :class:`HeldRuntime` when :data:`HOLD_GIL` is on, ``rt`` is cuda-python's own and the
    CUDA driver library loads; else ``rt`` itself."""
    if HOLD_GIL and not isinstance(rt, HeldRuntime):
        held = _held(rt)
        if held is not None:
            return held
    return rt


@functools.cache
def _held(rt: Any) -> HeldRuntime | None:
    try:
        from cuda.bindings import driver
        from cuda.bindings import runtime as cudart
    except ImportError:
        return None
    if rt is not cudart:
        return None
    try:
        return HeldRuntime(rt, ctypes.PyDLL("libcuda.so.1"), driver)
    except (OSError, AttributeError):
        return None
