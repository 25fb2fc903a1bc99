"""What a serving cell spent its CPU on: per process role, and inside the engine processes.

:class:`CellProfile` reads, at the start and at the end of a cell's measuring window, the
CPU time (``utime + stime`` of ``/proc/<pid>/stat``, every Linux) of each process of a
role (``front``, ``engine``, ``supervisor``, ``load``), and of each engine process its
event-loop thread (the main thread: decode, batching, answers) apart from its other
threads (engine calls, batch assembly). A process at ~100 % of one core is the
bottleneck. It also reads the server's ``GET /metrics`` at both ends: requests per batch,
rows per engine call, and the share of the window each engine process spent inside engine
calls (``engine_busy``). Where ``/proc`` is missing the CPU part is empty.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["CellProfile", "cpu_seconds", "describe", "pin_apart", "summarize"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def pin_apart(alone: Sequence[int], others: Sequence[int]) -> None:
    """The processes ``alone`` on the last CPU this process may use, ``others`` on the rest (a
    probe measuring one process's CPU keeps the load off its core); nothing with one CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return
    for pids, where in ((alone, {cpus[-1]}), (others, set(cpus[:-1]))):
        for pid in pids:
            with contextlib.suppress(OSError, TypeError):
                os.sched_setaffinity(pid, where)


def cpu_seconds(pid: int, tid: int | None = None) -> float | None:
    """User + system CPU seconds of process ``pid`` (or of its thread ``tid``); ``None`` if gone."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(b")") + 2:].split()  # the name may hold spaces: cut after it
    return (int(fields[11]) + int(fields[12])) / _TICK  # fields 14 and 15 of proc(5)


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def _engine_split(pid: int) -> tuple[float, float] | None:
    """``(loop thread, other threads)`` CPU seconds of one engine process."""
    loop = cpu_seconds(pid, pid)
    if loop is None:
        return None
    rest = sum(s for t in _threads(pid) if t != pid and (s := cpu_seconds(pid, t)) is not None)
    return loop, rest


def summarize(per_process: Sequence[float]) -> dict[str, float]:
    """``{"mean", "max"}`` percent of one core over a role's processes."""
    return {"mean": round(sum(per_process) / len(per_process), 1), "max": round(max(per_process), 1)}


def _metric_sums(url: str) -> dict[str, float]:
    """``{series: value}`` of the ``_sum`` / ``_count`` lines of the server's metrics."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return {}
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("trt_runtime_") and ("_sum{" in line or "_count{" in line):
            name, _, value = line.rpartition(" ")
            key = name.split("{", 1)[0]
            sums[key] = sums.get(key, 0.0) + float(value)
    return sums


class CellProfile:
    """Samples ``roles`` (``{role: pids}``) and ``metrics_url`` over one window; thread-backed.

    :meth:`begin` is called with the window's wall-clock ends (``time.time()``) and returns at
    once; :meth:`result` waits for the window's end and returns the row's ``cpu`` and
    ``engine`` entries.
    """

    def __init__(self, roles: Mapping[str, Sequence[int]], metrics_url: str | None = None,
                 engines: int = 0) -> None:
        self.roles = {role: list(pids) for role, pids in roles.items() if pids}
        self.metrics_url = metrics_url
        self.engines = engines
        self._thread: threading.Thread | None = None
        self._result: dict[str, Any] = {}

    def begin(self, start: float, stop: float) -> None:
        self._thread = threading.Thread(target=self._sample, args=(start, stop), daemon=True)
        self._thread.start()

    def result(self) -> dict[str, Any]:
        if self._thread is not None:
            self._thread.join()
        return self._result

    def _snapshot(self) -> tuple[dict[tuple[str, int], float], dict[int, tuple[float, float]],
                                 dict[str, float]]:
        cpu = {(role, pid): used for role, pids in self.roles.items() for pid in pids
               if (used := cpu_seconds(pid)) is not None}
        split = {pid: two for pid in self.roles.get("engine", ()) if (two := _engine_split(pid)) is not None}
        metrics = _metric_sums(self.metrics_url) if self.metrics_url else {}
        return cpu, split, metrics

    def _sample(self, start: float, stop: float) -> None:
        time.sleep(max(0.0, start - time.time()))
        t0 = time.time()
        cpu0, split0, metrics0 = self._snapshot()
        time.sleep(max(0.0, stop - time.time()))
        wall = time.time() - t0
        cpu1, split1, metrics1 = self._snapshot()
        if wall <= 0:
            return
        by_role: dict[str, list[float]] = {}
        for key, used in cpu1.items():
            if key in cpu0:
                by_role.setdefault(key[0], []).append(100 * (used - cpu0[key]) / wall)
        cpu: dict[str, Any] = {role: summarize(values) for role, values in by_role.items()}
        loops = [100 * (split1[p][0] - split0[p][0]) / wall for p in split1 if p in split0]
        others = [100 * (split1[p][1] - split0[p][1]) / wall for p in split1 if p in split0]
        if loops:
            cpu["engine_loop"] = summarize(loops)
            cpu["engine_threads"] = summarize(others)
        self._result = {"cpu": cpu, "engine": _engine_figures(metrics0, metrics1, wall, self.engines)}


def _engine_figures(before: dict[str, float], after: dict[str, float], wall: float,
                    engines: int) -> dict[str, float]:
    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    figures: dict[str, float] = {}
    batches, calls = delta("trt_runtime_batch_requests_count"), delta("trt_runtime_compute_seconds_count")
    if batches > 0:
        figures["requests_per_batch"] = round(delta("trt_runtime_batch_requests_sum") / batches, 2)
        figures["queue_ms"] = round(1e3 * delta("trt_runtime_queue_seconds_sum")
                                    / max(1.0, delta("trt_runtime_queue_seconds_count")), 3)
    for key, series in (("request_ms", "trt_runtime_request_seconds"),
                        ("round_trip_ms", "trt_runtime_engine_round_trip_seconds")):
        count = delta(f"{series}_count")
        if count > 0:
            figures[key] = round(1e3 * delta(f"{series}_sum") / count, 3)
    if calls > 0:
        figures["rows_per_call"] = round(delta("trt_runtime_batch_size_sum") / calls, 2)
        figures["call_ms"] = round(1e3 * delta("trt_runtime_compute_seconds_sum") / calls, 3)
        figures["calls_s"] = round(calls / wall, 1)
        figures["engine_busy"] = round(delta("trt_runtime_compute_seconds_sum") / wall / max(1, engines), 3)
    return figures


def describe(row: Mapping[str, Any]) -> str:
    """The row line's tail: ``cpu% front 61/70 engine 98/99 (loop 80 threads 19) sup 0/0 load 30/35 |
    batch 9.1 busy 22% call 0.210 ms | ms: route 1.210 trip 0.980 queue 0.201`` (mean/max percent of a
    core; loop and threads: the max; the route's and the engine round trip's mean times)."""
    cpu = row.get("cpu") or {}
    names = {"front": "front", "engine": "engine", "supervisor": "sup", "load": "load", "server": "server"}
    parts = [f"{short} {cpu[role]['mean']:.0f}/{cpu[role]['max']:.0f}" for role, short in names.items()
             if role in cpu]
    if "engine_loop" in cpu:
        parts.insert(2 if "front" in cpu else 1, f"(loop {cpu['engine_loop']['max']:.0f} "
                                                 f"threads {cpu['engine_threads']['max']:.0f})")
    text = f"  cpu% {' '.join(parts)}" if parts else ""
    engine = row.get("engine") or {}
    if "requests_per_batch" in engine:
        text += f" | batch {engine['requests_per_batch']:.1f}"
    if "engine_busy" in engine:
        text += f" busy {100 * engine['engine_busy']:.0f}% call {engine['call_ms']:.3f} ms"
    if "request_ms" in engine:  # where a request's time goes: the front's route, the engine round trip
        trip = f" trip {engine['round_trip_ms']:.3f}" if "round_trip_ms" in engine else ""
        queue = f" queue {engine['queue_ms']:.3f}" if "queue_ms" in engine else ""
        text += f" | ms: route {engine['request_ms']:.3f}{trip}{queue}"
    return text
