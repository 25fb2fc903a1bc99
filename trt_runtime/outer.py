"""The outer CUDA-graph manager, written once: graphs per (input shapes, profile), their
static buffers and the rules of capture, replay, re-capture and release.

Under :attr:`EngineBase.outer_graph <trt_runtime.EngineBase.outer_graph>` each lane (one
execution context) keeps an :class:`OuterGraphs`: a :class:`~trt_runtime.graphs.GraphCache`
of :class:`GraphSlot`\\ s by ``(input shapes, profile)``. A slot holds static input buffers
(allocated through the backend's ``_alloc_static``, also by ``engine.static_inputs()``
before any capture), static output buffers and, from its first call on, the captured graph.

A call (:meth:`OuterGraphs.run`):

1. is ordered after the caller's stream (``_graph_enter``, the backend's);
2. finds the slot of its key (an LRU: beyond ``OuterGraph.max_graphs`` the least recently
   used slot is released, after the lane's queued work is done);
3. copies its inputs into the static inputs, except an input whose address *is* the static
   buffer's (the caller filled ``static_inputs()`` itself);
4. on the slot's first call: binds the static buffers (``_bind_static``), runs the engine
   eagerly once (``_warm_up``: TensorRT-RTX compiles kernels lazily on a first run, which
   cannot be captured; its outputs are this call's results), then captures ``_enqueue``
   (``_capture``), counted in ``graph_captures`` and the cache's ``captures``; all of it
   under :data:`CAPTURE_LOCK`, one capture at a time in the process. A
   :class:`~trt_runtime.CapabilityError` while capturing (the context cannot be captured)
   is kept and raised again, without trying, until the graphs are dropped; later calls
   ``_launch`` the graph;
5. hands the static outputs over (``_graph_results``): the buffers themselves (``"view"``),
   new arrays (``"copy"``), or written into ``outputs=``;
6. is ordered before the caller's stream again (``_graph_exit``), even when it failed.

Graphs are released (``_destroy_graph``) when the lane's context is dropped (a settings
change), when ``outer_graph`` changes, on ``reset_graphs()`` and on close, always after the
lane's work is done (:meth:`EngineBase._sync <trt_runtime.EngineBase._sync>`); the next call
captures again. A backend's own replay fast path may look a slot up in
:attr:`OuterGraphs.shortcuts` (filled for calls whose ``_graph_call`` gives a shortcut key)
and report the replay with ``cache.touch(slot.key)``.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

from trt_runtime.contract import numel
from trt_runtime.dtypes import itemsize
from trt_runtime.errors import CapabilityError
from trt_runtime.graphs import GraphCache

__all__ = ["CAPTURE_LOCK", "SHORTCUTS", "GraphHooks", "GraphSlot", "OuterGraphs", "graph_hooks_from"]

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
    own replay function for it (``None`` until the backend makes one).
    """

    __slots__ = (
        "graph", "in_nbytes", "in_ptrs", "input_views", "inputs", "key", "out_nbytes", "out_ptrs",
        "out_shapes", "output_views", "outputs", "plan",
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


def _static_buffers(lane: Any, specs: Sequence[Any], shapes: Sequence[Sequence[int]]
                    ) -> tuple[list[Any], tuple[int, ...], tuple[int, ...]]:
    buffers, ptrs, sizes = [], [], []
    for spec, shape in zip(specs, shapes, strict=True):
        dims = tuple(int(d) for d in shape)
        buffer, ptr = lane._alloc_static(dims, spec)
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
    """The outer graphs of one lane (see the module docstring). Not thread-safe: the lane
    is leased by one call at a time. Its methods take the lane whose hooks they call."""

    __slots__ = ("_released", "cache", "refused", "shortcuts")

    def __init__(self) -> None:
        #: Slots by (input shapes, profile), bounded (``OuterGraph.max_graphs``).
        self.cache: GraphCache[tuple[Any, int], GraphSlot] = GraphCache(self._on_release)
        #: Captured slots by the backend's shortcut key (its replay fast path).
        self.shortcuts: dict[Hashable, GraphSlot] = {}
        #: The CapabilityError of a capture that could not be made, until the graphs go.
        self.refused: CapabilityError | None = None
        self._released: list[GraphSlot] = []

    def __len__(self) -> int:
        return len(self.cache)

    # -- slots --------------------------------------------------------------------------------
    def slot(self, lane: Any, key: tuple[Any, int]) -> GraphSlot:
        """The slot of ``key``, made now (static inputs allocated, nothing captured) when
        there is none."""
        slot = self.cache.peek(key)
        if slot is None:
            inputs, ptrs, sizes = _static_buffers(lane, lane._inputs, key[0])
            slot = GraphSlot(key, inputs, ptrs, sizes)
            self._keep(lane, slot)
        return slot

    def alloc_outputs(self, lane: Any, slot: GraphSlot, shapes: Sequence[Sequence[int]]) -> None:
        """Allocate ``slot``'s static outputs of ``shapes`` (through ``_alloc_static``), for a
        backend whose runtime writes into memory it is given (from ``_bind_static``)."""
        slot.outputs, slot.out_ptrs, slot.out_nbytes = _static_buffers(lane, lane._outputs, shapes)
        slot.out_shapes = [tuple(int(d) for d in s) for s in shapes]

    def static_inputs(self, lane: Any, key: tuple[Any, int], as_torch: bool | None) -> list[Any]:
        """The static inputs of ``key``'s slot, as the backend hands them out."""
        return lane._input_views(self.slot(lane, key), as_torch)  # type: ignore[no-any-return]

    def _keep(self, lane: Any, slot: GraphSlot) -> None:
        cache = self.cache
        outer = lane._outer_graph
        if outer is not None:
            cache.max_graphs = outer.max_graphs
        if len(cache) >= cache.max_graphs:
            lane._sync()  # no replay of the graph evicted below is still in flight
        cache.add(slot.key, slot, captured=False)
        self._release(lane)

    # -- one call -------------------------------------------------------------------------------
    def run(self, lane: Any, context: Any, call: Any, stream: Any, outputs: Sequence[Any] | None
            ) -> list[Any]:
        """One validated call under the outer graph: replay its slot's graph, or capture it
        (the eager warm-up run is then this call's result)."""
        if not lane._graph_capturable():
            return lane._run(context, call, stream, outputs)  # type: ignore[no-any-return]
        key, sources, addresses, shortcut = lane._graph_call(call)
        # Ordered first: static buffers made now are made on the call's stream.
        token = lane._graph_enter(stream, call)
        try:
            slot = self.cache.get(key)
            if slot is None:
                slot = self.slot(lane, key)
            copy = lane._copy
            for src, address, dst, ptr, nbytes in zip(
                sources, addresses, slot.inputs, slot.in_ptrs, slot.in_nbytes, strict=True
            ):
                if address != ptr and nbytes:
                    copy(dst, src, nbytes, token)
            if slot.graph is None:
                self._capture(lane, context, slot, token)
            else:
                lane._launch(slot.graph, token)
            view = outputs is None and lane._outer_graph.outputs == "view"
            results = lane._graph_results(context, slot, call, outputs, view, token)
        finally:
            lane._graph_exit(token)
        if shortcut is not None and outputs is None:
            shortcuts = self.shortcuts
            if len(shortcuts) >= SHORTCUTS:
                shortcuts.clear()
            shortcuts[shortcut] = slot
        return results  # type: ignore[no-any-return]

    def _capture(self, lane: Any, context: Any, slot: GraphSlot, token: Any) -> None:
        if self.refused is not None:
            raise self.refused
        with CAPTURE_LOCK:
            try:
                lane._bind_static(context, slot)
                if self.cache.peek(slot.key) is not slot:
                    self._keep(lane, slot)  # binding dropped the graphs (the context's memory grew)
                lane._warm_up(context, slot, token)
                enqueue = lambda stream: lane._enqueue(context, slot, stream)  # noqa: E731
                graph, made = _without_collector(lane._capture, enqueue, token, slot)
            except CapabilityError as exc:
                self.refused = exc
                raise
        slot.graph = graph
        if made is not None and not slot.outputs:
            slot.outputs = list(made)
        self.cache.captures += 1
        lane._graph_captures += 1

    # -- release ------------------------------------------------------------------------------
    def drop(self, lane: Any) -> None:
        """Release every graph and let go of the static buffers (views handed out keep
        their memory). Called with the lane held, after its work is done."""
        self.shortcuts.clear()
        self.refused = None
        self.cache.clear()
        self._release(lane)

    def _on_release(self, slot: GraphSlot) -> None:
        self._released.append(slot)

    def _release(self, lane: Any) -> None:
        released = self._released
        if not released:
            return
        self.shortcuts.clear()  # may point at a released slot
        while released:
            slot = released.pop()
            slot.plan = None
            graph, slot.graph = slot.graph, None
            if graph is not None:
                lane._destroy_graph(graph)


class GraphHooks:
    """The hooks :class:`OuterGraphs` calls on a lane: a base of
    :class:`~trt_runtime.EngineBase` (see docs/writing-a-backend.md). The required ones
    raise :class:`~trt_runtime.CapabilityError` here; a backend with
    ``supports_outer_cuda_graph`` implements them. ``stream`` below is the token
    ``_graph_enter`` returned (the backend's own stream, for instance)."""

    def _graph_call(self, call: Any) -> tuple[tuple[Any, int], Sequence[Any], Sequence[int], Hashable | None]:
        """``(key, sources, addresses, shortcut)`` of a validated ``call``: ``key`` is
        ``(input shapes as tuples of ints, profile index)``, ``sources`` what ``_copy`` copies
        from, ``addresses`` their device addresses (-1 for host memory), ``shortcut`` the key
        of :attr:`OuterGraphs.shortcuts` for the backend's replay fast path (or ``None``)."""
        raise self._no_graphs()

    def _alloc_static(self, shape: tuple[int, ...], spec: Any) -> tuple[Any, int]:
        """A new static buffer of ``shape`` for tensor ``spec``, and its device address."""
        raise self._no_graphs()

    def _bind_static(self, context: Any, slot: GraphSlot) -> None:
        """Before a slot's warm-up: set the context's shapes and profile for ``slot.key`` and
        the addresses of its static buffers; where the runtime writes into memory it is
        given, allocate the static outputs (:meth:`OuterGraphs.alloc_outputs`). Raise
        :class:`~trt_runtime.CapabilityError` for a context that cannot be captured."""
        raise self._no_graphs()

    def _enqueue(self, context: Any, slot: GraphSlot, stream: Any) -> list[Any] | None:
        """Run the engine once on ``slot``'s static buffers on ``stream``; return the outputs
        where the runtime allocates them (they become the static outputs when captured)."""
        raise self._no_graphs()

    def _warm_up(self, context: Any, slot: GraphSlot, stream: Any) -> None:
        """The eager run before a capture (default: one ``_enqueue`` on ``stream``)."""
        self._enqueue(context, slot, stream)

    def _capture(self, fn: Callable[[Any], list[Any] | None], stream: Any, slot: GraphSlot
                 ) -> tuple[Any, list[Any] | None]:
        """Capture ``fn(capture_stream)`` (``slot``'s enqueue) on a stream of the backend's
        (never the legacy default stream), ordered after ``stream``; return the graph and
        what ``fn`` returned."""
        raise self._no_graphs()

    def _launch(self, graph: Any, stream: Any) -> None:
        """Replay ``graph`` on ``stream``."""
        raise self._no_graphs()

    def _copy(self, dst: Any, src: Any, nbytes: int, stream: Any) -> None:
        """Copy ``nbytes`` from ``src`` (a source of ``_graph_call``, or a static output) into
        ``dst`` (a static input, or an ``outputs=`` array) on ``stream``."""
        raise self._no_graphs()

    def _destroy_graph(self, graph: Any) -> None:
        """Release a captured graph (its slot is gone; the lane's work is done)."""
        raise self._no_graphs()

    def _graph_enter(self, stream: Any, call: Any) -> Any:
        """Order the lane's graph work after the caller's ``stream``; return the token the
        other hooks get as ``stream`` (default: ``stream``)."""
        return stream

    def _graph_exit(self, stream: Any) -> None:
        """Order the caller's stream after the lane's graph work (also after a failure)."""

    def _graph_capturable(self) -> bool:
        """Whether calls go through the outer graph now (default: always)."""
        return True

    def _input_views(self, slot: GraphSlot, as_torch: bool | None) -> list[Any]:
        """``static_inputs()``'s answer for ``slot`` (default: the static inputs)."""
        return list(slot.inputs)

    def _graph_results(self, context: Any, slot: GraphSlot, call: Any, outputs: Sequence[Any] | None,
                       view: bool, stream: Any) -> list[Any]:
        """The call's outputs from the static outputs: written into ``outputs=`` (returned
        as given), the static outputs themselves (``view``), or new buffers
        (``_alloc_static``) they are copied into."""
        copy = self._copy
        if outputs is not None:
            for dst, src, nbytes in zip(outputs, slot.outputs, slot.out_nbytes, strict=True):
                if nbytes:
                    copy(dst, src, nbytes, stream)
            return list(outputs)
        if view:
            return list(slot.outputs)
        results = []
        for spec, shape, src, nbytes in zip(
            self._outputs, slot.out_shapes, slot.outputs, slot.out_nbytes, strict=True  # type: ignore[attr-defined]
        ):
            dst, _ = self._alloc_static(shape, spec)
            if nbytes:
                copy(dst, src, nbytes, stream)
            results.append(dst)
        return results

    def _no_graphs(self) -> CapabilityError:
        backend = getattr(getattr(self, "_backend", None), "name", type(self).__name__)
        return CapabilityError(f"the {backend!r} backend does not support outer_cuda_graph")


_E = TypeVar("_E", bound=type)


def graph_hooks_from(module: Any) -> Callable[[_E], _E]:
    """A class decorator: each :class:`GraphHooks` hook ``_name`` the class does not define
    itself becomes ``module.name`` when the module has it (a backend keeps its hooks as
    functions taking the lane first, in its ``graphs.py``). Raises ``TypeError`` for a
    module without any hook, so a misspelt module fails at import."""

    def bind(cls: _E) -> _E:
        bound = 0
        for name in vars(GraphHooks):
            if not name.startswith("_") or name.startswith("__") or name in vars(cls):
                continue
            fn = getattr(module, name[1:], None)
            if callable(fn):
                setattr(cls, name, fn)
                bound += 1
        if not bound:
            raise TypeError(f"{getattr(module, '__name__', module)!r} defines none of the GraphHooks")
        return cls

    return bind
