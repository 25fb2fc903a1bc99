"""Leasing execution contexts to concurrent callers: :class:`ContextPool`.

An engine with ``contexts=N`` holds N *lanes*: one object per execution context, each
with its own context, stream, events, bindings, output buffers, fast-path caches and
outer graphs. A call leases a free lane for its duration. The pool is FIFO-fair (a
caller that had to wait is served before later callers that also wait), takes an
optional timeout, and holds its lock only to pop or push a deque: the uncontended path
takes no lock at all (``deque.popleft``/``append`` are atomic), so a single caller pays
two deque operations per call.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

from trt_runtime.errors import ContextLeaseTimeout, EngineError

__all__ = ["ContextPool"]

T = TypeVar("T")


#: A waiter that has waited this long gets the next lane released, ahead of any newcomer.
#: Below it a released lane goes back to the free deque, where the caller that released it
#: (or another running thread) may take it again at once: handing every lane to a sleeping
#: thread would cost a thread switch per call under contention (a lock convoy).
FAIR_AFTER = 0.002


class _Waiter:
    """One waiting caller: a held lock its releaser unlocks (cheaper than an Event)."""

    __slots__ = ("lane", "lock", "since")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.lane: Any = None
        self.since = time.monotonic()

    def wake(self, lane: Any) -> None:
        self.lane = lane
        self.lock.release()


class ContextPool(Generic[T]):
    """Free lanes and the callers waiting for one.

    :meth:`acquire` returns a lane or raises :class:`~trt_runtime.ContextLeaseTimeout`
    (after ``timeout`` seconds) or :class:`~trt_runtime.EngineError` (the pool was
    closed while waiting); :meth:`release` gives it back. Fairness: waiters are served
    in arrival order; a waiter that has waited :data:`FAIR_AFTER` seconds is handed the
    next lane released, and until then a running caller may take a free lane first
    (which keeps a busy engine from switching threads on every call). Thread-safe.
    """

    __slots__ = ("_engine", "_free", "_lanes", "_lock", "_waiters", "closed")

    def __init__(self, engine: str, lanes: Sequence[T]) -> None:
        self._engine = engine
        self._lanes: list[T] = list(lanes)
        self._free: deque[T] = deque(self._lanes)
        self._waiters: deque[_Waiter] = deque()
        self._lock = threading.Lock()
        self.closed = False

    @property
    def lanes(self) -> tuple[T, ...]:
        return tuple(self._lanes)

    def __len__(self) -> int:
        return len(self._lanes)

    def acquire(self, timeout: float | None = None) -> T:
        """A free lane; waits for one (in arrival order) when all are leased."""
        try:
            return self._free.popleft()
        except IndexError:
            return self._wait(timeout)

    def _wait(self, timeout: float | None) -> T:
        waiter = _Waiter()
        with self._lock:
            if self.closed:
                raise EngineError(f"engine {self._engine!r} is closed")
            if self._free and not self._waiters:  # released since the failed pop
                return self._free.popleft()
            self._waiters.append(waiter)
        deadline = None if timeout is None else waiter.since + timeout
        while True:
            wait = FAIR_AFTER if deadline is None else min(FAIR_AFTER, deadline - time.monotonic())
            if waiter.lock.acquire(timeout=max(wait, 0.0)) or waiter.lane is not None:
                break
            with self._lock:
                if waiter.lane is not None:  # woken meanwhile
                    break
                if self._free and self._waiters[0] is waiter:  # our turn, and a lane is free
                    self._waiters.popleft()
                    return self._free.popleft()
                if deadline is not None and time.monotonic() >= deadline:
                    self._waiters.remove(waiter)
                    raise self._timeout(waiter, timeout)
        lane = waiter.lane
        if lane is _CLOSED:
            raise EngineError(f"engine {self._engine!r} was closed while this call waited for a context")
        return lane  # type: ignore[no-any-return]

    def _timeout(self, waiter: _Waiter, timeout: float | None) -> ContextLeaseTimeout:
        waited = time.monotonic() - waiter.since
        return ContextLeaseTimeout(
            f"engine {self._engine!r}: no execution context free after {waited:.3f} s "
            f"(lease_timeout={timeout!r}); all {len(self._lanes)} context(s) are leased by other "
            f"callers ({len(self._waiters)} more waiting). Raise engine.contexts or lease_timeout"
        )

    def release(self, lane: T) -> None:
        """Give ``lane`` back: to the oldest waiter if it has waited long enough.

        (``EngineBase.execute`` inlines the uncontended case: ``_free.append`` when there is
        no waiter; a waiter arriving just after still gets the lane within FAIR_AFTER.)"""
        if not self._waiters:
            self._free.append(lane)
            return
        with self._lock:
            waiters = self._waiters
            if waiters and time.monotonic() - waiters[0].since >= FAIR_AFTER:
                waiters.popleft().wake(lane)
            else:
                self._free.append(lane)

    @contextmanager
    def all_lanes(self, timeout: float | None = None) -> Iterator[list[T]]:
        """Lease every lane (in-flight calls finish first, in FIFO order with the other
        waiters); on exit give back every lane the pool then has (see :meth:`resize`),
        unless it was closed meanwhile."""
        held: list[T] = []
        try:
            for _ in range(len(self._lanes)):
                held.append(self.acquire(timeout))
        except BaseException:
            for lane in held:
                self.release(lane)
            raise
        try:
            yield held
        finally:
            if not self.closed:
                for lane in self._lanes:
                    self.release(lane)

    def resize(self, lanes: Sequence[T]) -> None:
        """Replace the set of lanes; only inside :meth:`all_lanes` (every lane is held)."""
        self._lanes = list(lanes)

    def close(self) -> None:
        """Wake every waiter with an error; later acquires fail. Lanes stay with their holders."""
        with self._lock:
            self.closed = True
            self._free.clear()
            while self._waiters:
                self._waiters.popleft().wake(_CLOSED)


_CLOSED: Any = object()
