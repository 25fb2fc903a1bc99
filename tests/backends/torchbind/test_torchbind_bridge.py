"""``TorchBridge`` (everything the torchbind backend asks of torch) against a minimal torch
stand-in: the calls it makes into torch, with the arguments torch expects."""

from __future__ import annotations

import contextlib
from typing import Any, ClassVar

import numpy as np
import pytest
from trt_runtime_backends.torchbind.bridge import TensorInfo, TorchBridge
from trt_runtime_backends.torchbind.streams import StreamPool

from trt_runtime.errors import EngineError


class _Dev:
    def __init__(self, kind: str, index: int | None) -> None:
        self.type, self.index = kind, index


class _T:
    def __init__(self, array: Any, device: _Dev) -> None:
        self.array, self.device = np.asarray(array), device
        self.dtype = f"torch.{self.array.dtype}"
        self.shape = self.array.shape

    def is_contiguous(self) -> bool:
        return bool(self.array.flags.c_contiguous)

    def stride(self) -> tuple[int, ...]:
        return tuple(s // self.array.itemsize for s in self.array.strides)

    def is_floating_point(self) -> bool:
        return bool(np.issubdtype(self.array.dtype, np.floating))

    def fill_(self, value: float) -> None:
        self.array[...] = value

    def __and__(self, other: _T) -> _T:
        return _T(self.array & other.array, self.device)

    def __invert__(self) -> _T:
        return _T(~self.array, self.device)

    def any(self) -> _T:
        return _T(np.any(self.array), self.device)

    def item(self) -> Any:
        return self.array.item()


class _Stream:
    def __init__(self, handle: int = 0, device: Any = None, priority: int = 0) -> None:
        self.handle = handle
        self.device = device
        self.priority = priority
        self.stream_id, self.device_index, self.device_type = handle, device, 1


class _ExternalStream(_Stream):
    pass


class _GraphContext:
    def __init__(self, graph: Any, stream: Any = None, capture_error_mode: str = "global") -> None:
        graph.options = {"stream": stream, "capture_error_mode": capture_error_mode}

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class _CUDAGraph:
    options: dict[str, Any]


class _Cuda:
    Stream = _Stream
    ExternalStream = _ExternalStream
    CUDAGraph = _CUDAGraph
    graph = _GraphContext

    def current_stream(self, index: int) -> _Stream:
        return _Stream(1000 + index)

    @staticmethod
    def stream(stream: Any) -> tuple[str, Any]:
        return ("stream-context", stream)


class _Packet:
    """What ``torch.ops.tensorrt.execute_engine`` is: a packet whose ``_op`` is the C++ op."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self._op = lambda inputs, engine: self.calls.append("raw") or ["out"]

    def __call__(self, inputs: Any, engine: Any) -> list[str]:
        self.calls.append("packet")
        return ["out"]


class _Ops:
    def __init__(self) -> None:
        self.tensorrt = type("tensorrt", (), {"execute_engine": _Packet()})()


class _C:
    @staticmethod
    def _cuda_getDevice() -> int:
        return 3


class _TorchStandIn:
    Tensor = _T
    uint8 = "uint8"
    float16 = "torch.float16"
    cuda = _Cuda()
    ops = _Ops()
    _C = _C

    @staticmethod
    def from_numpy(a: Any) -> _T:
        return _T(a, _Dev("cpu", None))

    @staticmethod
    def frombuffer(buf: bytearray, dtype: str) -> _T:
        return _T(np.frombuffer(buf, dtype=np.uint8), _Dev("cpu", None))

    @staticmethod
    def from_dlpack(value: Any) -> tuple[str, Any]:
        return ("dlpack", value)

    @staticmethod
    def as_tensor(value: Any, **kw: Any) -> tuple[str, Any, dict[str, Any]]:
        return ("cai", value, kw)

    @staticmethod
    def isnan(t: _T) -> _T:
        return _T(np.isnan(t.array), t.device)


def test_torchbind_bridge_describes_tensors_with_strides() -> None:
    bridge = TorchBridge(_TorchStandIn())
    info = bridge.describe(_T(np.ones((2, 3), np.float16), _Dev("cuda", 1)))
    assert info == TensorInfo("float16", (2, 3), "cuda", 1, True, (3, 1))
    assert bridge.describe(np.ones(3)) is None
    host = bridge.from_numpy(np.ones((4, 2), np.float32).T)
    assert bridge.describe(host) == TensorInfo("float32", (2, 4), "cpu", None, False, (1, 2))
    assert bridge.torch_dtype("float16") == "torch.float16" and bridge.torch_dtype("int8") is None
    assert bridge.tensor_type is _T


def test_torchbind_bridge_views_cuda_arrays_only() -> None:
    bridge = TorchBridge(_TorchStandIn())

    class Dl:
        def __init__(self, kind: int) -> None:
            self.kind = kind

        def __dlpack__(self, stream: Any = None) -> None: ...

        def __dlpack_device__(self) -> tuple[int, int]:
            return (self.kind, 0)

    class Cai:
        @property
        def __cuda_array_interface__(self) -> dict[str, Any]:
            return {"shape": (2,), "typestr": "<f4", "data": (1, False), "version": 3}

    cuda_dl = Dl(2)
    assert bridge.device_view(cuda_dl) == ("dlpack", cuda_dl)
    assert bridge.device_view(Dl(1)) is None  # a host DLPack array is a host array
    assert bridge.device_view(np.ones(3)) is None  # numpy has __dlpack__ too: on the host
    cai = Cai()
    # never as_tensor(..., device=...): torch would copy an array of another device
    assert bridge.device_view(cai) == ("cai", cai, {})
    assert bridge.device_view("text") is None


def test_torchbind_bridge_streams() -> None:
    bridge = TorchBridge(_TorchStandIn())
    assert bridge.resolve_stream(None, 0).handle == 1000
    mine = _Stream(7)
    assert bridge.resolve_stream(mine, 0) is mine
    assert bridge.resolve_stream(1234, 1).handle == 1234
    assert bridge.resolve_stream(type("CoreStream", (), {"handle": 99})(), 0).handle == 99
    proto = type("Proto", (), {"__cuda_stream__": lambda self: (0, 55)})()
    assert bridge.resolve_stream(proto, 0).handle == 55
    attribute = type("Attribute", (), {"__cuda_stream__": (0, 56)})()  # the attribute form too
    assert bridge.resolve_stream(attribute, 0).handle == 56
    with pytest.raises(TypeError, match=r"stream must be None, an int cudaStream_t.*got float"):
        bridge.resolve_stream(1.5, 0)
    assert bridge.stream_scope(mine) == ("stream-context", mine)
    assert bridge.current_device_fn()() == 3  # torch._C._cuda_getDevice, no Python layer
    blob = bytes(range(200))
    assert bytes(bridge.bytes_to_tensor(blob).array.tobytes()) == blob


def test_torchbind_bridge_calls_the_ops_cpp_operation() -> None:
    torch = _TorchStandIn()
    bridge = TorchBridge(torch)
    packet = torch.ops.tensorrt.execute_engine
    assert bridge.execute([], object()) == ["out"]
    assert packet.calls == ["raw"]  # the packet's Python-side fake-object scan is skipped
    del packet._op
    fresh = TorchBridge(torch)
    assert fresh.execute_op() is packet


def test_torchbind_bridge_captures_on_the_given_stream_thread_local() -> None:
    bridge = TorchBridge(_TorchStandIn())
    assert bridge.cuda_graphs_available()
    side = _Stream(5)
    graph, result = bridge.capture(lambda: ["static"], side)
    assert result == ["static"]
    assert graph.options == {"stream": side, "capture_error_mode": "thread_local"}


def test_torchbind_bridge_poisons_floating_outputs_only() -> None:
    bridge = TorchBridge(_TorchStandIn())
    out = _T(np.zeros(3, np.float32), _Dev("cuda", 0))

    assert bridge.poison(out) and np.isnan(out.array).all()
    reference = _T(np.ones(3, np.float32), _Dev("cuda", 0))
    assert bridge.unwritten(out, reference)
    out.array[...] = 1.0
    assert not bridge.unwritten(out, reference)
    assert not bridge.poison(_T(np.zeros(3, np.int32), _Dev("cuda", 0)))


class _Log(list):  # type: ignore[type-arg]
    pass


class _OrderedStream:
    def __init__(self, log: _Log, name: str, sid: int) -> None:
        self.log, self.name = log, name
        self.stream_id, self.device_index, self.device_type = sid, 0, 1

    def wait_event(self, event: Any) -> None:
        self.log.append(("wait", self.name, event.name))


class _OrderedEvent:
    made = 0

    def __init__(self, log: _Log) -> None:
        _OrderedEvent.made += 1
        self.log, self.name = log, f"event{_OrderedEvent.made}"

    def record(self, stream: Any) -> None:
        self.log.append(("record", self.name, stream.name))


class _Out:
    def __init__(self, log: _Log) -> None:
        self.log = log

    def record_stream(self, stream: Any) -> None:
        self.log.append(("record_stream", stream.name))


def test_torchbind_bridge_runs_the_op_on_the_lane_with_events_made_once(monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # the lane stream from torch's pool
    log = _Log()
    caller = _OrderedStream(log, "caller", 11)
    side = _OrderedStream(log, "lane", 22)
    current = {"id": 11}
    interrupt = {"after_switch": False}

    class Cuda(_Cuda):
        Event = staticmethod(lambda: _OrderedEvent(log))

        def current_stream(self, index: int) -> Any:
            return caller

        def Stream(self, device: int, priority: int = 0) -> Any:
            return side

    class C(_C):
        @staticmethod
        def _cuda_setStream(stream_id: int, device_index: int, device_type: int) -> None:
            log.append(("set_stream", stream_id))
            current["id"] = stream_id
            if interrupt["after_switch"] and stream_id == 22:  # a Ctrl-C just after the switch
                interrupt["after_switch"] = False
                raise KeyboardInterrupt

    class Torch(_TorchStandIn):
        cuda = Cuda()
        _C = C

    bridge = TorchBridge(Torch())
    lane = bridge.lane_stream(0)
    made = _OrderedEvent.made

    def op(tensors: Any, native: Any) -> list[Any]:
        log.append(("op", current["id"]))
        return [_Out(log)]

    for _ in range(2):
        log.clear()
        bridge.execute_on(lane, op, [], None, 0)
        ready, done = lane.ready.name, lane.done.name
        assert log == [
            ("record", ready, "caller"), ("wait", "lane", ready),
            ("set_stream", 22), ("op", 22), ("set_stream", 11),
            ("record", done, "lane"), ("wait", "caller", done),
            ("record_stream", "caller"),
        ]
    assert _OrderedEvent.made == made  # no event made per call

    def failing(tensors: Any, native: Any) -> list[Any]:
        raise RuntimeError("op failed")

    with pytest.raises(RuntimeError, match="op failed"):
        bridge.execute_on(lane, failing, [], None, 0)
    assert current["id"] == 11  # the caller's stream is current again
    interrupt["after_switch"] = True
    with pytest.raises(KeyboardInterrupt):
        bridge.execute_on(lane, op, [], None, 0)
    assert current["id"] == 11  # switched back even so


class _FakeCudart:
    """``cuda.bindings.runtime``: streams made and destroyed."""

    cudaStreamDefault = 0
    cudaStreamNonBlocking = 1

    def __init__(self) -> None:
        self.made: list[tuple[int, int]] = []
        self.destroyed: list[int] = []

    def cudaStreamCreateWithFlags(self, flags: int) -> tuple[int, int]:
        self.made.append((flags, 7000 + len(self.made)))
        return 0, self.made[-1][1]

    def cudaStreamDestroy(self, handle: int) -> tuple[int]:
        self.destroyed.append(handle)
        return (0,)


def _install(monkeypatch: pytest.MonkeyPatch, cudart: Any) -> None:
    """Make ``cudart`` what ``from cuda.bindings import runtime`` imports."""
    import sys
    import types

    bindings = types.ModuleType("cuda.bindings")
    bindings.runtime = cudart  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.runtime", cudart)


def _torch_with_devices() -> Any:
    import contextlib

    class Cuda(_Cuda):
        devices: ClassVar[list[int]] = []
        Event = object

        @contextlib.contextmanager
        def device(self, index: int) -> Any:
            self.devices.append(index)
            yield

    class Torch(_TorchStandIn):
        cuda = Cuda()

        @staticmethod
        def device(kind: str, index: int) -> _Dev:
            return _Dev(kind, index)

    return Torch()


def _pooled_bridge(monkeypatch: Any) -> tuple[TorchBridge, Any, StreamPool]:
    """A bridge on ``_torch_with_devices()`` whose private streams come from a pool of their own,
    made by a cuda-python double: the bridge, that double and the pool."""
    cudart = _FakeCudart()
    _install(monkeypatch, cudart)
    pool = StreamPool()
    monkeypatch.setattr("trt_runtime_backends.torchbind.bridge.STREAMS", pool)
    return TorchBridge(_torch_with_devices()), cudart, pool


def test_torchbind_bridge_private_streams_are_dedicated_non_blocking_streams(monkeypatch) -> None:
    import gc

    bridge, cudart, pool = _pooled_bridge(monkeypatch)
    torch = bridge.torch
    stream = bridge.new_stream(2)
    # a stream of its own (not one of torch's pooled streams), non-blocking, on device 2
    assert isinstance(stream, _ExternalStream) and stream.handle == 7000 and stream.device.index == 2
    assert cudart.made == [(1, 7000)] and torch.cuda.devices == [2]
    lane = bridge.lane_stream(2)
    assert lane.stream.handle == 7001
    del stream
    gc.collect()
    # torch may still record events on it (torch-tensorrt marks inputs used there): kept,
    # free for the next owner on its device, never destroyed
    assert cudart.destroyed == [] and pool.free(2) == 1 and pool.free(0) == 0
    again = bridge.new_stream(2)
    assert again.handle == 7000 and len(cudart.made) == 2 and pool.free(2) == 0
    other = bridge.new_stream(0)  # another device: a new stream
    assert other.handle == 7002 and other.device.index == 0
    del lane, again, other
    gc.collect()
    assert cudart.destroyed == [] and (pool.free(2), pool.free(0)) == (2, 1)
    assert pool.made == {2: 2, 0: 1}
    pool.forget()  # (what a forked child does: the parent's streams are not its own)
    assert (pool.free(2), pool.free(0), pool.made) == (0, 0, {})


def test_torchbind_bridge_private_streams_failing_create_is_an_engine_error(monkeypatch) -> None:
    class Failing(_FakeCudart):
        def cudaStreamCreateWithFlags(self, flags: int) -> tuple[int, int]:
            return 2, 0  # cudaErrorMemoryAllocation

    _install(monkeypatch, Failing())
    with pytest.raises(EngineError, match="could not create a CUDA stream on device 1: cudaStreamCreate"):
        StreamPool().take(_torch_with_devices(), 1)


def test_torchbind_bridge_private_streams_of_each_kind_go_to_lanes_of_that_kind(monkeypatch) -> None:
    import gc

    bridge, cudart, pool = _pooled_bridge(monkeypatch)
    blocking, other = bridge.lane_stream(0, blocking=True), bridge.lane_stream(0)
    assert cudart.made == [(0, 7000), (1, 7001)]  # cudaStreamDefault, cudaStreamNonBlocking
    assert blocking.blocking and not other.blocking
    del blocking, other
    gc.collect()
    assert (pool.free(0, blocking=True), pool.free(0)) == (1, 1)
    again = bridge.lane_stream(0)  # a non-blocking stream asked for: never the blocking one
    assert again.stream.handle == 7001 and (pool.free(0, blocking=True), pool.free(0)) == (1, 0)
    assert bridge.lane_stream(0, blocking=True).stream.handle == 7000
    assert len(cudart.made) == 2 and cudart.destroyed == [] and pool.made == {0: 2}


def test_torchbind_bridge_private_stream_given_back_goes_to_the_next_owner_once(monkeypatch) -> None:
    import gc

    bridge, cudart, pool = _pooled_bridge(monkeypatch)
    lane = bridge.lane_stream(0, blocking=True)
    kept = lane.stream  # a closed lane's objects may live on until the collector runs
    bridge.give_back(kept)
    assert pool.free(0, blocking=True) == 1
    again = bridge.lane_stream(0, blocking=True)  # the next owner takes it: no new stream
    assert again.stream.handle == kept.handle and len(cudart.made) == 1
    bridge.give_back(kept)  # again, or by the collector later: never a second time
    del lane, kept
    gc.collect()
    assert pool.free(0, blocking=True) == 0
    bridge.give_back(object())  # not one of the pool's: ignored
    assert pool.free(0, blocking=True) == 0 and cudart.destroyed == []


def test_torchbind_bridge_private_streams_without_cuda_python_use_the_high_priority_pool(monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # import fails
    stream = TorchBridge(_torch_with_devices()).new_stream(1)
    assert type(stream) is _Stream and stream.device == 1 and stream.priority == -1


def test_torchbind_bridge_graph_launcher_launches_the_executable_graph() -> None:
    """cuda-python's graph launch of ``raw_cuda_graph_exec()`` and its device copy; none for
    a torch without it; a failed launch is an EngineError naming the CUDA
    error (no GPU here: no driver)."""
    pytest.importorskip("cuda.bindings.runtime")

    class Graph:
        def raw_cuda_graph_exec(self) -> int:
            return 0

    assert TorchBridge.graph_launcher(object()) is None
    made = TorchBridge.graph_launcher(Graph())
    assert made is not None
    launch, copy = made
    assert callable(launch) and callable(copy)
    with pytest.raises(EngineError, match=r"replaying a CUDA graph failed: cudaGraphLaunch returned"):
        launch(0)
    assert TorchBridge(_TorchStandIn()).raw_current_stream(0) is None  # a torch without the C getter

    class WithRaw(_TorchStandIn):
        _C = type("C", (), {"_cuda_getCurrentRawStream": staticmethod(lambda index: 77 + index)})

    assert TorchBridge(WithRaw()).raw_current_stream(1) == 78


class _KeptGraph(_CUDAGraph):
    """A ``torch.cuda.CUDAGraph`` of torch 2.9+: ``keep_graph``, ``instantiate()``, ``raw_cuda_graph()``."""

    def __init__(self, keep_graph: bool = False) -> None:
        self.keep_graph = keep_graph
        self.instantiated = 0

    def instantiate(self) -> None:
        self.instantiated += 1

    def raw_cuda_graph(self) -> int:
        if not self.keep_graph:
            raise RuntimeError("the graph was not kept")
        return 4321


class _CudaKept(_Cuda):
    CUDAGraph = _KeptGraph

    def __init__(self) -> None:
        self.devices: list[int] = []

    def device(self, index: int) -> Any:
        self.devices.append(index)
        return contextlib.nullcontext()


class _TorchKept(_TorchStandIn):
    def __init__(self) -> None:
        self.cuda = _CudaKept()
        self.made: list[tuple[Any, ...]] = []

    def empty(self, shape: tuple[int, ...], dtype: Any, device: str) -> Any:
        self.made.append((shape, dtype, device))
        tensor = _T(np.zeros(shape, np.uint8), _Dev("cuda", int(device.rpartition(":")[2])))
        tensor.data_ptr = lambda: tensor.array.ctypes.data  # type: ignore[attr-defined]
        return tensor


def test_torchbind_bridge_capture_keeps_the_graph_where_torch_can() -> None:
    """torch 2.9+: the graph is made with keep_graph=True and instantiated after the capture
    (for copy_nodes and raw_cuda_graph_exec); an older CUDAGraph() is used as it is."""
    graph, _ = TorchBridge(_TorchKept()).capture(lambda: [], _Stream(5))
    assert graph.keep_graph and graph.instantiated == 1
    graph, _ = TorchBridge(_TorchStandIn()).capture(lambda: [], _Stream(5))
    assert type(graph) is _CUDAGraph


def test_torchbind_bridge_copy_nodes_build_around_the_kept_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """The nodes are built (trt_runtime.graphs.build_copy_nodes) around ``raw_cuda_graph()``
    on the engine's device, the side that changes per call on a torch tensor of the largest
    size asked; none for a graph that torch did not keep or that has no raw_cuda_graph."""
    rt = pytest.importorskip("cuda.bindings.runtime")
    from trt_runtime_backends.torchbind import bridge as bridge_module

    torch = _TorchKept()
    bridge = TorchBridge(torch)
    assert bridge.copy_nodes(object(), [(1, 4)], [], 0) is None
    assert bridge.copy_nodes(_KeptGraph(keep_graph=False), [(1, 4)], [], 0) is None
    seen: list[Any] = []

    def build(rt_: Any, graph: Any, ins: Any, outs: Any, placeholder: Any, d2d: Any) -> str:
        keeper, address = placeholder(96)
        held = keeper.array
        seen.extend([rt_, int(graph), ins, outs, held.nbytes, address == held.ctypes.data, d2d])
        return "nodes"

    monkeypatch.setattr(bridge_module, "build_copy_nodes", build)
    made = bridge.copy_nodes(_KeptGraph(keep_graph=True), [(1, 64)], [(2, 96)], 1)
    assert made == "nodes"
    assert seen == [rt, 4321, [(1, 64)], [(2, 96)], 96, True, rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice]
    assert torch.made == [((96,), "uint8", "cuda:1")] and torch.cuda.devices == [1]
    monkeypatch.setattr(bridge_module, "build_copy_nodes", lambda *args: None)
    assert bridge.copy_nodes(_KeptGraph(keep_graph=True), [(1, 64)], [], 0) is None
