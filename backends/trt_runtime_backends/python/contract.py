"""The python backend's side of the device contract: what a call's inputs are, checked before TensorRT.

:class:`Contract` (a part of each ``PythonEngine`` lane, as in the torchbind backend)
checks count, kind, dtype, device, contiguity, shape and optimization profile of a
call's inputs without an execution context, and raises :class:`~trt_runtime.InputError`
naming the input, the value given and what was expected; the shape and profile rules
are the core's :class:`~trt_runtime.contract.ShapeChecker`. :class:`TensorInfo` is what
the hot paths know about one input or output, computed once per engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from trt_runtime_backends.python.arrays import DeviceArray, describe_device_array
from trt_runtime_backends.python.bridge import TorchBridge

from trt_runtime.contract import (
    READ_DEVICE,
    READ_HOST,
    READ_TORCH_CUDA,
    READ_TORCH_HOST,
    ShapeChecker,
    read_inputs,
)
from trt_runtime.dtypes import itemsize, normalize_dtype
from trt_runtime.errors import InputError
from trt_runtime.protocols import TensorSpec

__all__ = ["Contract", "Inspection", "TensorInfo", "read_specs"]


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
    """What :meth:`Contract.inspect` learned about one call's inputs.

    ``kind``: ``KIND_TORCH`` when any input is a CUDA torch tensor, else ``KIND_DEVICE``
    when any is another CUDA array, else ``KIND_HOST``. ``ptrs``: device pointers, ``-1``
    for host inputs (listed in ``host`` as ``(index, array)``; CPU torch tensors stay
    tensors). ``shapes``: the input shapes as given (``torch.Size`` or tuples).
    ``profile``: the optimization profile the shapes run in.
    """

    __slots__ = ("checked", "host", "inputs", "kind", "profile", "ptrs", "remember", "shapes", "torch_host")

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
        #: ``outputs=`` and their addresses, once checked before any work was queued
        #: (``PythonLane.validate_outputs``), for the run not to check them again.
        self.checked: tuple[list[Any], list[int]] | None = None


class Contract:
    """The checks of a call's inputs (and preallocated outputs) that need no execution
    context, for one lane: its tensors, shape checker, device and torch bridge."""

    __slots__ = ("_read", "bridge", "device", "ins", "multi_device", "n_in", "name", "shapes")

    def __init__(self, name: str, ins: Sequence[TensorInfo], shapes: ShapeChecker, device: int,
                 multi_device: bool, bridge: TorchBridge) -> None:
        self.name = name
        self.ins = ins
        self.n_in = len(ins)
        #: Validates input shapes and picks their profile (remembers what it checked).
        self.shapes = shapes
        self.device = device
        self.multi_device = multi_device
        self.bridge = bridge
        self._read = self._reader()

    def inspect(self, inputs: Sequence[Any], profile: int | None, remember: bool = False) -> Inspection:
        """Every check that needs no execution context: count, dtype, device, contiguity,
        shape and optimization profile. Raises InputError; TensorRT is not called."""
        if len(inputs) != self.n_in:
            self.shapes.check_count(len(inputs))
        kind, ptrs, key, at, torch_host = read_inputs(self.ins, inputs, self._read)
        host: list[tuple[int, Any]] | None = None
        if at is not None:  # host arrays are staged by the run: their pointer is -1
            host = []
            for i in at:  # (an input's position is its TensorInfo.index)
                host.append((i, ptrs[i]))
                ptrs[i] = -1
        chosen = self.shapes.select(key, profile)
        return Inspection(kind, ptrs, key, host, torch_host, chosen, inputs, remember)

    def _reader(self) -> Callable[[TensorInfo, Any], tuple[int, Any, Any]]:
        """The ``read`` of :func:`~trt_runtime.contract.read_inputs` for this lane: one input
        checked, as ``(what, device pointer or host array, shape)``."""
        bridge = self.bridge
        is_torch = bridge.is_torch
        device = self.device

        def read(io: TensorInfo, x: Any) -> tuple[int, Any, Any]:
            tp = type(x)
            # Fast paths: exact types with every check passing; anything else falls through
            # to the general path, which raises the precise error. (``bridge.tensor`` is set
            # when the first torch tensor is seen.)
            if tp is bridge.tensor:
                if x.get_device() == device and x.dtype is io.torch_dtype and x.is_contiguous():
                    return READ_TORCH_CUDA, x.data_ptr(), x.shape
            elif tp is DeviceArray:
                if x.dtype == io.dtype and x.device_id == device:
                    return READ_DEVICE, x.ptr, x.shape
            if is_torch(x):
                if x.is_cuda:
                    self.check_torch(io, x)
                    return READ_TORCH_CUDA, x.data_ptr(), x.shape
                arr = self.torch_host(io, x)
                return READ_TORCH_HOST, arr, arr.shape
            if hasattr(x, "__cuda_array_interface__") or (
                hasattr(x, "__dlpack_device__") and _dl_is_cuda(x)
            ):
                ptr, shape = self.check_device_array(io, x)
                return READ_DEVICE, ptr, shape
            arr = self.check_host(io, x)
            return READ_HOST, arr, arr.shape

        return read

    # -- one input of each kind ------------------------------------------------------------
    def check_torch(self, io: TensorInfo, x: Any) -> None:
        if x.dtype != io.torch_dtype:
            raise InputError(
                f"engine {self.name!r}: input {io.name!r} must have dtype {io.dtype}; got {x.dtype}"
            )
        dev = x.get_device()
        if dev != self.device:
            raise InputError(
                f"engine {self.name!r}: input {io.name!r} is on cuda:{dev}; the engine runs on "
                f"cuda:{self.device}"
            )
        if not x.is_contiguous():
            raise InputError(
                f"engine {self.name!r}: input {io.name!r} is not contiguous (strides {tuple(x.stride())}); "
                "call .contiguous() first"
            )

    def torch_host(self, io: TensorInfo, x: Any) -> Any:
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

    def check_device_array(self, io: TensorInfo, x: Any) -> tuple[int, tuple[int, ...]]:
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
        if device is None and self.multi_device:
            device = _pointer_device(ptr)
        if device is not None and device != self.device:
            where = "the host" if device < 0 else f"cuda:{device}"
            raise InputError(
                f"engine {self.name!r}: input {io.name!r} is on {where}; "
                f"the engine runs on cuda:{self.device}"
            )
        if not contiguous:
            raise InputError(f"engine {self.name!r}: input {io.name!r} is not C-contiguous")
        return ptr, shape

    def check_host(self, io: TensorInfo, x: Any) -> Any:
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


def read_specs(trt: Any, trt_engine: Any) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The input and output specs of an ``ICudaEngine`` (profiles of dynamic inputs; outputs
    marked data-dependent when a -1 remains with static inputs)."""
    inputs: list[TensorSpec] = []
    outputs: list[TensorSpec] = []
    profiles = int(trt_engine.num_optimization_profiles)
    for i in range(trt_engine.num_io_tensors):
        name = trt_engine.get_tensor_name(i)
        dtype = normalize_dtype(trt_engine.get_tensor_dtype(name))
        shape = tuple(int(d) for d in trt_engine.get_tensor_shape(name))
        if trt_engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
            ranges = []
            if any(d < 0 for d in shape):
                for p in range(profiles):
                    lo, opt, hi = trt_engine.get_tensor_profile_shape(name, p)
                    ranges.append((tuple(lo), tuple(opt), tuple(hi)))
            inputs.append(TensorSpec(name, dtype, shape, True, profiles=tuple(ranges)))
        else:
            outputs.append(TensorSpec(name, dtype, shape, False))
    static_inputs = all(not s.is_dynamic for s in inputs)
    # With static inputs, a -1 left in an output shape can only come from the data.
    outputs = [
        TensorSpec(o.name, o.dtype, o.shape, False, data_dependent=static_inputs and o.is_dynamic)
        for o in outputs
    ]
    return inputs, outputs


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
