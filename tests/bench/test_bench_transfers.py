"""The H2D / compute / D2H split of ``bench``: n/a without a GPU; on a fake GPU (events,
copies and device arrays recorded, not performed) each part is timed apart, in order."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from trt_runtime import bench
from trt_runtime.bench_transfers import TransferSplit, transfer_split


class _FakeArray:
    def __init__(self, shape: tuple[int, ...], dtype: Any, device: int = 0) -> None:
        self.shape, self.dtype, self.device, self.ptr = shape, np.dtype(dtype), device, 0x1000

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False), "version": 3}


_FAKE_EMPTY = classmethod(lambda cls, shape, dtype, device=0: _FakeArray(shape, dtype, device))


class _FakeTimer:
    """Times each ``fn(stream)`` as 10 µs times the number of calls so far (distinct values)."""

    def __init__(self, log: list[str]) -> None:
        self.stream = type("Stream", (), {"handle": 7})()
        self.log = log
        self.calls = 0

    def time(self, fn: Any) -> tuple[Any, float]:
        self.calls += 1
        return fn(self.stream), 10.0 * self.calls


class _Engine:
    device = 0

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def execute(self, *inputs: Any, stream: Any = None) -> list[Any]:
        assert all(isinstance(a, _FakeArray) for a in inputs) and stream.handle == 7
        self.log.append("compute")
        return [_FakeArray((2, 3), np.float32)]


def test_transfer_split_is_na_without_a_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    no_gpu = classmethod(lambda cls, device=None: (None, "no GPU"))
    monkeypatch.setattr(bench.CudaEventTimer, "create", no_gpu)
    assert transfer_split(_Engine([]), [np.zeros(3, np.float32)]) == (None, "no GPU")


def test_transfer_split_times_each_part_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    from cuda.bindings import runtime

    from trt_runtime.testing import cuda_arrays

    log: list[str] = []
    timer = _FakeTimer(log)
    monkeypatch.setattr(bench.CudaEventTimer, "create", classmethod(lambda cls, device=None: (timer, "")))
    monkeypatch.setattr(cuda_arrays.CudaArray, "empty", _FAKE_EMPTY)

    def memcpy(dst: int, src: int, nbytes: int, kind: Any, stream: Any) -> tuple[Any]:
        assert stream == 7 and nbytes > 0
        log.append("h2d" if kind == runtime.cudaMemcpyKind.cudaMemcpyHostToDevice else "d2h")
        return (runtime.cudaError_t.cudaSuccess,)

    monkeypatch.setattr(runtime, "cudaMemcpyAsync", memcpy)
    inputs = [np.ones((2, 3), np.float32), np.ones(4, np.int32)]
    split, note = transfer_split(_Engine(log), inputs, iterations=3, warmup=1)
    assert note == "" and isinstance(split, TransferSplit)
    # 4 rounds (1 warmup + 3): two input copies, one call, one output copy, in that order.
    assert log == ["h2d", "h2d", "compute", "d2h"] * 4
    assert split.h2d_us == (40.0, 70.0, 100.0)  # timer calls 4, 7, 10: warmup dropped
    assert split.compute_us == (50.0, 80.0, 110.0) and split.d2h_us == (60.0, 90.0, 120.0)
    assert split.to_dict() == {"h2d_us": 70.0, "compute_us": 80.0, "d2h_us": 90.0, "iterations": 3}


def test_transfer_split_reports_a_backend_that_refuses_device_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    from trt_runtime.testing import cuda_arrays

    timer = _FakeTimer([])
    monkeypatch.setattr(bench.CudaEventTimer, "create", classmethod(lambda cls, device=None: (timer, "")))
    monkeypatch.setattr(cuda_arrays.CudaArray, "empty", _FAKE_EMPTY)

    class NumpyOnly(_Engine):
        def execute(self, *inputs: Any, stream: Any = None) -> list[Any]:
            raise TypeError("input 'x' must be a numpy array")

    split, note = transfer_split(NumpyOnly([]), [np.zeros(0, np.float32)], iterations=1, warmup=0)
    assert split is None and note == "could not time the parts: TypeError: input 'x' must be a numpy array"
