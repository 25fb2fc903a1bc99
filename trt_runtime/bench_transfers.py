"""Where a call's time goes on the GPU: host-to-device copies, compute, device-to-host copies.

:func:`transfer_split` times the three parts separately with CUDA events on one
``cuda.core`` stream (:class:`~trt_runtime.bench.CudaEventTimer`), as trtexec reports
H2D / GPU compute / D2H: the inputs are copied into device arrays with
``cudaMemcpyAsync`` from (pageable) host memory, the engine runs on those device arrays
(device in, device out, per the device contract), and its outputs are copied back.
Where there is no CUDA device (CPU backends such as ``memory``) it returns ``None`` and
the reason: the split is not applicable there.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

from trt_runtime.bench import CudaEventTimer, percentile
from trt_runtime.contract import cuda_result
from trt_runtime.extras import install_hint

__all__ = ["TransferSplit", "transfer_split"]


@dataclasses.dataclass(frozen=True, slots=True)
class TransferSplit:
    """Per-call GPU times of each part, in microseconds."""

    h2d_us: tuple[float, ...]
    compute_us: tuple[float, ...]
    d2h_us: tuple[float, ...]

    def medians(self) -> dict[str, float]:
        """``{"h2d_us", "compute_us", "d2h_us"}``: the median of each part."""
        return {
            "h2d_us": percentile(self.h2d_us, 50),
            "compute_us": percentile(self.compute_us, 50),
            "d2h_us": percentile(self.d2h_us, 50),
        }

    def to_dict(self) -> dict[str, Any]:
        return {**self.medians(), "iterations": len(self.compute_us)}


def _ignore_stream(fn: Any, value: Any, _stream: Any) -> Any:
    return fn(value)


def _memcpy(rt: Any, dst: int, src: int, nbytes: int, kind: Any, stream: Any) -> None:
    if nbytes:
        cuda_result(rt.cudaMemcpyAsync(dst, src, nbytes, kind, stream), f"cudaMemcpyAsync of {nbytes} bytes")


def transfer_split(
    engine: Any, inputs: Sequence[Any], *, iterations: int = 20, warmup: int = 2
) -> tuple[TransferSplit | None, str]:
    """``(split, "")``, or ``(None, why)`` where it cannot be measured (no CUDA device).

    ``inputs`` are host numpy arrays. Each iteration copies them to the device, runs
    ``engine.execute`` on the device copies and copies every output back, each part
    between its own pair of CUDA events.
    """
    import numpy as np

    timer, note = CudaEventTimer.create(getattr(engine, "device", None))
    if timer is None:
        return None, note
    try:
        from cuda.bindings import runtime as rt

        from trt_runtime.testing.cuda_arrays import CudaArray
    except ImportError as exc:
        return None, f"cuda-python is not importable ({exc}): {install_hint('cuda')}"
    device = getattr(engine, "device", None) or 0
    hosts = [np.ascontiguousarray(a) for a in inputs]
    devices = [CudaArray.empty(a.shape, a.dtype, device) for a in hosts]
    stream = timer.stream.handle
    h2d_kind, d2h_kind = rt.cudaMemcpyKind.cudaMemcpyHostToDevice, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost

    def h2d(_s: Any) -> None:
        for host, dev in zip(hosts, devices, strict=True):
            _memcpy(rt, dev.ptr, host.ctypes.data, host.nbytes, h2d_kind, stream)

    def d2h(outputs: Sequence[Any]) -> list[Any]:
        copies = []
        for value in outputs:
            cai = value.__cuda_array_interface__
            host = np.empty(tuple(cai["shape"]), np.dtype(cai["typestr"]))
            _memcpy(rt, host.ctypes.data, int(cai["data"][0]), host.nbytes, d2h_kind, stream)
            copies.append(host)
        return copies

    parts: tuple[list[float], list[float], list[float]] = ([], [], [])
    try:
        for i in range(warmup + iterations):
            _, t_h2d = timer.time(h2d)
            outputs, t_compute = timer.time(lambda s: engine.execute(*devices, stream=s))
            _, t_d2h = timer.time(functools.partial(_ignore_stream, d2h, outputs))
            if i >= warmup:
                for part, value in zip(parts, (t_h2d, t_compute, t_d2h), strict=True):
                    part.append(value)
    except Exception as exc:  # a backend that cannot take device arrays on this stream
        return None, f"could not time the parts: {type(exc).__name__}: {exc}"
    return TransferSplit(tuple(parts[0]), tuple(parts[1]), tuple(parts[2])), ""
