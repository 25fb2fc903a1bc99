"""What the tests of the benchmarks package share: the repository root and a measured row."""

from __future__ import annotations

from pathlib import Path

from benchmarks import runner
from trt_runtime.bench import summarize

ROOT = Path(__file__).resolve().parents[2]


def row_result(
    workload: str, row: str, enqueue: float, latency: float = 50.0, gpu: float = 30.0
) -> runner.RowResult:
    r = runner.RowResult(workload, row, status="ok")
    r.stats = {
        "enqueue": summarize([enqueue] * 3),
        "latency": summarize([latency] * 3),
        "gpu": summarize([gpu] * 3),
    }
    return r
