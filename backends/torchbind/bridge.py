"""Everything the torchbind backend asks of torch, behind one small class.

Keeping torch behind :class:`TorchBridge` keeps the backend's logic testable on a
machine without torch or a GPU: the CPU tests hand the backend a bridge double.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from collections.abc import Iterator
from typing import Any

__all__ = ["TensorInfo", "TorchBridge"]


@dataclasses.dataclass(frozen=True, slots=True)
class TensorInfo:
    """What input validation needs to know about a tensor."""

    dtype: str  # canonical name (trt_runtime.dtypes)
    shape: tuple[int, ...]
    device_type: str  # "cuda" or "cpu"
    device_index: int | None
    contiguous: bool


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

    def device_properties(self, index: int) -> tuple[int, int, str]:
        """``(major, minor, name)`` of CUDA device ``index``."""
        props = self.torch.cuda.get_device_properties(index)
        return int(props.major), int(props.minor), str(props.name)

    def device_scope(self, index: int) -> contextlib.AbstractContextManager[Any]:
        return self.torch.cuda.device(index)  # type: ignore[no-any-return,unused-ignore]

    # -- tensors -------------------------------------------------------------------------
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
        )

    def torch_dtype(self, name: str) -> Any | None:
        """The torch dtype of a canonical dtype name (None if torch has none)."""
        for dtype, known in self._dtype_names.items():
            if known == name:
                return dtype
        return None

    def fast_shape(self, value: Any, dtype: Any, index: int) -> Any:
        """The hot-path check: the shape of a contiguous CUDA tensor on ``index`` with exactly
        ``dtype``; None for anything else (it then goes through the full check and its
        messages)."""
        if (
            isinstance(value, self._tensor_type)
            and value.dtype is dtype
            and value.is_cuda
            and value.get_device() == index
            and value.is_contiguous()
        ):
            return value.shape
        return None

    def as_tensor(self, value: Any) -> Any | None:
        """A torch view of a numpy array or a DLPack / CUDA-array-interface object, or None."""
        torch = self.torch
        np: Any
        try:
            import numpy as np
        except ImportError:
            np = None
        if np is not None and isinstance(value, np.ndarray):
            return torch.from_numpy(value)  # shares memory; staged to the GPU later
        if hasattr(value, "__dlpack__"):
            return torch.from_dlpack(value)
        if hasattr(value, "__cuda_array_interface__"):
            return torch.as_tensor(value, device="cuda")
        return None

    def to_device(self, tensor: Any, index: int) -> Any:
        return tensor.to(device=f"cuda:{index}", non_blocking=False)

    def bytes_to_tensor(self, data: bytes) -> Any:
        """A CPU uint8 tensor over a private copy of ``data`` (the C++ handle copies it again)."""
        return self.torch.frombuffer(bytearray(data), dtype=self.torch.uint8)

    def tensor_to_bytes(self, tensor: Any) -> bytes:
        return bytes(tensor.contiguous().cpu().numpy().tobytes())

    # -- streams -------------------------------------------------------------------------
    def resolve_stream(self, stream: Any, index: int) -> Any:
        """A torch stream for ``stream``: None (the current stream), a torch stream, a raw
        ``cudaStream_t`` int, or an object with ``__cuda_stream__`` or ``.handle`` (cuda.core)."""
        cuda = self.torch.cuda
        if stream is None:
            return self.current_stream(index)
        if isinstance(stream, cuda.Stream):
            return stream
        handle: Any = None
        if hasattr(stream, "__cuda_stream__"):
            handle = stream.__cuda_stream__()[1]
        elif hasattr(stream, "handle"):
            handle = stream.handle
        elif isinstance(stream, int) and not isinstance(stream, bool):
            handle = stream
        if handle is None:
            raise TypeError(
                "stream must be None, a torch.cuda.Stream, a cudaStream_t int or an object with "
                f"__cuda_stream__ / .handle; got {type(stream).__name__}"
            )
        return cuda.ExternalStream(int(handle), device=f"cuda:{index}")

    def current_stream(self, index: int) -> Any:
        """torch's current stream on device ``index``; the stream objects are cached by
        their ``cudaStream_t`` so a per-call ``synchronize`` creates none."""
        if self._raw_stream is None:
            return self.torch.cuda.current_stream(index)
        key = (index, int(self._raw_stream(index)))
        stream = self._streams.get(key)
        if stream is None:
            if len(self._streams) > 64:  # streams come and go; keep the cache small
                self._streams.clear()
            stream = self._streams[key] = self.torch.cuda.current_stream(index)
        return stream

    @contextlib.contextmanager
    def stream_scope(self, stream: Any, index: int) -> Iterator[Any]:
        cuda = self.torch.cuda
        with cuda.device(index), cuda.stream(stream):
            yield stream

    def synchronize(self, stream: Any) -> None:
        stream.synchronize()

    def execute(self, inputs: list[Any], engine: Any) -> list[Any]:
        op = self._execute_op
        if op is None:
            op = self._execute_op = self.ops.execute_engine
        return list(op(inputs, engine))
