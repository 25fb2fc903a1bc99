"""The one way into a call: :meth:`EngineBase.execute <trt_runtime.engine.EngineBase.execute>`
and ``__call__``, made here once for every backend.

A call leases a lane (this thread's last one if free: one thread-local read and one
non-blocking lock acquire), runs inside the lane's device guard if the backend set one,
tries the lane's fast entry, else the general path, and gives the lane back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["make_entry"]


def make_entry(bare: bool, name: str, doc: str | None) -> Any:
    """``execute`` (``bare=False``) and ``__call__`` (``bare=True``): one body, no call
    between the user and the pipeline (a call is a few µs; a wrapper would be a tenth)."""

    def entry(
        # self: an EngineBase (typed Any: engine.py imports this module)
        self: Any, *inputs: Any, stream: Any = None, outputs: Sequence[Any] | None = None,
        profile: int | None = None,
    ) -> Any:
        pool = self._pool
        # ContextPool.acquire/give_back inlined for their uncontended case: this thread's
        # lane of its previous call, if it is free.
        try:
            slot = pool._local.slot  # (an attribute read: cheaper than getattr with a default)
        except AttributeError:
            slot = None
        first = slot is None
        if first:  # this thread's first call on this engine
            slot = pool.lease(self._lease_timeout)
        elif not slot.lock.acquire(False):
            slot = pool.lease(self._lease_timeout)
        lane = slot.lane
        guard = lane._device_guard
        try:
            token = None if guard is None else guard.enter()
            try:
                if first:
                    lane._thread_start()
                result = lane._fast_entry(inputs, stream, outputs) if profile is None else None
                if result is None:
                    result = lane._call(inputs, stream, outputs, profile)
            finally:
                if guard is not None:
                    guard.exit(token)
        finally:
            if pool._waiters:  # (close() holds every lane: no call is in flight then)
                pool.give_back(slot)
            else:
                slot.lock.release()
        if bare:
            return result[0] if len(result) == 1 else tuple(result)
        return result

    entry.__doc__ = doc
    entry.__name__ = name
    entry.__qualname__ = f"EngineBase.{name}"
    return entry
