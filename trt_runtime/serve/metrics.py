"""``ServeMetrics``: what a server has done, in the Prometheus text format (``GET /metrics``).

Built on ``prometheus_client``. With ``PROMETHEUS_MULTIPROC_DIR`` set (before
``prometheus_client`` is first imported in the process: it chooses its storage then),
every process of a server writes its values into that directory and :meth:`ServeMetrics.render`
in any of them sums them all; without it, the values live in this object's own registry
(one process, as in tests). Whoever starts the processes sets the directory and calls
:func:`mark_process_dead` for a process that exits, so its in-flight gauge stops counting.

Series (label ``model`` on each):

* ``trt_runtime_requests_total`` by HTTP status ``code``;
* ``trt_runtime_batch_size``: rows per engine call (histogram);
* ``trt_runtime_batch_requests``: requests per batch the batcher formed (histogram);
* ``trt_runtime_queue_seconds``: from a request's arrival at the batcher to its engine call;
* ``trt_runtime_compute_seconds``: one engine call;
* ``trt_runtime_inflight_requests``: requests being answered now (summed over live processes);
* ``trt_runtime_request_seconds``: an infer route's time, from its call with the request to its
  answer, body read and answer made included (summary: ``_count`` and ``_sum``);
* ``trt_runtime_engine_round_trip_seconds``: of the local server's fronts, from a request's send
  to an engine process to its answer's arrival (summary): the engine's queue and call, and the
  hop both ways.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

__all__ = ["MULTIPROC_ENV", "ServeMetrics", "mark_process_dead"]

#: The environment variable that turns on prometheus_client's multiprocess mode.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_SECONDS = (25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 0.1, 0.25, 1.0)


def _client() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:
        from trt_runtime.errors import BackendUnavailableError

        raise BackendUnavailableError(
            f"serving metrics need prometheus_client ({exc}): pip install -c constraints.txt -e '.[serve]'"
        ) from exc
    return prometheus_client


def multiprocess() -> bool:
    """Whether this process's metrics are shared through ``PROMETHEUS_MULTIPROC_DIR``."""
    if not os.environ.get(MULTIPROC_ENV):
        return False
    from prometheus_client import values

    if getattr(values.ValueClass, "__name__", "") == "MutexValue":
        from trt_runtime.errors import SettingsError

        raise SettingsError(
            f"{MULTIPROC_ENV} was set after prometheus_client was imported in process {os.getpid()}; "
            "set it before the server's processes start"
        )
    return True


def mark_process_dead(pid: int) -> None:
    """Forget the live gauges of process ``pid`` (multiprocess mode; nothing otherwise)."""
    if os.environ.get(MULTIPROC_ENV):
        _client()
        from prometheus_client import multiprocess as shared

        shared.mark_process_dead(pid)


def _histogram_parts(histogram: Any) -> tuple[list[Any] | None, Any]:
    """A prometheus_client histogram child's per-bucket values (the last for +Inf) and its sum;
    ``(None, None)`` where they are not laid out as ``_buckets`` and ``_sum`` with one value per
    bound of :data:`_SECONDS` and +Inf."""
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    bounds = getattr(histogram, "_upper_bounds", None)
    if (not isinstance(buckets, list) or total is None or bounds is None
            or list(bounds) != [*_SECONDS, float("inf")] or len(buckets) != len(bounds)
            or not all(hasattr(b, "inc") for b in buckets) or not hasattr(total, "inc")):
        return None, None
    return buckets, total


class ServeMetrics:
    """The metrics of one model in this process; thread-safe (engine threads observe too)."""

    def __init__(self, model: str) -> None:
        client = _client()
        self.model = model
        self._shared = multiprocess()
        # Own registry: several servers (tests) in one process never clash on names.
        self._registry = client.CollectorRegistry()
        labels = {"registry": self._registry}
        self._requests = client.Counter(
            "trt_runtime_requests", "Requests answered, by HTTP status.", ["model", "code"], **labels
        )
        self._batch = client.Histogram(
            "trt_runtime_batch_size", "Rows per engine call.", ["model"], buckets=_SIZES, **labels
        ).labels(model)
        self._requests_per_batch = client.Histogram(
            "trt_runtime_batch_requests", "Requests per batch.", ["model"], buckets=_SIZES, **labels
        ).labels(model)
        self._queue = client.Histogram(
            "trt_runtime_queue_seconds", "Time from a request's arrival at the batcher to its engine call.",
            ["model"], buckets=_SECONDS, **labels,
        ).labels(model)
        self._compute = client.Histogram(
            "trt_runtime_compute_seconds", "Time of one engine call.", ["model"], buckets=_SECONDS, **labels
        ).labels(model)
        self._inflight = client.Gauge(
            "trt_runtime_inflight_requests", "Requests being answered now.", ["model"],
            multiprocess_mode="livesum", **labels,
        ).labels(model)
        self._request = client.Summary(
            "trt_runtime_request_seconds", "Time of an infer route, from the request to its answer.",
            ["model"], **labels,
        ).labels(model)
        self._round_trip = client.Summary(
            "trt_runtime_engine_round_trip_seconds",
            "Time from a request's send to an engine process to its answer's arrival (local server).",
            ["model"], **labels,
        ).labels(model)
        self._by_code: dict[int, Any] = {}
        #: The queue histogram's bucket values and sum, for :meth:`queued_many` (``None``: its layout
        #: is not the one that was written for; each time is observed instead).
        self._queue_parts = _histogram_parts(self._queue)

    # -- observations --------------------------------------------------------------------
    def answered(self, code: int) -> None:
        counter = self._by_code.get(code)
        if counter is None:
            counter = self._by_code[code] = self._requests.labels(self.model, str(code))
        counter.inc()

    def started(self) -> None:
        self._inflight.inc()

    def finished(self) -> None:
        self._inflight.dec()

    def request_took(self, seconds: float) -> None:
        self._request.observe(seconds)

    def round_trip(self, seconds: float) -> None:
        self._round_trip.observe(seconds)

    def queued(self, seconds: float) -> None:
        self._queue.observe(seconds)

    def queued_many(self, seconds: Sequence[float], counts: Sequence[int] | None = None) -> None:
        """:meth:`queued` for each of a batch's requests, as a few counter updates: each bucket's
        count and the sum once (in multiprocess mode each update is a locked write to a shared
        file, and a batch has dozens of requests). ``counts``: how many requests each time stands
        for (a bundle's requests waited together); one each when left out."""
        weights = [1] * len(seconds) if counts is None else counts
        buckets, total = self._queue_parts
        if buckets is None or total is None:  # not the histogram layout this was written for
            for s, n in zip(seconds, weights, strict=True):
                for _ in range(n):
                    self._queue.observe(s)
            return
        by_bucket: dict[int, int] = {}
        for s, n in zip(seconds, weights, strict=True):
            i = bisect_left(_SECONDS, s)  # (the last bucket is +Inf)
            by_bucket[i] = by_bucket.get(i, 0) + n
        for i, n in by_bucket.items():
            buckets[i].inc(n)
        total.inc(sum(s * n for s, n in zip(seconds, weights, strict=True)))

    def batched(self, requests: int) -> None:
        self._requests_per_batch.observe(requests)

    def engine_call(self, rows: int, seconds: float) -> None:
        self._batch.observe(rows)
        self._compute.observe(seconds)

    # -- exposition ----------------------------------------------------------------------
    def render(self) -> tuple[bytes, str]:
        """``(body, content type)`` of the text exposition, summed over every process."""
        client = _client()
        if self._shared:
            from prometheus_client import multiprocess as shared

            registry = client.CollectorRegistry()
            shared.MultiProcessCollector(registry)
        else:
            registry = self._registry
        return client.generate_latest(registry), client.CONTENT_TYPE_LATEST
