"""Two CUDA calls that can be made while holding the GIL: a graph launch and an async copy.

Shared by the backends' replay paths (no backend imports another; both import this).

Each cuda-python call, and each torch operation, releases the GIL for the time it runs.
With several caller threads, every release is a point where a waiting thread takes the
GIL, and the caller then waits to get it back: a thread switch each way.
``tools/gpu_gil_probe.py`` counted them on an H100 (8 threads, each on its own context
and stream, ``engine(x)`` under ``outer="copy"`` then a synchronize): with the launch and
the copies made through the CUDA driver's ``cuGraphLaunch`` / ``cuMemcpyAsync`` via
``ctypes.PyDLL`` (GIL held), 3.9 switches per call instead of 7.1, and less CPU time per
call (tiny: 102 against 121 µs). **But not more calls per second**: in all six
comparisons made (python and torchbind, tiny and mlp, three runs) the released calls gave
2 to 25% more calls/s at 8 callers. While a thread holds the GIL through a 2 µs launch, no
other thread runs its Python; released, the launch overlaps another thread's work. So
:data:`HOLD_GIL` is off: replays call cuda-python as before. On one thread the held launch
is about 0.2 µs cheaper (1.84 against 2.08 µs, ``tools/gpu_step_costs.py``), for a program
that calls from one thread and counts every µs.

Held calls block only while the stream's launch queue is full (thousands of operations
queued). A CUDA host function written in Python needs the GIL to run, so a full queue
waiting on one would never drain: leave :data:`HOLD_GIL` off in such programs.

:func:`replay_calls` gives the calls a replay makes: the held ones when :data:`HOLD_GIL`
is set and they can be used (``libcuda.so.1`` loads, and the runtime is cuda-python's,
not a test double), else cuda-python's. A held call returns ``0`` or a cuda-python
``CUresult`` naming the error. The driver launches a graph from a thread with no current
context (the executable graph carries its own; tests/gpu/test_gpu_held_calls.py); should a
driver answer ``CUDA_ERROR_INVALID_CONTEXT`` all the same, the call is made again through
cuda-python, which makes the device's primary context current first.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Any

__all__ = ["HOLD_GIL", "ReplayCalls", "replay_calls"]

#: Whether replays launch graphs and copy with the GIL held (see the module docstring:
#: off, because it gave fewer calls/s to concurrent callers). Read when an engine's lane is
#: made (python backend) or a graph's replay plan is (torchbind): set it before loading.
HOLD_GIL = False

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
