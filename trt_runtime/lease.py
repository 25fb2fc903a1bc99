"""Leasing execution contexts to concurrent callers: :class:`ContextPool`.

An engine with ``contexts=N`` holds N *lanes*: one object per execution context, each
with its own context, stream, events, bindings, output buffers, fast-path caches and
outer graphs. A call leases a free lane for its duration: it takes the lane's one token
without waiting (:meth:`Slot.take`), and a thread first tries the lane it used last, so
a thread keeps its lane (its stream and bindings) while there are lanes enough. The pool
is FIFO-fair (a caller that had to wait is served before later callers that also wait)
and takes an optional timeout; its own lock is taken only when a caller has to wait, so
a single caller pays one thread-local read, one token taken and one given back per call.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

from trt_runtime.errors import ContextLeaseTimeout, EngineError

__all__ = ["EXIT_REPORT_ENV", "EXIT_WAIT", "ContextPool", "Slot", "exiting", "hold_lanes_at_exit"]

T = TypeVar("T")


#: A waiter that has waited this long gets the next lane released, ahead of any newcomer.
#: Below it a released lane goes back to the free deque, where the caller that released it
#: (or another running thread) may take it again at once: handing every lane to a sleeping
#: thread would cost a thread switch per call under contention (a lock convoy).
FAIR_AFTER = 0.002


class _Waiter:
    """One waiting caller: a held lock its releaser unlocks (cheaper than an Event)."""

    __slots__ = ("lock", "since", "slot")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.slot: Any = None
        self.since = time.monotonic()

    def wake(self, slot: Any) -> None:
        self.slot = slot
        self.lock.release()


class Slot(Generic[T]):
    """One lane and its token: there while the lane is free, taken while it is leased.

    ``free`` holds the token: ``free.pop()`` takes it (``IndexError``: the lane is leased)
    and ``free.append(True)`` gives it back, each one C call that no other thread can
    interleave with (atomic under the GIL, and under a free-threaded build's per-object
    lock). A lock's non-blocking acquire and its release cost three to four times as much
    (82 against 21 ns on the CPU machine); a call pays them once each. ``maxlen=1``: a
    token given back twice is still one token. Nothing waits on a slot: a caller without a
    lane waits in the pool's queue, and the exit hook polls (:func:`_hold`)."""

    __slots__ = ("claimed", "free", "held_at_exit", "lane")

    def __init__(self, lane: T, held: bool = False) -> None:
        self.lane = lane
        self.free: deque[bool] = deque(() if held else (True,), maxlen=1)
        #: Whether a thread has taken it as its own (new threads look for unclaimed lanes first).
        self.claimed = False
        #: Given back at exit to the exit hook, its token still taken (see :func:`hold_lanes_at_exit`).
        self.held_at_exit = False

    def take(self) -> bool:
        """Take the token if it is there (no wait); whether it was. (A leased slot costs a
        length test, not an exception: the pool's loops try every slot.)"""
        free = self.free
        if not free:
            return False
        try:
            free.pop()
        except IndexError:  # taken by another thread since the test
            return False
        return True

    def put(self) -> None:
        """Give the token back."""
        self.free.append(True)


class ContextPool(Generic[T]):
    """The lanes of an engine and the callers waiting for one.

    :meth:`acquire` returns a lane or raises :class:`~trt_runtime.ContextLeaseTimeout`
    (after ``timeout`` seconds) or :class:`~trt_runtime.EngineError` (the pool was
    closed while waiting); :meth:`release` gives it back. Thread-safe.

    *Affinity*: each thread first tries the lane it had last (its stream, bindings and
    caches are then those of its previous call: no stream switch, no rebinding), then any
    free lane. *Fairness*: waiters are served in arrival order; a waiter that has waited
    :data:`FAIR_AFTER` seconds is handed the next lane released, and until then a running
    caller may take a free lane first (which keeps a busy engine from switching threads on
    every call).
    """

    __slots__ = (
        "__weakref__", "_closed_message", "_engine", "_lock", "_slots", "closed", "local", "waiters",
    )

    def __init__(self, engine: str, lanes: Sequence[T]) -> None:
        self._engine = engine
        self._slots: list[Slot[T]] = [Slot(lane) for lane in lanes]
        self.waiters: deque[_Waiter] = deque()
        self._lock = threading.Lock()
        #: ``slot``: the slot this thread leased last.
        self.local = threading.local()
        self.closed = False
        self._closed_message = ""
        _POOLS.add(self)

    @property
    def lanes(self) -> tuple[T, ...]:
        return tuple(slot.lane for slot in self._slots)

    def __len__(self) -> int:
        return len(self._slots)

    def acquire(self, timeout: float | None = None) -> T:
        """A free lane (this thread's last one if it is free); waits for one (in arrival
        order) when all are leased."""
        slot = getattr(self.local, "slot", None)
        if slot is None or not slot.take():
            slot = self.lease(timeout)
        return slot.lane  # type: ignore[no-any-return]

    def lease(self, timeout: float | None = None) -> Slot[T]:
        """Any free slot, else wait for one; the slot becomes this thread's preferred one.
        (``EngineBase.execute`` tries the preferred slot inline first.)"""
        slot = self._take(timeout)
        self.local.slot = slot
        slot.claimed = True
        return slot

    def _take(self, timeout: float | None) -> Slot[T]:
        """Any free slot, else wait for one (a closed pool has none: :meth:`_wait` raises)."""
        slot = None if self.closed else self._take_any()
        return slot if slot is not None else self._wait(timeout)

    def _take_any(self) -> Slot[T] | None:
        """A free slot, one no thread has claimed first (so threads spread over the lanes)."""
        slots = self._slots
        for slot in slots:
            if not slot.claimed and slot.take():
                return slot
        for slot in slots:
            if slot.take():
                return slot
        return None

    def _wait(self, timeout: float | None) -> Slot[T]:
        if _EXITING.is_set():  # after the interpreter began to exit (see hold_lanes_at_exit)
            if threading.current_thread() is threading.main_thread():  # an atexit hook of its own
                raise EngineError(f"engine {self._engine!r}: the interpreter is exiting; engines serve no "
                                  "more calls (atexit hooks run last-registered first)")
            _park()
        waiter = _Waiter()
        with self._lock:
            if self.closed:
                raise EngineError(self._closed_message or f"engine {self._engine!r} is closed")
            if not self.waiters:  # released since the failed tries
                slot = self._take_any()
                if slot is not None:
                    return slot
            self.waiters.append(waiter)
        try:
            return self._queued(waiter, timeout)
        except BaseException:  # a KeyboardInterrupt in the wait, say: out of the queue, lane given back
            self._abandon(waiter)
            raise

    def _queued(self, waiter: _Waiter, timeout: float | None) -> Slot[T]:
        """Wait in the queue until ``waiter`` has a slot (see :meth:`_wait`)."""
        deadline = None if timeout is None else waiter.since + timeout
        while True:
            if _EXITING.is_set():
                with self._lock:
                    if waiter.slot is None:
                        self.waiters.remove(waiter)
                if waiter.slot is not None and waiter.slot is not _CLOSED:
                    waiter.slot.put()  # handed over meanwhile: for the exit hook
                _park()
            wait = FAIR_AFTER if deadline is None else min(FAIR_AFTER, deadline - time.monotonic())
            if waiter.lock.acquire(timeout=max(wait, 0.0)) or waiter.slot is not None:
                break
            with self._lock:
                if waiter.slot is not None:  # woken meanwhile
                    break
                if self.waiters[0] is waiter:  # our turn: is a lane free?
                    slot = self._take_any()
                    if slot is not None:
                        self.waiters.popleft()
                        return slot
                if deadline is not None and time.monotonic() >= deadline:
                    self.waiters.remove(waiter)
                    raise self._timeout(waiter, timeout)
        slot = waiter.slot
        if slot is _CLOSED:
            raise EngineError(f"engine {self._engine!r} was closed while this call waited for a context")
        return slot  # type: ignore[no-any-return]

    def _abandon(self, waiter: _Waiter) -> None:
        """``waiter`` stops waiting: it leaves the queue, and a slot handed to it meanwhile
        goes back to the pool (else no call would ever lease that lane again)."""
        with self._lock:
            if waiter in self.waiters:
                self.waiters.remove(waiter)
            slot = waiter.slot  # (set under this lock by give_back: no hand-over after this)
        if slot is not None and slot is not _CLOSED and not _EXITING.is_set():
            self.give_back(slot)

    def _timeout(self, waiter: _Waiter, timeout: float | None) -> ContextLeaseTimeout:
        waited = time.monotonic() - waiter.since
        return ContextLeaseTimeout(
            f"engine {self._engine!r}: no execution context free after {waited:.3f} s "
            f"(lease_timeout={timeout!r}); all {len(self._slots)} context(s) are leased by other "
            f"callers ({len(self.waiters)} more waiting). Raise engine.contexts or lease_timeout"
        )

    def release(self, lane: T) -> None:
        """Give ``lane`` back (see :meth:`give_back`)."""
        for slot in self._slots:
            if slot.lane is lane:
                self.give_back(slot)
                return
        raise EngineError(f"engine {self._engine!r}: {lane!r} is not one of its contexts")

    def give_back(self, slot: Slot[T]) -> None:
        """Give a leased slot back: to the oldest waiter if it has waited long enough.
        A closed pool keeps it (later acquires fail).

        (``EngineBase.execute`` inlines the uncontended case: ``slot.free.append(True)`` when
        there is no waiter; a waiter arriving just after still gets a lane within
        FAIR_AFTER.)"""
        if self.closed:
            return
        if _EXITING.is_set():  # handed to the exit hook, locked: the caller's next call parks
            slot.held_at_exit = True
            return
        if not self.waiters:
            slot.put()
            return
        with self._lock:
            waiters = self.waiters
            if waiters and time.monotonic() - waiters[0].since >= FAIR_AFTER:
                waiters.popleft().wake(slot)
            else:
                slot.put()

    @contextmanager
    def all_lanes(self, timeout: float | None = None) -> Iterator[list[T]]:
        """Lease every lane (in-flight calls finish first, in FIFO order with the other
        waiters); on exit give back every lane the pool then has (see :meth:`resize`),
        unless it was closed meanwhile."""
        held: list[Slot[T]] = []
        try:
            while len(held) < len(self._slots):
                held.append(self._take(timeout))
        except BaseException:
            for slot in held:
                self.give_back(slot)
            raise
        try:
            yield [slot.lane for slot in held]
        finally:
            if not self.closed:
                for slot in self._slots:
                    self.give_back(slot)

    def resize(self, lanes: Sequence[T]) -> None:
        """Replace the set of lanes; only inside :meth:`all_lanes` (every lane is held):
        kept lanes keep their (held) slots, new lanes get held ones."""
        slots = {id(slot.lane): slot for slot in self._slots}
        fresh: list[Slot[T]] = []
        for lane in lanes:
            slot = slots.get(id(lane))
            if slot is None:
                slot = Slot(lane, held=True)
            fresh.append(slot)
        self._slots = fresh

    def orphan(self, message: str) -> None:
        """In a forked child: closed, every lane taken for good (its token gone, whatever
        the parent's threads held), and ``message`` the error of every later acquire."""
        self._lock = threading.Lock()
        self.waiters = deque()
        for slot in self._slots:
            slot.free.clear()
        self._closed_message = message
        self.closed = True

    def close(self) -> None:
        """Wake every waiter with an error; later acquires fail. Leased lanes stay with
        their holders (and are kept when given back); free lanes are taken for good."""
        with self._lock:
            self.closed = True
            while self._take_any() is not None:
                pass
            while self.waiters:
                self.waiters.popleft().wake(_CLOSED)


_CLOSED: Any = object()


# -- interpreter exit -----------------------------------------------------------------------
#: Seconds the exit hook waits for the calls in flight (then it lets the process end anyway).
EXIT_WAIT = 5.0

_POOLS: weakref.WeakSet[ContextPool[Any]] = weakref.WeakSet()
_EXITING = threading.Event()


def exiting() -> bool:
    """Whether :func:`hold_lanes_at_exit` ran (the interpreter is exiting)."""
    return _EXITING.is_set()


def _park() -> None:
    """Block this thread for good, in a lock wait that holds no native frame of TensorRT,
    CUDA or torch."""
    threading.Event().wait()


def hold_lanes_at_exit(timeout: float = EXIT_WAIT) -> int:
    """Lease every lane of every engine for good, so that no call is inside native code when
    the interpreter finalizes: registered with :mod:`atexit`, which runs after the non-daemon
    threads were joined and while daemon threads still run.

    A daemon thread inside a call finishes it (waited for ``timeout`` seconds in all) and
    hands its lane to this hook as it gives it back (the hook is a waiter of every pool, so
    the call's release goes through :meth:`ContextPool.give_back`: a thread calling in a
    loop cannot take its lane again before the hook, whatever the scheduler does); its next
    call, like any call or engine change after, blocks for good in a lock wait. (CPython
    ends a daemon thread that comes back from a native call during finalization by unwinding
    its stack; through the C++ frames of TensorRT or torch that is ``std::terminate``: the
    process aborted after its work was done.) Lanes still in a call after ``timeout`` are
    named on stderr. With :data:`EXIT_REPORT_ENV` set, one line on stderr says how many
    lanes were held and how long that took. Returns the number of lanes held."""
    if _EXITING.is_set():  # held already
        return 0
    start = time.monotonic()
    _EXITING.set()
    pools = [pool for pool in list(_POOLS) if not pool.closed]  # a closed pool's lanes are taken
    for pool in pools:
        with pool._lock:
            pool.waiters.append(_EXIT_WAITER)
    deadline = start + timeout
    held = total = 0
    missed: list[str] = []
    for pool in pools:
        slots = list(pool._slots)
        total += len(slots)
        missing = sum(not _hold(slot, deadline) for slot in slots)
        held += len(slots) - missing
        if missing:
            missed.append(f"{pool._engine!r} ({missing} of {len(slots)})")
    waited = time.monotonic() - start
    if missed:
        print(f"trt_runtime: at interpreter exit, lanes still in a call after {waited:.1f} s: "
              f"{', '.join(missed)}; a daemon thread that returns from such a call while the "
              "interpreter finalizes makes the process abort", file=sys.stderr, flush=True)
    if os.environ.get(EXIT_REPORT_ENV):
        print(f"trt_runtime exit hook: held {held} of {total} lane(s) of {len(pools)} engine(s) "
              f"in {waited:.3f} s", file=sys.stderr, flush=True)
    return held


def _hold(slot: Slot[Any], deadline: float) -> bool:
    """Take ``slot`` for good: its token, or its hand-over by :meth:`ContextPool.give_back`
    (which keeps the token taken, so only the flag shows it); polled every half millisecond."""
    while not slot.held_at_exit:
        if slot.take():
            return True
        if time.monotonic() >= deadline:
            return slot.held_at_exit
        time.sleep(0.0005)
    return True


#: The environment variable that makes :func:`hold_lanes_at_exit` report on stderr.
EXIT_REPORT_ENV = "TRT_RUNTIME_EXIT_REPORT"


class _ExitWaiter(_Waiter):
    """The exit hook's place among every pool's waiters: it makes a call's release go through
    :meth:`ContextPool.give_back`, which keeps the lane for the hook (never woken)."""

    __slots__ = ()

    def wake(self, slot: Any) -> None:
        pass


_EXIT_WAITER = _ExitWaiter()


# weakref.finalize registers its own exit hook with its first finalizer: make that happen now,
# so that this hook, registered after it, runs before it (atexit runs hooks last-in first-out)
# and no finalizer runs while a daemon thread is still calling.
weakref.finalize(_EXITING, int).atexit = False
atexit.register(hold_lanes_at_exit)
