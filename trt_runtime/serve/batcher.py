"""``DynamicBatcher``: gathers checked requests on an event loop and runs them on engine threads.

Requests wait in one queue. Whenever an engine thread is free, the batcher takes the
oldest request and then up to ``max_batch - 1`` more: those already waiting, plus those
that arrive within ``max_queue_delay_us`` of the oldest one's arrival (Triton's
``max_queue_delay_microseconds``). The batch goes to that thread, which runs it with a
:class:`~trt_runtime.serve.batching.BatchRunner` (group by signature, pack along the batch
axis up to the optimization profile's maximum, split back); the answers are set on the
event loop. While every thread is busy requests pile up, so batches grow with the load
and the delay is paid only when the engine is idle.

One thread per execution function (one per execution context), each running one batch
at a time. The event loop never runs the engine.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from trt_runtime.errors import RequestError, SettingsError
from trt_runtime.serve.batching import Answer, BatchRunner
from trt_runtime.serve.validation import RequestChecker

if TYPE_CHECKING:
    from trt_runtime.serve.metrics import ServeMetrics

__all__ = ["DynamicBatcher"]


class _Request:
    __slots__ = ("arrays", "arrived", "future")

    def __init__(self, arrays: tuple[Any, ...], future: asyncio.Future[list[Any]]) -> None:
        self.arrays = arrays
        self.future = future
        self.arrived = time.perf_counter()


class _Worker:
    """One engine thread: its executor and its runner (a runner runs one batch at a time)."""

    def __init__(self, index: int, runner: BatchRunner) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"trt-serve-engine-{index}")
        self.runner = runner


class DynamicBatcher:
    """Batches requests for one engine; ``await submit(arrays)`` returns that request's outputs.

    ``execute_fns``: one callable per execution context, ``fn(*arrays) -> list`` of output
    arrays (``engine.execute``). ``checker``: the model's
    :class:`~trt_runtime.serve.validation.RequestChecker` (requests given to
    :meth:`submit` must have passed it). ``max_batch``: most requests per batch (1: each
    request alone). ``max_queue_delay_us``: how long the oldest waiting request may wait
    for others once an engine thread is free. ``copy_outputs``: copy each request's slice
    (for engines that overwrite their outputs, as the outer graph's ``"view"`` mode does).

    Bound to the event loop of the first :meth:`submit`; use it from that loop only.
    """

    def __init__(
        self,
        execute_fns: Sequence[Callable[..., list[Any]]],
        checker: RequestChecker,
        *,
        max_batch: int,
        max_queue_delay_us: int,
        metrics: ServeMetrics | None = None,
        copy_outputs: bool = False,
    ) -> None:
        if not execute_fns:
            raise SettingsError("DynamicBatcher needs at least one execute function; got none")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise SettingsError(f"max_batch must be an integer >= 1; got {max_batch!r}")
        delay = max_queue_delay_us
        if isinstance(delay, bool) or not isinstance(delay, int) or not 0 <= delay <= 10_000_000:
            raise SettingsError(f"max_queue_delay_us must be an integer in [0, 10000000]; got {delay!r}")
        self._checker = checker
        self._max_batch = max_batch if checker.batchable else 1
        self._delay_s = delay / 1e6
        self._metrics = metrics
        self._workers = [
            _Worker(i, BatchRunner(self._timed(fn), checker, copy_outputs=copy_outputs))
            for i, fn in enumerate(execute_fns)
        ]
        self._waiting: collections.deque[_Request] = collections.deque()
        self._idle: collections.deque[_Worker] = collections.deque(self._workers)
        self._busy = 0
        self._running: list[list[_Request]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._closing = False
        self._drained: asyncio.Event | None = None

    @property
    def max_batch(self) -> int:
        return self._max_batch

    @property
    def pending(self) -> int:
        """Requests waiting or running."""
        return len(self._waiting) + self._busy

    # -- requests ------------------------------------------------------------------------
    async def submit(self, arrays: tuple[Any, ...]) -> list[Any]:
        """Run one checked request (its arrays in input order); its outputs, or the engine's error."""
        return await self.enqueue(arrays)

    def enqueue(self, arrays: tuple[Any, ...]) -> asyncio.Future[list[Any]]:
        """:meth:`submit` without a coroutine: the future of the request's outputs (for callers that
        answer from a done-callback, with no task per request). Call it on the loop."""
        if self._closing:
            raise RequestError("the server is shutting down; not taking requests", 503)
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Any]] = loop.create_future()
        self._waiting.append(_Request(arrays, future))
        self._dispatch()
        return future

    def _dispatch(self) -> None:
        """Hand batches to idle threads; called on the loop after every arrival and completion."""
        while self._idle and self._waiting:
            now = time.perf_counter()
            if len(self._waiting) < self._max_batch and self._delay_s > 0:
                due = self._waiting[0].arrived + self._delay_s
                if now < due and not self._closing:
                    if self._timer is None:
                        self._timer = self._loop.call_later(due - now, self._on_timer)  # type: ignore[union-attr]
                    return
            batch: list[_Request] = []
            while self._waiting and len(batch) < self._max_batch:
                request = self._waiting.popleft()
                if not request.future.done():  # else its caller went away: skip it
                    batch.append(request)
            if not batch:
                continue
            worker = self._idle.popleft()
            self._busy += 1
            self._running.append(batch)
            if self._metrics is not None:
                self._metrics.batched(len(batch))
                for request in batch:
                    self._metrics.queued(now - request.arrived)
            run = self._loop.run_in_executor(  # type: ignore[union-attr]
                worker.pool, worker.runner.run, [r.arrays for r in batch]
            )
            run.add_done_callback(lambda done, w=worker, b=batch: self._finished(w, b, done))  # type: ignore[misc]

    def _on_timer(self) -> None:
        self._timer = None
        self._dispatch()

    def _finished(self, worker: _Worker, batch: list[_Request], done: asyncio.Future[list[Answer]]) -> None:
        self._busy -= 1
        self._running.remove(batch)
        self._idle.append(worker)
        try:
            answers: list[Answer] = done.result()
        except BaseException as exc:  # the runner itself failed: every request of the batch
            answers = [exc] * len(batch)
        for request, answer in zip(batch, answers, strict=True):
            if request.future.done():  # the caller went away
                continue
            if isinstance(answer, BaseException):
                request.future.set_exception(answer)
            else:
                request.future.set_result(answer)
        if self._timer is not None and len(self._waiting) >= self._max_batch:
            self._timer.cancel()
            self._timer = None
        self._dispatch()
        if self._drained is not None and not self._waiting and not self._busy:
            self._drained.set()

    def _timed(self, fn: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
        metrics = self._metrics
        if metrics is None:
            return fn

        def timed(*arrays: Any) -> list[Any]:
            started = time.perf_counter()
            try:
                return fn(*arrays)
            finally:
                rows = int(arrays[0].shape[0]) if arrays and arrays[0].ndim else 1
                metrics.engine_call(rows, time.perf_counter() - started)

        return timed

    # -- lifetime ------------------------------------------------------------------------
    async def aclose(self, drain_s: float = 30.0) -> None:
        """Stop taking requests, finish those queued or running (at most ``drain_s`` seconds),
        fail the rest with 503, stop the threads. Idempotent."""
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._loop is not None and (self._waiting or self._busy):
            self._drained = asyncio.Event()
            self._dispatch()  # the queue delay no longer applies
            try:
                await asyncio.wait_for(self._drained.wait(), max(0.0, drain_s))
            except asyncio.TimeoutError:
                pass
        late = [*self._waiting, *(r for batch in self._running for r in batch)]
        self._waiting.clear()
        for request in late:
            if not request.future.done():
                request.future.set_exception(
                    RequestError("the server stopped (drain time over) before answering this request", 503)
                )
        for worker in self._workers:
            worker.pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """Stop taking requests and wait for the engine calls running now (from any thread, e.g.
        before closing the engine); requests still queued are never run. Idempotent."""
        self._closing = True
        for worker in self._workers:
            worker.pool.shutdown(wait=True, cancel_futures=True)
