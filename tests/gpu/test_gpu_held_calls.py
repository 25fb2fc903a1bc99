"""The replays' GIL-holding graph launch and memcpy-node update (``trt_runtime_backends._held``)
on a GPU.

Proves: on a GPU host the replays' runtime is the held one; the CUDA driver, given our
``CUDA_MEMCPY3D``, points a real memcpy node at new buffers and the held launch runs the
graph; a thread with no current context launches all the same; both backends' replays under
``outer="copy"`` and ``"view"`` give the reference's outputs held and released, and with the
held calls 8 threads on their own streams keep every output right.

Run: ``python -m pytest -m gpu tests/gpu/test_gpu_held_calls.py -rA -q``.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from trt_runtime import EngineSource, enable_cudagraphs

pytestmark = pytest.mark.gpu


def _torch() -> Any:
    torch = pytest.importorskip("torch", reason="torch is not installed on this GPU host")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA support here")
    return torch


def _copy_graph(rt: Any, dst: Any, src: Any) -> tuple[Any, Any, Any]:
    """A graph of one memcpy node ``src`` -> ``dst`` (torch tensors): (graph, exec, node)."""
    d2d = rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
    err, graph = rt.cudaGraphCreate(0)
    assert not err
    err, node = rt.cudaGraphAddMemcpyNode1D(graph, None, 0, dst.data_ptr(), src.data_ptr(),
                                            src.numel() * src.element_size(), d2d)
    assert not err
    err, graph_exec = rt.cudaGraphInstantiate(graph, 0)
    assert not err
    return graph, graph_exec, node


def test_gpu_held_calls_point_a_memcpy_node_and_launch() -> None:
    torch = _torch()
    from cuda.bindings import runtime as rt
    from trt_runtime_backends._held import HeldRuntime, replay_runtime

    held = replay_runtime(rt)
    assert isinstance(held, HeldRuntime), "on a GPU host the replays hold the GIL (libcuda.so.1 loads)"
    d2d = rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
    first_src = torch.arange(4096, dtype=torch.float32, device="cuda")
    first_dst = torch.zeros_like(first_src)
    graph, graph_exec, node = _copy_graph(rt, first_dst, first_src)
    stream = torch.cuda.Stream()
    handle = int(stream.cuda_stream)
    try:
        for k in range(3):
            src = torch.randn(1000, device="cuda")
            dst = torch.zeros(1000, device="cuda")
            torch.cuda.synchronize()
            assert held.cudaGraphExecMemcpyNodeSetParams1D(graph_exec, node, dst.data_ptr(), src.data_ptr(),
                                                           4000 - 4 * k, d2d) == (0,)
            assert held.cudaGraphLaunch(graph_exec, handle) == (0,)
            stream.synchronize()
            n = 1000 - k
            assert torch.equal(dst[:n], src[:n]) and not dst[n:].any(), "exactly the bytes asked for"
        assert not first_dst.any(), "the node was pointed away from the buffers it was built with"
    finally:
        rt.cudaGraphExecDestroy(graph_exec)
        rt.cudaGraphDestroy(graph)


def test_gpu_held_launch_from_a_thread_without_a_current_context() -> None:
    """A thread with no current context (``cuCtxSetCurrent(NULL)``) launches through the driver
    all the same: the executable graph carries its context."""
    torch = _torch()
    from cuda.bindings import driver
    from cuda.bindings import runtime as rt
    from trt_runtime_backends._held import HeldRuntime

    class Counting:
        launches = 0

        def __getattr__(self, name: str) -> Any:
            return getattr(rt, name)

        def cudaGraphLaunch(self, graph: Any, stream: int) -> Any:
            Counting.launches += 1
            return rt.cudaGraphLaunch(graph, stream)

    import ctypes

    held = HeldRuntime(Counting(), ctypes.PyDLL("libcuda.so.1"), driver)
    src = torch.arange(256, dtype=torch.float32, device="cuda")
    dst = torch.zeros_like(src)
    graph, graph_exec, _ = _copy_graph(rt, dst, src)
    stream = torch.cuda.Stream()
    results: list[Any] = []

    def body() -> None:
        (err,) = driver.cuCtxSetCurrent(driver.CUcontext(0))
        assert not err
        results.append(held.cudaGraphLaunch(graph_exec, int(stream.cuda_stream)))

    try:
        torch.cuda.synchronize()
        thread = threading.Thread(target=body)
        thread.start()
        thread.join()
        stream.synchronize()
        assert results == [(0,)]
        assert Counting.launches == 0, "the driver launched it; cuda-python was not needed"
        assert torch.equal(dst, src)
    finally:
        rt.cudaGraphExecDestroy(graph_exec)
        rt.cudaGraphDestroy(graph)


def _inputs(torch: Any, built: Any, count: int, seed: int) -> list[tuple[Any, Any]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        host = rng.standard_normal((8, 256)).astype(np.float16)
        want = np.asarray(built.reference(host.astype(np.float64))[0], dtype=np.float32)
        out.append((torch.from_numpy(host).cuda(), torch.from_numpy(want).cuda()))
    return out


def _right(torch: Any, built: Any, got: Any, want: Any) -> bool:
    rtol, atol = (max(t * 10, 1e-3) for t in built.tolerance)
    return bool(torch.allclose(got.float(), want, rtol=rtol, atol=atol))


def _held_and_released(torch: Any, backend: Any, built: Any, monkeypatch: pytest.MonkeyPatch, mode: str,
                       check: Any) -> None:
    from trt_runtime_backends import _held

    cases = _inputs(torch, built, 40, seed=3)
    for hold in (True, False):
        monkeypatch.setattr(_held, "HOLD_GIL", hold)
        engine = backend.load_engine(EngineSource(built.plan, name=f"held-{hold}"))
        try:
            with enable_cudagraphs(engine, outer=mode):
                kept = []
                for x, _ in cases:
                    y = engine(x)
                    kept.append(y.clone() if mode == "view" else y)
                check(engine, hold)
            torch.cuda.synchronize()
            wrong = [i for i, (y, (_, want)) in enumerate(zip(kept, cases, strict=True))
                     if not _right(torch, built, y, want)]
            assert wrong == [], f"HOLD_GIL={hold}, outer={mode!r}: outputs {wrong} are wrong"
        finally:
            engine.close()


@pytest.mark.parametrize("mode", ["copy", "view"])
def test_gpu_python_replays_right_held_and_released(python_backend: Any, engines: Any, monkeypatch: Any,
                                                    mode: str) -> None:
    torch = _torch()
    from trt_runtime_backends._held import HeldRuntime

    def check(engine: Any, hold: bool) -> None:
        assert isinstance(engine._graphs.rt, HeldRuntime) is hold
        assert engine.graph_captures == 1

    _held_and_released(torch, python_backend, engines("mlp_fp16"), monkeypatch, mode, check)


@pytest.mark.parametrize("mode", ["copy", "view"])
def test_gpu_torchbind_replays_right_held_and_released(engines: Any, monkeypatch: Any, mode: str) -> None:
    torch = _torch()
    from trt_runtime import backend_status, get_backend

    status = backend_status().get("torchbind")
    if not status:
        pytest.skip(f"the torchbind backend cannot run here: {getattr(status, 'reason', 'not installed')}")

    def check(engine: Any, hold: bool) -> None:
        from cuda.bindings import runtime as rt
        from trt_runtime_backends._held import HeldRuntime, replay_runtime

        assert isinstance(replay_runtime(rt), HeldRuntime) is hold  # what its replay plans were given
        assert engine.graph_captures == 1

    _held_and_released(torch, get_backend("torchbind"), engines("mlp_fp16"), monkeypatch, mode, check)


def test_gpu_held_replays_from_8_threads_keep_every_output(load: Any, engines: Any) -> None:
    """8 threads, each on its own stream and context, replay under ``outer="copy"`` with the
    held calls and keep every output: each is still its own call's result after all ran."""
    torch = _torch()
    from trt_runtime_backends._held import HeldRuntime

    built = engines("mlp_fp16")
    engine = load("mlp_fp16", contexts=8)
    threads, calls = 8, 60
    per_thread = [_inputs(torch, built, 6, seed=100 + t) for t in range(threads)]
    kept: list[list[tuple[Any, Any]]] = [[] for _ in range(threads)]
    errors: list[str] = []
    barrier = threading.Barrier(threads)

    def work(t: int) -> None:
        try:
            stream = torch.cuda.Stream()
            barrier.wait()
            with torch.cuda.stream(stream):
                for i in range(calls):
                    x, want = per_thread[t][i % len(per_thread[t])]
                    kept[t].append((engine(x), want))
            stream.synchronize()
        except Exception as exc:  # reported below
            errors.append(f"thread {t}: {exc!r}")

    with enable_cudagraphs(engine, outer="copy"):
        engine(per_thread[0][0][0])
        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        torch.cuda.synchronize()
        assert all(isinstance(lane._graphs.rt, HeldRuntime) for lane in engine._lanes)
    assert errors == []
    wrong = [(t, i) for t in range(threads) for i, (y, want) in enumerate(kept[t])
             if not _right(torch, built, y, want)]
    assert wrong == [], f"{len(wrong)} of {threads * calls} outputs are not their call's"
    assert sum(len(k) for k in kept) == threads * calls
