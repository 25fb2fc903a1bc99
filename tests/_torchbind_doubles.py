"""Doubles of torch and torch-tensorrt's runtime for the torchbind backend's CPU tests.

They model what the C++ side does (serialized-info checks, lazy execution contexts,
``update_runtime_settings``, the ``RuntimeCacheHandle`` stash and drain, optimization
profiles) for three releases: torch-tensorrt-rtx 2.11 (ABI 8, Engine only), 2.13 (ABI 9,
serialize before materialization returns nothing) and 2.14 (ABI 10); and what torch does
with tensors, streams and CUDA graphs, closely enough to check ordering: every op, copy,
wait and replay is recorded with the stream it was queued on.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from trt_runtime_backends.torchbind import TorchbindBackend, runtime
from trt_runtime_backends.torchbind.bridge import CallerDevice, TensorInfo
from trt_runtime_backends.torchbind.library import RuntimeLibrary

from trt_runtime.graphs import build_copy_nodes
from trt_runtime.protocols import EngineSource, TensorSpec

FIELDS_2_11 = [
    "ABI_TARGET", "NAME", "DEVICE", "ENGINE", "INPUT_BINDING_NAMES", "OUTPUT_BINDING_NAMES",
    "HW_COMPATIBLE", "SERIALIZED_METADATA", "TARGET_PLATFORM", "REQUIRES_OUTPUT_ALLOCATOR",
    "RESOURCE_ALLOCATION_STRATEGY",
]  # fmt: skip
RELEASES = {
    "2.11.0": {"abi": "8", "fields": FIELDS_2_11, "cache": False, "pending_serialize": False},
    "2.13.0": {
        "abi": "9",
        "fields": [*FIELDS_2_11, "REQUIRES_NATIVE_MULTIDEVICE"],
        "cache": True,
        "pending_serialize": False,
    },
    "2.14.0": {
        "abi": "10",
        "fields": [*FIELDS_2_11, "REQUIRES_NATIVE_MULTIDEVICE", "ALIASED_IO"],
        "cache": True,
        "pending_serialize": True,
    },
}


# -- tensors and arrays ------------------------------------------------------------------------
class FakeDType:
    """A torch dtype: one object per name, so ``x.dtype is dtype`` holds as in torch."""

    _known: ClassVar[dict[str, FakeDType]] = {}
    name: str

    def __new__(cls, name: str) -> FakeDType:
        known = cls._known.get(name)
        if known is None:
            known = cls._known[name] = super().__new__(cls)
            known.name = name
        return known

    @property
    def itemsize(self) -> int:
        return int(np.dtype(self.name).itemsize)

    def __repr__(self) -> str:
        return f"torch.{self.name}"


class FakeTensor:
    """A torch tensor: a numpy array and a device string (``"cuda:0"``, ``"cpu"``)."""

    def __init__(self, array: Any, device: str = "cuda:0") -> None:
        self.array = np.asarray(array)
        self.device = device

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:  # what .cpu().numpy() gives
        return self.array if dtype is None else self.array.astype(dtype)

    @property
    def dtype(self) -> FakeDType:
        return FakeDType(str(self.array.dtype))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def get_device(self) -> int:
        return int(self.device.partition(":")[2] or 0) if self.is_cuda else -1

    def is_contiguous(self) -> bool:
        return bool(self.array.flags.c_contiguous)

    def data_ptr(self) -> int:
        return int(self.array.__array_interface__["data"][0])

    def numel(self) -> int:
        return int(self.array.size)

    def element_size(self) -> int:
        return int(self.array.itemsize)

    def unbind(self, dim: int = 0) -> tuple[FakeTensor, ...]:
        assert dim == 0
        return tuple(FakeTensor(row, self.device) for row in self.array)  # views: one buffer

    def __repr__(self) -> str:
        return f"FakeTensor({self.shape}, {self.array.dtype}, {self.device})"


class FakeCudaArray:
    """A CUDA array that is not a torch tensor (CuPy-like): ``__cuda_array_interface__`` only."""

    def __init__(self, array: Any, device: int = 0, *, broken: bool = False) -> None:
        self.array = np.asarray(array)
        self.device = device
        self.broken = broken

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.array.shape, "typestr": self.array.dtype.str, "data": (0, False), "version": 3}


class FakeStream:
    def __init__(self, name: str) -> None:
        self.name = name
        self.syncs = 0

    def synchronize(self) -> None:
        self.syncs += 1

    def __repr__(self) -> str:
        return f"FakeStream({self.name!r})"


class FakeCacheHandle:
    """Models core/runtime/RuntimeSettings.cpp: stash before materialization, drain once."""

    def __init__(self, path: str, release: dict[str, Any]) -> None:
        self.path = path
        self.release = release
        self.live: dict[str, str] | None = None
        self.pending = b""
        self.drained = 0
        self.loads: list[bytes] = []

    def _has_method(self, name: str) -> bool:
        return name in ("serialize", "deserialize", "has_cache")

    def _type(self) -> Any:
        return _QualifiedType("__torch__.torch.classes.tensorrt.RuntimeCacheHandle")

    def has_cache(self) -> bool:
        return self.live is not None

    def serialize(self) -> FakeTensor:
        if self.live is None:
            data = self.pending if self.release["pending_serialize"] else b""
        else:
            data = b"KC" + json.dumps(self.live, sort_keys=True).encode()
        return FakeTensor(np.frombuffer(data, dtype=np.uint8), "cpu")

    def deserialize(self, tensor: FakeTensor) -> None:
        data = tensor.array.tobytes()
        if self.live is None:
            self.pending = data
        else:
            self.live = _parse_kernels(data)  # TensorRT-RTX replaces, it does not merge
            self.loads.append(data)

    def materialize(self) -> None:  # what the C++ ensure_materialized does
        if self.live is None:
            self.live = {}
            if self.pending:
                self.live = _parse_kernels(self.pending)
                self.loads.append(self.pending)
                self.drained += 1
                self.pending = b""


def _parse_kernels(data: bytes) -> dict[str, str]:
    assert data.startswith(b"KC"), f"cache bytes must start with KC; got {data[:8]!r}"
    return json.loads(data[2:])


class _QualifiedType:
    def __init__(self, name: str) -> None:
        self.name = name

    def qualified_name(self) -> str:
        return self.name


class FakeEngine:
    """Models TRTEngine: checks the serialized info, lazy IExecutionContext, settings."""

    def __init__(self, info: list[Any], release: dict[str, Any], ops: FakeOps) -> None:
        layout = {name: i for i, name in enumerate(release["fields"])}
        if len(info) != len(layout):
            raise RuntimeError("Program to be deserialized targets an incompatible Torch-TensorRT ABI")
        if info[layout["ABI_TARGET"]] != release["abi"]:
            raise RuntimeError("Program to be deserialized targets a different Torch-TensorRT ABI Version")
        engine = info[layout["ENGINE"]]
        if not isinstance(engine, bytes):
            raise RuntimeError(f"engine field must arrive as bytes; got {type(engine).__name__}")
        if not engine.startswith(b"PLAN"):
            raise RuntimeError("Unable to deserialize the TensorRT engine")
        self.info = list(info)
        self.layout = layout
        self.release = release
        self.ops = ops
        self.inputs = info[layout["INPUT_BINDING_NAMES"]].split("%")
        self.outputs = info[layout["OUTPUT_BINDING_NAMES"]].split("%")
        self.device = info[layout["DEVICE"]]
        first_ctx = {"settings": (0, 0, None), "profile": 0}
        self.ctx: dict[str, Any] | None = None if release["cache"] else first_ctx
        self.ctx_created = 0 if release["cache"] else 1
        self.settings: tuple[int, int, Any] = (0, 0, None)
        self.updates: list[tuple[int, int, Any]] = []
        # Optimization profiles (2.14): batch ranges per profile; like TRTEngine, the
        # active index is NOT reset when the IExecutionContext is recreated.
        self.profile_ranges: list[tuple[int, int]] = list(ops.profile_ranges)
        self._active_profile_index = 0
        self.shape_key: Any = None
        if release["abi"] == "10":
            self.num_optimization_profiles = max(1, len(self.profile_ranges))
            self._auto_select_profiles = False

    def set_active_profile(self, index: int) -> None:
        if index == self._active_profile_index:
            return
        self.exec_ctx()["profile"] = index
        self._active_profile_index = index
        self.shape_key = None

    def run_profiles(self, inputs: list[FakeTensor]) -> None:
        """What execute_engine does with profiles; raises like inferShapes on a misfit."""
        if not self.profile_ranges:
            return
        batch = inputs[0].array.shape[0]
        key = tuple(t.array.shape for t in inputs)
        if key != self.shape_key and getattr(self, "_auto_select_profiles", False):
            lo, hi = self.profile_ranges[self._active_profile_index]
            if not lo <= batch <= hi:
                for i, (lo, hi) in enumerate(self.profile_ranges):
                    if lo <= batch <= hi:
                        self.exec_ctx()["profile"] = i
                        self._active_profile_index = i
                        break
        self.shape_key = key
        lo, hi = self.profile_ranges[self.exec_ctx()["profile"]]
        if not lo <= batch <= hi:
            raise RuntimeError("Expected nbNames == 0 to be true but got false")

    def _has_method(self, name: str) -> bool:
        if name in ("update_runtime_settings", "num_execution_contexts_created"):
            return bool(self.release["cache"])
        if name == "set_active_profile":
            return self.release["abi"] == "10"
        return name in ("disable_profiling", "get_engine_layer_info")

    def update_runtime_settings(self, ds: int, cg: int, handle: Any) -> None:
        if not 0 <= ds <= 2 or not 0 <= cg <= 1:
            raise RuntimeError(f"Invalid strategy int: {ds}, {cg}")
        self.updates.append((ds, cg, handle))
        new = (ds, cg, handle)
        if new[:2] != self.settings[:2] or new[2] is not self.settings[2]:
            self.settings = new
            self.ctx = None

    def num_execution_contexts_created(self) -> int:
        return self.ctx_created

    def disable_profiling(self) -> None:
        if self.release["cache"]:
            self.ctx = None

    def exec_ctx(self) -> dict[str, Any]:
        if self.ctx is None:
            handle = self.settings[2]
            if handle is not None:
                handle.materialize()
            self.ctx = {"settings": self.settings, "profile": 0}
            self.ctx_created += 1
        return self.ctx


class FakeOps:
    """``torch.ops.tensorrt``: the layout functions and ``execute_engine``
    (output k is ``(k + 2) * sum(inputs)``)."""

    def __init__(self, release: dict[str, Any]) -> None:
        self.release = release
        self.bridge: FakeBridge | None = None
        self.calls: list[tuple[list[Any], FakeEngine]] = []
        #: The stream each execute_engine call was queued on.
        self.streams: list[str] = []
        self.profile_ranges: list[tuple[int, int]] = []
        #: False: under capture, execute_engine enqueues nothing (TensorRT-RTX refusing to
        #: enqueue a context that is not stream-capturable, an error torch-tensorrt ignores).
        self.capturable = True
        #: An exception execute_engine raises under capture (the capture is invalidated).
        self.capture_error: Exception | None = None
        self.fail_with: Exception | None = None
        for i, name in enumerate(release["fields"]):
            setattr(self, f"{name}_IDX", lambda i=i: i)

    def ABI_VERSION(self) -> str:
        return str(self.release["abi"])

    def SERIALIZATION_LEN(self) -> int:
        return len(self.release["fields"])

    def SERIALIZED_ENGINE_BINDING_DELIM(self) -> str:
        return "%"

    def SERIALIZED_RT_DEVICE_DELIM(self) -> str:
        return "%"

    def get_current_platform(self) -> str:
        return "linux_x86_64"

    @staticmethod
    def compute(inputs: list[FakeTensor], engine: FakeEngine) -> list[np.ndarray]:
        total = sum(t.array.astype(np.float32) for t in inputs)
        return [(total * (k + 2)).astype(inputs[0].array.dtype) for k in range(len(engine.outputs))]

    def execute_engine(self, inputs: list[FakeTensor], engine: FakeEngine) -> list[FakeTensor]:
        if self.fail_with is not None:
            raise self.fail_with
        for t in inputs:
            if not isinstance(t, FakeTensor) or not t.is_cuda:
                raise RuntimeError(f"Expected input tensors to have device cuda, found {t!r}")
        bridge = self.bridge
        capturing = bridge is not None and bridge.capturing is not None
        self.calls.append((list(inputs), engine))
        self.streams.append(bridge.active_stream(0).name if bridge is not None else "?")
        ctx = engine.exec_ctx()
        engine.run_profiles(inputs)
        handle = ctx["settings"][2]
        if handle is not None:
            shapes = ",".join("x".join(map(str, t.array.shape)) for t in inputs)
            handle.live[f"{engine.info[engine.layout['NAME']]}|{shapes}|cg{ctx['settings'][1]}"] = "k"
        if capturing and self.capture_error is not None:
            raise self.capture_error
        if capturing and not self.capturable:
            return [FakeTensor(np.zeros_like(a)) for a in self.compute(inputs, engine)]
        outputs = [FakeTensor(a) for a in self.compute(inputs, engine)]
        if capturing:
            assert bridge is not None
            bridge.capture_log.append((list(inputs), engine, outputs))
        return outputs


class FakeGraph:
    """A captured ``torch.cuda.CUDAGraph``: replay recomputes the captured calls from the
    current contents of their (static) inputs into their (static) outputs."""

    def __init__(self, log: list[tuple[list[FakeTensor], FakeEngine, list[FakeTensor]]], stream: FakeStream):
        self.log = log
        self.stream = stream
        self.replays = 0
        self.resets = 0

    def replay(self) -> None:
        self.replays += 1
        for inputs, engine, outputs in self.log:
            for out, fresh in zip(outputs, FakeOps.compute(inputs, engine), strict=True):
                np.copyto(out.array, fresh)


class FakeNodeRuntime:
    """cuda-python's runtime module for graphs built node by node (``trt_runtime.graphs.
    CopyNodes``) over :class:`FakeGraph`\\ s: memcpy nodes really copy (``ctypes.memmove``
    between the numpy buffers behind the addresses), a child node replays its FakeGraph.
    ``calls`` records (name, ...) of each call; ``refuse`` names a call that fails."""

    class cudaMemcpyKind:
        cudaMemcpyDeviceToDevice = 3

    def __init__(self, bridge: FakeBridge) -> None:
        self.bridge = bridge
        self.refuse: str | None = None
        self.calls: list[tuple[Any, ...]] = []
        self._ids = iter(range(9000, 10**6))
        self.graphs: dict[int, list[list[Any]]] = {}  # graph -> its nodes: [kind, params, deps]
        self.execs: dict[int, dict[int, list[Any]]] = {}  # exec -> node -> its params (copied)
        self.destroyed: list[int] = []

    def _answer(self, name: str, value: Any = None) -> tuple[Any, ...]:
        self.calls.append((name,))
        if self.refuse == name:
            return (1,) if value is None else (1, None)
        return (0,) if value is None else (0, value)

    def cudaGraphCreate(self, flags: int) -> tuple[int, int]:
        graph = next(self._ids)
        self.graphs[graph] = []
        return self._answer("cudaGraphCreate", graph)  # type: ignore[return-value]

    def cudaGraphAddMemcpyNode1D(self, graph: int, deps: Any, n: int, dst: int, src: int, count: int,
                                 kind: Any) -> tuple[int, int]:
        node = next(self._ids)
        self.graphs[graph].append([node, "memcpy", [dst, src, count], list(deps or ())])
        return self._answer("cudaGraphAddMemcpyNode1D", node)  # type: ignore[return-value]

    def cudaGraphAddChildGraphNode(self, graph: int, deps: Any, n: int, child: FakeGraph) -> tuple[int, int]:
        node = next(self._ids)
        self.graphs[graph].append([node, "child", child, list(deps)])
        return self._answer("cudaGraphAddChildGraphNode", node)  # type: ignore[return-value]

    def cudaGraphInstantiate(self, graph: int, flags: int) -> tuple[int, int]:
        graph_exec = next(self._ids)
        self.execs[graph_exec] = {node: [kind, list(p) if kind == "memcpy" else p]
                                  for node, kind, p, _ in self.graphs[graph]}
        return self._answer("cudaGraphInstantiate", graph_exec)  # type: ignore[return-value]

    def cudaGraphExecMemcpyNodeSetParams1D(self, graph_exec: int, node: int, dst: int, src: int,
                                           count: int, kind: Any) -> tuple[int]:
        answer = self._answer("cudaGraphExecMemcpyNodeSetParams1D")
        if not answer[0]:
            self.execs[graph_exec][node][1] = [dst, src, count]
        return answer  # type: ignore[return-value]

    def cudaGraphLaunch(self, graph_exec: int, stream: int) -> tuple[int]:
        """Run the nodes in the order they were added (memcpy in, child, memcpy out)."""
        answer = self._answer("cudaGraphLaunch")
        stream_name = next(s.name for s in (self.bridge.active_stream(0),) if id(s) == stream)
        self.bridge.events.append(("launch nodes", stream_name))
        for kind, params in self.execs[graph_exec].values():
            if kind == "memcpy":
                ctypes.memmove(params[0], params[1], params[2])
            else:
                params.replay()
        return answer  # type: ignore[return-value]

    def cudaGraphExecDestroy(self, graph_exec: int) -> tuple[int]:
        self.destroyed.append(graph_exec)
        del self.execs[graph_exec]
        return self._answer("cudaGraphExecDestroy")  # type: ignore[return-value]

    def cudaGraphDestroy(self, graph: int) -> tuple[int]:
        self.destroyed.append(graph)
        del self.graphs[graph]
        return self._answer("cudaGraphDestroy")  # type: ignore[return-value]

    def named(self, name: str) -> int:
        return sum(1 for call in self.calls if call[0] == name)


class FakeBridge:
    """A TorchBridge double: FakeTensor for tensors, numpy for host arrays, FakeStream for
    streams, FakeGraph for CUDA graphs. ``events`` records what was queued where."""

    def __init__(self, version: str = "2.14.0", *, devices: int = 1, registered: bool = False,
                 graphs: bool = True) -> None:
        self.release = RELEASES[version]
        self.devices = devices
        self.ops = FakeOps(self.release)
        self.ops.bridge = self
        self.registered = registered
        self.graphs = graphs
        self.loaded: list[str] = []
        self.synced: list[Any] = []
        #: Lane streams made, and (lane, caller stream, thread) of each execute_engine call.
        self.lanes = 0
        self.lane_calls: list[tuple[str, str, int]] = []
        #: (thread id, device) of each bind_thread call.
        self.bound_threads: list[tuple[int, int]] = []
        self.current = 0
        #: Every set_device call, in order.
        self.device_sets: list[int] = []
        self._current_streams = {i: FakeStream(f"current:{i}") for i in range(max(devices, 1))}
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

    def lane_stream(self, index: int) -> FakeStream:
        self.lanes += 1
        return FakeStream(f"lane:{index}:{self.lanes}")

    def execute_on(self, lane: FakeStream, op: Any, tensors: Any, native: Any, index: int) -> Any:
        # The op runs as it did on the caller's stream (the streams the tests expect); the
        # routing through the lane is recorded.
        caller = self.current_stream(index)
        self.lane_calls.append((lane.name, caller.name, threading.get_ident()))
        return op(tensors, native)

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
