"""Measure the rows of one workload, interleaved, and keep going whatever fails.

All rows of a workload are set up first; then, round after round, each row in turn
(the starting row rotates) gets a slice of each metric of :mod:`trt_runtime.bench`:

* **enqueue**: chunks of ``workload.chunk`` back-to-back calls timed with no synchronize,
  one untimed device synchronize after each chunk (the per-call CPU cost);
* **latency**: one call + a device synchronize, per call;
* **GPU**: CUDA events recorded on the row's stream before and after every call of a
  chunk, behind a spin gate so the GPU does not wait for the CPU between calls.

Interleaving puts clock and thermal drift into every row alike, so ratios within a
workload are fair. A row that fails while set up, warmed up or measured is kept as
``skipped`` with the error; the others go on.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from trt_runtime.bench import Stats, summarize, time_enqueue, time_gpu, time_latency

from .environment import Environment, one_line
from .row_base import Bench, RowSkip, Workbench

__all__ = ["Budget", "Plan", "RowResult", "check_output", "run_workload", "slice_counts"]

#: Metrics every row reports, each a :class:`~trt_runtime.bench.Stats` in µs per call.
METRICS = ("enqueue", "latency", "gpu")


class Budget:
    """Wall-clock budget of a run; ``clock`` is injectable for tests."""

    def __init__(self, total_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not total_s > 0:
            raise ValueError(f"budget must be > 0 seconds; got {total_s!r}")
        self.total_s = float(total_s)
        self.clock = clock
        self._start = clock()

    def elapsed(self) -> float:
        return self.clock() - self._start

    def remaining(self) -> float:
        return max(0.0, self.total_s - self.elapsed())

    def share(self, parts_left: int) -> float:
        """Seconds the next part may take if the rest is split evenly among ``parts_left``."""
        return self.remaining() / max(1, parts_left)


@dataclasses.dataclass(frozen=True)
class Plan:
    """How much of each metric a row gets per round, at most (see :func:`slice_counts`)."""

    rounds: int = 10
    min_rounds: int = 2
    latency: int = 400
    enqueue_chunks: int = 20
    gpu_chunks: int = 2
    warmup: int = 50

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field.name} must be an int >= 1; got {value!r}")
        if self.min_rounds > self.rounds:
            raise ValueError(f"min_rounds ({self.min_rounds}) must be <= rounds ({self.rounds})")


def slice_counts(plan: Plan, per_call_s: float, chunk: int, slice_s: float) -> tuple[int, int, int]:
    """``(latency calls, enqueue chunks, gpu chunks)`` of one row in one round: half the
    slice to latency, a third to enqueue, the rest to GPU time, within the plan's caps and
    at least 10 latency calls and 2 chunks (1 GPU chunk)."""
    if per_call_s <= 0:
        return plan.latency, plan.enqueue_chunks, plan.gpu_chunks
    latency = int(0.5 * slice_s / per_call_s)
    chunks = int(slice_s / 3 / (chunk * per_call_s))
    gpu = int(slice_s / 6 / (chunk * per_call_s))
    return (
        max(min(10, plan.latency), min(plan.latency, latency)),
        max(min(2, plan.enqueue_chunks), min(plan.enqueue_chunks, chunks)),
        max(1, min(plan.gpu_chunks, gpu)),
    )


@dataclasses.dataclass
class RowResult:
    """One (workload, row) cell: its statistics, or why it was skipped."""

    workload: str
    row: str
    call: str = ""
    status: str = "pending"  # "ok" | "skipped" | "pending"
    reason: str = ""
    stats: dict[str, Stats] = dataclasses.field(default_factory=dict)
    #: Also the drained figure (µs per call with the chunk's synchronize).
    drained: Stats | None = None
    samples: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    #: Per metric, the median of each round's samples, in round order: a target pairs them
    #: with its reference row's of the same round (measured close in time: a drift of the
    #: host's speed between rounds cancels out).
    round_medians: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    rounds: int = 0
    chunk: int = 0
    gpu_gated: bool = False
    check: str = ""
    flags: list[str] = dataclasses.field(default_factory=list)
    ratios: dict[str, float] = dataclasses.field(default_factory=dict)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def note(self) -> str:
        if self.status == "skipped":
            return f"skipped: {self.reason}"
        return "; ".join(self.flags)

    def median(self, metric: str) -> float | None:
        stats = self.stats.get(metric)
        return None if stats is None else stats.median

    def skip(self, reason: str) -> None:
        self.status, self.reason = "skipped", reason
        self.stats.clear()
        self.samples.clear()
        self.round_medians.clear()
        self.drained = None

    def to_dict(self, samples: bool = False) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "workload": self.workload,
            "row": self.row,
            "call": self.call,
            "status": self.status,
            "note": self.note,
            "rounds": self.rounds,
            "chunk": self.chunk,
            **{f"{m}_us": (self.stats[m].to_dict() if m in self.stats else None) for m in METRICS},
            "drained_us": None if self.drained is None else self.drained.to_dict(),
            "gpu_gated": self.gpu_gated,
            "check": self.check,
            "flags": list(self.flags),
            "ratios": dict(self.ratios),
            "round_medians_us": {k: [round(v, 3) for v in vs] for k, vs in self.round_medians.items()},
            "info": {k: v for k, v in self.info.items() if isinstance(v, (str, int, float, bool))},
        }
        if samples:
            doc["samples_us"] = {k: [round(v, 3) for v in vs] for k, vs in self.samples.items()}
        return doc


def check_output(got: Any, expected: Any, tolerance: tuple[float, float]) -> tuple[bool, str]:
    """Whether ``got`` (a torch tensor or array) matches the float64 ``expected``; and a
    one-line description (max abs error, or why not comparable)."""
    import numpy as np

    if hasattr(got, "detach"):
        got = got.detach().float().cpu().numpy()
    values = np.asarray(got, dtype=np.float64)
    want = np.asarray(expected, dtype=np.float64)
    if values.shape != want.shape:
        return False, f"wrong shape {tuple(values.shape)}, expected {tuple(want.shape)}"
    err = float(np.max(np.abs(values - want))) if values.size else 0.0
    rtol, atol = tolerance
    if not np.allclose(values, want, rtol=rtol, atol=atol):
        return False, f"max abs err {err:.3g} (rtol {rtol:g}, atol {atol:g})"
    return True, f"max abs err {err:.3g}"


@dataclasses.dataclass
class _Active:
    spec: Any
    result: RowResult
    bench: Bench
    per_call_s: float
    counts: tuple[int, int, int] = (0, 0, 0)
    position: int = 0  # calls made so far: shapes keep cycling across slices
    gated: bool = True  # every GPU chunk so far ran behind a gate


def _error(what: str, exc: BaseException) -> str:
    return f"error {what}: {type(exc).__name__}: {one_line(exc)}"


def run_workload(
    workload: Any,
    specs: Sequence[Any],
    env: Environment,
    make_workbench: Callable[[], Workbench],
    plan: Plan,
    deadline: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    echo: Callable[[str], None] = lambda text: None,
) -> list[RowResult]:
    """Measure ``specs`` (rows) on ``workload`` until ``deadline`` (a ``clock()`` value),
    at least ``plan.min_rounds`` rounds. Never raises for a row's failure."""
    results = [RowResult(workload.key, spec.name, call=spec.call) for spec in specs]
    runnable = []
    for spec, result in zip(specs, results, strict=True):
        why = env.reason(spec.needs)
        if why:
            result.skip(why)
        else:
            runnable.append((spec, result))
    if not runnable:
        return results
    try:
        wb = make_workbench()
    except Exception as exc:
        for _, result in runnable:
            result.skip(_error(f"building {workload.key}", exc))
        return results
    active: list[_Active] = []
    try:
        for spec, result in runnable:
            entry = _set_up(spec, result, wb, plan)
            if entry is not None:
                active.append(entry)
                echo(f"  {workload.key:<8} {spec.name:<22} set up ({entry.per_call_s * 1e6:.1f} us/call)")
            else:
                echo(f"  {workload.key:<8} {spec.name:<22} {result.note}")
        if active:
            _rounds(active, wb, workload, plan, deadline, clock)
            _finish(active, wb)
    finally:
        for entry in active:
            try:
                entry.bench.close()
            except Exception:
                pass
        wb.close()
    for result in results:
        if result.status == "pending":  # pragma: no cover - every path sets a status
            result.skip("not measured")
    return results


def _set_up(spec: Any, result: RowResult, wb: Workbench, plan: Plan) -> _Active | None:
    try:
        bench = spec.setup(wb)
    except RowSkip as exc:
        result.skip(str(exc))
        return None
    except Exception as exc:
        result.skip(_error("in setup", exc))
        return None
    result.info.update(bench.info)
    try:
        sync = wb.device.synchronize
        calls = bench.calls
        warmup = max(1, plan.warmup)
        for i in range(warmup):
            calls[i % len(calls)]()
        sync()
        per_call_s = sum(time_latency(calls, sync, 10, start=warmup)) / 10 / 1e6
    except Exception as exc:
        result.skip(_error("in warm-up", exc))
        try:
            bench.close()
        except Exception:
            pass
        return None
    # Shapes keep cycling from where the warm-up left them.
    return _Active(spec, result, bench, per_call_s, position=warmup + 10)


def _rounds(active: list[_Active], wb: Workbench, workload: Any, plan: Plan, deadline: float,
            clock: Callable[[], float]) -> None:
    chunk = workload.chunk
    sync = wb.device.synchronize
    slice_s = max(0.0, deadline - clock()) / (plan.rounds * len(active))
    for entry in active:
        entry.counts = slice_counts(plan, entry.per_call_s, chunk, slice_s)
        entry.result.chunk = chunk
    done = 0
    for r in range(plan.rounds):
        if r >= plan.min_rounds and clock() > deadline:
            break
        live = [e for e in active if e.result.status == "pending"]
        if not live:
            break
        start = r % len(live)
        gc.collect()  # once a round: no slice pays for another's garbage
        for entry in live[start:] + live[:start]:
            # No collector pauses inside a slice (it runs between slices instead).
            collecting = gc.isenabled()
            gc.disable()
            try:
                _measure_slice(entry, wb, sync, chunk)
            except Exception as exc:
                entry.result.skip(_error("while measuring", exc))
            finally:
                if collecting:
                    gc.enable()
        done = r + 1
    for entry in active:
        entry.result.rounds = done


def _measure_slice(entry: _Active, wb: Workbench, sync: Callable[[], Any], chunk: int) -> None:
    calls = entry.bench.calls
    samples = entry.result.samples
    n_latency, n_chunks, n_gpu = entry.counts
    pos = entry.position
    enqueue, drained = time_enqueue(calls, sync, n_chunks, chunk, start=pos)
    pos += n_chunks * chunk
    latency = time_latency(calls, sync, n_latency, start=pos)
    pos += n_latency
    timer = wb.device.timer(entry.bench.stream)
    gate_us = min(20_000.0, chunk * entry.per_call_s * 1e6 * 1.5 + 100.0)
    gpu: list[float] = []
    for _ in range(n_gpu):
        part, gated = time_gpu(calls, timer, chunk, gate_us=gate_us, start=pos)
        pos += chunk
        gpu.extend(part)
        entry.gated = entry.gated and gated
    sync()
    entry.position = pos
    samples.setdefault("enqueue", []).extend(enqueue)
    samples.setdefault("drained", []).extend(drained)
    samples.setdefault("latency", []).extend(latency)
    samples.setdefault("gpu", []).extend(gpu)
    medians = entry.result.round_medians
    for metric, part in (("enqueue", enqueue), ("latency", latency), ("gpu", gpu)):
        if part:
            medians.setdefault(metric, []).append(statistics.median(part))


def _finish(active: list[_Active], wb: Workbench) -> None:
    """Summarize each measured row, flag what needs a caveat, and check its output."""
    try:
        expected = wb.expected()
    except Exception:
        expected = None
    for entry in active:
        result = entry.result
        if result.status != "pending":
            continue
        for metric in METRICS:
            result.stats[metric] = summarize(result.samples[metric])
        result.drained = summarize(result.samples["drained"])
        result.gpu_gated = entry.gated
        result.status = "ok"
        result.flags.extend(flags_for(result))
        if entry.bench.check is None or expected is None:
            result.check = "not checked"
            continue
        try:
            good, text = check_output(entry.bench.check(), expected, wb.tolerance)
        except Exception as exc:
            good, text = False, _error("checking the output", exc)
        result.check = ("ok: " if good else "WRONG: ") + text
        if not good:
            result.flags.append("wrong output")


def flags_for(result: RowResult) -> list[str]:
    """Caveats of a measured row: an ungated GPU time, or an enqueue cost within 10% of
    the GPU time. A CPU well slower than the GPU never waits for it, and one well faster
    only fills the queue with the chunk's few calls; only when the two are close can the
    enqueue figure be the GPU's pace instead of the CPU's cost."""
    flags = []
    enqueue, gpu = result.median("enqueue"), result.median("gpu")
    if not result.gpu_gated:
        flags.append("GPU time ungated: includes waits for the CPU")
    if enqueue is not None and gpu is not None and gpu > 0 and 0.9 <= enqueue / gpu <= 1.1:
        flags.append("enqueue within 10% of GPU time: may be the GPU's pace")
    return flags
