"""Output slabs: the outputs of many calls from one allocation, for backends that return
new tensors per call.

A call that returns new tensors (``engine(x)``) would make each output with a torch
operation, and each torch operation releases the GIL: under several caller threads every
release is a thread switch (on an H100 the raw TensorRT-RTX loop with a ``torch.empty`` per
call gave half the calls/s of the same loop without, at 8 threads; docs/concurrency.md). So
one ``empty((calls, *shape))`` makes the outputs of up to :data:`SLAB_CALLS` calls
(``unbind(0)``), as long as that stays within :data:`SLAB_BYTES`. An output is a view of its
slab (its own elements, ``storage_offset`` k x its size): the slab's memory is freed when the
last of its outputs is. No torch import here: the backend passes its ``empty``.

Used by the python backend's natural and copy-mode replay plans
(``backends/trt_runtime_backends/python/plans.py``) and the torchbind backend's copy-mode
replay plan (``backends/trt_runtime_backends/torchbind/graphs.py``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["SLAB_BYTES", "SLAB_CALLS", "SLAB_STREAMS", "Slabs", "slab_calls", "slab_pools"]

#: The most calls one slab holds the outputs of.
SLAB_CALLS = 32
#: The most bytes one slab takes (outputs larger than SLAB_BYTES / 2 get no slab).
SLAB_BYTES = 1 << 20
#: The most current streams one :class:`Slabs` keeps pools for (a lane serving threads on
#: their own streams).
SLAB_STREAMS = 16


def slab_calls(shapes: Any, dtypes: Any) -> int:
    """How many calls' outputs one slab holds for outputs of ``shapes`` and torch ``dtypes``
    (1: too large for a slab, or a dtype without ``itemsize``)."""
    nbytes = 0
    for shape, dtype in zip(shapes, dtypes, strict=True):
        size = getattr(dtype, "itemsize", None)
        if not isinstance(size, int) or any(not isinstance(d, int) or d < 0 for d in shape):
            return 1
        for d in shape:
            size *= d
        nbytes += size
    return max(1, min(SLAB_CALLS, SLAB_BYTES // max(nbytes, 1)))


class Slabs:
    """The slabs of one call signature, by the stream they were made on: ``pools[stream]``
    holds the outputs of the calls to come on that current stream (a tuple per call, popped
    from the end). A call on a stream with none left refills that stream's pool: the caching
    allocator gives a block back to the stream it was made on, and only the work ordered on
    that stream is known to be done with it. A lane that serves threads on several streams
    (fewer contexts than callers) keeps a pool per stream, up to :data:`SLAB_STREAMS` of them
    (then the pools are dropped: outputs no call used go back with their slabs).

    ``empty(shape, dtype=..., device=...)`` makes a slab (``torch.empty``); its result must
    have ``unbind(0)``."""

    __slots__ = ("calls", "device", "empty", "pools", "specs")

    def __init__(self, empty: Any, device: Any, shapes: Any, dtypes: Any, calls: int) -> None:
        self.empty, self.device, self.calls = empty, device, calls
        self.specs = tuple(zip(shapes, dtypes, strict=True))
        self.pools: dict[Any, list[tuple[Any, ...]]] = {}

    def refill(self, stream: Any) -> list[tuple[Any, ...]]:
        """The pool of ``stream``, refilled with the outputs of :attr:`calls` calls."""
        pools = self.pools
        pool = pools.get(stream)
        if pool is None:
            if len(pools) >= SLAB_STREAMS:
                pools.clear()
            pool = pools[stream] = []
        empty, device, calls = self.empty, self.device, self.calls
        columns = [empty((calls, *shape), dtype=dtype, device=device).unbind(0)
                   for shape, dtype in self.specs]
        pool.extend(zip(*columns, strict=True))
        pool.reverse()
        return pool

    def fields(self) -> tuple[Any, Any]:
        """A plan's constants ``pools`` and ``refill``."""
        return self.pools, self.refill


def slab_pools(empty: Any, device: Any, shapes: Any, dtypes: Any) -> tuple[Any, Any] | None:
    """A plan's constants ``pools`` and ``refill`` for outputs of ``shapes`` and ``dtypes``
    (:meth:`Slabs.fields`); ``None`` when they get no slab (too large, no ``itemsize``, no
    outputs, or no ``empty``): the plan then makes each output per call."""
    if empty is None or not shapes:
        return None
    calls = slab_calls(shapes, dtypes)
    return Slabs(empty, device, shapes, dtypes, calls).fields() if calls > 1 else None
