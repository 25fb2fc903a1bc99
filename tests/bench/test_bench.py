"""CPU tests of trt_runtime.bench's per-call metrics: enqueue, latency, GPU events, summaries."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trt_runtime.bench import summarize, time_enqueue, time_gpu, time_latency


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=1e6, allow_nan=False), min_size=1, max_size=200))
def test_bench_summarize_matches_numpy(samples: list[float]) -> None:
    s = summarize(samples)
    assert s.n == len(samples)
    for value, q in ((s.median, 50), (s.p10, 10), (s.p90, 90), (s.p99, 99)):
        assert value == pytest.approx(float(np.percentile(samples, q)), rel=1e-9, abs=1e-9)
    assert s.mean == pytest.approx(float(np.mean(samples)), rel=1e-9, abs=1e-9)
    assert (s.min, s.max) == (min(samples), max(samples))
    assert s.min <= s.p10 <= s.median <= s.p90 <= s.p99 <= s.max
    assert s.to_dict()["median"] == s.median


def test_bench_summarize_rejects_empty() -> None:
    with pytest.raises(ValueError, match="empty list of samples"):
        summarize([])


def _cycle(log: list[int], k: int) -> list[Any]:
    return [lambda i=i: log.append(i) for i in range(k)]


def test_bench_time_latency_cycles_from_start_and_times_the_synchronize() -> None:
    log: list[int] = []
    syncs: list[int] = []
    samples = time_latency(_cycle(log, 3), lambda: syncs.append(len(log)), 5, start=2)
    assert log == [2, 0, 1, 2, 0]
    assert syncs == [1, 2, 3, 4, 5]  # one synchronize after every call
    assert len(samples) == 5
    slow = time_latency([lambda: None], lambda: time.sleep(0.002), 3)
    assert min(slow) >= 2000.0  # the synchronize is inside the timed region


def test_bench_time_enqueue_keeps_the_synchronize_out_of_the_enqueue_figure() -> None:
    log: list[int] = []
    syncs: list[int] = []
    enqueue, drained = time_enqueue(_cycle(log, 3), lambda: syncs.append(len(log)), 2, 4, start=1)
    assert log == [1, 2, 0, 1, 2, 0, 1, 2]
    assert syncs == [0, 4, 8]  # before the first chunk and after each chunk, never inside one
    assert len(enqueue) == len(drained) == 2
    assert all(d >= e for e, d in zip(enqueue, drained, strict=True))

    # A 4 ms drain is excluded from enqueue and divided over the chunk's 4 calls in drained.
    enqueue, drained = time_enqueue([lambda: None], lambda: time.sleep(0.004), 3, 4)
    assert max(enqueue) < 500.0
    assert min(drained) >= 1000.0
    # A call that costs 1 ms of CPU shows in enqueue, per call.
    enqueue, _ = time_enqueue([lambda: time.sleep(0.001)], lambda: None, 2, 3)
    assert min(enqueue) >= 1000.0


class _Timer:
    """Events whose timestamps are given: event i completes at ``stamps[i]`` µs."""

    def __init__(self, stamps: list[float], can_gate: bool = True) -> None:
        self.stamps = stamps
        self.can_gate = can_gate
        self.trace: list[Any] = []

    def gate(self, us: float) -> bool:
        self.trace.append(("gate", us))
        return self.can_gate

    def record(self, index: int) -> None:
        self.trace.append(("record", index))

    def elapsed_us(self, first: int, second: int) -> float:
        return self.stamps[second] - self.stamps[first]

    def synchronize(self) -> None:
        self.trace.append(("sync",))


def test_bench_time_gpu_records_around_every_call_behind_the_gate() -> None:
    log: list[int] = []
    timer = _Timer([0.0, 10.0, 25.0, 31.0])

    def step(i: int) -> Any:
        def call() -> None:
            log.append(i)
            timer.trace.append(("call", i))

        return call

    calls = [step(i) for i in range(2)]
    samples, gated = time_gpu(calls, timer, 3, gate_us=500.0, start=1)
    assert samples == [10.0, 15.0, 6.0]  # consecutive event differences, one per call
    assert gated is True
    assert timer.trace == [
        ("gate", 500.0),
        ("record", 0),
        ("call", 1),
        ("record", 1),
        ("call", 0),
        ("record", 2),
        ("call", 1),
        ("record", 3),
        ("sync",),
    ]
    ungated = _Timer([0.0, 1.0], can_gate=False)
    assert time_gpu([lambda: None], ungated, 1, gate_us=100.0) == ([1.0], False)
    no_gate = _Timer([0.0, 1.0])
    assert time_gpu([lambda: None], no_gate, 1)[1] is False
    assert no_gate.trace[0] == ("record", 0)  # gate_us=0: no gate queued


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: time_latency([], lambda: None, 1), "nothing to time: no calls"),
        (lambda: time_latency([lambda: None], lambda: None, 0), "iterations must be an int >= 1; got 0"),
        (lambda: time_enqueue([lambda: None], lambda: None, 1, 0), "chunk must be an int >= 1; got 0"),
        (lambda: time_enqueue([lambda: None], lambda: None, True, 2), "chunks must be an int >= 1; got True"),
        (lambda: time_gpu([lambda: None], _Timer([0.0]), 0), "chunk must be an int >= 1; got 0"),
    ],
)
def test_bench_metrics_reject_bad_counts(call: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()
