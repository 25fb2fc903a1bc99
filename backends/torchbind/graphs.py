"""The outer CUDA-graph wrap of the torchbind backend: ``execute_engine`` captured into a
``torch.cuda.CUDAGraph`` per input-shape key, then replayed.

It follows torch-tensorrt's own cudagraphs module (``_CudaGraphsTorchTensorRTModule``):
static input tensors owned by the engine, a warm-up on a side stream so that first-run
allocations and kernel compilation stay out of the graph, capture under
``torch.cuda.graph(graph, stream=side)``, then ``replay()``; new inputs are copied into the
static inputs and outputs are cloned from the static outputs (``"copy"``) or returned as
they are (``"view"``).

Where it differs: a graph is kept per input-shape key (torch-tensorrt keeps one and
captures again on every shape change); capture happens on an engine-owned side stream,
never on the legacy default stream, ordered against the caller's stream with events;
replays run on the caller's stream, so a call queues a graph launch and its copies and
nothing else. When replays move to another stream, that stream first waits for the last
one (the graphs share the execution context's memory).

torch-tensorrt's ``execute_engine`` ignores a failed ``enqueueV3``; a context TensorRT-RTX
cannot capture (engines built without ``BuilderFlag.REQUIRE_USER_ALLOCATION``) would give a
graph that computes nothing. So each new graph is replayed once into outputs filled with
NaN and compared with the warm-up run; a graph that left them unwritten, or a capture that
raised, is a :class:`~trt_runtime.CapabilityError` (kept until the graphs are dropped).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from trt_runtime.errors import CapabilityError, EngineError, TrtRuntimeError
from trt_runtime.graphs import GraphCache

if TYPE_CHECKING:
    from .bridge import TorchBridge
    from .contract import Call

__all__ = ["GraphEntry", "OuterGraphs"]

#: Eager runs on the side stream before a capture: the first compiles TensorRT-RTX's
#: kernels for the shapes, the second settles what the first allocated.
WARMUP_RUNS = 2

_NOT_CAPTURABLE = (
    "TensorRT-RTX captures an execution context only when the engine was built with "
    "BuilderFlag.REQUIRE_USER_ALLOCATION and "
    "IExecutionContext.is_stream_capturable is true; run the engine without the outer "
    "graph, or with cuda_graph_strategy='whole_graph_capture' (TensorRT-RTX's own capture)"
)


#: Serializes outer-graph captures (see OuterGraphs._capture).
_CAPTURE_LOCK = threading.Lock()


class GraphEntry:
    """One captured graph and the static tensors it reads and writes."""

    __slots__ = ("graph", "inputs", "outputs")

    def __init__(self, graph: Any, inputs: list[Any], outputs: list[Any]) -> None:
        self.graph = graph
        self.inputs = inputs
        self.outputs = outputs


class OuterGraphs:
    """The captured graphs of one lane, kept in the core's :class:`~trt_runtime.graphs.GraphCache`
    (LRU, ``OuterGraph.max_graphs``). Not thread-safe: the lane is leased by one call."""

    def __init__(
        self,
        engine: str,
        device: int,
        bridge: TorchBridge,
        run: Callable[[list[Any]], list[Any]],
        output_names: tuple[str, ...],
    ) -> None:
        self._engine = engine
        self._device = device
        self._bridge = bridge
        self._run = run  # one eager execute_engine call on the current stream
        self._output_names = output_names
        self._entries: GraphCache[tuple[Any, ...], GraphEntry] = GraphCache(self._release)
        self._side: Any = None
        self._last: Any = None  # the stream the graphs last ran on
        self._error: CapabilityError | None = None
        #: Static inputs handed out by :meth:`static_inputs` before their graph exists.
        self._reserved: dict[tuple[Any, ...], list[Any]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def cache(self) -> GraphCache[tuple[Any, ...], GraphEntry]:
        return self._entries

    @property
    def replayable(self) -> bool:
        """Whether any graph is captured (the hot path may replay it)."""
        return len(self._entries) > 0

    def _settle(self) -> None:
        """Wait for this lane's replays and captures: each replay waits for the one before
        (``_last``), so its stream and the capture stream cover them all. Not the whole
        device: another lane may be capturing, and a device synchronize then fails (CUDA's
        "operation not permitted when stream is capturing", seen with several contexts)."""
        for stream in (self._last, self._side):
            if stream is not None:
                self._bridge.synchronize(stream)

    def _release(self, entry: GraphEntry) -> None:
        self._bridge.reset_graph(entry.graph)

    def replay(self, shapes: tuple[Any, ...], tensors: Sequence[Any], *, view: bool) -> list[Any] | None:
        """The hot path: replay the graph already captured for ``shapes`` with CUDA torch
        ``tensors``; ``None`` when there is none."""
        entry = self._entries.peek(shapes)
        if entry is None:
            return None
        self._entries.touch(shapes)
        return self._replay(entry, tensors, view)

    def run(self, call: Call, *, view: bool) -> tuple[list[Any], bool]:
        """Replay the graph of ``call``'s shapes on the current stream (capturing it first if
        there is none); return the outputs and whether a graph was captured."""
        entry = self._entries.get(call.shapes)
        captured = entry is None
        if entry is None:
            entry = self._capture(call)
        return self._replay(entry, call.tensors, view), captured

    def _replay(self, entry: GraphEntry, tensors: Sequence[Any], view: bool) -> list[Any]:
        bridge = self._bridge
        current = bridge.current_stream(self._device)
        last = self._last
        if last is not None and last is not current:
            bridge.wait_stream(current, last)
        self._last = current
        for static, tensor in zip(entry.inputs, tensors, strict=True):
            if tensor is not static:  # the caller may fill the static inputs itself
                bridge.copy_(static, tensor)
        bridge.replay(entry.graph)
        if view:
            return list(entry.outputs)
        return [bridge.clone(o) for o in entry.outputs]

    def _capture(self, call: Call) -> GraphEntry:
        """Capture ``call``'s graph, one capture at a time in the process
        (:data:`_CAPTURE_LOCK`): ``torch.cuda.graph`` synchronizes the whole device when it
        starts, which fails while another lane's stream is capturing (seen on an H100 with
        several contexts under the outer graph: "operation not permitted when stream is
        capturing"). Captures happen once per shapes and lane; replays take no lock."""
        with _CAPTURE_LOCK:
            return self._capture_now(call)

    def _capture_now(self, call: Call) -> GraphEntry:
        if self._error is not None:
            raise self._error
        bridge = self._bridge
        caller = bridge.current_stream(self._device)
        if self._side is None:
            self._side = bridge.new_stream(self._device)
        side = self._side
        bridge.wait_stream(side, caller)  # the inputs were produced on the caller's stream
        if self._last is not None and self._last is not caller:
            bridge.wait_stream(side, self._last)  # replays of other graphs share the context
        if len(self._entries) >= self._entries.max_graphs:
            self._settle()  # no replay of the graph evicted below is in flight
        host = set(call.host)
        reserved = self._reserved.pop(call.shapes, None)
        try:
            with bridge.stream_scope(side):
                if reserved is not None:
                    statics = reserved
                    for static, tensor in zip(statics, call.tensors, strict=True):
                        if tensor is not static:
                            bridge.copy_(static, tensor)
                else:
                    statics = [
                        bridge.to_device(t, self._device) if i in host else bridge.clone(t)
                        for i, t in enumerate(call.tensors)
                    ]
                eager: list[Any] = []
                for _ in range(WARMUP_RUNS):
                    eager = self._run(statics)
        except TrtRuntimeError:
            raise
        except Exception as exc:
            raise EngineError(
                f"engine {self._engine!r}: execute_engine failed in torch-tensorrt's runtime "
                f"(warm-up before the outer CUDA graph capture): {exc}"
            ) from exc
        try:
            graph, outputs = bridge.capture(lambda: self._run(statics), side)
        except Exception as exc:
            self._error = CapabilityError(
                f"engine {self._engine!r}: the outer CUDA graph could not capture torch-tensorrt's "
                f"execute_engine ({type(exc).__name__}: {exc}); {_NOT_CAPTURABLE}"
            )
            raise self._error from exc
        outputs = list(outputs)
        try:
            self._verify(graph, outputs, eager, side)
        except TrtRuntimeError:
            raise
        except Exception as exc:  # the replay itself failed
            self._error = CapabilityError(
                f"engine {self._engine!r}: the outer CUDA graph captured from torch-tensorrt's "
                f"execute_engine could not be replayed ({type(exc).__name__}: {exc}); {_NOT_CAPTURABLE}"
            )
            raise self._error from exc
        bridge.wait_stream(caller, side)
        self._last = caller
        entry = GraphEntry(graph, statics, outputs)
        self._entries.add(call.shapes, entry)
        return entry

    def _verify(self, graph: Any, outputs: list[Any], eager: list[Any], side: Any) -> None:
        """Replay the new graph into NaN-filled outputs once: an output it did not write
        means TensorRT-RTX enqueued nothing under capture (waits for the side stream)."""
        bridge = self._bridge
        with bridge.stream_scope(side):
            poisoned = [bridge.poison(o) for o in outputs]
            bridge.replay(graph)
            for name, out, ref, checked in zip(self._output_names, outputs, eager, poisoned, strict=True):
                if checked and bridge.unwritten(out, ref):
                    bridge.reset_graph(graph)
                    self._error = CapabilityError(
                        f"engine {self._engine!r}: the CUDA graph captured from torch-tensorrt's "
                        f"execute_engine did not write output {name!r}: TensorRT-RTX did not enqueue "
                        f"the engine under stream capture; {_NOT_CAPTURABLE}"
                    )
                    raise self._error

    def static_inputs(self, shapes: tuple[tuple[int, ...], ...], dtypes: list[str]) -> list[Any]:
        """The static inputs of the graph for ``shapes``; allocated now (zeros) when it has
        not been captured yet, and used by its capture."""
        entry = self._entries.peek(shapes)
        if entry is not None:
            return list(entry.inputs)
        reserved = self._reserved.get(shapes)
        if reserved is None:
            zeros = self._bridge.zeros
            reserved = self._reserved[shapes] = [
                zeros(shape, dtype, self._device) for shape, dtype in zip(shapes, dtypes, strict=True)
            ]
        return list(reserved)

    def drop(self) -> None:
        """Release every graph and its static tensors (after the device finished with them)."""
        if self._entries:
            self._settle()
        self._entries.clear()
        self._reserved.clear()
        self._error = None
        self._last = None
