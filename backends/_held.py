"""Two CUDA calls made while holding the GIL: a graph launch and an asynchronous copy.

Shared by the backends' replay paths (no backend imports another; both import this).

Each cuda-python call, and each torch operation, releases the GIL for the time it runs.
With one caller thread that costs nothing. With several, every release is a point where a
waiting thread takes the GIL, and the caller then has to wait to get it back: a context
switch each way. ``tools/gpu_gil_probe.py`` counted them on an H100, with 8 threads each
running their own replay of a small graph and then synchronizing:

* cuda-python's ``cudaGraphLaunch``: 3.5 switches per call, and 0.62x the calls/s of 1 thread;
* the driver's ``cuGraphLaunch`` through ``ctypes.PyDLL`` (GIL held): 1.2 switches per
  call, and 1.25x the calls/s of 1 thread.

A launch or a copy only queues work: it returns in about 2 µs, and holding the GIL for that
long costs the other threads less than giving it away. (Waiting, like a stream
synchronize, still releases it.) Both calls can block only while the stream's launch queue
is full (thousands of operations queued), and then for as long as the GPU needs to make
room. A CUDA host function written in Python needs the GIL to run, so a full queue that
waits on one would never drain. :data:`HOLD_GIL` turns these calls off for such programs.

:func:`replay_calls` gives the calls a replay makes: these, or cuda-python's when they
cannot be used (:data:`HOLD_GIL` false, no ``libcuda.so.1``, or a cuda-python stand-in in
tests). A held call returns ``0`` or a cuda-python ``CUresult`` naming the error. The
driver launches a graph from a thread with no current context (the executable graph
carries its own; tests/gpu/test_gpu_held_calls.py); should a driver answer
``CUDA_ERROR_INVALID_CONTEXT`` all the same, the call is made again through cuda-python,
which makes the device's primary context current first.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Any

__all__ = ["HOLD_GIL", "ReplayCalls", "replay_calls"]

#: Whether replays launch graphs and copy with the GIL held (see the module docstring).
#: Read when a plan is made: set it before loading engines.
HOLD_GIL = True

#: ``CUDA_ERROR_INVALID_CONTEXT``: this thread has no current CUDA context.
_INVALID_CONTEXT = 201


class ReplayCalls:
    """``launch(graph_exec, stream)``, ``launch_ptr(address, stream)`` and ``copy(dst, src,
    nbytes, stream)`` (device to device): each returns ``0`` or the error. ``graph_exec`` is
    what ``runtime`` takes; the other arguments are addresses and stream handles.
    :attr:`held` tells whether they keep the GIL (the CUDA driver through ctypes) or
    release it (cuda-python's ``runtime``, which may be a test double)."""

    __slots__ = ("copy", "held", "launch", "launch_ptr")

    def __init__(self, runtime: Any, library: Any = None, driver: Any = None) -> None:
        d2d = runtime.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        rt_launch, rt_copy = runtime.cudaGraphLaunch, runtime.cudaMemcpyAsync
        self.held = library is not None
        if library is None:
            def launch(graph: Any, stream: int) -> Any:
                return rt_launch(graph, stream)[0]

            def copy(dst: int, src: int, nbytes: int, stream: int) -> Any:
                return rt_copy(dst, src, nbytes, d2d, stream)[0]

            self.launch = self.launch_ptr = launch
            self.copy = copy
            return
        graph_launch = library.cuGraphLaunch
        graph_launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        graph_launch.restype = ctypes.c_int
        memcpy = library.cuMemcpyAsync
        memcpy.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
        memcpy.restype = ctypes.c_int

        def failed(err: int, retry: Callable[[], Any]) -> Any:
            if err == _INVALID_CONTEXT:
                return retry()[0]  # cuda-python's runtime makes the primary context current
            try:
                return driver.CUresult(err)
            except ValueError:
                return err

        def launch_ptr(graph: int, stream: int) -> Any:
            err = graph_launch(graph, stream)
            return failed(err, lambda: rt_launch(graph, stream)) if err else 0

        def held_launch(graph: Any, stream: int) -> Any:
            return launch_ptr(int(graph), stream)

        def held_copy(dst: int, src: int, nbytes: int, stream: int) -> Any:
            err = memcpy(dst, src, nbytes, stream)
            return failed(err, lambda: rt_copy(dst, src, nbytes, d2d, stream)) if err else 0

        self.launch, self.launch_ptr, self.copy = held_launch, launch_ptr, held_copy


def replay_calls(runtime: Any) -> ReplayCalls:
    """The calls a replay makes, for cuda-python's ``runtime`` module (or a test double):
    held ones when :data:`HOLD_GIL` is set, ``runtime`` is cuda-python's own and the CUDA
    driver library loads; else ``runtime``'s."""
    if HOLD_GIL:
        held = _held(runtime)
        if held is not None:
            return held
    return ReplayCalls(runtime)


@functools.cache
def _held(runtime: Any) -> ReplayCalls | None:
    try:
        from cuda.bindings import driver
        from cuda.bindings import runtime as cudart
    except ImportError:
        return None
    if runtime is not cudart:
        return None
    try:
        return ReplayCalls(runtime, ctypes.PyDLL("libcuda.so.1"), driver)
    except (OSError, AttributeError):
        return None
