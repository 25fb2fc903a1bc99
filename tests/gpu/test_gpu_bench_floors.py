"""The raw floors of ``benchmarks/bench_concurrency.py`` on the GPU: the bare TensorRT-RTX
loops that make a new output per call (``Row.alloc``), against which the runtime's
``engine(x)`` under threads is read. Each must return a new tensor per call with the
caller's right output, eager and under its graph."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("outer", [False, True], ids=["eager", "outer"])
def test_gpu_raw_alloc_floor_returns_a_new_right_output_per_call(outer: bool) -> None:
    torch = pytest.importorskip("torch", reason="the raw loops run on torch tensors and streams")
    from benchmarks import workloads
    from benchmarks.concurrency_callers import raw_callers
    from benchmarks.raw_rows import open_engine

    workload = workloads.WORKLOADS_BY_KEY["tiny"]
    built, _ = workloads.build(workload)
    raw = open_engine(built.plan)
    shape = tuple(workload.shapes[0])
    bound, fresh = (raw_callers(raw, torch, built, shape, 2, outer=outer, alloc=alloc)
                    for alloc in (False, True))
    for plain, caller in zip(bound, fresh, strict=True):
        with torch.cuda.stream(caller.stream):  # as the caller's thread does (prepare())
            outputs = [caller.call() for _ in range(3)]
        assert all(caller.check(y) for y in outputs)  # each equals the caller's serial output
        assert len({y.data_ptr() for y in outputs}) == 3  # a new output per call, all alive
        assert all(y.data_ptr() != caller.y.data_ptr() for y in outputs)  # not the bound buffer
        with torch.cuda.stream(plain.stream):
            again = plain.call()
        assert plain.check(again) and again is plain.y  # the bound loop hands its one buffer back
        torch.testing.assert_close(outputs[0], again)  # the same input: the same output
