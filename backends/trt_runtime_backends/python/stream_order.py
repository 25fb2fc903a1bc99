"""Ordering an engine's own stream after and before a caller's stream.

An engine queues its work on its own stream (TensorRT-RTX's ``whole_graph_capture``
cannot run on the legacy default stream, and one execution context must not run on two
streams at once). A caller's stream is ordered with two events: before the work the
engine's stream waits for what the caller queued so far (``cudaEventRecord`` on the
caller's stream, ``cudaStreamWaitEvent`` on ours); after it the caller's stream waits
for the engine's work (the same the other way round).

Modes (:data:`DEFAULT_MODE`, read when an engine is created):

* ``"implicit"`` (default): the engine's stream is a *blocking* stream, which CUDA
  orders with the legacy default stream by itself: a caller on the legacy default
  stream (torch's default stream) needs no event at all, other caller streams get the
  four event operations. Measured on an H100 this saves about 4 µs per call (each
  cuda-python call costs about 1 µs), see docs/python-backend.md.
* ``"events"``: a non-blocking engine stream; every caller stream gets the events.

Doing the same four operations with torch's C-level ``Event``/``ExternalStream``
objects was measured too and was slower than cuda-python (about 0.8 µs per call).

*Following the caller* (the fast paths: a repeat ``engine(x)``, a pre-bound call, an
outer-graph replay): the work goes straight onto the caller's own stream, with no event
at all when the lane's previous work went there too (:attr:`StreamOrder.tail`): a thread
that keeps its lane (see :mod:`trt_runtime.lease`) and its stream pays nothing for the
ordering. When the lane's previous work went to another stream, the caller's stream first
waits for it (one event record and one wait). Every cuda-python call releases the GIL,
and under many threads each release is a thread switch: the events were most of what
made 8 callers slower than 1. The general path still runs on the lane's own stream
(staging, profile switches, allocations, captures), after joining :attr:`tail` to it.
"""

from __future__ import annotations

from typing import Any

from trt_runtime_backends.python import cuda

from trt_runtime.contract import cuda_result, stream_handle

__all__ = ["DEFAULT_MODE", "LEGACY_STREAMS", "MODES", "StreamOrder"]

MODES = ("implicit", "events")

#: The ordering engines use (see the module docstring).
DEFAULT_MODE = "implicit"

#: Handles of the legacy default stream: 0 as torch reports it, 1 as ``cudaStreamLegacy``.
LEGACY_STREAMS = (0, 1)


class StreamOrder:
    """Orders an engine's stream ``ours`` with a caller's stream (see the module docstring).

    ``skip`` holds the caller handles that need no event (the legacy default stream when
    ``ours`` is a blocking stream). The events belong to the engine's finalizer.
    """

    __slots__ = (
        "bridge", "device", "event_in", "event_out", "event_tail", "mode", "ours", "ours_t", "own", "rt",
        "seen", "skip", "tail",
    )

    def __init__(self, rt: Any, ours: int, mode: str = DEFAULT_MODE, own: Any = None, bridge: Any = None,
                 device: int = 0) -> None:
        if mode not in MODES:
            allowed = ", ".join(map(repr, MODES))
            raise ValueError(f"stream ordering mode must be one of {allowed}; got {mode!r}")
        self.rt = rt
        self.ours = ours
        #: :attr:`ours` as cuda-python's ``cudaStream_t``: a launch or copy given it skips making one.
        self.ours_t = _stream_t(rt, ours)
        self.mode = mode
        self.event_in = cuda.create_event(rt)
        self.event_out = cuda.create_event(rt)
        self.event_tail = cuda.create_event(rt)
        #: The stream this lane's last work was queued on (ours, or a caller's it followed).
        self.tail = ours
        self.skip: tuple[int, ...] = LEGACY_STREAMS if mode == "implicit" else ()
        #: The engine's own stream object (passing it as ``stream=`` needs no event), and the
        #: lane's TorchBridge and device (torch calls order with torch's current stream).
        self.own = own
        self.bridge = bridge
        self.device = device
        #: Caller streams seen, by id: (the object, its handle); a few threads' streams.
        self.seen: dict[int, tuple[Any, int]] = {}

    def caller(self, stream: Any, torch_inputs: bool) -> int | None:
        """The handle of the caller's ``stream`` to order with; ``None`` when there is none
        (no stream given and no torch inputs), it is our own stream, or it needs no event
        (one in :attr:`skip`). ``stream=None`` with torch inputs: torch's current stream."""
        if stream is None:
            caller = self.bridge.raw_stream(self.device) if torch_inputs else None
        elif stream is self.own:
            return None
        else:
            # Each caller thread often has its own stream: remember a few, by identity.
            seen = self.seen.get(id(stream))
            if seen is not None and seen[0] is stream:
                caller = seen[1]
            else:
                caller = stream_handle(stream)
                if len(self.seen) >= 16:
                    self.seen.clear()
                self.seen[id(stream)] = (stream, caller)
        if caller == self.ours or caller in self.skip:
            return None
        return caller

    def follow(self, caller: int | None) -> int:
        """The stream a fast-path call runs on, ordered after the lane's previous work:
        ``caller`` (as :meth:`caller` returned it) when it is a stream of its own, else
        ours. Nothing to order when the lane's previous work went to that very stream (the
        common case). For a legacy-stream caller in ``"events"`` mode this also makes our
        stream wait for it; the call then owes :meth:`after` (``run != caller``)."""
        if caller in LEGACY_STREAMS:  # only in "events" mode (implicit mode skips them)
            self.to_ours()
            self.before(caller)
            return self.ours
        target = self.ours if caller is None else caller
        if self.tail != target:
            self.join(target)
        return target

    def to_ours(self) -> None:
        """Before queuing anything on our stream: order it after the lane's previous work."""
        if self.tail != self.ours:
            self.join(self.ours)

    def join(self, target: int) -> None:
        """Make ``target`` wait for the work queued so far on :attr:`tail`; it becomes the tail."""
        self._chain(self.event_tail, self.tail, target)
        self.tail = target

    def use_stream(self, ours: int, own: Any, skip: tuple[int, ...]) -> None:
        """Run on another stream of the lane from now on (the old one is idle: the lane
        synchronized it), with ``skip`` the caller streams that need no event."""
        self.ours = self.tail = ours
        self.ours_t = _stream_t(self.rt, ours)
        self.own = own
        self.skip = skip

    def release(self) -> None:
        """Forget the streams (the engine closes)."""
        self.seen.clear()
        self.own = None

    @staticmethod
    def blocking(mode: str) -> bool:
        """Whether an engine stream for ``mode`` must be created blocking (synchronizing
        with the legacy default stream)."""
        return mode == "implicit"

    def before(self, caller: int) -> None:
        """Make our stream wait for the work queued so far on ``caller``."""
        self._chain(self.event_in, caller, self.ours)

    def after(self, caller: int) -> None:
        """Make ``caller`` wait for the work queued so far on our stream."""
        self._chain(self.event_out, self.ours, caller)

    def _chain(self, event: Any, producer: int, waiter: int) -> None:
        """``waiter`` waits for the work queued so far on ``producer`` (through ``event``)."""
        rt = self.rt
        (err,) = rt.cudaEventRecord(event, producer)
        if err:
            cuda_result((err,), "cudaEventRecord")
        (err,) = rt.cudaStreamWaitEvent(waiter, event, 0)
        if err:
            cuda_result((err,), "cudaStreamWaitEvent")

    def events(self) -> tuple[Any, ...]:
        """The events, for the engine's finalizer."""
        return (self.event_in, self.event_out, self.event_tail)


def _stream_t(rt: Any, handle: int) -> Any:
    """``handle`` as ``rt.cudaStream_t`` (cuda-python turns an int given to a launch or a copy into
    one on every call: about 0.1-0.2 µs on an H100 host), or the int where ``rt`` has no such type."""
    make = getattr(rt, "cudaStream_t", None)
    return handle if make is None else make(handle)
