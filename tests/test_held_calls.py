"""The replays' GIL-holding graph launch and memcpy-node update (``trt_runtime_backends._held``)
with a stand-in for the CUDA driver library: what reaches the driver, errors, the fallbacks to
cuda-python, the copy parameters' layout against cuda-python's own, and that both backends'
replays call through it. (On a GPU: tests/gpu/test_gpu_held_calls.py.)"""

from __future__ import annotations

import ctypes
import sys
import threading
from typing import Any

import pytest
from _python_doubles import FakeTorch, _fake_engine, _FakeRuntimeNodes
from trt_runtime_backends import _held
from trt_runtime_backends._held import HeldRuntime, Memcpy3D, replay_runtime

from trt_runtime import enable_cudagraphs

_INVALID_CONTEXT = 201


class FakeDriver:
    """``libcuda.so.1`` as :class:`HeldRuntime` uses it: records each call, answers ``errors[name]``
    (0 by default), and reports ``context`` as the thread's current one."""

    def __init__(self, context: int = 0xC0FFEE) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.context = context
        self.errors: dict[str, int] = {}
        self.threads: set[int] = set()

        def launch(graph: int, stream: int) -> int:
            self.calls.append(("cuGraphLaunch", graph, stream))
            return self.errors.get("cuGraphLaunch", 0)

        def set_params(graph: int, node: int, params: Any, context: Any) -> int:
            copy = params._obj  # the Memcpy3D behind ctypes.byref
            self.threads.add(threading.get_ident())
            self.calls.append(("cuGraphExecMemcpyNodeSetParams", graph, node, copy.dstDevice, copy.srcDevice,
                               copy.WidthInBytes, copy.Height, copy.Depth, copy.srcMemoryType,
                               copy.dstMemoryType, context.value, id(copy)))
            return self.errors.get("cuGraphExecMemcpyNodeSetParams", 0)

        def get_current(out: Any) -> int:
            out._obj.value = self.context or None
            return self.errors.get("cuCtxGetCurrent", 0)

        self.cuGraphLaunch = launch
        self.cuGraphExecMemcpyNodeSetParams = set_params
        self.cuCtxGetCurrent = get_current


class _Handle:
    """A cuda-python handle object: an address through ``int()``."""

    def __init__(self, address: int) -> None:
        self.address = address

    def __int__(self) -> int:
        return self.address


def _held_over(runtime: Any, driver: FakeDriver | None = None) -> tuple[HeldRuntime, FakeDriver]:
    driver = driver or FakeDriver()
    return HeldRuntime(runtime, driver), driver


def _d2d(runtime: Any) -> Any:
    return runtime.cudaMemcpyKind.cudaMemcpyDeviceToDevice


# -- the calls -------------------------------------------------------------------------------------
def test_held_launch_goes_to_the_driver_with_addresses() -> None:
    runtime = _FakeRuntimeNodes()
    held, driver = _held_over(runtime)
    assert held.cudaGraphLaunch(_Handle(0x7000), 0x5100) == (0,)
    assert held.cudaGraphLaunch(0x7001, 0x5100) == (0,)  # an address as it is
    assert driver.calls == [("cuGraphLaunch", 0x7000, 0x5100), ("cuGraphLaunch", 0x7001, 0x5100)]
    assert not [c for c in runtime.calls if c[0] == "launch"], "cuda-python was not called"


def test_held_node_update_fills_a_one_dimensional_device_copy() -> None:
    runtime = _FakeRuntimeNodes()
    held, driver = _held_over(runtime)
    d2d = _d2d(runtime)
    exec_, node = _Handle(0x7100), _Handle(0x42)
    assert held.cudaGraphExecMemcpyNodeSetParams1D(exec_, node, 0xD000, 0x5000, 96, d2d) == (0,)
    assert held.cudaGraphExecMemcpyNodeSetParams1D(0x7100, 0x43, 0xD100, 0x5100, 32, d2d) == (0,)
    first, second = driver.calls
    # exec, node, dst, src, width, height, depth, memory types (device), the current context
    assert first[1:11] == (0x7100, 0x42, 0xD000, 0x5000, 96, 1, 1, 2, 2, 0xC0FFEE)
    assert second[1:11] == (0x7100, 0x43, 0xD100, 0x5100, 32, 1, 1, 2, 2, 0xC0FFEE)
    assert first[11] == second[11], "one parameter block per thread, refilled"
    assert not [c for c in runtime.calls if c[0] == "set_copy"]


def test_held_node_update_other_copy_kinds_go_to_cuda_python() -> None:
    runtime = _FakeRuntimeNodes()
    held, driver = _held_over(runtime)
    h2d = runtime.cudaMemcpyKind.cudaMemcpyHostToDevice
    assert held.cudaGraphExecMemcpyNodeSetParams1D(0x7100, 0x42, 0xD000, 0x5000, 8, h2d) == (0,)
    assert driver.calls == []
    assert [c[0] for c in runtime.calls] == ["set_copy"]


def test_held_node_update_without_a_current_context_goes_to_cuda_python() -> None:
    runtime = _FakeRuntimeNodes()
    held, driver = _held_over(runtime, FakeDriver(context=0))
    assert held.cudaGraphExecMemcpyNodeSetParams1D(0x7100, 0x42, 0xD000, 0x5000, 8, _d2d(runtime)) == (0,)
    assert driver.calls == []
    assert [c[:5] for c in runtime.calls] == [("set_copy", 0x7100, 0x42, 0xD000, 0x5000)]


def test_held_calls_made_again_through_cuda_python_when_the_thread_has_no_context() -> None:
    """``CUDA_ERROR_INVALID_CONTEXT``: cuda-python makes the primary context current and its
    answer is the call's."""
    runtime = _FakeRuntimeNodes()
    held, driver = _held_over(runtime)
    driver.errors = {"cuGraphLaunch": _INVALID_CONTEXT, "cuGraphExecMemcpyNodeSetParams": _INVALID_CONTEXT}
    assert held.cudaGraphLaunch(0x7000, 0x51) == (0,)
    assert held.cudaGraphExecMemcpyNodeSetParams1D(0x7100, 0x42, 0xD0, 0x50, 8, _d2d(runtime)) == (0,)
    assert [c[0] for c in driver.calls] == ["cuGraphLaunch", "cuGraphExecMemcpyNodeSetParams"]
    assert [c[0] for c in runtime.calls] == ["launch", "set_copy"]


def test_held_call_errors_are_named_by_the_driver() -> None:
    driver_module = pytest.importorskip("cuda.bindings.driver", reason="cuda-python is not installed")
    runtime = _FakeRuntimeNodes()
    driver = FakeDriver()
    held = HeldRuntime(runtime, driver, driver_module)
    driver.errors = {"cuGraphLaunch": 400, "cuGraphExecMemcpyNodeSetParams": 1}  # invalid handle, value
    (err,) = held.cudaGraphLaunch(0x7000, 0x51)
    assert err == driver_module.CUresult.CUDA_ERROR_INVALID_HANDLE
    (err,) = held.cudaGraphExecMemcpyNodeSetParams1D(0x7100, 0x42, 0xD0, 0x50, 8, _d2d(runtime))
    assert err == driver_module.CUresult.CUDA_ERROR_INVALID_VALUE
    assert runtime.calls == [], "no second try for an error that is not the context's"
    driver.errors = {"cuGraphLaunch": 987654}  # not a CUresult: the number itself
    assert held.cudaGraphLaunch(0x7000, 0x51) == (987654,)


def test_held_runtime_is_the_runtime_for_every_other_name() -> None:
    runtime = _FakeRuntimeNodes()
    held, _ = _held_over(runtime)
    assert held.cudaMemcpyAsync == runtime.cudaMemcpyAsync
    assert held.cudaMemcpyKind is runtime.cudaMemcpyKind
    with pytest.raises(AttributeError):
        held.cudaNoSuchCall  # noqa: B018


def test_held_node_updates_of_threads_use_their_own_parameters() -> None:
    """Each thread fills its own copy parameters: a thread switch between filling and the
    call cannot hand one thread's addresses to another's node."""
    runtime = _FakeRuntimeNodes()
    held, driver = _held_over(runtime)
    d2d = _d2d(runtime)

    together = threading.Barrier(4)  # all alive at once: their idents and blocks are distinct

    def body(base: int) -> None:
        together.wait()
        for i in range(200):
            (err,) = held.cudaGraphExecMemcpyNodeSetParams1D(0x7100, base, base + i, base + i + 1, 8, d2d)
            assert err == 0
        together.wait()

    threads = [threading.Thread(target=body, args=(k << 20,)) for k in range(1, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(driver.calls) == 800 and len(driver.threads) == 4
    for call in driver.calls:
        node, dst, src = call[2], call[3], call[4]
        assert node <= dst < node + 200 and src == dst + 1, call
    assert len({c[11] for c in driver.calls}) == 4, "one parameter block per thread"


def test_memcpy3d_layout_is_the_drivers() -> None:
    """The ctypes struct has cuda-python's ``CUDA_MEMCPY3D`` layout: same size, and the same bytes
    for the same field values."""
    driver = pytest.importorskip("cuda.bindings.driver", reason="cuda-python is not installed")
    theirs = driver.CUDA_MEMCPY3D()
    ours = Memcpy3D()
    values: dict[str, int] = {}
    for k, (name, _) in enumerate(Memcpy3D._fields_):
        value = 0x1000 + 17 * k
        if name.endswith("MemoryType"):
            value = 2
            setattr(theirs, name, driver.CUmemorytype(value))
        elif name.endswith("Reserved"):
            continue  # cuda-python does not expose reserved0 / reserved1
        elif name.endswith("Array"):
            continue  # a CUarray object there; left NULL on both sides
        else:
            setattr(theirs, name, value)
        values[name] = value
        setattr(ours, name, value)
    size = driver.sizeof(driver.CUDA_MEMCPY3D) if hasattr(driver, "sizeof") else ctypes.sizeof(Memcpy3D)
    assert ctypes.sizeof(Memcpy3D) == size == 200
    assert ctypes.string_at(theirs.getPtr(), size) == bytes(ours)
    assert values["WidthInBytes"] and values["dstDevice"]


# -- where they are used ---------------------------------------------------------------------------
def test_replay_runtime_is_the_runtime_unless_cuda_python_and_the_driver(monkeypatch: pytest.MonkeyPatch
                                                                        ) -> None:
    runtime = _FakeRuntimeNodes()
    assert replay_runtime(runtime) is runtime, "a test double is used as it is"
    rt = pytest.importorskip("cuda.bindings.runtime", reason="cuda-python is not installed")
    _held._held.cache_clear()
    try:
        monkeypatch.setattr(_held.ctypes, "PyDLL", lambda name: FakeDriver())
        held = replay_runtime(rt)
        assert isinstance(held, HeldRuntime) and held.cudaMemcpyAsync is rt.cudaMemcpyAsync
        assert replay_runtime(held) is held
        monkeypatch.setattr(_held, "HOLD_GIL", False)
        assert replay_runtime(rt) is rt, "HOLD_GIL off: cuda-python's calls"
        monkeypatch.setattr(_held, "HOLD_GIL", True)
        _held._held.cache_clear()

        def missing(name: str) -> Any:
            raise OSError(f"{name}: cannot open shared object file")

        monkeypatch.setattr(_held.ctypes, "PyDLL", missing)
        assert replay_runtime(rt) is rt, "no driver library (a CPU machine): cuda-python's calls"
    finally:
        _held._held.cache_clear()


@pytest.mark.parametrize(("value", "on"), [(None, True), ("1", True), ("0", False), ("off", False)])
def test_hold_gil_follows_the_environment(value: str | None, on: bool) -> None:
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "TRT_RUNTIME_HOLD_GIL"}
    if value is not None:
        env["TRT_RUNTIME_HOLD_GIL"] = value
    code = "from trt_runtime_backends import _held; print(_held.HOLD_GIL)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == str(on)


@pytest.fixture
def torch(monkeypatch: pytest.MonkeyPatch) -> FakeTorch:
    fake = FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", fake)
    return fake


def test_python_replays_launch_and_point_nodes_through_the_held_calls(
    torch: FakeTorch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy-mode replay's node updates and launch reach the driver, none cuda-python, and
    every call gets its own output."""
    from trt_runtime_backends.python import graphs

    driver = FakeDriver()
    monkeypatch.setattr(graphs, "replay_runtime", lambda rt: HeldRuntime(rt, driver))
    runtime = _FakeRuntimeNodes()
    engine = _fake_engine(runtime=runtime)
    with enable_cudagraphs(engine, outer="copy"):
        x = torch.cuda_tensor((2, 4))
        engine(x)  # the capture
        (slot,) = engine._outer_graphs.shortcuts.values()
        copying = engine._graphs.copying[int(slot.graph)]
        (node_in,), (node_out,) = copying.ins, copying.outs
        outs = []
        for _ in range(4):
            runtime.calls.clear()
            driver.calls.clear()
            outs.append(engine(x))
            assert [c for c in runtime.calls if c[0] in ("launch", "set_copy", "memcpy")] == []
            names = [c[0] for c in driver.calls]
            # the input buffer is the same each call: its node is not pointed again after the first
            assert names[-2:] == ["cuGraphExecMemcpyNodeSetParams", "cuGraphLaunch"]
            update, launch = driver.calls[-2:]
            assert update[1:4] == (int(copying.exec), int(node_out), outs[-1].data_ptr())
            assert update[4] == slot.out_ptrs[0] and launch[1] == int(copying.exec)
        assert len({o.data_ptr() for o in outs}) == 4
    assert int(node_in) != int(node_out)


def test_torchbind_graph_calls_hold_the_gil_where_they_can(monkeypatch: pytest.MonkeyPatch) -> None:
    """The torchbind backend's replays (graph_launcher, copy_nodes) take their runtime from
    ``replay_runtime``: the held calls when they can be used."""
    from trt_runtime_backends.torchbind import bridge

    rt = pytest.importorskip("cuda.bindings.runtime", reason="cuda-python is not installed")
    driver = FakeDriver()
    _held._held.cache_clear()
    try:
        monkeypatch.setattr(_held.ctypes, "PyDLL", lambda name: driver)

        class Graph:
            def raw_cuda_graph_exec(self) -> int:
                return 0x7700

        found = bridge._with_runtime(Graph(), "raw_cuda_graph_exec")
        assert found is not None and isinstance(found[1], HeldRuntime)
        launch, _ = bridge.TorchBridge.graph_launcher(Graph())  # type: ignore[misc]
        launch(0x5100)
        assert driver.calls == [("cuGraphLaunch", 0x7700, 0x5100)]
        monkeypatch.setattr(_held, "HOLD_GIL", False)
        assert bridge._with_runtime(Graph(), "raw_cuda_graph_exec")[1] is rt  # type: ignore[index]
    finally:
        _held._held.cache_clear()
