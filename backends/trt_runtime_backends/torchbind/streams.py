"""The dedicated CUDA streams of torchbind lanes and outer graphs, never destroyed.

torch-tensorrt's ``execute_engine`` marks every input tensor as used on the stream it runs
on (``CUDACachingAllocator::recordStream``): a lane's stream, or the capture stream of its
outer graphs. When such a tensor is freed, torch's caching allocator records an event on
that stream, however long after the call, interpreter teardown included. A destroyed
stream then fails the record ("invalid resource handle" thrown from a tensor's destructor:
the process aborts), so a stream torch may have recorded on must live as long as the
process. :class:`StreamPool` keeps them: a stream whose owner is gone goes back to the pool
of its device and is handed to the next owner, so a process holds as many streams as it
ever had owners alive at once, and destroys none. An owner that closes gives its streams back
then (:meth:`StreamPool.give_back`) rather than when the garbage collector frees it: a closed
engine's objects reference each other and may wait thousands of loads for a collection, and
meanwhile each new engine would take a new stream (and torch's caching allocator a new pool of
blocks for it; on an H100 device memory grew by ~45 KB per load/close cycle until a collection).
"""

from __future__ import annotations

import collections
import os
import weakref
from typing import Any

from trt_runtime.errors import EngineError

__all__ = ["STREAMS", "StreamPool"]


class StreamPool:
    """Raw stream handles per device and kind (blocking or non-blocking), free for the next
    owner of that kind: a lane that asked for a non-blocking stream never gets a blocking one.

    Thread-safe without a lock (deque appends and pops are atomic), so a garbage-collector
    finalizer that gives a stream back can run in any thread, even inside :meth:`take`.
    """

    def __init__(self) -> None:
        self._free: dict[tuple[int, bool], collections.deque[int]] = {}
        #: Streams this pool made, per device (they all live until the process ends).
        self.made: dict[int, int] = {}
        #: The finalizer that gives a taken stream back, by ``id()`` of its ExternalStream
        #: (an entry goes when it ran: before that object is freed and its id reused).
        self._returns: dict[int, weakref.finalize] = {}

    def free(self, index: int, *, blocking: bool = False) -> int:
        """How many streams of device ``index`` (and of that kind) wait for an owner."""
        return len(self._free.get((index, blocking), ()))

    def take(self, torch: Any, index: int, *, blocking: bool = False) -> Any:
        """A dedicated stream on device ``index`` as a torch ``ExternalStream`` (a free one of
        that kind, else a new one), back in the pool when that object is collected; ``None``
        when cuda-python is not installed.

        ``blocking=False``: ``cudaStreamNonBlocking``, no implicit ordering with the legacy
        default stream. ``blocking=True``: ``cudaStreamDefault``, which CUDA orders with the
        legacy default stream both ways (see :meth:`.bridge.TorchBridge.execute_on`)."""
        try:
            from cuda.bindings import runtime as rt
        except ImportError:
            return None
        key = (index, blocking)
        try:
            handle = self._free.setdefault(key, collections.deque()).pop()
        except IndexError:
            flags = rt.cudaStreamDefault if blocking else rt.cudaStreamNonBlocking
            with torch.cuda.device(index):
                err, made = rt.cudaStreamCreateWithFlags(flags)
            if int(err):
                raise EngineError(
                    f"could not create a CUDA stream on device {index}: "
                    f"cudaStreamCreateWithFlags returned {err}"
                ) from None
            handle = int(made)
            self.made[index] = self.made.get(index, 0) + 1
        stream = torch.cuda.ExternalStream(handle, device=torch.device("cuda", index))
        ident = id(stream)
        returned = weakref.finalize(stream, self._give_back, key, handle, ident)
        returned.atexit = False  # not at exit: nothing is left to hand it to, the process ends it
        self._returns[ident] = returned
        return stream

    def give_back(self, stream: Any) -> None:
        """Hand ``stream`` (taken from this pool; anything else is ignored) to the next owner
        now; its owner, which stops using it, has waited for the work it queued there. Once:
        the garbage collector does not give it back again."""
        returned = self._returns.get(id(stream))
        if returned is not None and (alive := returned.peek()) is not None and alive[0] is stream:
            returned()

    def _give_back(self, key: tuple[int, bool], handle: int, ident: int) -> None:
        self._returns.pop(ident, None)
        self._free.setdefault(key, collections.deque()).append(handle)

    def forget(self) -> None:
        """Drop every free stream (in a forked child: they are the parent's)."""
        self._free = {}
        self.made = {}
        self._returns = {}


#: The process's pool (CUDA streams are per process).
STREAMS = StreamPool()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=STREAMS.forget)
