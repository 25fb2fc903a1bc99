"""The grid of :mod:`benchmarks.bench_concurrency`: which rows a run has, how one is measured,
and the concurrency targets evaluated from the rows.

A row is ``(backend, workload, mode, callers, contexts)``. Every caller runs on its own
thread: all threads start together, warm up for ``warmup_s``, then call for
``duration_s`` (request/response: call, then synchronize the caller's stream). Each
call's latency is timed; every ``check_every``-th output (and the first) is compared
with the caller's serial output (see :mod:`benchmarks.concurrency_callers`), and
``wrong`` counts those that differ; ``errors`` counts callers stopped by an exception
(the first message is kept as the row's note); ``max_error`` is the largest error of a
caller's serial output against the float64 reference, relative to its peak.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from trt_runtime.bench import percentile

from .concurrency_callers import Caller

__all__ = [
    "BACKENDS",
    "CALLERS",
    "CONTEXTS",
    "MODES",
    "Row",
    "estimate_seconds",
    "evaluate_targets",
    "grid",
    "measure",
    "merge_runs",
    "row_label",
]

CALLERS = (1, 2, 4, 8, 16)
CONTEXTS = (1, 2, 4, 8)
MODES = ("eager", "outer")
#: ``raw`` first: the bare loops every backend row is compared with.
BACKENDS = ("raw", "python", "torchbind")
#: The caller counts of the raw floors that make an output per call (``Row.alloc``).
FLOOR_CALLERS = (1, 8)
#: Seconds a row costs beyond its warmup and duration (threads, contexts, graph captures).
ROW_OVERHEAD_S = 0.15


def row_label(backend: str, alloc: bool) -> str:
    """A row's backend as tables and plots name it: ``raw+alloc`` for the floors."""
    return f"{backend}+alloc" if alloc else backend


@dataclasses.dataclass
class Row:
    """One row of the JSON (``skipped`` holds the reason a row was not measured)."""

    backend: str
    workload: str
    mode: str
    callers: int
    contexts: int
    calls_per_s: float | None = None
    items_per_s: float | None = None
    p50_us: float | None = None
    p99_us: float | None = None
    wrong: int | None = None
    errors: int = 0
    max_error: float | None = None
    #: The largest difference of a wrong output from its caller's serial output, relative to
    #: the serial output's peak (``None``: no output was wrong).
    wrong_diff: float | None = None
    checked: int = 0
    calls: int = 0
    #: Voluntary context switches of the caller threads per call (Linux ``getrusage``; each
    #: GIL release a caller waits to get back is one), and the process's CPU µs per call.
    switches_per_call: float | None = None
    cpu_us_per_call: float | None = None
    skipped: str | None = None
    note: str | None = None
    #: A raw row whose callers make a new output on every call (and, under a graph, copy the
    #: input in), as ``engine(x)`` must: the floor of the runtime's own call under threads.
    alloc: bool = False
    #: With ``--repeat K``: each pass's calls/s, in pass order (the row shows their median).
    runs: list[float] | None = None

    @property
    def label(self) -> str:
        """The backend as tables and plots name it (:func:`row_label`)."""
        return row_label(self.backend, self.alloc)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def ok(self) -> bool:
        return self.skipped is None and self.calls_per_s is not None


def grid(
    backends: Sequence[str], workloads: Sequence[str], callers: Sequence[int], contexts: Sequence[int]
) -> list[Row]:
    """Every row of a run, in run order: per workload, per backend, per mode, per contexts, per
    callers. A raw row has one context per thread, so raw rows have ``contexts == callers``;
    the raw floors that make an output per call (:attr:`Row.alloc`) run at 1 and 8 callers,
    the two counts the targets compare."""
    rows: list[Row] = []
    for workload in workloads:
        for backend in backends:
            for mode in MODES:
                if backend == "raw":
                    rows.extend(Row(backend, workload, mode, n, n) for n in callers)
                    floors = [n for n in callers if n in FLOOR_CALLERS]
                    rows.extend(Row(backend, workload, mode, n, n, alloc=True) for n in floors)
                    continue
                for k in contexts:
                    rows.extend(Row(backend, workload, mode, n, k) for n in callers)
    return rows


def estimate_seconds(rows: int, duration_s: float, warmup_s: float) -> float:
    """What measuring ``rows`` rows costs, builds and loads aside."""
    return rows * (duration_s + warmup_s + ROW_OVERHEAD_S)


def measure(
    row: Row,
    callers: Sequence[Caller],
    duration_s: float,
    warmup_s: float,
    *,
    batch: int,
    check_every: int = 16,
) -> Row:
    """Run ``callers`` on a thread each for ``duration_s`` after ``warmup_s``; fill ``row``."""
    count = len(callers)
    start = threading.Barrier(count + 1)
    timed = threading.Barrier(count + 1)
    warm_done, stop = threading.Event(), threading.Event()
    samples: list[list[int]] = [[] for _ in range(count)]
    switches = [0] * count
    wrong = [0] * count
    checked = [0] * count
    errors: list[str] = []
    clock = time.perf_counter_ns

    def body(index: int) -> None:
        caller = callers[index]
        mine = samples[index]
        try:
            caller.prepare()
            start.wait(timeout=120)
            while not warm_done.is_set():
                caller.call()
            timed.wait(timeout=120)
            switched = _switches()
            done = 0
            while not stop.is_set():
                t0 = clock()
                output = caller.call()
                mine.append(clock() - t0)
                if done % check_every == 0:
                    checked[index] += 1
                    if not caller.check(output):
                        wrong[index] += 1
                done += 1
            switches[index] = _switches() - switched
        except threading.BrokenBarrierError:
            errors.append(f"thread {index}: the threads did not start together")
        except Exception as exc:
            errors.append(f"thread {index}: {type(exc).__name__}: {exc}")
            start.abort()
            timed.abort()

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    try:
        start.wait(timeout=120)
        time.sleep(warmup_s)
        warm_done.set()
        timed.wait(timeout=120)
        t0, cpu0 = time.perf_counter(), time.process_time()
        time.sleep(duration_s)
    except threading.BrokenBarrierError:
        warm_done.set()
        t0, cpu0 = time.perf_counter(), time.process_time()
    stop.set()
    for thread in threads:
        thread.join(timeout=120)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    hung = sum(t.is_alive() for t in threads)
    if hung:
        errors.append(f"{hung} thread(s) still running 120 s after the row ended")
    total = sum(len(s) for s in samples)
    row.calls = total
    row.wrong = sum(wrong)
    row.checked = sum(checked)
    row.errors = len([e for e in errors if e.startswith("thread")])
    found = [c.error for c in callers if c.error is not None]
    row.max_error = round(max(found), 6) if found else None
    diffs = [c.wrong_diff for c in callers if c.wrong_diff is not None]
    row.wrong_diff = round(max(diffs), 6) if diffs else None
    if errors:
        row.note = errors[0] + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else "")
    if total:
        us = [ns / 1000.0 for s in samples for ns in s]
        row.calls_per_s = round(total / elapsed, 1)
        row.items_per_s = round(total * batch / elapsed, 1)
        row.p50_us = round(percentile(us, 50), 2)
        row.p99_us = round(percentile(us, 99), 2)
        row.cpu_us_per_call = round(cpu / total * 1e6, 1)
        if _switches() >= 0:
            row.switches_per_call = round(sum(switches) / total, 2)
    elif row.skipped is None:
        row.skipped = f"no call finished: {row.note or 'unknown error'}"
    return row


def merge_runs(row: Row, trials: Sequence[Row]) -> Row:
    """Fill ``row`` from the passes ``trials`` of it (``--repeat``): calls/s and the other
    per-call figures of the pass with the median calls/s (the lower one of the middle two for
    an even count), every pass's calls/s in :attr:`Row.runs`, and the outputs, wrong ones,
    errors and calls of all passes summed (a wrong output in any pass counts). Passes that
    were skipped are left out; with none measured the row keeps the first one's reason."""
    done = [t for t in trials if t.ok]
    if not done:
        row.skipped = next((t.skipped for t in trials if t.skipped), None) or "not measured"
        return row
    ordered = sorted(done, key=lambda t: t.calls_per_s or 0.0)
    middle = ordered[(len(ordered) - 1) // 2]
    for name in ("calls_per_s", "items_per_s", "p50_us", "p99_us", "switches_per_call", "cpu_us_per_call"):
        setattr(row, name, getattr(middle, name))
    row.runs = [t.calls_per_s or 0.0 for t in done]
    row.calls = sum(t.calls for t in done)
    row.checked = sum(t.checked for t in done)
    row.wrong = sum(t.wrong or 0 for t in done)
    row.errors = sum(t.errors for t in trials)
    errors = [t.max_error for t in done if t.max_error is not None]
    row.max_error = max(errors) if errors else None
    diffs = [t.wrong_diff for t in done if t.wrong_diff is not None]
    row.wrong_diff = max(diffs) if diffs else None
    notes = [t.note for t in trials if t.note]
    row.note = notes[0] if notes else None
    row.skipped = None
    return row


def _switches() -> int:
    """This thread's voluntary context switches so far (-1 where ``getrusage`` cannot tell)."""
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw)
    except (ImportError, AttributeError, OSError):
        return -1


# -- targets ------------------------------------------------------------------------------
def _best(rows: Iterable[Row], **where: Any) -> Row | None:
    found = [r for r in rows if r.ok and all(getattr(r, k) == v for k, v in where.items())]
    return max(found, key=lambda r: r.calls_per_s or 0.0) if found else None


def _ratio(label: str, got: Row | None, base: Row | None, limit: float, what: str) -> dict[str, Any]:
    if got is None or base is None or not base.calls_per_s:
        missing = what if got is None else "its reference row"
        return {"target": label, "status": "n/a", "detail": f"{missing} not measured"}
    ratio = (got.calls_per_s or 0.0) / base.calls_per_s
    status = "met" if ratio >= limit else "missed"
    detail = (
        f"{got.calls_per_s:,.0f} / {base.calls_per_s:,.0f} calls/s = {ratio:.2f}x "
        f"(>= {limit}x; best contexts {got.contexts})"
    )
    return {"target": label, "status": status, "ratio": round(ratio, 3), "detail": detail}


def _add_floor(result: dict[str, Any], got: Row | None, base: Row | None, what: str) -> None:
    """Put ``got`` over ``base`` beside a target's figures (``floor_ratio``): the same ratio for
    work a target's reference row does not do (an output made per call, which releases the GIL
    once more), so a reader sees how much of a shortfall is the runtime's own."""
    if got is None or base is None or not base.calls_per_s or got.calls_per_s is None:
        return
    ratio = got.calls_per_s / base.calls_per_s
    result["floor_ratio"] = round(ratio, 3)
    result["detail"] = f"{result['detail']}; {what}: {ratio:.2f}x"


def evaluate_targets(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """The concurrency targets from a run's rows: ``met`` / ``missed`` / ``n/a`` with the figures."""
    results: list[dict[str, Any]] = []
    measured = [r for r in rows if r.ok]
    wrong = sum(r.wrong or 0 for r in measured)
    failed = sum(r.errors for r in rows)
    bad = [f"{r.backend}/{r.workload}/{r.mode}/{r.callers}x{r.contexts}"
           + (f" (off by up to {r.wrong_diff:.1e} of the peak)" if r.wrong_diff is not None else "")
           for r in rows if r.wrong or r.errors]
    results.append(
        {
            "target": "0 wrong outputs in every row",
            "status": "missed" if wrong or failed else ("met" if measured else "n/a"),
            "detail": f"{wrong} wrong of {sum(r.checked for r in measured)} checked, {failed} caller error(s)"
            + (f" in {', '.join(bad[:6])}" if bad else ""),
        }
    )
    keys = sorted({(r.backend, r.workload, r.mode) for r in rows if r.backend != "raw"})
    for backend, workload, mode in keys:
        one = _best(rows, backend=backend, workload=workload, mode=mode, callers=1, contexts=1)
        eight = _best(rows, backend=backend, workload=workload, mode=mode, callers=8)
        result = _ratio(
            f"no collapse: {backend} {workload} {mode}, best contexts at 8 callers >= 0.9x 1 caller",
            eight,
            one,
            0.9,
            "8 callers",
        )
        floor1 = _best(rows, backend="raw", workload=workload, mode=mode, callers=1, alloc=True)
        floor8 = _best(rows, backend="raw", workload=workload, mode=mode, callers=8, alloc=True)
        _add_floor(result, floor8, floor1, "the raw loop that makes its output per call, 8 callers over 1")
        results.append(result)
    for workload in sorted({r.workload for r in rows}):
        raw1 = _best(rows, backend="raw", workload=workload, mode="eager", callers=1, alloc=False)
        raw8 = _best(rows, backend="raw", workload=workload, mode="eager", callers=8, alloc=False)
        replay1 = _best(rows, backend="raw", workload=workload, mode="outer", callers=1, alloc=False)
        py8 = _best(rows, backend="python", workload=workload, mode="eager", callers=8)
        py1 = _best(rows, backend="python", workload=workload, mode="eager", callers=1, contexts=1)
        outer1 = _best(rows, backend="python", workload=workload, mode="outer", callers=1, contexts=1)
        result = _ratio(
            f"near raw: python {workload} eager 8 callers >= 0.8x raw 8 threads",
            py8,
            raw8,
            0.8,
            "python at 8 callers",
        )
        floor8 = _best(rows, backend="raw", workload=workload, mode="eager", callers=8, alloc=True)
        _add_floor(result, py8, floor8, "python at 8 callers over the raw loop making its output per call")
        results.append(result)
        results.append(
            _ratio(
                f"near raw: python {workload} eager 1 caller >= 0.8x raw 1 thread",
                py1,
                raw1,
                0.8,
                "python at 1 caller",
            )
        )
        results.append(
            _ratio(
                f"near raw: python {workload} outer 1 caller >= 0.5x bare replay + sync",
                outer1,
                replay1,
                0.5,
                "python outer at 1 caller",
            )
        )
    return results
