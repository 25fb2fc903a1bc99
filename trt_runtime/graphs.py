"""Options of the outer CUDA-graph wrap: the runtime captures each engine call into a graph.

TensorRT-RTX's ``cuda_graph_strategy`` makes TensorRT capture its own kernels inside
``enqueueV3``. The *outer* wrap is the runtime's own: the whole call (the engine's
enqueue, with its inputs and outputs in static buffers owned by the engine) is captured
once per input shape and optimization profile, and later calls replay the graph. With
full TensorRT it is the only CUDA-graph mechanism there is.

Set it with :func:`trt_runtime.enable_cudagraphs` (``outer=True``) or
:attr:`Engine.outer_graph <trt_runtime.EngineBase.outer_graph>`; a backend declares it
with ``BackendCapabilities.supports_outer_cuda_graph``.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from trt_runtime.errors import SettingsError

__all__ = ["COPY_NODE_CALLS", "DEFAULT_MAX_GRAPHS", "OUTPUT_MODES", "CopyNodes", "GraphCache", "OuterGraph",
           "build_copy_nodes"]

#: Graphs kept per execution context by default (each holds static buffers).
DEFAULT_MAX_GRAPHS = 32

#: ``copy``: every call returns new arrays (a device-to-device copy of the engine's static
#: output buffers, queued on the engine's stream). ``view``: zero-copy views of the static
#: output buffers, overwritten by the next replay of the same graph.
OUTPUT_MODES = ("copy", "view")


@dataclasses.dataclass(frozen=True, slots=True)
class OuterGraph:
    """How an engine runs under the outer CUDA-graph wrap.

    Graphs are keyed by the input shapes and the optimization profile; a graph is
    captured again when the execution context changes (a settings change), when the
    shapes of a call have no graph yet, and after :meth:`EngineBase.reset_graphs`. Inputs
    are copied into the engine's static input buffers unless the caller passes those very
    buffers (``engine.static_inputs(*shapes)``). An execution context that TensorRT says
    cannot be captured (``IExecutionContext.is_stream_capturable`` false) and engines with
    data-dependent output shapes are refused with :class:`~trt_runtime.CapabilityError`
    at the first call; nothing is ever captured on the legacy default stream. (The python
    backend creates TensorRT-RTX contexts with USER_MANAGED memory, which TensorRT-RTX
    reports capturable; see docs/python-backend.md.)
    """

    outputs: str = "copy"
    #: Graphs kept per execution context; beyond it the least recently used is released.
    max_graphs: int = DEFAULT_MAX_GRAPHS

    def __post_init__(self) -> None:
        if self.outputs not in OUTPUT_MODES:
            allowed = ", ".join(repr(m) for m in OUTPUT_MODES)
            raise SettingsError(f"outer graph outputs must be one of {allowed}; got {self.outputs!r}")
        if isinstance(self.max_graphs, bool) or not isinstance(self.max_graphs, int) or self.max_graphs < 1:
            raise SettingsError(f"outer graph max_graphs must be an int >= 1; got {self.max_graphs!r}")

    @classmethod
    def coerce(cls, value: OuterGraph | bool | str | None) -> OuterGraph | None:
        """``None``/``False``: no outer wrap; ``True``: defaults; a mode name; an instance."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls(outputs=value)
        raise TypeError(
            f"outer graph must be None, a bool, one of {', '.join(map(repr, OUTPUT_MODES))} "
            f"or OuterGraph; got {type(value).__name__} {value!r}"
        )


K = TypeVar("K", bound=Hashable)
G = TypeVar("G")


class GraphCache(Generic[K, G]):
    """The captured graphs of one execution context, by (input shapes, profile): an LRU.

    The core owns the rules (what a key is, how many are kept, when all go); a backend
    stores whatever its graphs are and is called back to release one (``release``) when
    it is evicted or the cache is cleared. ``hits``, ``misses``, ``captures`` and
    ``evictions`` count lookups that found a graph, lookups that did not, graphs added
    and graphs evicted; ``updates`` the captures whose executable graph the backend made
    by updating a released one in place instead of instantiating a new one (the backend
    counts them; see :meth:`GraphOps.capture <trt_runtime.outer.GraphOps.capture>`).
    A backend's hot path may look graphs up in its own shortcut table and report the
    replay with :meth:`touch`.
    """

    __slots__ = ("_entries", "_release", "captures", "evictions", "hits", "max_graphs", "misses", "refresh",
                 "updates")

    def __init__(self, release: Callable[[G], None], max_graphs: int = DEFAULT_MAX_GRAPHS) -> None:
        self._entries: OrderedDict[K, G] = OrderedDict()
        #: ``refresh(key)``: ``key`` becomes the most recently used, uncounted (a replay plan that
        #: found its graph itself counts the hit in :attr:`hits` and calls this: :meth:`touch` inline).
        self.refresh: Callable[[K], None] = self._entries.move_to_end
        self._release = release
        self.max_graphs = max_graphs
        self.hits = self.misses = self.captures = self.evictions = self.updates = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[K]:
        return iter(self._entries)

    def values(self) -> list[G]:
        return list(self._entries.values())

    def get(self, key: K) -> G | None:
        """The graph for ``key`` (now the most recently used), counted as a hit or a miss."""
        graph = self._entries.get(key)
        if graph is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return graph

    def peek(self, key: K) -> G | None:
        """The graph for ``key`` without counting or reordering."""
        return self._entries.get(key)

    def touch(self, key: K) -> None:
        """A replay of ``key`` found through a backend's own shortcut: count it, refresh it."""
        self.hits += 1
        self.refresh(key)

    def add(self, key: K, graph: G, *, captured: bool = True) -> list[G]:
        """Keep ``graph`` for ``key``; returns the graphs evicted to stay within
        ``max_graphs`` (already released). ``captured=False``: a placeholder (static
        buffers reserved before any capture), not counted as a capture."""
        self._entries[key] = graph
        self._entries.move_to_end(key)
        if captured:
            self.captures += 1
        evicted = []
        while len(self._entries) > self.max_graphs:
            _, old = self._entries.popitem(last=False)
            self.evictions += 1
            self._release(old)
            evicted.append(old)
        return evicted

    def pop(self, key: K) -> G | None:
        graph = self._entries.pop(key, None)
        if graph is not None:
            self._release(graph)
        return graph

    def clear(self) -> None:
        """Release every graph (counts are kept)."""
        entries = list(self._entries.values())
        self._entries.clear()
        for graph in entries:
            self._release(graph)

    def stats(self) -> dict[str, int]:
        return {
            "graphs": len(self._entries),
            "max_graphs": self.max_graphs,
            "hits": self.hits,
            "misses": self.misses,
            "captures": self.captures,
            "evictions": self.evictions,
            "updates": self.updates,
        }


#: The CUDA runtime functions (cuda-python's ``cuda.bindings.runtime``) that
#: :func:`build_copy_nodes` and :class:`CopyNodes` call.
COPY_NODE_CALLS = ("cudaGraphCreate", "cudaGraphAddMemcpyNode1D", "cudaGraphAddChildGraphNode",
                   "cudaGraphInstantiate", "cudaGraphExecMemcpyNodeSetParams1D", "cudaGraphExecDestroy",
                   "cudaGraphDestroy")


class CopyNodes:
    """A captured graph with a replay's copies as nodes of a second graph: a memcpy node
    into each static input, the captured graph as a child node after them and, for
    ``"copy"`` mode, a memcpy node out of each static output after it. A replay points the
    nodes at its own buffers (:meth:`point`: ``cudaGraphExecMemcpyNodeSetParams1D``, about
    1 µs) and launches ``exec`` once, where a ``cudaMemcpyAsync`` of its own costs about 5
    µs of CPU (measured on an H100: ``benchmarks/probes/gpu_copy_probe.py``,
    ``benchmarks/probes/gpu_keep_graph_probe.py``). ``graph`` is the built graph (destroyed after
    ``exec``), ``ins``/``outs`` its memcpy nodes in input and output order, ``rt``
    cuda-python's runtime module. Not thread-safe: one lane's call at a time."""

    __slots__ = ("d2d", "exec", "graph", "ins", "last", "nodes", "outs", "rt")

    def __init__(self, rt: Any, d2d: Any, graph: Any, graph_exec: Any, ins: list[Any], outs: list[Any]
                 ) -> None:
        self.rt = rt
        self.d2d = d2d
        self.graph = graph
        self.exec = graph_exec
        self.ins = ins
        self.outs = outs
        self.nodes = (*ins, *outs)
        #: The address on the side that changes per call (the source of an input node, the
        #: destination of an output node) each node has in ``exec``; ``None``: unknown.
        self.last: list[int | None] = [None] * len(self.nodes)

    def point(self, index: int, dst: int, src: int, nbytes: int) -> bool:
        """Make node ``index`` (inputs first, then outputs) copy ``nbytes`` from ``src`` to
        ``dst``, unless it already does: a caller that reuses its input buffer, or gets its
        output where the last one was freed, makes no CUDA call (no GIL release). False when
        CUDA refuses the address (memory of another kind than the node was built with): the
        call must copy another way. The python backend's replay plans compare the address inline and
        call this only when it changed."""
        changing = src if index < len(self.ins) else dst
        if changing == self.last[index]:
            return True
        (err,) = self.rt.cudaGraphExecMemcpyNodeSetParams1D(self.exec, self.nodes[index], dst, src, nbytes,
                                                             self.d2d)
        self.last[index] = None if err else changing
        return not err

    def destroy(self) -> None:
        """Destroy the executable graph, then the graph (the lane's work is done)."""
        self.rt.cudaGraphExecDestroy(self.exec)
        self.rt.cudaGraphDestroy(self.graph)


def build_copy_nodes(rt: Any, graph: Any, ins: Sequence[tuple[int, int]], outs: Sequence[tuple[int, int]],
                     placeholder: Callable[[int], tuple[Any, int]], d2d: Any) -> CopyNodes | None:
    """The :class:`CopyNodes` graph of a captured ``graph`` (a ``cudaGraph_t``; the child
    node is a copy of it), instantiated. ``ins``: ``(address, bytes)`` of each static input,
    ``outs`` of each static output to copy out (none: outputs handed over as they are);
    ``rt``: cuda-python's runtime module (given: the core imports no CUDA). ``None`` when
    ``rt`` lacks a call of :data:`COPY_NODE_CALLS`, there is no input, a buffer is empty or
    CUDA refuses; replays then copy with calls of their own.

    A node's address can later be set only to memory of the kind it was built with (pool
    memory such as ``cudaMallocAsync``'s, or not: measured on an H100, recorded in the GPU
    results). So the side that changes per call (the caller's input,
    the new output) is built on ``placeholder(nbytes)``: ``(keeper, address)`` of memory of
    the kind the calls will bring (a torch tensor), held until the graph is instantiated."""
    if any(getattr(rt, name, None) is None for name in COPY_NODE_CALLS):
        return None
    if not ins or any(nbytes <= 0 for _, nbytes in (*ins, *outs)):
        return None
    keeper, other = placeholder(max(nbytes for _, nbytes in (*ins, *outs)))
    err, built = rt.cudaGraphCreate(0)
    if err:
        return None
    made = None
    try:
        in_nodes = []
        for ptr, nbytes in ins:
            err, node = rt.cudaGraphAddMemcpyNode1D(built, None, 0, ptr, other, nbytes, d2d)
            if err:
                return None
            in_nodes.append(node)
        err, child = rt.cudaGraphAddChildGraphNode(built, in_nodes, len(in_nodes), graph)
        if err:
            return None
        out_nodes = []
        for ptr, nbytes in outs:
            err, node = rt.cudaGraphAddMemcpyNode1D(built, [child], 1, other, ptr, nbytes, d2d)
            if err:
                return None
            out_nodes.append(node)
        err, graph_exec = rt.cudaGraphInstantiate(built, 0)
        if err:
            return None
        made = CopyNodes(rt, d2d, built, graph_exec, in_nodes, out_nodes)
        return made
    finally:
        del keeper
        if made is None:
            rt.cudaGraphDestroy(built)
