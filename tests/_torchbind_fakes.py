"""Fakes of what torch and torch-tensorrt's runtime hand the torchbind backend, for its CPU tests:
the releases' serialized-info fields, tensors and arrays, streams, the ``RuntimeCacheHandle``,
the C++ ``Engine``, the ops, CUDA graphs and copy nodes. tests/_torchbind_doubles.py builds the
bridge and the engines from them.
"""

from __future__ import annotations

import ctypes
import itertools
import json
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

if TYPE_CHECKING:
    from _torchbind_doubles import FakeBridge

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

    def record_stream(self, stream: FakeStream) -> None:
        """``Tensor.record_stream``: logged on the stream's log."""
        stream.log.append(("record_stream", stream.name))

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


_STREAM_IDS = itertools.count(100)


class FakeStream:
    """A torch CUDA stream: its raw handle (``cudaStream_t``; 0 for torch's default stream,
    the legacy default stream), torch's ``stream_id`` and whether it is a blocking stream.
    Event records, waits and ``record_stream`` calls on it go to ``log``."""

    def __init__(self, name: str, *, handle: int | None = None, blocking: bool = False) -> None:
        self.name = name
        self.syncs = 0
        self.handle = self.stream_id = next(_STREAM_IDS) if handle is None else handle
        self.device_index, self.device_type = 0, 1
        self.blocking = blocking
        self.log: list[tuple[str, ...]] = []

    def synchronize(self) -> None:
        self.syncs += 1

    def wait_event(self, event: FakeEvent) -> None:
        self.log.append(("wait_event", self.name))


class FakeEvent:
    """A torch CUDA event: its records go to the recorded stream's log."""

    def record(self, stream: FakeStream) -> None:
        stream.log.append(("record", stream.name))

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
