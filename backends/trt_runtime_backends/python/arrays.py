"""Array handling for the python backend: what an input is, and the device arrays it returns.

Three kinds of arrays are accepted: torch tensors (fast path), any other object with
``__cuda_array_interface__`` or ``__dlpack__`` on a CUDA device (bound zero-copy), and
host arrays (numpy, or anything ``numpy.asarray`` takes), which are staged through
device buffers.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from typing import Any

__all__ = [
    "DeviceArray",
    "c_strides",
    "describe_device_array",
    "torch_module",
]

_TYPESTR = {
    "f4": "float32",
    "f2": "float16",
    "i4": "int32",
    "i8": "int64",
    "i1": "int8",
    "u1": "uint8",
    "b1": "bool",
}
_TYPESTR_OF = {
    "float32": "<f4",
    "float16": "<f2",
    "int32": "<i4",
    "int64": "<i8",
    "int8": "|i1",
    "uint8": "|u1",
    "bool": "|b1",
    "bfloat16": "<V2",
    "float8_e4m3fn": "|V1",
}


def torch_module() -> Any:
    """torch if it is already imported (never imports it: torch inputs imply it is loaded)."""
    return sys.modules.get("torch")


def c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides = []
    acc = itemsize
    for dim in reversed(shape):
        strides.append(acc)
        acc *= max(dim, 1)
    return tuple(reversed(strides))


def _typestr_name(typestr: str) -> str:
    name = _TYPESTR.get(typestr[1:])
    if name is None:
        return f"typestr {typestr!r}"
    return name


def describe_device_array(obj: Any) -> tuple[int, tuple[int, ...], str, int | None, bool]:
    """``(pointer, shape, dtype name, device id or None, c_contiguous)`` of a device array.

    Uses ``__cuda_array_interface__`` when present (a dict lookup), else DLPack through
    cuda.core's ``StridedMemoryView`` without stream synchronization (the backend orders
    streams itself). ``device id`` is ``None`` when the protocol does not say (CAI).
    """
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        shape = tuple(int(d) for d in cai["shape"])
        name = _typestr_name(cai["typestr"])
        strides = cai.get("strides")
        contiguous = strides is None or _is_c_contiguous(shape, tuple(strides), _itemsize_of(cai["typestr"]))
        return int(cai["data"][0]), shape, name, None, contiguous
    from cuda.core.utils import StridedMemoryView

    view = StridedMemoryView(obj, -1)
    shape = tuple(int(d) for d in view.shape)
    dtype = view.dtype
    name = str(getattr(dtype, "name", dtype))
    strides = view.strides  # in elements, None when C-contiguous
    contiguous = strides is None or _is_c_contiguous(shape, tuple(int(s) for s in strides), 1)
    device = int(view.device_id) if view.is_device_accessible else -1
    return int(view.ptr), shape, name, device, contiguous


def _itemsize_of(typestr: str) -> int:
    return int(typestr[2:]) if typestr[2:].isdigit() else 1


def _is_c_contiguous(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> bool:
    expected = itemsize
    for dim, stride in zip(reversed(shape), reversed(strides), strict=False):
        if dim > 1 and stride != expected:
            return False
        expected *= max(dim, 1)
    return True


# -- a small device array for outputs of CUDA-array inputs ---------------------------------


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [
    ("dl_tensor", _DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _DELETER),
]

_DL_CODES = {
    "float32": (2, 32),
    "float16": (2, 16),
    "bfloat16": (4, 16),
    "int64": (0, 64),
    "int32": (0, 32),
    "int8": (0, 8),
    "uint8": (1, 8),
    "bool": (6, 8),
}
_KDLCUDA = 2

# Exported tensors stay alive here until the consumer calls the deleter.
_live: dict[int, tuple[Any, ...]] = {}
_live_lock = threading.Lock()


@_DELETER
def _dl_deleter(managed: Any) -> None:
    with _live_lock:
        _live.pop(ctypes.addressof(managed.contents), None)


# The destructor gets the raw PyObject* (c_void_p): turning it into a py_object would
# take a new reference to a capsule that is being destroyed.
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
# Private prototypes: never mutate the shared ctypes.pythonapi function objects.
_capsule_get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_GetName", ctypes.pythonapi)
)
_capsule_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi)
)


def _capsule_destructor_impl(capsule: int) -> None:
    # If no consumer renamed the capsule to "used_dltensor", nobody took ownership.
    if _capsule_get_name(capsule) == b"dltensor":
        address = _capsule_get_pointer(capsule, b"dltensor")
        with _live_lock:
            _live.pop(address, None)


_capsule_destructor = _CAPSULE_DESTRUCTOR(_capsule_destructor_impl)


class DeviceArray:
    """A contiguous array in CUDA device memory, returned for CUDA-array inputs.

    Exposes ``__cuda_array_interface__`` (v3) and ``__dlpack__`` / ``__dlpack_device__``, so
    ``cupy.asarray``, ``torch.as_tensor`` / ``torch.from_dlpack`` and
    ``numpy.from_dlpack``-style consumers take it without a copy. ``numpy()`` copies it to
    the host. The memory is owned by the wrapped cuda.core ``Buffer`` and freed with it.
    ``stream`` is the stream the producing work was queued on (0 when the caller's stream
    was already made to wait for it).
    """

    __slots__ = ("__weakref__", "_buffer", "device_id", "dtype", "ptr", "shape", "stream")

    #: DLPack device type of the memory (kDLCUDA).
    _dl_device_type = _KDLCUDA

    def __init__(self, buffer: Any, shape: tuple[int, ...], dtype: str, device_id: int, stream: int = 0):
        self._buffer = buffer
        self.ptr = int(buffer.handle) if buffer is not None else 0
        self.shape = tuple(shape)
        self.dtype = dtype
        self.device_id = device_id
        self.stream = stream

    @property
    def buffer(self) -> Any:
        """The cuda.core ``Buffer`` holding the data."""
        return self._buffer

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        from trt_runtime.dtypes import itemsize

        return self.size * itemsize(self.dtype)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {
            "shape": self.shape,
            "typestr": _TYPESTR_OF[self.dtype],
            "data": (self.ptr, False),
            "strides": None,
            "version": 3,
            "stream": self.stream if self.stream not in (0,) else None,
        }

    def __dlpack_device__(self) -> tuple[int, int]:
        return (self._dl_device_type, self.device_id)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:
        if self.stream and stream is not None and stream != -1 and stream != self.stream:
            from cuda.bindings import runtime

            from trt_runtime.contract import cuda_result

            cuda_result(runtime.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        if self.dtype not in _DL_CODES:
            raise BufferError(f"DLPack cannot describe dtype {self.dtype}")
        code, bits = _DL_CODES[self.dtype]
        ndim = len(self.shape)
        shape_arr = (ctypes.c_int64 * max(ndim, 1))(*self.shape)
        managed = _DLManagedTensor()
        managed.dl_tensor.data = self.ptr
        managed.dl_tensor.device = _DLDevice(self._dl_device_type, self.device_id)
        managed.dl_tensor.ndim = ndim
        managed.dl_tensor.dtype = _DLDataType(code, bits, 1)
        managed.dl_tensor.shape = shape_arr
        managed.dl_tensor.strides = None
        managed.dl_tensor.byte_offset = 0
        managed.manager_ctx = None
        managed.deleter = _dl_deleter
        address = ctypes.addressof(managed)
        with _live_lock:
            _live[address] = (managed, shape_arr, self)  # self keeps the Buffer alive
        return _capsule_new(address, b"dltensor", ctypes.cast(_capsule_destructor, ctypes.c_void_p))

    def numpy(self) -> Any:
        """Copy to a new numpy array (waits for the producing stream)."""
        import numpy as np
        from cuda.bindings import runtime

        from trt_runtime.contract import cuda_result
        from trt_runtime.dtypes import to_numpy

        out = np.empty(self.shape, dtype=to_numpy(self.dtype))
        if self.stream:
            cuda_result(runtime.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        if out.nbytes:
            cuda_result(
                runtime.cudaMemcpy(out.ctypes.data, self.ptr, out.nbytes,
                                   runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost),
                "cudaMemcpy",
            )
        return out

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d DeviceArray")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, device={self.device_id})"
