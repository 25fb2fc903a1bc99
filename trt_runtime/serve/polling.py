"""``LoopPoller``: keeps an event loop polling its sockets for a while instead of sleeping.

An event loop with nothing to do sleeps in ``epoll_wait``, and the next message that arrives has to
wake it: the kernel schedules the process again, and on a virtual machine whose CPU halted in the
meantime that takes tens of µs (``benchmarks/probes/cpu_wakeup.py`` measures it per host). A request
of the local server crosses two such hops between a front and its engine process. While a poller
is active, a callback that queues itself again keeps the loop's ready queue non-empty, so each pass
of the loop polls its sockets with no wait and reacts within a few µs. The price is a core kept
busy for the window after the last activity (:meth:`LoopPoller.poke`); an idle server sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from time import perf_counter

from trt_runtime.errors import SettingsError

__all__ = ["LoopPoller", "check_poll_us"]

#: The longest polling window accepted, in µs (a second of a busy core after each message).
MAX_POLL_US = 1_000_000


def check_poll_us(name: str, value: object) -> int:
    """``value`` as a polling window in µs (0: never poll); ``SettingsError`` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_POLL_US:
        raise SettingsError(f"{name} must be an integer number of µs in [0, {MAX_POLL_US}]; got {value!r}")
    return value


class LoopPoller:
    """Keeps ``loop`` polling (no sleep) until ``window_us`` after the last :meth:`poke`.

    ``on_pass``: called once per pass of the loop while it polls (a deadline to check, say); the last
    pass begins at or after the end of the window, so a deadline given to :meth:`poke` as ``until``
    is always seen as passed by some pass. Use it on the loop's own thread only.
    """

    __slots__ = ("_active", "_closed", "_loop", "_on_pass", "_until", "_window_s")

    def __init__(self, loop: asyncio.AbstractEventLoop, window_us: int,
                 on_pass: Callable[[], None] | None = None) -> None:
        self._loop = loop
        self._window_s = check_poll_us("window_us", window_us) / 1e6
        self._on_pass = on_pass
        self._until = 0.0
        self._active = False
        self._closed = False

    @property
    def active(self) -> bool:
        """Whether the loop polls now."""
        return self._active

    def poke(self, until: float | None = None) -> None:
        """Something happened: poll until the window after now, or until ``until`` (a
        :func:`time.perf_counter` time) if that is later."""
        if self._closed:
            return
        end = perf_counter() + self._window_s
        if until is not None and until > end:
            end = until
        if end > self._until:
            self._until = end
        if not self._active:
            self._active = True
            self._loop.call_soon(self._pass)

    def _pass(self) -> None:
        # The time is read before ``on_pass``: the pass that ends the polling began at or after
        # ``_until``, so an ``on_pass`` deadline at or before it (``poke(until=)``) is seen as passed.
        now = perf_counter()
        if self._closed:
            self._active = False
            return
        try:
            if self._on_pass is not None:
                self._on_pass()
        finally:  # (an on_pass that raised is the loop's to report; the polling stays consistent)
            if not self._closed and now < self._until:
                self._loop.call_soon(self._pass)
            else:
                self._active = False

    def close(self) -> None:
        """Stop polling: the pass queued now ends it without calling ``on_pass``. Idempotent."""
        self._closed = True
