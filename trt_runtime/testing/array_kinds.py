"""The array kinds of the device contract: what goes into an engine, what must come out.

docs/device-contract.md names four kinds of arrays. The conformance kit feeds each kind
a backend accepts and checks the kind of what comes back:

========================  ===========================================================
``"numpy"``               a host ``numpy.ndarray``
``"torch_cpu"``           a ``torch.Tensor`` on the CPU
``"torch_cuda"``          a ``torch.Tensor`` on a CUDA device
``"cuda_array"``          any other CUDA array (``__cuda_array_interface__`` / DLPack)
========================  ===========================================================

The kinds are :class:`trt_runtime.contract.ArrayKind`; the output kind of a call follows
its inputs (:func:`trt_runtime.contract.output_kind`, re-exported here): any CUDA torch
tensor -> CUDA torch tensors; else any other CUDA array -> device arrays; else any CPU
torch tensor -> CPU torch tensors; else numpy arrays.

Nothing here imports torch or cuda-python at import time; functions that need them
import them when called, and :func:`unavailable` says why a kind cannot be made here.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from typing import Any

from trt_runtime.contract import ArrayKind, output_kind
from trt_runtime.dtypes import normalize_dtype

__all__ = [
    "ALL_KINDS",
    "CUDA_ARRAY",
    "DEVICE_KINDS",
    "HOST_KINDS",
    "NUMPY",
    "TORCH_CPU",
    "TORCH_CUDA",
    "address",
    "assert_output",
    "converter",
    "device_of",
    "dtype_of",
    "empty",
    "kind_of",
    "non_contiguous",
    "output_kind",
    "overwrite",
    "shape_key",
    "standard_converters",
    "to_numpy",
    "unavailable",
]

NUMPY = ArrayKind.NUMPY
TORCH_CPU = ArrayKind.TORCH_CPU
TORCH_CUDA = ArrayKind.TORCH_CUDA
CUDA_ARRAY = ArrayKind.CUDA_ARRAY
#: Every kind, in the order tests are parametrized.
ALL_KINDS = (NUMPY, TORCH_CPU, TORCH_CUDA, CUDA_ARRAY)
#: Kinds in host memory (a backend needs ``supports_host_io`` to take them).
HOST_KINDS = frozenset({NUMPY, TORCH_CPU})
#: Kinds in device memory.
DEVICE_KINDS = frozenset({TORCH_CUDA, CUDA_ARRAY})

_KDLCUDA = (2, 13)  # kDLCUDA, kDLCUDAManaged


# -- what can be made here ------------------------------------------------------------------
def _torch_reason() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    return None


def _cuda_reason() -> str | None:
    from trt_runtime.testing.cuda_arrays import cuda_unavailable

    return cuda_unavailable()


def unavailable(kind: str, *, host_io: bool = True) -> str | None:
    """Why arrays of ``kind`` cannot be used here, or ``None`` when they can.

    ``host_io``: whether the backend declares ``supports_host_io`` (host kinds need it).
    """
    if kind not in ALL_KINDS:
        raise ValueError(f"array kind must be one of {', '.join(map(repr, ALL_KINDS))}; got {kind!r}")
    if kind in HOST_KINDS and not host_io:
        return "the backend lacks supports_host_io"
    if kind in (TORCH_CPU, TORCH_CUDA):
        reason = _torch_reason()
        if reason is not None:
            return reason
    if kind == TORCH_CUDA:
        import torch

        if not torch.cuda.is_available():
            return "no CUDA device for torch (torch.cuda.is_available() is False)"
    if kind == CUDA_ARRAY:
        return _cuda_reason()
    return None


def converter(kind: str, device: int = 0) -> Callable[[Any], Any]:
    """A function turning a numpy array into a new array of ``kind`` (on ``device``)."""
    import numpy as np

    if kind == NUMPY:
        return lambda a: np.array(a, copy=True, order="C")
    if kind == TORCH_CPU:
        import torch

        return lambda a: torch.from_numpy(np.array(a, copy=True, order="C"))
    if kind == TORCH_CUDA:
        import torch

        where = torch.device("cuda", device)
        return lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(where)
    if kind == CUDA_ARRAY:
        from trt_runtime.testing.cuda_arrays import CudaArray

        return lambda a: CudaArray.from_numpy(a, device)
    raise ValueError(f"array kind must be one of {', '.join(map(repr, ALL_KINDS))}; got {kind!r}")


def standard_converters(device: int = 0, *, host_io: bool = True) -> dict[str, Callable[[Any], Any]]:
    """A converter for every kind that can be made here (see :func:`unavailable`)."""
    return {kind: converter(kind, device) for kind in ALL_KINDS if unavailable(kind, host_io=host_io) is None}


def empty(kind: str, shape: Sequence[int], dtype: str, device: int = 0) -> Any:
    """A new uninitialised array of ``kind``, ``shape`` and canonical ``dtype``."""
    import numpy as np

    from trt_runtime.dtypes import to_numpy as np_dtype

    shape = tuple(int(d) for d in shape)
    if kind == NUMPY:
        return np.empty(shape, dtype=np_dtype(dtype))
    if kind in (TORCH_CPU, TORCH_CUDA):
        import torch

        where = torch.device("cpu") if kind == TORCH_CPU else torch.device("cuda", device)
        return torch.empty(shape, dtype=getattr(torch, dtype), device=where)
    if kind == CUDA_ARRAY:
        from trt_runtime.testing.cuda_arrays import CudaArray

        return CudaArray.empty(shape, np_dtype(dtype), device)
    raise ValueError(f"array kind must be one of {', '.join(map(repr, ALL_KINDS))}; got {kind!r}")


def non_contiguous(kind: str, array: Any, convert: Callable[[Any], Any]) -> Any | None:
    """An array of ``kind`` with the values and shape of the numpy ``array`` that is *not*
    C-contiguous (every other element of a twice-as-long axis); ``None`` when ``array``
    has no axis longer than 1, so every layout of it is contiguous."""
    import numpy as np

    axes = [i for i, d in enumerate(array.shape) if d > 1]
    if not axes:
        return None
    axis = axes[-1]
    base = convert(np.repeat(array, 2, axis=axis))
    every_other = getattr(base, "every_other", None)
    if every_other is not None:  # CudaArray
        return every_other(axis)
    index = (slice(None),) * axis + (slice(None, None, 2),)
    return base[index]


def overwrite(value: Any, array: Any) -> bool:
    """Write the numpy ``array`` into ``value`` in place (numpy, or torch on any device,
    on torch's current stream); ``False`` when ``value`` is of a kind with no in-place write."""
    import numpy as np

    if isinstance(value, np.ndarray):
        value[...] = array
        return True
    if _is_torch(value):
        import torch

        value.copy_(torch.from_numpy(np.ascontiguousarray(array)))
        return True
    return False


# -- what an array is -----------------------------------------------------------------------
def _is_torch(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "data_ptr")


def _cai(value: Any) -> dict[str, Any] | None:
    try:
        return getattr(value, "__cuda_array_interface__", None)  # type: ignore[no-any-return]
    except Exception:  # torch raises for CPU tensors
        return None


def kind_of(value: Any) -> str | None:
    """The kind of ``value``, or ``None`` when it is none of the four."""
    import numpy as np

    if _is_torch(value):
        return TORCH_CUDA if value.device.type == "cuda" else TORCH_CPU
    if isinstance(value, np.ndarray):
        return NUMPY
    if _cai(value) is not None:
        return CUDA_ARRAY
    dl_device = getattr(value, "__dlpack_device__", None)
    if dl_device is not None and hasattr(value, "__dlpack__"):
        try:
            device_type, _ = dl_device()
        except Exception:
            return None
        if int(device_type) in _KDLCUDA:
            return CUDA_ARRAY
    return None


def device_of(value: Any) -> int | None:
    """The CUDA device index of a device array (``None`` for host arrays or when unknown)."""
    if _is_torch(value):
        return value.device.index if value.device.type == "cuda" else None
    dl_device = getattr(value, "__dlpack_device__", None)
    if dl_device is not None:
        try:
            device_type, index = dl_device()
        except Exception:
            device_type, index = 0, 0
        if int(device_type) in _KDLCUDA:
            return int(index)
    cai = _cai(value)
    if cai is not None:
        from trt_runtime.testing.cuda_arrays import pointer_device

        return pointer_device(int(cai["data"][0]))
    return None


_TYPESTR = {"f4": "float32", "f2": "float16", "i4": "int32", "i8": "int64", "i1": "int8",
            "u1": "uint8", "b1": "bool"}


def dtype_of(value: Any) -> str:
    """The canonical dtype name of any array kind (the raw text when it has no name)."""
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        cai = _cai(value)
        if cai is not None:
            return _TYPESTR.get(cai["typestr"][1:], cai["typestr"])
        return "?"
    try:
        return normalize_dtype(dtype)
    except ValueError:
        return str(dtype)


def address(value: Any) -> int | None:
    """Where the data of ``value`` starts (host or device address), to tell views from copies."""
    if _is_torch(value):
        return int(value.data_ptr())
    interface = getattr(value, "__array_interface__", None)
    if interface is not None:
        return int(interface["data"][0])
    cai = _cai(value)
    if cai is not None:
        return int(cai["data"][0])
    ptr = getattr(value, "ptr", None)
    return int(ptr) if isinstance(ptr, int) else None


def shape_key(inputs: Sequence[Any]) -> tuple[tuple[int, ...], ...]:
    """The input shapes of a call as plain tuples (what outer graphs are keyed by)."""
    key = []
    for value in inputs:
        shape = getattr(value, "shape", None)
        if shape is None:
            cai = _cai(value)
            shape = cai["shape"] if cai is not None else ()
        key.append(tuple(int(d) for d in shape))
    return tuple(key)


def to_numpy(value: Any) -> Any:
    """A host numpy copy of an array of any kind (torch on any device, CUDA arrays, lists)."""
    import numpy as np

    if _is_torch(value):
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        return value.numpy()
    if isinstance(value, np.ndarray):
        return value
    if _cai(value) is not None:
        from trt_runtime.testing.cuda_arrays import device_to_numpy

        return device_to_numpy(value)
    if kind_of(value) == CUDA_ARRAY:  # DLPack only: let torch read it, if it is here
        import torch

        return to_numpy(torch.from_dlpack(value))
    return np.asarray(value)


def assert_output(
    kind: str, value: Any, *, name: str, dtype: str, shape: Sequence[int], device: int | None
) -> None:
    """Assert that one output is of ``kind`` (on ``device`` for device kinds), has the
    canonical ``dtype`` and ``shape``; the message names the output."""
    got = kind_of(value)
    if kind == CUDA_ARRAY:
        # A CUDA torch tensor is a device array too (it exposes both protocols).
        ok = got in (CUDA_ARRAY, TORCH_CUDA)
    else:
        ok = got == kind
    assert ok, (
        f"output {name!r}: inputs of kind {kind!r} must give outputs of kind {kind!r}; "
        f"got {type(value).__module__}.{type(value).__name__} (kind {got!r})"
    )
    if kind in DEVICE_KINDS and device is not None:
        where = device_of(value)
        assert where is None or where == device, (
            f"output {name!r} is on cuda:{where}; the engine runs on cuda:{device}"
        )
    got_dtype = dtype_of(value)
    assert got_dtype == dtype, f"output {name!r} has dtype {got_dtype}; the engine's output is {dtype}"
    got_shape = tuple(int(d) for d in value.shape) if hasattr(value, "shape") else shape_key([value])[0]
    assert got_shape == tuple(shape), f"output {name!r} has shape {got_shape}; expected {tuple(shape)}"
