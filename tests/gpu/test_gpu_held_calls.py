"""The replays' GIL-holding graph launch and copy (``trt_runtime_backends._held``) on a GPU.

Proves: replays use cuda-python by default; asked for, the CUDA driver's ``cuGraphLaunch``
and ``cuMemcpyAsync`` through ``ctypes.PyDLL`` run a torch-captured graph and copy device
memory; a thread with no current context launches through the driver too; the python
backend's replays give the same outputs held and released.
(The driver does not check a graph handle: a bad one crashes the process, so none is
tried here; error naming is tested with stand-ins in tests/test_held_calls.py.)
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import pytest

from trt_runtime import EngineSource, enable_cudagraphs

pytestmark = pytest.mark.gpu


def _torch() -> Any:
    torch = pytest.importorskip("torch", reason="torch is not installed on this GPU host")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA support here")
    return torch


class _CountingRuntime:
    """cuda-python's runtime, counting the graph launches made through it."""

    def __init__(self, rt: Any) -> None:
        self._rt = rt
        self.launches = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rt, name)

    def cudaGraphLaunch(self, graph: Any, stream: int) -> Any:
        self.launches += 1
        return self._rt.cudaGraphLaunch(graph, stream)


def _doubling_graph(torch: Any) -> tuple[Any, Any, Any, Any]:
    x = torch.arange(1024, dtype=torch.float32, device="cuda")
    y = torch.zeros_like(x)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        y.copy_(x * 2)  # warm-up outside the capture
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        y.copy_(x * 2)
    y.zero_()
    torch.cuda.synchronize()
    return graph, x, y, stream


def test_held_calls_launch_and_copy_on_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = _torch()
    from cuda.bindings import runtime as rt
    from trt_runtime_backends import _held

    assert not _held.replay_calls(rt).held, "off by default"
    monkeypatch.setattr(_held, "HOLD_GIL", True)
    calls = _held.replay_calls(rt)
    assert calls.held, "on a GPU host the replays' calls hold the GIL (libcuda.so.1 loads)"
    graph, x, y, stream = _doubling_graph(torch)
    handle = int(stream.cuda_stream)
    assert calls.launch_ptr(int(graph.raw_cuda_graph_exec()), handle) == 0
    z = torch.empty_like(y)
    assert calls.copy(z.data_ptr(), y.data_ptr(), y.numel() * y.element_size(), handle) == 0
    stream.synchronize()
    assert torch.equal(y, x * 2) and torch.equal(z, y)


def test_held_launch_from_a_thread_without_a_current_context() -> None:
    """A thread with no current context (made so with ``cuCtxSetCurrent(NULL)``) launches
    through the driver all the same: the executable graph carries its context (measured
    here on TensorRT-RTX's host, CUDA 13 driver), so cuda-python is not called."""
    torch = _torch()
    from cuda.bindings import driver
    from cuda.bindings import runtime as rt
    from trt_runtime_backends import _held

    counting = _CountingRuntime(rt)
    calls = _held.ReplayCalls(counting, ctypes.PyDLL("libcuda.so.1"), driver)
    graph, x, y, stream = _doubling_graph(torch)
    exec_ptr, handle = int(graph.raw_cuda_graph_exec()), int(stream.cuda_stream)
    results: list[Any] = []

    def body() -> None:
        (err,) = driver.cuCtxSetCurrent(driver.CUcontext(0))
        assert not err
        err, current = driver.cuCtxGetCurrent()
        assert not err and int(current) == 0
        results.extend([calls.launch_ptr(exec_ptr, handle), calls.launch_ptr(exec_ptr, handle)])

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    stream.synchronize()
    assert results == [0, 0]
    assert counting.launches == 0
    assert torch.equal(y, x * 2)


@pytest.mark.parametrize("mode", ["copy", "view"])
def test_python_replays_hold_the_gil_and_match_released_ones(python_backend, engines, monkeypatch,
                                                             mode) -> None:
    torch = _torch()
    from trt_runtime_backends import _held

    built = engines("mlp_fp16")
    xs = [torch.from_numpy(built.random_inputs(seed=seed)[0]).cuda() for seed in range(3)]
    outputs = {}
    for hold in (True, False):
        monkeypatch.setattr(_held, "HOLD_GIL", hold)
        engine = python_backend.load_engine(EngineSource(built.plan, name=f"held-{hold}"))
        try:
            assert engine._graphs.calls.held is hold
            with enable_cudagraphs(engine, outer=mode):
                outputs[hold] = [[engine(x).clone() for x in xs] for _ in range(3)]
            torch.cuda.synchronize()
        finally:
            engine.close()
    for held_run, released_run in zip(outputs[True], outputs[False], strict=True):
        for got, want in zip(held_run, released_run, strict=True):
            assert torch.equal(got, want)
