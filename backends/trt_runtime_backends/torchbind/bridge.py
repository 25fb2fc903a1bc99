"""Everything the torchbind backend asks of torch, behind one small class.

Keeping torch behind :class:`TorchBridge` keeps the backend's logic testable on a
machine without torch or a GPU: the CPU tests hand the backend a bridge double.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from trt_runtime.contract import stream_handle
from trt_runtime.errors import EngineError, TrtRuntimeError
from trt_runtime.graphs import CopyNodes, build_copy_nodes

from .streams import STREAMS

__all__ = ["CallerDevice", "LaneStream", "TensorInfo", "TorchBridge", "translate_errors"]


@contextlib.contextmanager
def translate_errors(engine: str, what: str) -> Iterator[None]:
    """Turn an exception from torch / torch-tensorrt into :class:`EngineError`."""
    try:
        yield
    except TrtRuntimeError:
        raise
    except Exception as exc:
        raise EngineError(f"engine {engine!r}: {what} failed in torch-tensorrt's runtime: {exc}") from exc

#: DLPack device types of CUDA memory (kDLCUDA, kDLCUDAManaged).
_KDLCUDA = 2
_KDLCUDA_MANAGED = 13


class CallerDevice:
    """Gives the calling thread its current device back after a call or a state change of an
    engine, whatever torch or torch-tensorrt switched to on the way (its multi-device mode,
    a stream scope on another device, a graph capture): one device query before, one
    after, and a switch only where it changed."""

    __slots__ = ("_get", "_set")

    def __init__(self, get: Callable[[], int], set_device: Callable[[int], Any]) -> None:
        self._get = get
        self._set = set_device

    def enter(self) -> int:
        return self._get()

    def exit(self, token: object) -> None:
        if isinstance(token, int) and self._get() != token:
            self._set(token)


@dataclasses.dataclass(frozen=True, slots=True)
class TensorInfo:
    """What input validation needs to know about a tensor."""

    dtype: str  # canonical name (trt_runtime.dtypes)
    shape: tuple[int, ...]
    device_type: str  # "cuda" or "cpu"
    device_index: int | None
    contiguous: bool
    strides: tuple[int, ...] = ()  # in elements


class LaneStream:
    """One lane's private stream (every ``execute_engine`` call of the lane runs there) and
    the two events that order it with a caller's stream, made once.

    ``blocking``: whether the stream is a blocking CUDA stream (``cudaStreamDefault``), which
    CUDA orders with the legacy default stream by itself; fixed when the stream is made.
    ``switch``: the arguments of ``torch._C._cuda_setStream`` making it current.
    """

    __slots__ = ("blocking", "device_index", "device_type", "done", "ready", "stream", "stream_id", "switch")

    def __init__(self, stream: Any, ready: Any, done: Any, *, blocking: bool = False) -> None:
        self.stream, self.ready, self.done = stream, ready, done
        self.blocking = blocking
        self.stream_id = stream.stream_id
        self.device_index = stream.device_index
        self.device_type = stream.device_type
        self.switch: tuple[int, int, int] = (self.stream_id, self.device_index, self.device_type)


#: A device-to-device copy ``(dst, src, nbytes, stream) -> 0 or the error``.
_Copy = Callable[[int, int, int, int], Any]


class TorchBridge:
    """Tensors, devices, streams and the ``tensorrt`` torch namespaces, for real."""

    def __init__(self, torch_module: Any = None) -> None:
        if torch_module is None:
            torch_module = importlib.import_module("torch")
        self.torch: Any = torch_module
        from trt_runtime.dtypes import DTYPE_NAMES

        #: torch dtype -> canonical name, for the per-call input checks.
        self._dtype_names: dict[Any, str] = {}
        for name in DTYPE_NAMES:
            dtype = getattr(torch_module, name, None)
            if dtype is not None:
                self._dtype_names[dtype] = name
        self._tensor_type: Any = getattr(torch_module, "Tensor", ())
        self._raw_stream = getattr(getattr(torch_module, "_C", None), "_cuda_getCurrentRawStream", None)
        self._streams: dict[tuple[int, int], Any] = {}
        self._execute_op: Any = None
        #: torch's C-level current-stream setter (what ``torch.cuda.set_stream`` calls).
        self._set_stream: Any = getattr(getattr(torch_module, "_C", None), "_cuda_setStream", None)
        #: ``torch.empty_like``: a new tensor like the one given, on the current stream (no
        #: wrapper: the replays through copy nodes make their outputs with it).
        self.empty_like: Callable[[Any], Any] | None = getattr(torch_module, "empty_like", None)
        #: ``torch.empty``: the output slabs of those replays (``trt_runtime.slabs``).
        self.empty: Callable[..., Any] | None = getattr(torch_module, "empty", None)

    # -- the namespaces the runtime library registers ----------------------------------
    @property
    def ops(self) -> Any:
        return self.torch.ops.tensorrt

    def engine_class(self) -> Any:
        """``torch.classes.tensorrt.Engine``; raises RuntimeError if not registered."""
        return self.torch.classes.tensorrt.Engine

    def cache_handle_class(self) -> Any | None:
        """``torch.classes.tensorrt.RuntimeCacheHandle``, or None (before torch-tensorrt 2.13)."""
        try:
            return self.torch.classes.tensorrt.RuntimeCacheHandle
        except (RuntimeError, AttributeError):
            return None

    def is_registered(self) -> bool:
        """Whether some library already registered the ``tensorrt`` classes and ops."""
        try:
            self.engine_class()
            return callable(self.ops.execute_engine)
        except (RuntimeError, AttributeError):
            return False

    def load_library(self, path: str) -> None:
        self.torch.ops.load_library(path)

    @staticmethod
    def has_method(obj: Any, name: str) -> bool:
        """Whether a torchbind object has method ``name`` (ScriptObject._has_method)."""
        probe = getattr(obj, "_has_method", None)
        if probe is not None:
            try:
                return bool(probe(name))
            except Exception:
                return False
        return callable(getattr(obj, name, None))

    @staticmethod
    def qualified_name(obj: Any) -> str:
        try:
            return str(obj._type().qualified_name())
        except Exception:
            return type(obj).__name__

    # -- devices -------------------------------------------------------------------------
    def cuda_available(self) -> bool:
        return bool(self.torch.cuda.is_available())

    def device_count(self) -> int:
        return int(self.torch.cuda.device_count())

    def current_device(self) -> int:
        return int(self.torch.cuda.current_device())

    def current_device_fn(self) -> Callable[[], int]:
        """A cheap callable returning the current device index (``torch._C._cuda_getDevice``
        when torch has it; torch.cuda is initialized by then, engines exist)."""
        raw = getattr(getattr(self.torch, "_C", None), "_cuda_getDevice", None)
        return raw if callable(raw) else self.current_device  # type: ignore[no-any-return]

    def device_guard(self) -> CallerDevice:
        """The engines' :class:`~trt_runtime.protocols.DeviceGuard` with several GPUs."""
        torch_c = getattr(self.torch, "_C", None)
        setter = getattr(torch_c, "_cuda_setDevice", None)
        if not callable(setter):
            setter = self.torch.cuda.set_device
        return CallerDevice(self.current_device_fn(), setter)

    def device_properties(self, index: int) -> tuple[int, int, str]:
        """``(major, minor, name)`` of CUDA device ``index``."""
        props = self.torch.cuda.get_device_properties(index)
        return int(props.major), int(props.minor), str(props.name)

    def device_scope(self, index: int) -> Any:
        """A context manager making device ``index`` current for the block."""
        return self.torch.cuda.device(index)

    def bind_thread(self, index: int) -> None:
        """Make device ``index``'s primary CUDA context current in the calling thread.

        A thread that has made no CUDA call has no current context; torch's allocator and
        stream calls may not make one, and TensorRT-RTX's profile switch inside
        ``execute_engine`` then fails ("No CUDA context is current", seen on an H100 with
        16 new threads). A stream synchronize is a CUDA call that needs the context.
        """
        cuda = self.torch.cuda
        with cuda.device(index):
            cuda.current_stream(index).synchronize()

    # -- tensors -------------------------------------------------------------------------
    @property
    def tensor_type(self) -> Any:
        """``torch.Tensor`` (the hot path compares ``type(x) is`` it)."""
        return self._tensor_type

    def describe(self, value: Any) -> TensorInfo | None:
        """Describe a torch tensor; None for anything else."""
        torch = self.torch
        if not isinstance(value, torch.Tensor):
            return None
        dtype = self._dtype_names.get(value.dtype)
        if dtype is None:
            dtype = str(value.dtype).removeprefix("torch.")
        device = value.device
        return TensorInfo(
            dtype=dtype,
            shape=tuple(int(d) for d in value.shape),
            device_type=str(device.type),
            device_index=device.index,
            contiguous=bool(value.is_contiguous()),
            strides=tuple(int(s) for s in value.stride()),
        )

    def torch_dtype(self, name: str) -> Any | None:
        """The torch dtype of a canonical dtype name (None if torch has none)."""
        for dtype, known in self._dtype_names.items():
            if known == name:
                return dtype
        return None

    def device_view(self, value: Any) -> Any | None:
        """A zero-copy torch view of a CUDA array (DLPack on a CUDA device, or
        ``__cuda_array_interface__``); None when ``value`` is not a CUDA array.

        DLPack is preferred: ``torch.from_dlpack`` hands the producer torch's current
        stream, so work queued there by the producer is ordered before ours. A CUDA
        array interface object is taken on the device its pointer is on (never copied to
        another device; the device check then names both).
        """
        device = getattr(value, "__dlpack_device__", None)
        if device is not None and hasattr(value, "__dlpack__"):
            kind, _index = device()
            if int(kind) in (_KDLCUDA, _KDLCUDA_MANAGED):
                return self.torch.from_dlpack(value)
        if hasattr(value, "__cuda_array_interface__"):
            return self.torch.as_tensor(value)
        return None

    def from_numpy(self, array: Any) -> Any:
        """A CPU tensor sharing the memory of a numpy array (read-only arrays included:
        the backend only ever reads host inputs, so torch's warning about them is muted)."""
        if array.flags.writeable:
            return self.torch.from_numpy(array)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            return self.torch.from_numpy(array)

    def to_device(self, tensor: Any, index: int) -> Any:
        """Copy a host tensor to CUDA device ``index`` on the current stream."""
        return tensor.to(device=f"cuda:{index}", non_blocking=False)

    def to_host(self, tensor: Any) -> Any:
        """Copy a CUDA tensor to a new CPU tensor; returns when the copy is done (it waits
        for the work queued before it on the current stream)."""
        return tensor.cpu()

    @staticmethod
    def to_numpy(tensor: Any) -> Any:
        """A numpy array over a CPU tensor's memory."""
        return tensor.numpy()

    @staticmethod
    def copy_(dst: Any, src: Any) -> None:
        """``dst.copy_(src)`` on the current stream (host to device included)."""
        dst.copy_(src)

    @staticmethod
    def clone(tensor: Any) -> Any:
        return tensor.clone()

    def zeros(self, shape: tuple[int, ...], dtype: str, index: int) -> Any:
        """A new zero-filled tensor of canonical ``dtype`` on CUDA device ``index``."""
        return self.torch.zeros(shape, dtype=self.torch_dtype(dtype), device=f"cuda:{index}")

    def bytes_to_tensor(self, data: bytes) -> Any:
        """A CPU uint8 tensor over a private copy of ``data`` (the C++ handle copies it again)."""
        return self.torch.frombuffer(bytearray(data), dtype=self.torch.uint8)

    def tensor_to_bytes(self, tensor: Any) -> bytes:
        return bytes(tensor.contiguous().cpu().numpy().tobytes())

    # -- streams -------------------------------------------------------------------------
    def resolve_stream(self, stream: Any, index: int) -> Any:
        """A torch stream for ``stream``: None (the current stream), a torch stream, or anything
        :func:`trt_runtime.contract.stream_handle` takes (wrapped in an ``ExternalStream``)."""
        cuda = self.torch.cuda
        if stream is None:
            return self.current_stream(index)
        if isinstance(stream, cuda.Stream):
            return stream
        return cuda.ExternalStream(stream_handle(stream), device=f"cuda:{index}")

    def current_stream(self, index: int) -> Any:
        """torch's current stream on device ``index``; the stream objects are cached by
        their ``cudaStream_t`` so a per-call ``synchronize`` creates none."""
        if self._raw_stream is None:
            return self.torch.cuda.current_stream(index)
        return self._stream_object(index, int(self._raw_stream(index)))

    def _stream_object(self, index: int, raw: int) -> Any:
        """torch's current stream on device ``index``, whose handle is ``raw``."""
        key = (index, raw)
        stream = self._streams.get(key)
        if stream is None:
            if len(self._streams) > 64:  # streams come and go; keep the cache small
                self._streams.clear()
            stream = self._streams[key] = self.torch.cuda.current_stream(index)
        return stream

    @staticmethod
    def stream_handle(stream: Any) -> int:
        """The ``cudaStream_t`` of a torch stream."""
        return int(stream.cuda_stream)

    def stream_scope(self, stream: Any) -> Any:
        """A context manager making ``stream`` current (and its device, for the block)."""
        return self.torch.cuda.stream(stream)

    def execute_on(self, lane: LaneStream, op: Callable[..., Any], tensors: Any, native: Any, index: int
                   ) -> Any:
        """``op(tensors, native)`` with ``lane`` current, ordered after torch's current stream
        on device ``index`` (the caller's) and before it again.

        *A caller on the legacy default stream* (torch's default stream: raw handle 0) *and a
        blocking lane stream*: the two stream switches and the op, nothing else. CUDA orders a
        blocking stream with the legacy default stream both ways: the op's work waits for
        everything queued before it on the legacy stream, and the caller's later work there
        waits for the op's. No ``record_stream`` either: the outputs are allocated on the
        lane's stream, so their memory is handed out again only to later work on the lane's
        stream; that work waits for everything queued earlier on the legacy stream, and the
        caller's legacy-stream uses of an output are queued before it frees the output.

        *Any other caller stream, or a non-blocking lane stream*: ``lane.ready`` recorded on
        the caller's stream and waited for by the lane's, ``lane.done`` the other way round
        after the op, and each output recorded as used on the caller's stream
        (``Tensor.record_stream``).

        The events are made once with the lane; the switch is torch's C-level setter
        (``torch.cuda.stream(...)`` and ``Stream.wait_stream`` cost a Python context manager
        and a new event per call), and the caller's stream is made current again however
        the op ends (an error, an interrupt)."""
        set_stream = self._set_stream
        raw_of = self._raw_stream
        if set_stream is None or raw_of is None:
            return self._execute_ordered(lane, op, tensors, native, self.current_stream(index))
        raw = raw_of(index)
        if raw == 0 and lane.blocking:
            try:  # (the switch inside: an interrupt right after it still switches back)
                set_stream(*lane.switch)
                return op(tensors, native)
            finally:  # torch's default stream: stream id 0 of the device
                set_stream(0, index, lane.device_type)
        return self._execute_ordered(lane, op, tensors, native, self._stream_object(index, int(raw)))

    def _execute_ordered(self, lane: LaneStream, op: Callable[..., Any], tensors: Any, native: Any,
                         caller: Any) -> Any:
        """``op(tensors, native)`` on ``lane`` ordered with ``caller`` by its events, the
        outputs recorded as used on ``caller`` (see :meth:`execute_on`)."""
        stream = lane.stream
        lane.ready.record(caller)
        stream.wait_event(lane.ready)
        set_stream = self._set_stream
        if set_stream is None:
            with self.torch.cuda.stream(stream):
                results = op(tensors, native)
        else:
            try:  # (the switch inside: an interrupt right after it still switches back)
                set_stream(*lane.switch)
                results = op(tensors, native)
            finally:
                set_stream(caller.stream_id, caller.device_index, caller.device_type)
        lane.done.record(stream)
        caller.wait_event(lane.done)
        for result in results:
            result.record_stream(caller)
        return results

    def lane_stream(self, index: int, *, blocking: bool = False) -> LaneStream:
        """The private stream of one lane of an engine on device ``index``, and its events.

        ``blocking=True`` asks for a blocking stream (:meth:`new_stream`); without
        cuda-python the lane gets a non-blocking stream anyway, and its
        :attr:`LaneStream.blocking` says so."""
        cuda = self.torch.cuda
        made = STREAMS.take(self.torch, index, blocking=True) if blocking else None
        if made is None:
            return LaneStream(self.new_stream(index), cuda.Event(), cuda.Event())
        return LaneStream(made, cuda.Event(), cuda.Event(), blocking=True)

    def give_back(self, stream: Any) -> None:
        """A stream of :meth:`lane_stream` or :meth:`new_stream` its closed owner no longer uses
        (after waiting for its work): to the pool now, for the next owner (:mod:`.streams`)."""
        STREAMS.give_back(stream)

    def new_stream(self, index: int) -> Any:
        """A new non-blocking stream on device ``index`` that nothing else in the process uses.

        ``torch.cuda.Stream()`` hands out one of a small pool of streams (32 per priority and
        device) shared by every ``torch.cuda.Stream()`` of the process, so a caller's stream
        could be the very stream a lane runs on or captures an outer graph on (seen on an
        H100: 16 caller threads and 8 contexts, a capture then failed and left the CUDA
        context unusable). With cuda-python installed the stream is made with
        ``cudaStreamCreateWithFlags(cudaStreamNonBlocking)`` and wrapped in an
        ``ExternalStream``; when that object goes, the stream goes back to a process-wide pool
        for the next lane, never destroyed (:mod:`.streams` says why); without cuda-python, a
        stream of torch's high-priority pool, which callers' default-priority streams do not
        share. (Outer graphs are captured on such a stream: a capture on a blocking stream
        would make every call on the legacy default stream fail meanwhile.)"""
        torch = self.torch
        made = STREAMS.take(torch, index)
        if made is None:
            return torch.cuda.Stream(device=index, priority=-1)
        return made

    @staticmethod
    def wait_stream(waiter: Any, producer: Any) -> None:
        """Make ``waiter`` wait for the work queued so far on ``producer`` (an event)."""
        waiter.wait_stream(producer)

    def synchronize(self, stream: Any) -> None:
        stream.synchronize()

    # -- CUDA graphs -------------------------------------------------------------------------
    def cuda_graphs_available(self) -> bool:
        """Whether this torch can capture CUDA graphs (``torch.cuda.CUDAGraph``, ``torch.cuda.graph``)."""
        cuda = getattr(self.torch, "cuda", None)
        return cuda is not None and hasattr(cuda, "CUDAGraph") and hasattr(cuda, "graph")

    def capture(self, fn: Callable[[], Any], stream: Any) -> tuple[Any, Any]:
        """Capture what ``fn()`` queues into a new ``torch.cuda.CUDAGraph`` on ``stream``;
        return the graph and what ``fn`` returned (tensors in the graph's private pool).

        ``capture_error_mode="thread_local"``: TensorRT-RTX compiles kernels on its own
        threads; their CUDA calls must not invalidate this thread's capture.
        """
        cuda = self.torch.cuda
        try:  # the graph itself kept (torch 2.9+), for copy_nodes
            graph, kept = cuda.CUDAGraph(keep_graph=True), True
        except TypeError:
            graph, kept = cuda.CUDAGraph(), False
        with cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            result = fn()
        if kept:  # a kept graph is instantiated on request (raw_cuda_graph_exec needs it)
            graph.instantiate()
        return graph, result

    @staticmethod
    def replay(graph: Any) -> None:
        """Launch ``graph`` on the current stream."""
        graph.replay()

    def raw_current_stream(self, index: int) -> int | None:
        """The handle of torch's current stream on device ``index`` (``None``: this torch
        cannot tell it without making a stream object)."""
        raw = self._raw_stream
        return None if raw is None else int(raw(index))

    @staticmethod
    def graph_launcher(graph: Any) -> tuple[Callable[[int], None], _Copy] | None:
        """A function launching ``graph``'s executable graph on a stream handle, and a device
        copy ``(dst, src, nbytes, stream) -> error``, both through cuda-python: what
        ``replay()`` does after its bookkeeping for random-number generators, which a
        TensorRT graph has no use for. ``None`` without cuda-python, or for a torch whose
        ``CUDAGraph`` has no ``raw_cuda_graph_exec``."""
        found = _with_runtime(graph, "raw_cuda_graph_exec")
        if found is None:
            return None
        exec_of, rt = found
        launch, memcpy = rt.cudaGraphLaunch, rt.cudaMemcpyAsync
        handle = rt.cudaGraphExec_t(int(exec_of()))  # made once, not per launch
        d2d = rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice

        def run(stream: int, graph: Any = graph) -> None:  # the graph lives as long as this
            (err,) = launch(handle, stream)
            if err:
                raise EngineError(f"replaying a CUDA graph failed: cudaGraphLaunch returned {err!r}")

        def copy(dst: int, src: int, nbytes: int, stream: int) -> Any:
            return memcpy(dst, src, nbytes, d2d, stream)[0]

        return run, copy

    def copy_nodes(self, graph: Any, ins: Sequence[tuple[int, int]], outs: Sequence[tuple[int, int]],
                   index: int) -> CopyNodes | None:
        """The replay copies of ``graph`` as memcpy nodes around it
        (:func:`trt_runtime.graphs.build_copy_nodes`; ``ins``/``outs``: ``(address, bytes)``
        of the static inputs and of the static outputs to copy out). ``None`` without
        cuda-python, for a graph torch did not keep (``raw_cuda_graph``), or when CUDA
        refuses. The side that changes per call is built on a torch tensor, the kind of
        memory the calls bring."""
        found = _with_runtime(graph, "raw_cuda_graph")
        if found is None:
            return None
        raw_of, rt = found
        try:
            raw = int(raw_of())
        except RuntimeError:  # captured without keep_graph
            return None
        torch = self.torch

        def placeholder(nbytes: int) -> tuple[Any, int]:
            tensor = torch.empty((nbytes,), dtype=torch.uint8, device=f"cuda:{index}")
            return tensor, tensor.data_ptr()

        with self.device_scope(index):
            return build_copy_nodes(rt, rt.cudaGraph_t(raw), ins, outs, placeholder,
                                    rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice)

    @staticmethod
    def reset_graph(graph: Any) -> None:
        graph.reset()

    def poison(self, tensor: Any) -> bool:
        """Fill a floating-point tensor with NaN (on the current stream); False for other dtypes."""
        if not tensor.is_floating_point():
            return False
        tensor.fill_(float("nan"))
        return True

    def unwritten(self, tensor: Any, reference: Any) -> bool:
        """Whether ``tensor`` still holds NaN where ``reference`` does not (waits for the
        current stream): the poisoned buffer was not overwritten."""
        torch = self.torch
        return bool((torch.isnan(tensor) & ~torch.isnan(reference)).any().item())

    # -- the op ----------------------------------------------------------------------------
    def execute_op(self) -> Callable[[Sequence[Any], Any], list[Any]]:
        """The callable behind ``torch.ops.tensorrt.execute_engine``.

        That is the overload packet's C++ operation (``_op``): calling the packet itself
        first walks the arguments in Python looking for fake script objects (tracing
        only), a few microseconds per call; the C++ operation checks the schema itself.
        """
        op = self._execute_op
        if op is None:
            packet = self.ops.execute_engine
            raw = getattr(packet, "_op", None)
            op = self._execute_op = raw if callable(raw) else packet
        return op  # type: ignore[no-any-return]

    def execute(self, inputs: list[Any], engine: Any) -> list[Any]:
        return self.execute_op()(inputs, engine)


def _with_runtime(graph: Any, method: str) -> tuple[Callable[[], Any], Any] | None:
    """``graph``'s ``method`` (a ``torch.cuda.CUDAGraph`` accessor of its raw handles) and
    cuda-python's runtime module; ``None`` when this torch lacks the one or cuda-python the other."""
    accessor = getattr(graph, method, None)
    if accessor is None:
        return None
    try:
        from cuda.bindings import runtime as rt
    except ImportError:
        return None
    return accessor, rt
