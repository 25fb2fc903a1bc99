"""Doubles of torch and torch-tensorrt's runtime for the torchbind backend's CPU tests.

They model what the C++ side does (serialized-info checks, lazy execution contexts,
``update_runtime_settings``, the ``RuntimeCacheHandle`` stash and drain, optimization
profiles) for three releases: torch-tensorrt-rtx 2.11 (ABI 8, Engine only), 2.13 (ABI 9,
serialize before materialization returns nothing) and 2.14 (ABI 10); and what torch does
with tensors, streams and CUDA graphs, closely enough to check ordering: every op, copy,
wait and replay is recorded with the stream it was queued on. The fakes themselves (tensors,
streams, the C++ engine, ops, graphs) are in tests/_torchbind_fakes.py; here: the bridge, the
backend and the engines and inputs the tests load.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
from _torchbind_fakes import (
    RELEASES,
    FakeCacheHandle,
    FakeCudaArray,
    FakeDType,
    FakeEngine,
    FakeEvent,
    FakeGraph,
    FakeNodeRuntime,
    FakeOps,
    FakeStream,
    FakeTensor,
)
from trt_runtime_backends.torchbind import TorchbindBackend, runtime
from trt_runtime_backends.torchbind.bridge import CallerDevice, LaneStream, TensorInfo, TorchBridge
from trt_runtime_backends.torchbind.library import RuntimeLibrary

from trt_runtime.graphs import build_copy_nodes
from trt_runtime.protocols import EngineSource, TensorSpec


class FakeBridge:
    """A TorchBridge double: FakeTensor for tensors, numpy for host arrays, FakeStream for
    streams, FakeGraph for CUDA graphs. ``events`` records what was queued where."""

    def __init__(self, version: str = "2.14.0", *, devices: int = 1, registered: bool = False,
                 graphs: bool = True, ordering: bool = False, cuda_python: bool = True) -> None:
        self.release = RELEASES[version]
        self.devices = devices
        self.ops = FakeOps(self.release)
        self.ops.bridge = self
        self.registered = registered
        self.graphs = graphs
        self.loaded: list[str] = []
        self.synced: list[Any] = []
        self.given_back: list[Any] = []  # streams handed back by closed lanes (give_back)
        #: Lane streams made, and (lane, caller stream, thread) of each execute_engine call.
        self.lanes = 0
        self.lane_calls: list[tuple[str, str, int]] = []
        #: (thread id, device) of each bind_thread call.
        self.bound_threads: list[tuple[int, int]] = []
        self.current = 0
        #: Every set_device call, in order.
        self.device_sets: list[int] = []
        #: torch's default stream of each device (the legacy default stream: handle 0).
        self._current_streams = {i: FakeStream(f"current:{i}", handle=0) for i in range(max(devices, 1))}
        self._defaults = dict(self._current_streams)
        #: ``ordering``: execute_on is TorchBridge's own, over the torch of ``_OrderingTorch``
        #: (else the op runs on the caller's stream); event records, waits and
        #: ``record_stream`` calls of every stream it knows go to ``ordering_log``, and
        #: each ``_cuda_setStream`` to ``stream_sets`` (the name of the stream made current).
        self.ordering_log: list[tuple[str, ...]] = []
        self.stream_sets: list[str] = []
        self._by_id: dict[int, FakeStream] = {}
        self.torch_bridge = TorchBridge(_OrderingTorch(self)) if ordering else None
        #: Whether blocking lane streams can be made (cuda-python installed).
        self.cuda_python = cuda_python
        self._scopes: list[FakeStream] = []
        self._side_streams = 0
        self.capturing: FakeStream | None = None
        self.capture_log: list[tuple[list[FakeTensor], FakeEngine, list[FakeTensor]]] = []
        self.captured: list[FakeGraph] = []
        #: An exception ``replay`` raises (a graph the driver cannot launch).
        self.replay_error: Exception | None = None
        self.clones = 0
        #: (what, stream name): "copy", "h2d", "d2h", "replay", "wait <producer>", "sync".
        self.events: list[tuple[str, str]] = []

    # -- torch-tensorrt's namespaces --
    def engine_class(self) -> Any:
        if not self.registered:
            raise RuntimeError("Class tensorrt.Engine not registered!")
        return lambda info: FakeEngine(info, self.release, self.ops)

    def cache_handle_class(self) -> Any:
        if not self.registered or not self.release["cache"]:
            return None
        return lambda path: FakeCacheHandle(path, self.release)

    def is_registered(self) -> bool:
        return self.registered

    def load_library(self, path: str) -> None:
        self.loaded.append(path)
        self.registered = True

    @staticmethod
    def has_method(obj: Any, name: str) -> bool:
        probe = getattr(obj, "_has_method", None)
        return bool(probe(name)) if probe is not None else callable(getattr(obj, name, None))

    @staticmethod
    def qualified_name(obj: Any) -> str:
        return obj._type().qualified_name() if hasattr(obj, "_type") else type(obj).__name__

    def execute_op(self) -> Callable[[list[Any], Any], list[Any]]:
        return self.ops.execute_engine

    def execute(self, inputs: list[Any], engine: Any) -> list[Any]:
        return self.ops.execute_engine(inputs, engine)

    # -- devices --
    def cuda_available(self) -> bool:
        return self.devices > 0

    def device_count(self) -> int:
        return self.devices

    def current_device(self) -> int:
        return self.current

    def current_device_fn(self) -> Callable[[], int]:
        return lambda: self.current

    def device_properties(self, index: int) -> tuple[int, int, str]:
        return 9, 0, f"NVIDIA H200 #{index}"

    def device_scope(self, index: int) -> Any:
        return contextlib.nullcontext()

    def device_guard(self) -> CallerDevice:
        return CallerDevice(lambda: self.current, self.set_device)

    def set_device(self, index: int) -> None:
        """What torch.cuda.set_device does (recorded in ``device_sets``)."""
        self.device_sets.append(index)
        self.current = index

    def bind_thread(self, index: int) -> None:
        self.bound_threads.append((threading.get_ident(), index))

    # -- tensors --
    tensor_type = FakeTensor

    def describe(self, value: Any) -> TensorInfo | None:
        if isinstance(value, FakeTensor):
            kind, _, idx = value.device.partition(":")
            itemsize = value.array.itemsize or 1
            return TensorInfo(
                dtype=str(value.array.dtype),
                shape=tuple(value.array.shape),
                device_type=kind,
                device_index=int(idx) if idx else None,
                contiguous=bool(value.array.flags.c_contiguous),
                strides=tuple(s // itemsize for s in value.array.strides),
            )
        return None

    def torch_dtype(self, name: str) -> Any:
        return FakeDType(name)

    def device_view(self, value: Any) -> Any:
        if isinstance(value, FakeCudaArray):
            if value.broken:
                raise BufferError("the producer released the buffer")
            return FakeTensor(value.array, f"cuda:{value.device}")  # shares the memory
        return None

    def from_numpy(self, array: Any) -> FakeTensor:
        return FakeTensor(array, "cpu")  # shares the memory, as torch.from_numpy does

    def to_device(self, tensor: FakeTensor, index: int) -> FakeTensor:
        self.events.append(("h2d", self.active_stream(index).name))
        return FakeTensor(tensor.array.copy(), f"cuda:{index}")

    def to_host(self, tensor: FakeTensor) -> FakeTensor:
        self.events.append(("d2h", self.active_stream(0).name))
        return FakeTensor(tensor.array.copy(), "cpu")

    @staticmethod
    def to_numpy(tensor: FakeTensor) -> Any:
        return tensor.array

    def copy_(self, dst: FakeTensor, src: FakeTensor) -> None:
        assert dst.array.shape == src.array.shape, (dst, src)
        self.events.append(("copy", self.active_stream(0).name))
        np.copyto(dst.array, src.array)

    def clone(self, tensor: FakeTensor) -> FakeTensor:
        self.clones += 1
        return FakeTensor(tensor.array.copy(), tensor.device)

    @staticmethod
    def zeros(shape: tuple[int, ...], dtype: str, index: int) -> FakeTensor:
        return FakeTensor(np.zeros(shape, dtype), f"cuda:{index}")

    def bytes_to_tensor(self, data: bytes) -> FakeTensor:
        return FakeTensor(np.frombuffer(bytearray(data), dtype=np.uint8), "cpu")

    def tensor_to_bytes(self, tensor: FakeTensor) -> bytes:
        return bytes(tensor.array.tobytes())

    # -- streams --
    def active_stream(self, index: int) -> FakeStream:
        return self._scopes[-1] if self._scopes else self._current_streams[index]

    def current_stream(self, index: int) -> FakeStream:
        return self.active_stream(index)

    def resolve_stream(self, stream: Any, index: int) -> Any:
        return stream if stream is not None else self.current_stream(index)

    @staticmethod
    def stream_handle(stream: Any) -> int:
        return id(stream)

    @contextlib.contextmanager
    def stream_scope(self, stream: Any) -> Iterator[Any]:
        self._scopes.append(stream)
        try:
            yield stream
        finally:
            self._scopes.pop()

    def lane_stream(self, index: int, *, blocking: bool = False) -> LaneStream:
        self.lanes += 1
        blocking = blocking and self.cuda_python
        stream = self.known(FakeStream(f"lane:{index}:{self.lanes}", blocking=blocking))
        return LaneStream(stream, FakeEvent(), FakeEvent(), blocking=blocking)

    def known(self, stream: FakeStream) -> FakeStream:
        """``stream``, found by its stream id from now on; its log is ``ordering_log``."""
        if self._by_id.get(stream.stream_id) is not stream and stream.handle != 0:
            self._by_id[stream.stream_id] = stream
        stream.log = self.ordering_log
        return stream

    def set_current(self, stream_id: int, device_index: int) -> None:
        """What ``torch._C._cuda_setStream`` does: the stream becomes current (stream id 0:
        the device's default stream)."""
        stream = self._defaults[device_index] if stream_id == 0 else self._by_id[stream_id]
        self.stream_sets.append(stream.name)
        if self._scopes:
            self._scopes[-1] = stream
        else:
            self._current_streams[device_index] = stream

    def execute_on(self, lane: LaneStream, op: Any, tensors: Any, native: Any, index: int) -> Any:
        # Without ``ordering`` the op runs as it did on the caller's stream (the streams the
        # tests expect); the routing through the lane is recorded.
        caller = self.current_stream(index)
        self.lane_calls.append((lane.stream.name, caller.name, threading.get_ident()))
        if self.torch_bridge is not None:
            return self.torch_bridge.execute_on(lane, op, tensors, native, index)
        return op(tensors, native)

    def give_back(self, stream: FakeStream) -> None:
        self.given_back.append(stream)

    def new_stream(self, index: int) -> FakeStream:
        self._side_streams += 1
        return FakeStream(f"side:{index}:{self._side_streams}")

    def wait_stream(self, waiter: FakeStream, producer: FakeStream) -> None:
        self.events.append((f"wait {producer.name}", waiter.name))

    def synchronize(self, stream: Any) -> None:
        self.synced.append(stream)
        self.events.append(("sync", stream.name))
        stream.synchronize()

    # -- CUDA graphs --
    def cuda_graphs_available(self) -> bool:
        return self.graphs

    def capture(self, fn: Callable[[], Any], stream: FakeStream) -> tuple[FakeGraph, Any]:
        assert self.capturing is None, "nested capture"
        assert not stream.name.startswith("current"), "captured on the caller's (default) stream"
        self.capturing = stream
        self.capture_log = []
        try:
            with self.stream_scope(stream):
                result = fn()
        finally:
            self.capturing = None
        graph = FakeGraph(self.capture_log, stream)
        self.captured.append(graph)
        return graph, result

    def replay(self, graph: FakeGraph) -> None:
        if self.replay_error is not None:
            raise self.replay_error
        self.events.append(("replay", self.active_stream(0).name))
        graph.replay()

    def raw_current_stream(self, index: int) -> int:
        return id(self.active_stream(index))

    #: ``graph_launcher(graph)``: None (replay() launches) unless a test sets a factory,
    #: which returns the launch function, or the launch and copy functions.
    launcher_factory: Any = None

    def graph_launcher(self, graph: FakeGraph) -> Any:
        if self.launcher_factory is None:
            return None
        made = self.launcher_factory(graph)
        return made if isinstance(made, tuple) else (made, None)

    #: ``copy_nodes``: None (replays copy with calls of their own) unless a test sets a
    #: :class:`FakeNodeRuntime`, through which the nodes are then built and launched.
    node_runtime: FakeNodeRuntime | None = None

    def copy_nodes(self, graph: FakeGraph, ins: Any, outs: Any, index: int) -> Any:
        rt = self.node_runtime
        if rt is None:
            return None

        def placeholder(nbytes: int) -> tuple[Any, int]:
            buffer = np.zeros(nbytes, np.uint8)
            return buffer, buffer.ctypes.data

        return build_copy_nodes(rt, graph, ins, outs, placeholder, rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice)

    @staticmethod
    def empty_like(tensor: FakeTensor) -> FakeTensor:
        return FakeTensor(np.full_like(tensor.array, 7), tensor.device)  # not zeros: must be written

    #: The shapes ``empty`` was asked for (the output slabs).
    emptied: ClassVar[list[tuple[int, ...]]] = []

    @staticmethod
    def empty(shape: tuple[int, ...], dtype: FakeDType, device: str) -> FakeTensor:
        FakeBridge.emptied.append(tuple(shape))
        return FakeTensor(np.full(shape, 7, np.dtype(dtype.name)), device)

    @staticmethod
    def reset_graph(graph: FakeGraph) -> None:
        graph.resets += 1

    @staticmethod
    def poison(tensor: FakeTensor) -> bool:
        if not np.issubdtype(tensor.array.dtype, np.floating):
            return False
        tensor.array[...] = np.nan
        return True

    @staticmethod
    def unwritten(tensor: FakeTensor, reference: FakeTensor) -> bool:
        return bool(np.any(np.isnan(tensor.array) & ~np.isnan(reference.array)))


class _OrderingTorch:
    """What ``TorchBridge.execute_on`` asks of torch, over a :class:`FakeBridge`'s streams:
    ``torch._C``'s raw current stream and stream setter, ``torch.cuda``'s current stream and
    events."""

    def __init__(self, bridge: FakeBridge) -> None:
        def current_stream(index: int) -> FakeStream:
            return bridge.known(bridge.active_stream(index))

        def set_stream(stream_id: int, device_index: int, device_type: int) -> None:
            assert device_type == 1, device_type
            bridge.set_current(stream_id, device_index)

        self._C = SimpleNamespace(
            _cuda_getCurrentRawStream=lambda index: bridge.active_stream(index).handle,
            _cuda_setStream=set_stream,
        )
        self.cuda = SimpleNamespace(current_stream=current_stream, Event=FakeEvent)
        self.Tensor = FakeTensor


# -- engines and inputs ------------------------------------------------------------------------
LIB = RuntimeLibrary(Path("/fake/torch_tensorrt/lib/libtorchtrt_runtime.so"), "torch-tensorrt-rtx", "2.14.0")


def make_backend(version: str = "2.14.0", **bridge_options: Any) -> tuple[TorchbindBackend, FakeBridge]:
    bridge = FakeBridge(version, **bridge_options)
    lib = RuntimeLibrary(LIB.path, LIB.distribution, version)
    original = runtime.find_runtime_library
    runtime.find_runtime_library = lambda: lib  # type: ignore[assignment]
    try:
        loaded = runtime.load_runtime(bridge)  # type: ignore[arg-type]
    finally:
        runtime.find_runtime_library = original  # type: ignore[assignment]
    return TorchbindBackend(runtime=loaded), bridge


X = TensorSpec("x", "float16", (2, 4), True)
Y = TensorSpec("y", "float16", (2, 4), True)
OUT = TensorSpec("out", "float16", (2, 4), False)
DYNAMIC_X = TensorSpec("x", "float32", (-1, 4), True, (((1, 4), (2, 4), (8, 4)),))
DYNAMIC_Y = TensorSpec("y", "float32", (-1, 4), False)
TWO_PROFILES = TensorSpec(
    "x", "float32", (-1, 4), True, (((1, 4), (4, 4), (8, 4)), ((9, 4), (16, 4), (32, 4)))
)


def source(*, bindings: tuple[TensorSpec, ...] = (X, Y, OUT), **kw: Any) -> EngineSource:
    return EngineSource(data=kw.pop("data", b"PLAN" + bytes(range(256))), name="mlp", bindings=bindings, **kw)


def cuda(array: Any, device: str = "cuda:0") -> FakeTensor:
    return FakeTensor(np.asarray(array, dtype=np.float16), device)


def inputs() -> list[FakeTensor]:
    return [cuda(np.ones((2, 4))), cuda(np.full((2, 4), 2.0))]
