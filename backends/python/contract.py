"""The python backend's side of the device contract: what a call's inputs are, checked before TensorRT.

:class:`InputInspection` (a mixin of ``PythonEngine``) checks count, kind, dtype,
device, contiguity, shape and optimization profile of a call's inputs without an
execution context, and raises :class:`~trt_runtime.InputError` naming the input, the
value given and what was expected. :class:`TensorInfo` is what the hot paths know about
one input or output, computed once per engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trt_runtime_backends.python.arrays import DeviceArray, describe_device_array, torch_module
from trt_runtime_backends.python.lane import LaneState

from trt_runtime.contract import KIND_DEVICE, KIND_HOST, KIND_TORCH
from trt_runtime.dtypes import itemsize
from trt_runtime.errors import InputError
from trt_runtime.protocols import TensorSpec

__all__ = ["InputInspection", "Inspection", "TensorInfo"]


class TensorInfo:
    """What the hot path needs to know about one tensor, computed once."""

    __slots__ = ("dtype", "index", "itemsize", "name", "np_dtype", "rank", "shape", "spec", "torch_dtype")

    def __init__(self, spec: TensorSpec, index: int) -> None:
        self.spec = spec
        self.name = spec.name
        self.index = index
        self.dtype = spec.dtype
        self.itemsize = itemsize(spec.dtype)
        self.shape = spec.shape
        self.rank = len(spec.shape)
        self.np_dtype: Any = None
        self.torch_dtype: Any = None


class Inspection:
    """What :meth:`InputInspection._inspect` learned about one call's inputs.

    ``kind``: ``KIND_TORCH`` when any input is a CUDA torch tensor, else ``KIND_DEVICE``
    when any is another CUDA array, else ``KIND_HOST``. ``ptrs``: device pointers, ``-1``
    for host inputs (listed in ``host`` as ``(index, array)``; CPU torch tensors stay
    tensors). ``shapes``: the input shapes as given (``torch.Size`` or tuples).
    ``profile``: the optimization profile the shapes run in.
    """

    __slots__ = ("host", "inputs", "kind", "profile", "ptrs", "remember", "shapes", "torch_host")

    def __init__(self, kind: int, ptrs: list[int], shapes: tuple[Any, ...],
                 host: list[tuple[int, Any]] | None, torch_host: bool, profile: int,
                 inputs: Sequence[Any] = (), remember: bool = False) -> None:
        #: The inputs as given; ``remember``: whether a fast path may be recorded from it.
        self.inputs = inputs
        self.remember = remember
        self.kind = kind
        self.ptrs = ptrs
        self.shapes = shapes
        self.host = host
        self.torch_host = torch_host
        self.profile = profile


class InputInspection(LaneState):
    """Checks of a call's inputs that need no execution context (mixin of ``PythonEngine``)."""

    _torch_tensor: Any  # assigned here too
    _torch_device: Any
    _in_torch_dtypes: tuple[Any, ...]
    _current_raw_stream: Any
    _torch_empty: Any

    def _inspect(self, inputs: Sequence[Any], profile: int | None, remember: bool = False) -> Inspection:
        """Every check that needs no execution context: count, dtype, device, contiguity,
        shape and optimization profile. Raises InputError; TensorRT is not called."""
        if len(inputs) != self._n_in:
            self._shapes.check_count(len(inputs))
        kind = KIND_HOST
        ptrs: list[int] = []
        shapes: list[Any] = []
        host: list[tuple[int, Any]] | None = None
        torch_tensor = self._torch_tensor
        torch_host = False
        device = self._device
        for io, x in zip(self._in, inputs, strict=False):
            tp = type(x)
            # Fast paths: exact types with every check passing; anything else falls through
            # to the general path, which raises the precise error.
            if tp is torch_tensor:
                if x.get_device() == device and x.dtype is io.torch_dtype and x.is_contiguous():
                    kind = KIND_TORCH
                    ptrs.append(x.data_ptr())
                    shapes.append(x.shape)
                    continue
            elif tp is DeviceArray:
                if x.dtype == io.dtype and x.device_id == device:
                    if kind == KIND_HOST:
                        kind = KIND_DEVICE
                    ptrs.append(x.ptr)
                    shapes.append(x.shape)
                    continue
            if self._is_torch(x):
                if x.is_cuda:
                    self._check_torch(io, x)
                    kind = KIND_TORCH
                    ptrs.append(x.data_ptr())
                    shapes.append(x.shape)
                    continue
                arr = self._torch_host(io, x)
                torch_host = True
            elif hasattr(x, "__cuda_array_interface__") or (
                hasattr(x, "__dlpack_device__") and _dl_is_cuda(x)
            ):
                ptr, shape = self._check_device_array(io, x)
                if kind == KIND_HOST:
                    kind = KIND_DEVICE
                ptrs.append(ptr)
                shapes.append(shape)
                continue
            else:
                arr = self._check_host(io, x)
            if host is None:
                host = []
            host.append((io.index, arr))
            ptrs.append(-1)
            shapes.append(arr.shape)
        key = tuple(shapes)
        chosen = self._shapes.select(key, profile)
        return Inspection(kind, ptrs, key, host, torch_host, chosen, inputs, remember)

    # -- one input of each kind ------------------------------------------------------------
    def _is_torch(self, x: Any) -> bool:
        torch = torch_module()
        if torch is None or not isinstance(x, torch.Tensor):
            return False
        if self._torch_tensor is None:
            self._torch_tensor = torch.Tensor
            self._torch_device = torch.device("cuda", self._device)
            for io in (*self._in, *self._out):
                io.torch_dtype = torch_dtype(torch, io.dtype)
            self._in_torch_dtypes = tuple(io.torch_dtype for io in self._in)
            raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
            self._current_raw_stream = raw if raw is not None else _current_stream_fallback
            self._torch_empty = torch.empty
        return True

    def _check_torch(self, io: TensorInfo, x: Any) -> None:
        if x.dtype != io.torch_dtype:
            raise InputError(
                f"engine {self.name!r}: input {io.name!r} must have dtype {io.dtype}; got {x.dtype}"
            )
        dev = x.get_device()
        if dev != self._device:
            raise InputError(
                f"engine {self.name!r}: input {io.name!r} is on cuda:{dev}; the engine runs on "
                f"cuda:{self._device}"
            )
        if not x.is_contiguous():
            raise InputError(
                f"engine {self.name!r}: input {io.name!r} is not contiguous (strides {tuple(x.stride())}); "
                "call .contiguous() first"
            )

    def _torch_host(self, io: TensorInfo, x: Any) -> Any:
        """A CPU torch tensor, checked; it is staged from its own memory (any dtype)."""
        if x.dtype != io.torch_dtype:
            raise InputError(
                f"engine {self.name!r}: input {io.name!r} must have dtype {io.dtype}; got {x.dtype}"
            )
        if not x.is_contiguous():
            raise InputError(
                f"engine {self.name!r}: input {io.name!r} is not contiguous (strides {tuple(x.stride())}); "
                "call .contiguous() first"
            )
        return x

    def _check_device_array(self, io: TensorInfo, x: Any) -> tuple[int, tuple[int, ...]]:
        try:
            ptr, shape, dtype, device, contiguous = describe_device_array(x)
        except Exception as exc:
            raise InputError(
                f"engine {self.name!r}: input {io.name!r} ({type(x).__name__}) is not a readable device "
                f"array: {exc}"
            ) from exc
        if dtype != io.dtype:
            raise InputError(
                f"engine {self.name!r}: input {io.name!r} must have dtype {io.dtype}; got {dtype}"
            )
        if device is None and self._multi_device:
            device = _pointer_device(ptr)
        if device is not None and device != self._device:
            where = "the host" if device < 0 else f"cuda:{device}"
            raise InputError(
                f"engine {self.name!r}: input {io.name!r} is on {where}; "
                f"the engine runs on cuda:{self._device}"
            )
        if not contiguous:
            raise InputError(f"engine {self.name!r}: input {io.name!r} is not C-contiguous")
        return ptr, shape

    def _check_host(self, io: TensorInfo, x: Any) -> Any:
        import numpy as np

        if io.np_dtype is None:
            from trt_runtime.dtypes import to_numpy

            try:
                io.np_dtype = to_numpy(io.dtype)
            except TypeError as exc:
                raise InputError(f"engine {self.name!r}: input {io.name!r}: {exc}") from exc
        if not isinstance(x, np.ndarray):
            if isinstance(x, (list, tuple, int, float)):
                x = np.asarray(x, dtype=io.np_dtype)
            else:
                try:
                    x = np.asarray(x)
                except Exception as exc:
                    raise InputError(
                        f"engine {self.name!r}: input {io.name!r} must be a torch tensor, a CUDA array "
                        f"or a host array; got {type(x).__name__}"
                    ) from exc
        if x.dtype != io.np_dtype:
            raise InputError(
                f"engine {self.name!r}: input {io.name!r} must have dtype {io.dtype}; got {x.dtype}"
            )
        if not x.flags.c_contiguous:
            raise InputError(
                f"engine {self.name!r}: input {io.name!r} is not C-contiguous; use numpy.ascontiguousarray"
            )
        return x


# -- helpers ------------------------------------------------------------------------------------


def _dl_is_cuda(x: Any) -> bool:
    try:
        device_type, _ = x.__dlpack_device__()
    except Exception:
        return False
    return int(device_type) in (2, 13)  # kDLCUDA, kDLCUDAManaged


def _pointer_device(ptr: int) -> int:
    from cuda.bindings import runtime as rt

    err, attrs = rt.cudaPointerGetAttributes(ptr)
    if int(err) != 0:
        return -1
    memory_type = int(attrs.type)
    if memory_type in (2, 3):  # cudaMemoryTypeDevice, cudaMemoryTypeManaged
        return int(attrs.device)
    return -1


def torch_dtype(torch: Any, name: str) -> Any:
    """The torch dtype of a dtype name (``None`` when this torch lacks it)."""
    return {
        "float32": torch.float32,
        "float16": torch.float16,
        "bfloat16": torch.bfloat16,
        "int64": torch.int64,
        "int32": torch.int32,
        "int8": torch.int8,
        "uint8": torch.uint8,
        "bool": torch.bool,
        "float8_e4m3fn": getattr(torch, "float8_e4m3fn", None),
    }[name]


def _current_stream_fallback(device: int) -> int:
    torch = torch_module()
    return int(torch.cuda.current_stream(device).cuda_stream)
