"""``DynamicBatcher``: gathers checked requests on an event loop and runs them on engine threads.

Requests wait in one queue. Each engine thread takes its next batch itself as soon as its
previous call ended: the oldest waiting request and up to ``max_batch - 1`` more, those
already waiting plus those that arrive within ``max_queue_delay_us`` of the oldest one's
arrival (Triton's ``max_queue_delay_microseconds``). It runs the batch with a
:class:`~trt_runtime.serve.batching.BatchRunner` (group by signature, pack along the batch
axis up to the optimization profile's maximum, split back) and hands the answers to the event
loop, which sets them. While every thread is busy requests pile up, so batches grow with the
load and the delay is paid only when a thread is idle.

The threads take their batches themselves rather than wait for the event loop to hand them
one: between two engine calls a thread needs nothing of the loop, which is busy reading new
requests and writing answers. (On the GPU host the local server's engines were inside their
calls only 41-49% of the time, full batches waiting or not; ``benchmarks/probes/cpu_batcher_busy.py``
measures the share on the CPU, and ``docs/serving.md`` has its figures.)

One thread per execution function (one per execution context), each running one batch at
a time. With ``on_loop=True`` (one execution function) there is no engine thread: the event
loop itself takes the batches and runs the engine calls, between two passes over its sockets
(a small alarm thread only wakes it when a batch's queue delay ends). With ``poll_us`` the loop
polls its sockets instead of sleeping for that long after each request and each batch
(:class:`~trt_runtime.serve.polling.LoopPoller`), and checks the queue delay on each pass itself.
A process that serves one context that way never shares the GIL between its loop and an
engine thread: each C call of an engine call that releases the GIL (copies, the launch, the
synchronize) gets it back at once instead of waiting for the loop to let go of it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from trt_runtime.errors import RequestError, SettingsError
from trt_runtime.serve.batching import Answer, BatchRunner, Stager, Started
from trt_runtime.serve.polling import LoopPoller, check_poll_us
from trt_runtime.serve.validation import RequestChecker

if TYPE_CHECKING:
    from trt_runtime.serve.metrics import ServeMetrics

__all__ = ["MAX_IN_FLIGHT", "DynamicBatcher"]

#: The most batches a stager's calls may keep started at once (``in_flight``).
MAX_IN_FLIGHT = 8


class _Request:
    """A waiting request: its answer goes to ``future``, or to ``done`` when there is no future
    (:meth:`DynamicBatcher.enqueue_call`). ``count``: how many clients' requests it stands for (a
    bundle of requests packed along the batch axis counts each of them)."""

    __slots__ = ("arrays", "arrived", "count", "done", "future")

    def __init__(self, arrays: tuple[Any, ...], future: asyncio.Future[list[Any]] | None,
                 done: Callable[[Answer], None] | None = None, count: int = 1) -> None:
        self.arrays = arrays
        self.future = future
        self.done = done
        self.count = count
        self.arrived = time.perf_counter()

    def gone(self) -> bool:
        """Whether nobody waits for the answer any more (a future cancelled or set, a call made)."""
        future = self.future
        return self.done is None if future is None else future.done()

    def answer(self, answer: Answer) -> None:
        """Hand over ``answer`` (outputs, or the exception) once, unless nobody waits for it (on
        the loop): a request refused at shutdown whose batch still ends later is answered once."""
        done = self.done
        if done is not None:
            self.done = None
            done(answer)
            return
        future = self.future
        if future is None or future.done():  # the caller went away, or the drain gave up on it
            return
        if isinstance(answer, BaseException):
            future.set_exception(answer)
        else:
            future.set_result(answer)


class DynamicBatcher:
    """Batches requests for one engine; ``await submit(arrays)`` returns that request's outputs.

    ``execute_fns``: one callable per execution context, ``fn(*arrays) -> list`` of output
    arrays (``engine.execute``). ``checker``: the model's
    :class:`~trt_runtime.serve.validation.RequestChecker` (requests given to
    :meth:`submit` must have passed it). ``max_batch``: most requests per batch (1: each
    request alone). ``max_queue_delay_us``: how long the oldest waiting request may wait
    for others once an engine thread is free. ``copy_outputs``: copy each request's slice
    (for engines that overwrite their outputs, as the outer graph's ``"view"`` mode does).
    ``on_loop``: run the engine calls on the event loop, no engine thread (one execute function only;
    each call blocks the loop while it runs). ``pad_rows``: pad each call's rows up to a power
    of two (:class:`~trt_runtime.serve.batching.BatchRunner`). ``poll_us`` (``on_loop`` only): keep the
    loop polling its sockets, with no sleep, for that many µs after each request and each batch, and
    until a waiting batch's queue delay ends (0: sleep, and let the alarm thread end the delay).
    ``stager`` (``on_loop`` and ``pad_rows`` only): the loop only starts each batch's calls
    (:meth:`BatchRunner.start <trt_runtime.serve.batching.BatchRunner.start>`) and collects them on
    its later passes, reading its sockets meanwhile; up to ``in_flight`` batches at once (the next
    one starts as the queue allows while fewer run, else as soon as the oldest ends).

    Bound to the event loop of the first :meth:`submit`; use it from that loop only. The
    engine threads start with the first request.
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
        on_loop: bool = False,
        pad_rows: bool = False,
        poll_us: int = 0,
        stager: Stager | None = None,
        in_flight: int = 2,
    ) -> None:
        if not execute_fns:
            raise SettingsError("DynamicBatcher needs at least one execute function; got none")
        if on_loop and len(execute_fns) != 1:
            raise SettingsError(f"engine calls on the event loop need exactly one execute function (one "
                                f"context); got {len(execute_fns)}")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise SettingsError(f"max_batch must be an integer >= 1; got {max_batch!r}")
        delay = max_queue_delay_us
        if isinstance(delay, bool) or not isinstance(delay, int) or not 0 <= delay <= 10_000_000:
            raise SettingsError(f"max_queue_delay_us must be an integer in [0, 10000000]; got {delay!r}")
        if check_poll_us("poll_us", poll_us) and not on_loop:
            raise SettingsError(f"poll_us needs the engine calls on the event loop (on_loop=True); got "
                                f"poll_us={poll_us} with engine threads")
        if stager is not None and not on_loop:
            raise SettingsError("a stager's calls are collected by the event loop: it needs on_loop=True")
        bad = isinstance(in_flight, bool) or not isinstance(in_flight, int)
        if bad or not 1 <= in_flight <= MAX_IN_FLIGHT:
            raise SettingsError(f"in_flight must be an integer in [1, {MAX_IN_FLIGHT}]; got {in_flight!r}")
        self._poll_us = poll_us
        self._checker = checker
        self._max_batch = max_batch if checker.batchable else 1
        self._delay_s = delay / 1e6
        self._metrics = metrics
        self._runners = [BatchRunner(self._timed(fn), checker, copy_outputs=copy_outputs, pad_rows=pad_rows,
                                     stager=stager)
                         for fn in execute_fns]
        self._stager = stager
        self._in_flight = in_flight
        #: stager: the batches whose calls were started, oldest first, with when they started.
        self._flying: collections.deque[tuple[list[_Request], Started, float]] = collections.deque()
        self._collecting = False  # whether a pass of the loop will look for ended calls
        #: Guards the queue and the counts below; the engine threads wait on it for requests.
        self._cond = threading.Condition(threading.Lock())
        self._waiting: collections.deque[_Request] = collections.deque()
        self._queued = 0  # the clients' requests in ``_waiting`` (a bundle counts each of its own)
        self._busy = 0
        self._running: list[list[_Request]] = []
        self._threads: list[threading.Thread] = []
        self._stopped = False  # the threads end after their current batch
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._drained: asyncio.Event | None = None
        self._on_loop = on_loop
        #: on_loop: whether the loop's next run of a batch is already queued (to run as soon as
        #: the loop can); while it is, arriving requests plan nothing.
        self._next_run_now = False
        #: on_loop: what wakes the loop when a batch's queue delay ends, and when it is set to.
        self._alarm: _Alarm | None = None
        self._alarm_due: float | None = None
        #: on_loop with poll_us: what keeps the loop polling (made with the first request).
        self._poller: LoopPoller | None = None

    @property
    def max_batch(self) -> int:
        return self._max_batch

    @property
    def pending(self) -> int:
        """Requests waiting, and batches running."""
        return self._queued + self._busy

    def max_rows(self, arrays: tuple[Any, ...]) -> int:
        """The most rows one engine call takes for requests shaped like ``arrays`` (the profile's
        maximum batch); at least 1."""
        return self._runners[0].max_rows(arrays)

    # -- requests (on the loop) ------------------------------------------------------------
    async def submit(self, arrays: tuple[Any, ...]) -> list[Any]:
        """Run one checked request (its arrays in input order); its outputs, or the engine's error."""
        return await self.enqueue(arrays)

    def enqueue(self, arrays: tuple[Any, ...]) -> asyncio.Future[list[Any]]:
        """:meth:`submit` without a coroutine: the future of the request's outputs. Call it on the loop."""
        loop = self._loop or asyncio.get_running_loop()
        future: asyncio.Future[list[Any]] = loop.create_future()
        self._add(_Request(arrays, future))
        return future

    def enqueue_call(self, arrays: tuple[Any, ...], done: Callable[[Answer], None], count: int = 1) -> None:
        """Queue a request whose answer (its outputs, or the exception its engine call or the
        shutdown gave) is handed to ``done`` on the loop, once, as its batch ends: no future and
        no done-callback per request (the engine process answers thousands a second this way).
        ``done`` must not raise. Call it on the loop.

        ``count``: the request is a bundle of that many clients' requests, already packed along the
        batch axis (at most :attr:`max_batch` of them, and at most :meth:`max_rows` rows). It runs
        whole in one engine call and counts as ``count`` requests towards a batch and in the
        metrics."""
        self._add(_Request(arrays, None, done, count))

    def _add(self, request: _Request) -> None:
        if self._closing:
            raise RequestError("the server is shutting down; not taking requests", 503)
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._start()
        waiting = self._waiting
        if self._on_loop:
            waiting.append(request)  # (only this loop touches the queue)
            self._queued += request.count
            if self._poller is not None:
                self._poller.poke()
            if not self._next_run_now:
                self._plan_run()
            return
        with self._cond:
            waiting.append(request)
            self._queued += request.count
            # A thread waits for a first request, or (timed) for the oldest one's batch to fill:
            # wake one only then (a thread that takes a batch wakes the next if more wait).
            if len(waiting) == 1 or self._queued >= self._max_batch:
                self._cond.notify()

    def _finished(self, batch: list[_Request], answers: list[Answer]) -> None:
        """A thread's batch is done: its answers handed over, on the loop."""
        with self._cond:
            self._busy -= 1
            self._running.remove(batch)
            drained = not self._waiting and not self._busy
        for request, answer in zip(batch, answers, strict=True):
            request.answer(answer)
        if self._drained is not None and drained:
            self._drained.set()

    # -- engine calls on the loop (on_loop) ---------------------------------------------------
    def _plan_run(self) -> None:
        """Plan the loop's next batch: as soon as the loop can once a batch is full, the oldest
        request's delay is over, there is no queue delay or the batcher is closing; else when that
        delay ends (:class:`_Alarm`). Called as each request arrives, so a busy loop starts the
        batch itself once the delay is over."""
        if not self._waiting or self._stopped or self._full():
            return
        loop = self._loop
        assert loop is not None
        due = self._due()
        if due is None:
            if self._alarm_due is not None:
                self._alarm_due = None
                if self._alarm is not None:
                    self._alarm.disarm()
            self._next_run_now = True
            loop.call_soon(self._run_on_loop)
        elif self._alarm_due is None:
            self._alarm_due = due
            if self._poller is not None:  # (each pass of the polling loop checks the delay)
                self._poller.poke(until=due)
                return
            if self._alarm is None:
                self._alarm = _Alarm(loop, self._alarm_rang)
            self._alarm.arm(due)

    def _check_due(self) -> None:
        """A pass of the polling loop: run the waiting batch if its queue delay has ended."""
        due = self._alarm_due
        if due is not None and time.perf_counter() >= due:
            self._alarm_rang()

    def _alarm_rang(self) -> None:
        """The oldest waiting request's delay is over (on the loop)."""
        self._alarm_due = None
        if not self._next_run_now:
            self._run_on_loop()

    def _run_on_loop(self, after_call: bool = False) -> None:
        """Run one batch here, on the loop, and hand over its answers. The next batch runs after the
        loop has passed over its callbacks twice, so these answers are written before that call (a
        future's callback queues its frame in the next pass, an :meth:`enqueue_call` callback at once;
        the write goes in the pass after), and the sockets are read in between (asyncio runs the
        reads' callbacks after those already queued), with no queue delay (``after_call``): the
        requests read in those two passes came in while the engine ran, even though the loop read
        them only after the call, so they have waited already. Requests read later, with the
        engine idle, wait the delay."""
        self._next_run_now = False
        if not after_call and self._waiting and self._due() is not None:
            self._plan_run()  # (the alarm was set for a request that has run since)
            return
        if self._full():
            return  # (the end of the oldest call starts the next batch: :meth:`_collect`)
        batch = self._pop_batch()
        if batch is None:
            return
        if self._stager is not None:
            self._launch(batch)
            return
        answers: list[Answer] = []
        try:
            answers = self._runners[0].run([r.arrays for r in batch])
        except BaseException as exc:  # the runner itself failed (an interrupt: the loop's to handle next)
            answers = [exc] * len(batch)
            if not isinstance(exc, Exception):
                raise
        finally:  # (the batch is answered and the next one planned either way)
            self._finished(batch, answers)
            self._plan_run_after_call()
            if self._poller is not None:
                self._poller.poke()

    def _full(self) -> bool:
        """Whether as many batches run as may (a stager's started calls; never without a stager)."""
        return len(self._flying) >= self._in_flight

    def _launch(self, batch: list[_Request]) -> None:
        """Start ``batch``'s calls through the stager and have the loop look for their end."""
        loop = self._loop
        assert loop is not None
        try:
            started = self._runners[0].start([r.arrays for r in batch])
        except BaseException as exc:  # the runner itself failed (an interrupt: the loop's to handle next)
            self._finished(batch, [exc] * len(batch))
            self._plan_run()
            if not isinstance(exc, Exception):
                raise
            return
        self._flying.append((batch, started, time.perf_counter()))
        if not self._collecting:
            self._collecting = True
            loop.call_soon(self._collect)
        if self._poller is not None:
            self._poller.poke()
        self._plan_run()  # (one more batch, as the queue allows, while fewer than in_flight run)

    def _collect(self) -> None:
        """A pass of the loop: hand over the answers of the batches whose calls have ended, oldest
        first, and start the next batch at once (its requests came in while the calls ran); look
        again in the next pass while calls run. The loop keeps passing over its sockets with no
        sleep meanwhile, for as long as the GPU takes (a call that waited for it spun too)."""
        self._collecting = False
        if self._stopped:
            return  # (the requests were refused; closing the stager waits for its stream)
        flying, metrics = self._flying, self._metrics
        ended = False
        while flying and flying[0][1].done():
            batch, started, began = flying.popleft()
            if metrics is not None:
                took = time.perf_counter() - began
                for launched in started.calls:
                    metrics.engine_call(launched.rows, took)
            try:
                answers = started.finish()
                for j, request in enumerate(batch):  # (a future's answer is read later: its own copy)
                    answer = answers[j]
                    if request.future is not None and not isinstance(answer, BaseException):
                        answers[j] = [o.copy() for o in answer]
            except Exception as exc:  # (splitting failed: every request of the batch)
                answers = [exc] * len(batch)
            try:
                self._finished(batch, answers)  # (the answers are read here: written into their slots)
            finally:
                started.release()
            ended = True
        if flying:
            self._collecting = True
            assert self._loop is not None
            self._loop.call_soon(self._collect)
        if ended:
            if self._poller is not None:
                self._poller.poke()
            if self._waiting and not self._next_run_now:
                self._run_on_loop(after_call=True)

    def _plan_run_after_call(self) -> None:
        """The next batch, two passes of the loop from now (also with none waiting yet: the loop
        has not read its sockets since the call began)."""
        loop = self._loop
        if self._stopped or loop is None:
            return
        self._next_run_now = True
        loop.call_soon(loop.call_soon, self._run_on_loop, True)

    # -- the engine threads --------------------------------------------------------------
    def _start(self) -> None:
        if self._on_loop:
            if self._poll_us:
                assert self._loop is not None
                self._poller = LoopPoller(self._loop, self._poll_us, self._check_due)
            return
        for i, runner in enumerate(self._runners):
            thread = threading.Thread(target=self._work, args=(runner,), name=f"trt-serve-engine-{i}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)

    def _work(self, runner: BatchRunner) -> None:
        """One engine thread: take a batch, run it, hand the answers to the loop; until stopped."""
        loop = self._loop
        assert loop is not None
        while (batch := self._take()) is not None:
            try:
                answers: list[Answer] = runner.run([r.arrays for r in batch])
            except BaseException as exc:  # the runner itself failed: every request of the batch
                answers = [exc] * len(batch)
            try:
                loop.call_soon_threadsafe(self._finished, batch, answers)
            except RuntimeError:  # the loop is closed: nobody waits for these answers
                return

    def _take(self) -> list[_Request] | None:
        """The next batch, once the queue has one (``None``: stop): the oldest request and up to
        ``max_batch - 1`` more, after waiting up to the queue delay from the oldest one's
        arrival for the batch to fill (no wait while closing). Requests whose caller went away
        are left out."""
        cond, waiting = self._cond, self._waiting
        with cond:
            while True:
                if self._stopped:
                    return None
                if not waiting:
                    cond.wait()
                    continue
                due = self._due()
                if due is not None:
                    cond.wait(max(0.0, due - time.perf_counter()))
                    continue
                batch = self._pop_batch()
                if waiting:
                    cond.notify()  # another thread may take the rest
                if batch is not None:
                    return batch

    def _due(self) -> float | None:
        """When the waiting requests' batch may start (:func:`time.perf_counter`), or ``None``: now,
        as it is full, the batcher is closing, there is no queue delay, or the oldest request has
        waited it out. Some request waits; the caller holds the lock or is the loop."""
        if self._queued >= self._max_batch or self._closing or self._delay_s <= 0:
            return None
        due = self._waiting[0].arrived + self._delay_s
        return None if time.perf_counter() >= due else due

    def _pop_batch(self) -> list[_Request] | None:
        """Up to ``max_batch`` waiting requests (a bundle counting each of its own), oldest first,
        counted as running (``None``: only requests whose caller went away were waiting); the
        caller holds the lock or is the loop."""
        waiting, most = self._waiting, self._max_batch
        batch: list[_Request] = []
        taken = 0
        while waiting and (not batch or taken + waiting[0].count <= most):
            request = waiting.popleft()
            self._queued -= request.count
            if not request.gone():
                batch.append(request)
                taken += request.count
        if not batch:
            return None
        self._busy += 1
        self._running.append(batch)
        metrics = self._metrics
        if metrics is not None:
            now = time.perf_counter()
            metrics.batched(taken)
            metrics.queued_many([now - request.arrived for request in batch],
                                [request.count for request in batch])
        return batch

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
        with self._cond:
            busy = bool(self._waiting or self._busy)
            self._cond.notify_all()  # the queue delay no longer applies
        if self._on_loop and self._loop is not None and not self._next_run_now:
            self._plan_run()  # (the same: what waits runs now)
        if self._loop is not None and busy:  # (no batch can end before the wait: ends run on this loop)
            self._drained = asyncio.Event()
            try:
                await asyncio.wait_for(self._drained.wait(), max(0.0, drain_s))
            except asyncio.TimeoutError:
                pass
        with self._cond:
            running = [r for batch in self._running for r in batch]
        self._refuse([*self._stop(), *running])

    def close(self) -> None:
        """Stop taking requests and wait for the engine calls running now (from any thread, e.g.
        before closing the engine); requests still queued are never run: they get a 503 if
        their event loop still runs. Idempotent."""
        self._closing = True
        late = self._stop()
        if late and self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._refuse, late)
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()

    def _stop(self) -> list[_Request]:
        """End the threads after their current batch; the requests still queued (never run)."""
        with self._cond:
            late = list(self._waiting)
            self._waiting.clear()
            self._queued = 0
            self._stopped = True
            self._cond.notify_all()
        if self._alarm is not None:
            self._alarm.close()
        if self._poller is not None:
            self._poller.close()
        return late

    @staticmethod
    def _refuse(requests: Sequence[_Request]) -> None:
        """Fail each of ``requests`` not answered yet with 503 (on their loop)."""
        for request in requests:
            request.answer(RequestError("the server stopped before answering this request", 503))


class _Alarm:
    """Calls ``ring`` on ``loop`` once a :func:`time.perf_counter` deadline has passed, from a thread
    that sleeps until then. The queue delay is often a fraction of a millisecond, and uvloop's
    timers have millisecond resolution (one of under half a millisecond runs at once), so a
    loop timer would either cut the delay short or have the loop poll until it ends. The thread
    holds the GIL only to hand ``ring`` to the loop; a loop busy with requests checks the
    deadline itself as each one arrives (:meth:`DynamicBatcher._plan_run`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, ring: Callable[[], None]) -> None:
        self._loop = loop
        self._ring = ring
        self._cond = threading.Condition(threading.Lock())
        self._due: float | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="trt-serve-batch-alarm", daemon=True)
        self._thread.start()

    def arm(self, due: float) -> None:
        with self._cond:
            self._due = due
            self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._due = None  # (the thread finds it gone when it wakes)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        cond = self._cond
        with cond:
            while not self._closed:
                if self._due is None:
                    cond.wait()
                    continue
                wait = self._due - time.perf_counter()
                if wait > 0:
                    cond.wait(wait)
                    continue
                self._due = None
                try:
                    self._loop.call_soon_threadsafe(self._ring)
                except RuntimeError:  # the loop is closed
                    return
