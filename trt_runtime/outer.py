"""The outer CUDA-graph manager, written once: graphs per (input shapes, profile), their
static buffers and the rules of capture, replay, re-capture and release.

Under :attr:`EngineBase.outer_graph <trt_runtime.EngineBase.outer_graph>` each lane (one
execution context) keeps an :class:`OuterGraphs`: a :class:`~trt_runtime.graphs.GraphCache`
of :class:`GraphSlot`\\ s by ``(input shapes, profile)``. A slot holds static input buffers
(allocated through the lane's :class:`GraphOps` ``alloc_static``, also by ``engine.static_inputs()``
before any capture), static output buffers and, from its first call on, the captured graph.

A call (:meth:`OuterGraphs.run`):

1. is ordered after the caller's stream (``graph_enter``, the backend's);
2. finds the slot of its key (an LRU: beyond ``OuterGraph.max_graphs`` the least recently
   used slot is released, after the lane's queued work is done);
3. copies its inputs into the static inputs, except an input whose address *is* the static
   buffer's (the caller filled ``static_inputs()`` itself);
4. on the slot's first call: binds the static buffers (``bind_static``), runs the engine
   eagerly once (``warm_up``: TensorRT-RTX compiles kernels lazily on a first run, which
   cannot be captured; its outputs are this call's results), then captures ``enqueue``
   (``capture``), counted in ``graph_captures`` and the cache's ``captures``; all of it
   under :data:`CAPTURE_LOCK`, one capture at a time in the process. A
   :class:`~trt_runtime.CapabilityError` while capturing (the context cannot be captured)
   is kept and raised again, without trying, until the graphs are dropped; later calls
   ``launch`` the graph;
5. hands the static outputs over (``graph_results``): the buffers themselves (``"view"``),
   new arrays (``"copy"``), or written into ``outputs=``;
6. is ordered before the caller's stream again (``graph_exit``), even when it failed.

Graphs are released (``destroy_graph``) when the lane's context is dropped (a settings
change), when ``outer_graph`` changes, on ``reset_graphs()`` and on close, always after the
lane's work is done (:meth:`LaneOps.sync <trt_runtime.lane.LaneOps.sync>`); the next call
captures again. A backend's own replay fast path may look a slot up in
:attr:`OuterGraphs.shortcuts` (filled for calls whose ``graph_call`` gives a shortcut key)
and report the replay with ``cache.touch(slot.key)`` (or inline: ``cache.hits += 1`` and
``cache.refresh(slot.key)``).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from trt_runtime.contract import numel
from trt_runtime.dtypes import itemsize
from trt_runtime.errors import CapabilityError
from trt_runtime.graphs import GraphCache

if TYPE_CHECKING:
    from trt_runtime.protocols import TensorSpec

__all__ = ["CAPTURE_LOCK", "SHORTCUTS", "GraphOps", "GraphSlot", "OuterGraphs", "default_graph_results"]

#: Serializes outer-graph captures in the whole process, for every backend: TensorRT-RTX
#: 1.6.1 crashed (segfault, H100, 2026-11-24) when two contexts of one engine captured at
#: once, and ``torch.cuda.graph`` synchronizes the device when it starts, which fails while
#: another lane's stream is capturing. Captures happen once per shapes and lane; replays
#: take no lock.
CAPTURE_LOCK = threading.Lock()

#: How many shortcut keys (input shapes) :attr:`OuterGraphs.shortcuts` remembers.
SHORTCUTS = 16


class GraphSlot:
    """The static buffers and the graph of one ``(input shapes, profile)`` of one lane.

    ``inputs``/``outputs``: the static buffers (the backend's objects), ``in_ptrs``/
    ``out_ptrs`` their device addresses, ``in_nbytes``/``out_nbytes`` their sizes,
    ``out_shapes`` the output shapes; ``graph``: the backend's captured graph, ``None``
    until the first call captures it; ``input_views``/``output_views``: the backend's
    cached views of them (e.g. torch tensors), made at most once; ``plan``: the backend's
    own replay function for it (``None`` until the backend makes one); ``static_plan``: the
    backend's replay function for calls given the static input buffers themselves, where it
    has one of its own (the python backend's plain plan). Both are dropped on release.
    """

    __slots__ = (
        "graph", "in_nbytes", "in_ptrs", "input_views", "inputs", "key", "out_nbytes", "out_ptrs",
        "out_shapes", "output_views", "outputs", "plan", "static_plan",
    )

    def __init__(self, key: tuple[Any, int], inputs: list[Any], in_ptrs: tuple[int, ...],
                 in_nbytes: tuple[int, ...]) -> None:
        self.key = key
        self.inputs = inputs
        self.in_ptrs = in_ptrs
        self.in_nbytes = in_nbytes
        self.outputs: list[Any] = []
        self.out_ptrs: tuple[int, ...] = ()
        self.out_nbytes: tuple[int, ...] = ()
        self.out_shapes: list[tuple[int, ...]] = []
        self.graph: Any = None
        self.input_views: list[Any] | None = None
        self.output_views: list[Any] | None = None
        self.plan: Any = None
        self.static_plan: Any = None


class GraphOps(Protocol):
    """The backend's side of one lane's outer CUDA graphs, called by
    :class:`~trt_runtime.outer.OuterGraphs`. ``stream`` below is the token
    :meth:`graph_enter` returned (the backend's own stream, for instance)."""

    def graph_call(self, call: Any) -> tuple[tuple[Any, int], Sequence[Any], Sequence[int], Hashable | None]:
        """``(key, sources, addresses, shortcut)`` of a validated ``call``: ``key`` is
        ``(input shapes as tuples of ints, profile index)``, ``sources`` what :meth:`copy`
        copies from, ``addresses`` their device addresses (-1 for host memory), ``shortcut``
        the key of :attr:`OuterGraphs.shortcuts` for the backend's replay fast path (or ``None``)."""
        ...

    def alloc_static(self, shape: tuple[int, ...], spec: Any) -> tuple[Any, int]:
        """A new static buffer of ``shape`` for tensor ``spec``, and its device address."""
        ...

    def bind_static(self, context: Any, slot: GraphSlot) -> None:
        """Before a slot's warm-up: set the context's shapes and profile for ``slot.key`` and
        the addresses of its static buffers; where the runtime writes into memory it is
        given, allocate the static outputs (:meth:`OuterGraphs.alloc_outputs`). Raise
        :class:`~trt_runtime.CapabilityError` for a context that cannot be captured."""
        ...

    def enqueue(self, context: Any, slot: GraphSlot, stream: Any) -> list[Any] | None:
        """Run the engine once on ``slot``'s static buffers on ``stream``; return the outputs
        where the runtime allocates them (they become the static outputs when captured)."""
        ...

    def warm_up(self, context: Any, slot: GraphSlot, stream: Any) -> None:
        """The eager run before a capture (one :meth:`enqueue` on ``stream``, typically)."""
        ...

    def capture(self, fn: Callable[[Any], list[Any] | None], stream: Any, slot: GraphSlot
                ) -> tuple[Any, list[Any] | None]:
        """Capture ``fn(capture_stream)`` (``slot``'s enqueue) on a stream of the backend's
        (never the legacy default stream), ordered after ``stream``; return the graph and
        what ``fn`` returned."""
        ...

    def launch(self, graph: Any, stream: Any) -> None:
        """Replay ``graph`` on ``stream``."""
        ...

    def copy(self, dst: Any, src: Any, nbytes: int, stream: Any) -> None:
        """Copy ``nbytes`` from ``src`` (a source of :meth:`graph_call`, or a static output)
        into ``dst`` (a static input, or an ``outputs=`` array) on ``stream``."""
        ...

    def destroy_graph(self, graph: Any) -> None:
        """Release a captured graph (its slot is gone; the lane's work is done)."""
        ...

    def graph_enter(self, stream: Any, call: Any) -> Any:
        """Order the lane's graph work after the caller's ``stream``; return the token the
        other methods get as ``stream``."""
        ...

    def graph_exit(self, stream: Any) -> None:
        """Order the caller's stream after the lane's graph work (also after a failure)."""
        ...

    def graph_capturable(self) -> bool:
        """Whether calls go through the outer graph now (else they run eagerly)."""
        ...

    def input_views(self, slot: GraphSlot, as_torch: bool | None) -> list[Any]:
        """``static_inputs()``'s answer for ``slot``."""
        ...

    def graph_results(self, context: Any, slot: GraphSlot, call: Any, outputs: Sequence[Any] | None,
                      view: bool, stream: Any) -> list[Any]:
        """The call's outputs from the static outputs: written into ``outputs=`` (returned
        as given), the static outputs themselves (``view``), or new buffers
        (:func:`~trt_runtime.outer.default_graph_results` does all three with :meth:`copy`)."""
        ...


def _static_buffers(ops: GraphOps, specs: Sequence[Any], shapes: Sequence[Sequence[int]]
                    ) -> tuple[list[Any], tuple[int, ...], tuple[int, ...]]:
    buffers, ptrs, sizes = [], [], []
    for spec, shape in zip(specs, shapes, strict=True):
        dims = tuple(int(d) for d in shape)
        buffer, ptr = ops.alloc_static(dims, spec)
        buffers.append(buffer)
        ptrs.append(ptr)
        sizes.append(numel(dims) * itemsize(spec.dtype))
    return buffers, tuple(ptrs), tuple(sizes)


def _without_collector(capture: Callable[..., Any], *args: Any) -> Any:
    """``capture(*args)`` with Python's garbage collector off: a collection inside a capture
    may finalize an unrelated TensorRT object (an engine dropped by its last cycle), whose
    destructor frees memory on the capturing thread and so invalidates the capture (seen on
    the H100: ``~ICudaEngine ... operation not permitted when stream is capturing``)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return capture(*args)
    finally:
        if collecting:
            gc.enable()


class OuterGraphs:
    """The outer graphs of one lane (see the module docstring), whose backend side is
    ``ops``; ``inputs``/``outputs`` are the engine's tensors, ``sync`` waits for the lane's
    work. Not thread-safe: the lane is leased by one call at a time. Its lane sets
    ``cache.max_graphs`` from the wrap in force."""

    __slots__ = ("_released", "cache", "captures", "inputs", "ops", "outputs", "refused", "shortcuts", "sync")

    def __init__(self, ops: GraphOps, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                 sync: Callable[[], None]) -> None:
        self.ops = ops
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.sync = sync
        #: Slots by (input shapes, profile), bounded (``OuterGraph.max_graphs``).
        self.cache: GraphCache[tuple[Any, int], GraphSlot] = GraphCache(self._on_release)
        #: Captured slots by the backend's shortcut key (its replay fast path).
        self.shortcuts: dict[Hashable, GraphSlot] = {}
        #: The CapabilityError of a capture that could not be made, until the graphs go.
        self.refused: CapabilityError | None = None
        #: Graphs captured, ever (``engine.graph_captures``).
        self.captures = 0
        self._released: list[GraphSlot] = []

    def __len__(self) -> int:
        return len(self.cache)

    # -- slots --------------------------------------------------------------------------------
    def slot(self, key: tuple[Any, int]) -> GraphSlot:
        """The slot of ``key``, made now (static inputs allocated, nothing captured) when
        there is none."""
        slot = self.cache.peek(key)
        if slot is None:
            inputs, ptrs, sizes = _static_buffers(self.ops, self.inputs, key[0])
            slot = GraphSlot(key, inputs, ptrs, sizes)
            self._keep(slot)
        return slot

    def alloc_outputs(self, slot: GraphSlot, shapes: Sequence[Sequence[int]]) -> None:
        """Allocate ``slot``'s static outputs of ``shapes`` (through ``alloc_static``), for a
        backend whose runtime writes into memory it is given (from ``bind_static``)."""
        slot.outputs, slot.out_ptrs, slot.out_nbytes = _static_buffers(self.ops, self.outputs, shapes)
        slot.out_shapes = [tuple(int(d) for d in s) for s in shapes]

    def static_inputs(self, key: tuple[Any, int], as_torch: bool | None) -> list[Any]:
        """The static inputs of ``key``'s slot, as the backend hands them out."""
        return self.ops.input_views(self.slot(key), as_torch)

    def _keep(self, slot: GraphSlot) -> None:
        cache = self.cache
        if len(cache) >= cache.max_graphs:
            self.sync()  # no replay of the graph evicted below is still in flight
        cache.add(slot.key, slot, captured=False)
        self._release()

    # -- one call -------------------------------------------------------------------------------
    def run(self, context: Any, call: Any, stream: Any, outputs: Sequence[Any] | None, view: bool
            ) -> list[Any]:
        """One validated call under the outer graph (the lane checked ``graph_capturable``):
        replay its slot's graph, or capture it (the eager warm-up run is then this call's
        result); ``view``: hand the static outputs over as they are."""
        ops = self.ops
        key, sources, addresses, shortcut = ops.graph_call(call)
        # Ordered first: static buffers made now are made on the call's stream.
        token = ops.graph_enter(stream, call)
        try:
            slot = self.cache.get(key)
            if slot is None:
                slot = self.slot(key)
            copy = ops.copy
            for src, address, dst, ptr, nbytes in zip(
                sources, addresses, slot.inputs, slot.in_ptrs, slot.in_nbytes, strict=True
            ):
                if address != ptr and nbytes:
                    copy(dst, src, nbytes, token)
            if slot.graph is None:
                self._capture(context, slot, token)
            else:
                ops.launch(slot.graph, token)
            results = ops.graph_results(context, slot, call, outputs, view, token)
        finally:
            ops.graph_exit(token)
        if shortcut is not None and outputs is None:
            shortcuts = self.shortcuts
            if len(shortcuts) >= SHORTCUTS:
                shortcuts.clear()
            shortcuts[shortcut] = slot
        return results

    def _capture(self, context: Any, slot: GraphSlot, token: Any) -> None:
        if self.refused is not None:
            raise self.refused
        ops = self.ops
        with CAPTURE_LOCK:
            try:
                ops.bind_static(context, slot)
                if self.cache.peek(slot.key) is not slot:
                    self._keep(slot)  # binding dropped the graphs (the context's memory grew)
                ops.warm_up(context, slot, token)
                enqueue = lambda stream: ops.enqueue(context, slot, stream)  # noqa: E731
                graph, made = _without_collector(ops.capture, enqueue, token, slot)
            except CapabilityError as exc:
                self.refused = exc
                raise
        slot.graph = graph
        if made is not None and not slot.outputs:
            slot.outputs = list(made)
        self.cache.captures += 1
        self.captures += 1

    # -- release ------------------------------------------------------------------------------
    def drop(self) -> None:
        """Release every graph and let go of the static buffers (views handed out keep
        their memory). Called with the lane held, after its work is done."""
        self.shortcuts.clear()
        self.refused = None
        self.cache.clear()
        self._release()

    def _on_release(self, slot: GraphSlot) -> None:
        self._released.append(slot)

    def _release(self) -> None:
        released = self._released
        if not released:
            return
        self.shortcuts.clear()  # may point at a released slot
        while released:
            slot = released.pop()
            slot.plan = slot.static_plan = None
            graph, slot.graph = slot.graph, None
            if graph is not None:
                self.ops.destroy_graph(graph)


def default_graph_results(ops: GraphOps, specs: Sequence[Any], slot: GraphSlot, outputs: Sequence[Any] | None,
                          view: bool, stream: Any) -> list[Any]:
    """A call's outputs from ``slot``'s static outputs through ``ops``: written into
    ``outputs=`` (returned as given), the static outputs themselves (``view``), or new
    buffers (``ops.alloc_static`` for the output ``specs``) they are copied into."""
    copy = ops.copy
    if outputs is not None:
        for dst, src, nbytes in zip(outputs, slot.outputs, slot.out_nbytes, strict=True):
            if nbytes:
                copy(dst, src, nbytes, stream)
        return list(outputs)
    if view:
        return list(slot.outputs)
    results = []
    for spec, shape, src, nbytes in zip(specs, slot.out_shapes, slot.outputs, slot.out_nbytes, strict=True):
        dst, _ = ops.alloc_static(shape, spec)
        if nbytes:
            copy(dst, src, nbytes, stream)
        results.append(dst)
    return results
