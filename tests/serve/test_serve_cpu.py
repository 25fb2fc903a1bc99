"""``benchmarks/serve_cpu.py``: the CPU time of processes by role over a window, and the engine figures."""

from __future__ import annotations

import os
import threading
import time

import pytest

from benchmarks.serve_cpu import CellProfile, _engine_figures, cpu_seconds, describe, summarize

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux /proc")


def test_serve_cpu_seconds_counts_a_busy_thread_apart_from_the_main_thread() -> None:
    seen: list[tuple[float, float | None, float | None]] = []

    def spin() -> None:  # CPU time, not wall time: the machine may be shared
        main_before = cpu_seconds(os.getpid(), os.getpid())
        while time.thread_time() < 0.25:
            pass
        seen.append((time.thread_time(), cpu_seconds(os.getpid(), threading.get_native_id()),
                     main_before))

    before = cpu_seconds(os.getpid())
    thread = threading.Thread(target=spin)
    thread.start()
    thread.join()
    after = cpu_seconds(os.getpid())
    own, read, main_before = seen[0]
    assert read is not None and abs(read - own) <= 0.05  # /proc counts in ticks of 10 ms
    assert before is not None and after is not None and after - before >= 0.2  # the process holds it
    main_after = cpu_seconds(os.getpid(), os.getpid())
    assert main_before is not None and main_after is not None and main_after - main_before < 0.2
    assert cpu_seconds(2**22 + 12345) is None  # no such process


def test_serve_cpu_profile_reports_each_role_in_percent_of_a_core() -> None:
    profile = CellProfile({"engine": [os.getpid()], "front": [], "load": [os.getpid()]}, engines=1)
    start = time.time() + 0.05
    profile.begin(start, start + 0.4)
    end = start + 0.4
    while time.time() < end:  # this thread (the main one: the "loop") is busy the whole window
        pass
    result = profile.result()
    cpu = result["cpu"]
    assert set(cpu) == {"engine", "engine_loop", "engine_threads", "load"}  # an empty role is left out
    assert 20 <= cpu["engine_loop"]["max"] <= 130  # 2 shared cores: the spinning thread gets a share
    assert cpu["engine_threads"]["max"] < cpu["engine_loop"]["max"] - 10
    assert result["engine"] == {}  # no metrics URL


def test_serve_cpu_engine_figures_are_deltas_over_the_window() -> None:
    before = {"trt_runtime_batch_requests_sum": 100.0, "trt_runtime_batch_requests_count": 10.0,
              "trt_runtime_batch_size_sum": 100.0, "trt_runtime_compute_seconds_count": 10.0,
              "trt_runtime_compute_seconds_sum": 0.5}
    after = {"trt_runtime_batch_requests_sum": 500.0, "trt_runtime_batch_requests_count": 60.0,
             "trt_runtime_batch_size_sum": 500.0, "trt_runtime_compute_seconds_count": 60.0,
             "trt_runtime_compute_seconds_sum": 1.5, "trt_runtime_queue_seconds_sum": 0.4,
             "trt_runtime_queue_seconds_count": 400.0}
    figures = _engine_figures(before, after, wall=2.0, engines=2)
    assert figures == {"requests_per_batch": 8.0, "queue_ms": 1.0, "rows_per_call": 8.0, "call_ms": 20.0,
                       "calls_s": 25.0, "engine_busy": 0.25}
    assert summarize([10.0, 30.0]) == {"mean": 20.0, "max": 30.0}
    cpu = {"front": {"mean": 50, "max": 60}, "engine": {"mean": 99, "max": 100},
           "engine_loop": {"mean": 80, "max": 81}, "engine_threads": {"mean": 19, "max": 20}}
    line = describe({"cpu": cpu, "engine": figures})
    assert line == "  cpu% front 50/60 engine 99/100 (loop 81 threads 20) | batch 8.0 busy 25% call 20.000 ms"


def test_serve_cpu_engine_figures_split_a_request_into_route_and_round_trip() -> None:
    route, trip = "trt_runtime_request_seconds", "trt_runtime_engine_round_trip_seconds"
    before = {f"{route}_sum": 1.0, f"{route}_count": 1000.0, f"{trip}_sum": 0.5, f"{trip}_count": 1000.0}
    after = {f"{route}_sum": 3.0, f"{route}_count": 2000.0, f"{trip}_sum": 2.0, f"{trip}_count": 2000.0,
             "trt_runtime_queue_seconds_sum": 0.2, "trt_runtime_queue_seconds_count": 1000.0}
    figures = _engine_figures(before, after, wall=1.0, engines=1)
    assert figures == {"request_ms": 2.0, "round_trip_ms": 1.5}  # no batch counted: no queue figure
    line = describe({"engine": {**figures, "queue_ms": 0.2}})
    assert line == " | ms: route 2.000 trip 1.500 queue 0.200"
