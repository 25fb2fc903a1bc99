"""A backend-agnostic latency harness: per-call wall time, percentiles, throughput, GPU time.

Two layers:

* :func:`bench_engine` / :func:`benchmark` (what ``trt-runtime bench`` uses): wall time
  around each call with :func:`time.perf_counter_ns` after the work is synchronized, so
  it is what a caller waits for; GPU time from a pair of CUDA events on the engine's
  stream where ``cuda.core`` and a GPU are present (``None`` otherwise).
* the three per-call metrics of ``benchmarks/`` (any callables, nothing imported):
  :func:`time_enqueue` (CPU cost of a call with no synchronize), :func:`time_latency`
  (call + synchronize) and :func:`time_gpu` (CUDA events between consecutive calls,
  through a :class:`GpuTimer`), summarized by :func:`summarize`.

Calls are given as a sequence and call ``i`` is ``calls[(start + i) % len(calls)]``, so
a workload that cycles input shapes cycles them in every metric alike. Nothing here
imports torch, TensorRT or CUDA at import time.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from trt_runtime.errors import SettingsError
from trt_runtime.extras import install_hint

__all__ = [
    "BenchResult",
    "CudaEventTimer",
    "GpuTimer",
    "Stats",
    "bench_engine",
    "benchmark",
    "check_plotting",
    "percentile",
    "plot_results",
    "summarize",
    "time_enqueue",
    "time_gpu",
    "time_latency",
    "write_json",
]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, linearly interpolated between ranks.

    Matches ``numpy.percentile(values, q)`` (its default, "linear" method) without numpy.
    """
    if not values:
        raise SettingsError("percentile of an empty sequence is undefined")
    if not 0.0 <= q <= 100.0:
        raise SettingsError(f"percentile q must be in [0, 100]; got {q!r}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclasses.dataclass(frozen=True, slots=True)
class Stats:
    """Summary of per-call samples, in microseconds (percentiles as :func:`percentile`)."""

    n: int
    median: float
    p10: float
    p90: float
    p99: float
    mean: float
    min: float
    max: float

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def summarize(samples_us: Sequence[float]) -> Stats:
    """Median, p10, p90, p99, mean, min and max of ``samples_us`` (ValueError if empty)."""
    if not samples_us:
        raise SettingsError("cannot summarize an empty list of samples")
    values = [float(v) for v in samples_us]
    return Stats(
        n=len(values),
        median=percentile(values, 50),
        p10=percentile(values, 10),
        p90=percentile(values, 90),
        p99=percentile(values, 99),
        mean=math.fsum(values) / len(values),
        min=min(values),
        max=max(values),
    )


def _check_calls(calls: Sequence[Callable[[], Any]], **counts: int) -> None:
    if not calls:
        raise SettingsError("nothing to time: no calls")
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SettingsError(f"{name} must be an int >= 1; got {value!r}")


def time_latency(
    calls: Sequence[Callable[[], Any]], sync: Callable[[], Any], iterations: int, *, start: int = 0
) -> list[float]:
    """Microseconds of each of ``iterations`` calls, each followed by ``sync()`` inside
    the timed region: what a caller that waits for every result sees."""
    _check_calls(calls, iterations=iterations)
    k = len(calls)
    clock = time.perf_counter_ns
    samples: list[float] = []
    for i in range(start, start + iterations):
        call = calls[i % k]
        t0 = clock()
        call()
        sync()
        samples.append((clock() - t0) / 1000.0)
    return samples


def time_enqueue(
    calls: Sequence[Callable[[], Any]],
    sync: Callable[[], Any],
    chunks: int,
    chunk: int,
    *,
    start: int = 0,
) -> tuple[list[float], list[float]]:
    """Per-call CPU cost with no synchronize: ``chunks`` times, ``chunk`` calls back to
    back are timed, then ``sync()`` drains the GPU outside the timed region.

    Returns ``(enqueue, drained)``: per chunk, µs per call without the synchronize (the
    enqueue-side cost) and with it (calls per second once the GPU has finished). Keep
    ``chunk`` small enough that a chunk's launches fit CUDA's launch queue (about a
    thousand entries), or the enqueue figure includes waiting for the GPU.
    """
    _check_calls(calls, chunks=chunks, chunk=chunk)
    k = len(calls)
    clock = time.perf_counter_ns
    enqueue: list[float] = []
    drained: list[float] = []
    sync()
    for c in range(chunks):
        first = start + c * chunk
        t0 = clock()
        for i in range(first, first + chunk):
            calls[i % k]()
        t1 = clock()
        sync()
        t2 = clock()
        enqueue.append((t1 - t0) / 1000.0 / chunk)
        drained.append((t2 - t0) / 1000.0 / chunk)
    return enqueue, drained


class GpuTimer(Protocol):
    """CUDA events on the stream a row's work is ordered on (see :func:`time_gpu`)."""

    def gate(self, us: float) -> bool:
        """Queue about ``us`` µs of GPU waiting on the stream, so the calls that follow are
        all queued before the GPU reaches them; False where it cannot (no gate)."""
        ...

    def record(self, index: int) -> None:
        """Record event ``index`` on the stream."""
        ...

    def elapsed_us(self, first: int, second: int) -> float:
        """GPU microseconds between two recorded events (after :meth:`synchronize`)."""
        ...

    def synchronize(self) -> None:
        """Wait for the last recorded event."""
        ...


def time_gpu(
    calls: Sequence[Callable[[], Any]],
    timer: GpuTimer,
    chunk: int,
    *,
    gate_us: float = 0.0,
    start: int = 0,
) -> tuple[list[float], bool]:
    """GPU microseconds of each of ``chunk`` calls: events recorded before the first call
    and after every call on the row's stream, behind a gate of ``gate_us`` µs.

    Without a gate the GPU may wait for the CPU between calls and that wait is counted;
    with one (long enough for the chunk to be queued) the figure is the GPU's own time
    per call. Returns ``(samples, gated)``.
    """
    _check_calls(calls, chunk=chunk)
    k = len(calls)
    gated = timer.gate(gate_us) if gate_us > 0 else False
    timer.record(0)
    for j in range(chunk):
        calls[(start + j) % k]()
        timer.record(j + 1)
    timer.synchronize()
    return [timer.elapsed_us(j, j + 1) for j in range(chunk)], gated


@dataclasses.dataclass(frozen=True, slots=True)
class BenchResult:
    """Timings of one benchmarked callable. Times are in microseconds."""

    label: str
    latencies_us: tuple[float, ...]
    #: Wall time of the whole timed loop, in seconds (for throughput).
    total_s: float
    warmup: int = 0
    #: Per-call GPU time from CUDA events, or ``None`` where none could be measured.
    gpu_times_us: tuple[float, ...] | None = None
    #: Why there is no GPU time (empty when there is).
    gpu_note: str = ""
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def iterations(self) -> int:
        return len(self.latencies_us)

    @property
    def median_us(self) -> float:
        return percentile(self.latencies_us, 50)

    @property
    def p90_us(self) -> float:
        return percentile(self.latencies_us, 90)

    @property
    def p99_us(self) -> float:
        return percentile(self.latencies_us, 99)

    @property
    def mean_us(self) -> float:
        return sum(self.latencies_us) / len(self.latencies_us)

    @property
    def throughput(self) -> float:
        """Calls per second over the timed loop."""
        return self.iterations / self.total_s if self.total_s > 0 else math.inf

    @property
    def gpu_median_us(self) -> float | None:
        return None if not self.gpu_times_us else percentile(self.gpu_times_us, 50)

    def to_dict(self) -> dict[str, Any]:
        """Summary statistics plus the raw samples, JSON-ready."""
        return {
            "label": self.label,
            "iterations": self.iterations,
            "warmup": self.warmup,
            "median_us": self.median_us,
            "p90_us": self.p90_us,
            "p99_us": self.p99_us,
            "mean_us": self.mean_us,
            "min_us": min(self.latencies_us),
            "max_us": max(self.latencies_us),
            "throughput_per_s": self.throughput,
            "gpu_median_us": self.gpu_median_us,
            "gpu_note": self.gpu_note,
            "metadata": dict(self.metadata),
            "latencies_us": list(self.latencies_us),
            "gpu_times_us": None if self.gpu_times_us is None else list(self.gpu_times_us),
        }


class CudaEventTimer:
    """Times GPU work between two CUDA events on its own ``cuda.core`` stream.

    Create it with :meth:`create`, which returns ``None`` (and a reason) where
    ``cuda.core`` or a GPU is missing. Pass :attr:`stream` to the engine so the work
    runs between the events.
    """

    def __init__(self, device: Any, stream: Any, options: Any) -> None:
        self._device = device
        self.stream = stream
        self._options = options

    @classmethod
    def create(cls, device: int | None = None) -> tuple[CudaEventTimer | None, str]:
        """A timer on ``device`` (default: the current one), or ``(None, reason)``."""
        try:
            from cuda.core import Device, EventOptions
        except Exception as exc:
            return None, f"cuda.core is not importable ({exc}): {install_hint('cuda')}"
        try:
            dev = Device() if device is None else Device(device)
            dev.set_current()
            stream = dev.create_stream()
        except Exception as exc:
            return None, f"no CUDA device: {exc}"
        return cls(dev, stream, EventOptions(timing_enabled=True)), ""

    def time(self, fn: Callable[[Any], Any]) -> tuple[Any, float]:
        """Run ``fn(stream)`` between two events; return its result and the GPU time in µs."""
        start = self.stream.record(options=self._options)
        result = fn(self.stream)
        end = self.stream.record(options=self._options)
        end.sync()
        return result, (end - start) * 1000.0


def benchmark(
    fn: Callable[[], Any],
    *,
    iterations: int = 100,
    warmup: int = 10,
    label: str = "",
    synchronize: Callable[[], Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
    duration: float | None = None,
) -> BenchResult:
    """Time ``fn()`` ``iterations`` times after ``warmup`` untimed calls.

    ``synchronize`` is called after each call, inside the timed region, so work that
    ``fn`` only queued is counted. With ``duration`` (seconds) the timed loop runs at
    least that long and at least ``iterations`` calls, as trtexec's ``--duration``.
    """
    _check_counts(iterations, warmup, duration)

    def once() -> None:
        fn()
        if synchronize is not None:
            synchronize()

    return _timed(once, label, iterations, warmup, duration, metadata, gpu_note="not measured")


def bench_engine(
    engine: Any,
    inputs: Sequence[Any],
    *,
    iterations: int = 100,
    warmup: int = 10,
    label: str | None = None,
    gpu_time: bool = True,
    metadata: Mapping[str, Any] | None = None,
    duration: float | None = None,
) -> BenchResult:
    """Benchmark ``engine.execute(*inputs)``; adds per-call GPU time where it can.

    GPU time needs ``cuda.core``, a GPU and a backend whose ``execute`` accepts a
    ``cuda.core`` stream as ``stream=``; where one is missing the result's
    :attr:`~BenchResult.gpu_note` says which and only wall time is reported.
    ``duration`` is as in :func:`benchmark`.
    """
    _check_counts(iterations, warmup, duration)
    name = label or getattr(getattr(engine, "backend", None), "name", None) or "engine"
    meta = dict(metadata or {})
    timer: CudaEventTimer | None = None
    note = "disabled"
    if gpu_time:
        timer, note = CudaEventTimer.create()
    if timer is not None:
        try:
            timer.time(lambda s: engine.execute(*inputs, stream=s))
        except Exception as exc:  # the backend does not take this stream: wall time only
            timer, note = None, f"engine.execute(stream=cuda.core Stream) failed: {exc}"
    if timer is None:
        result = benchmark(
            lambda: engine.execute(*inputs),
            iterations=iterations,
            warmup=warmup,
            label=name,
            synchronize=engine.synchronize,
            metadata=meta,
            duration=duration,
        )
        return dataclasses.replace(result, gpu_note=note)

    active = timer

    def timed_once() -> float:
        return float(active.time(lambda s: engine.execute(*inputs, stream=s))[1])

    return _timed(timed_once, name, iterations, warmup, duration, meta)


def _timed(call: Callable[[], float | None], label: str, iterations: int, warmup: int,
           duration: float | None, metadata: Mapping[str, Any] | None, gpu_note: str | None = None
           ) -> BenchResult:
    """``warmup`` untimed calls, then the timed loop: the wall µs of each call and, where ``call``
    returns one, its GPU µs."""
    for _ in range(warmup):
        call()
    wall: list[float] = []
    gpu: list[float] = []
    clock = time.perf_counter_ns
    loop_start = clock()
    for _ in _calls(iterations, duration, clock, loop_start):
        t0 = clock()
        gpu_us = call()
        wall.append((clock() - t0) / 1000.0)
        if gpu_us is not None:
            gpu.append(gpu_us)
    extra: dict[str, Any] = {"gpu_note": gpu_note} if gpu_note is not None else {"gpu_times_us": tuple(gpu)}
    return BenchResult(label=label, latencies_us=tuple(wall), total_s=(clock() - loop_start) / 1e9,
                       warmup=warmup, metadata=dict(metadata or {}), **extra)


def _check_counts(iterations: int, warmup: int, duration: float | None = None) -> None:
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise SettingsError(f"iterations must be an int >= 1; got {iterations!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise SettingsError(f"warmup must be an int >= 0; got {warmup!r}")
    if duration is not None and (isinstance(duration, bool) or not isinstance(duration, (int, float))
                                 or not 0 <= duration < math.inf):
        raise SettingsError(f"duration must be a number of seconds >= 0 or None; got {duration!r}")


def _calls(iterations: int, duration: float | None, clock: Callable[[], int], start: int) -> Iterator[int]:
    """Call indices: at least ``iterations``, and until ``duration`` seconds after ``start``."""
    deadline = start + int((duration or 0.0) * 1e9)
    i = 0
    while i < iterations or clock() < deadline:
        yield i
        i += 1


def write_json(
    results: Sequence[BenchResult],
    path: str | os.PathLike[str],
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``results`` (with host information and ``metadata``) as JSON; return the path."""
    target = Path(path)
    document = {
        "host": {"python": platform.python_version(), "platform": platform.platform()},
        "metadata": dict(metadata or {}),
        "results": [r.to_dict() for r in results],
    }
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(document, indent=2, default=str) + "\n")
    return target


def check_plotting() -> None:
    """Raise ImportError with the install line when matplotlib is missing (check before measuring)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ImportError("plotting needs matplotlib: " + install_hint("plot")) from exc


def plot_results(results: Sequence[BenchResult], path: str | os.PathLike[str], title: str = "") -> Path:
    """Draw a latency box plot per result into a PNG (needs matplotlib, the ``plot`` extra)."""
    check_plotting()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not results:
        raise SettingsError("nothing to plot: no benchmark results")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.8 * len(results) + 2), 4.0))
    try:
        ax.boxplot([list(r.latencies_us) for r in results], showfliers=False)
        ax.set_xticks(range(1, len(results) + 1), [r.label for r in results])
        for i, r in enumerate(results, start=1):
            ax.annotate(
                f"p50 {r.median_us:.1f}\np99 {r.p99_us:.1f}",
                (i, r.p99_us),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                fontsize=8,
            )
        ax.set_ylabel("latency per call (µs)")
        ax.set_title(title or "trt-runtime bench")
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        fig.savefig(target, dpi=120)
    finally:
        plt.close(fig)
    return target
