"""``CudaArray``: a CUDA array that is neither torch nor CuPy, for the ``cuda_array`` kind.

The device contract says any object exposing ``__cuda_array_interface__`` is a device
input, and that its outputs are device arrays. To test that without assuming CuPy,
:class:`CudaArray` allocates device memory with cuda-python (``cuda.bindings.runtime``)
and exposes nothing but ``__cuda_array_interface__`` (v3). Needs cuda-python and a CUDA
driver; :func:`cuda_unavailable` says why not when they are missing.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from typing import Any

from trt_runtime.contract import cuda_result

__all__ = ["CudaArray", "cuda_unavailable", "device_to_numpy", "gpu_unavailable", "pointer_device"]


def _rt() -> Any:
    from cuda.bindings import runtime

    return runtime


@functools.lru_cache(maxsize=1)
def gpu_unavailable() -> str | None:
    """Why a TensorRT-RTX engine cannot run on a CUDA GPU here (the GPU tests' skip reason),
    or ``None``."""
    try:
        import tensorrt_rtx  # noqa: F401
    except ImportError as exc:
        return f"tensorrt_rtx is not installed ({exc}): pip install -c constraints.txt -e '.[rtx]'"
    return cuda_unavailable()


@functools.lru_cache(maxsize=1)
def cuda_unavailable() -> str | None:
    """Why :class:`CudaArray` cannot be made here, or ``None``."""
    try:
        rt = _rt()
    except ImportError as exc:
        return f"cuda-python is not installed ({exc}): pip install -c constraints.txt -e '.[cuda]'"
    try:
        err, count = rt.cudaGetDeviceCount()
    except Exception as exc:
        return f"no CUDA device: cudaGetDeviceCount raised {exc}"
    if int(err) != 0 or not count:
        return f"no CUDA device: cudaGetDeviceCount returned {err!s}, {count} device(s)"
    return None


class _Allocation:
    """Owns one ``cudaMalloc`` block; freed when the last array over it goes."""

    def __init__(self, nbytes: int, device: int) -> None:
        rt = _rt()
        self.device = device
        previous = cuda_result(rt.cudaGetDevice(), "cudaGetDevice")
        cuda_result(rt.cudaSetDevice(device), "cudaSetDevice")
        try:
            self.ptr = int(cuda_result(rt.cudaMalloc(max(nbytes, 1)), "cudaMalloc"))
        finally:
            rt.cudaSetDevice(previous)
        self._finalizer = weakref.finalize(self, rt.cudaFree, self.ptr)


class CudaArray:
    """An array in CUDA device memory exposing only ``__cuda_array_interface__``.

    Made by :meth:`from_numpy` (a synchronous copy: the data is ready when it returns) or
    :meth:`empty`. :meth:`every_other` gives a strided, non-contiguous view. The memory
    is freed when the last array over it is garbage collected.
    """

    __slots__ = ("_allocation", "device", "dtype", "offset", "shape", "strides")

    def __init__(self, allocation: _Allocation, shape: Sequence[int], dtype: Any,
                 strides: tuple[int, ...] | None = None, offset: int = 0) -> None:
        import numpy as np

        self._allocation = allocation
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.strides = strides  # bytes; None: C-contiguous
        self.offset = offset
        self.device = allocation.device

    @classmethod
    def empty(cls, shape: Sequence[int], dtype: Any, device: int = 0) -> CudaArray:
        import numpy as np

        dtype = np.dtype(dtype)
        count = 1
        for d in shape:
            count *= int(d)
        return cls(_Allocation(count * dtype.itemsize, device), shape, dtype)

    @classmethod
    def from_numpy(cls, array: Any, device: int = 0) -> CudaArray:
        """A device copy of ``array`` (made C-contiguous first)."""
        import numpy as np

        host = np.ascontiguousarray(array)
        out = cls.empty(host.shape, host.dtype, device)
        if host.nbytes:
            rt = _rt()
            cuda_result(rt.cudaMemcpy(out.ptr, host.ctypes.data, host.nbytes,
                                      rt.cudaMemcpyKind.cudaMemcpyHostToDevice), "cudaMemcpy")
        return out

    @property
    def ptr(self) -> int:
        return self._allocation.ptr + self.offset

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ptr, False),
            "strides": self.strides,
            "version": 3,
            "stream": None,  # from_numpy copies synchronously; nothing to wait for
        }

    def every_other(self, axis: int) -> CudaArray:
        """A view of every other element along ``axis`` (not C-contiguous when the result
        has more than one element there)."""
        strides = list(self.strides or _c_strides(self.shape, self.dtype.itemsize))
        shape = list(self.shape)
        shape[axis] = (shape[axis] + 1) // 2
        strides[axis] *= 2
        return CudaArray(self._allocation, shape, self.dtype, tuple(strides), self.offset)

    def numpy(self) -> Any:
        return device_to_numpy(self)

    def __repr__(self) -> str:
        return f"CudaArray(shape={self.shape}, dtype={self.dtype}, device={self.device})"


def _c_strides(shape: Sequence[int], itemsize: int) -> tuple[int, ...]:
    strides = []
    acc = itemsize
    for dim in reversed(shape):
        strides.append(acc)
        acc *= max(int(dim), 1)
    return tuple(reversed(strides))


def device_to_numpy(value: Any) -> Any:
    """Copy a C-contiguous ``__cuda_array_interface__`` array to a new numpy array.

    Waits for the ``stream`` the interface names (as a consumer must); with no stream,
    the copy runs in the legacy default stream's order, so work still queued on another
    non-blocking stream is *not* waited for: a producer that hands out such an array
    with ``stream`` ``None`` breaks the contract, and this copy shows it.
    """
    import numpy as np

    rt = _rt()
    cai = value.__cuda_array_interface__
    shape = tuple(int(d) for d in cai["shape"])
    dtype = np.dtype(cai["typestr"])
    strides = cai.get("strides")
    if strides is not None and tuple(strides) != _c_strides(shape, dtype.itemsize):
        raise ValueError(f"device_to_numpy needs a C-contiguous array; got strides {strides}")
    stream = cai.get("stream")
    if stream:
        cuda_result(rt.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
    out = np.empty(shape, dtype=dtype)
    if out.nbytes:
        cuda_result(rt.cudaMemcpy(out.ctypes.data, int(cai["data"][0]), out.nbytes,
                                  rt.cudaMemcpyKind.cudaMemcpyDeviceToHost), "cudaMemcpy")
    return out


def pointer_device(ptr: int) -> int | None:
    """The CUDA device of a device pointer; ``None`` for host memory or when unknown."""
    rt = _rt()
    err, attrs = rt.cudaPointerGetAttributes(ptr)
    if int(err) != 0:
        return None
    if int(attrs.type) in (2, 3):  # cudaMemoryTypeDevice, cudaMemoryTypeManaged
        return int(attrs.device)
    return None
