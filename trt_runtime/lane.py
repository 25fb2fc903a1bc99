"""One execution context's state and path: :class:`Lane`, and the backend's side of it,
:class:`LaneOps` (with :class:`GraphOps` for the outer CUDA graph).

An engine with ``contexts=N`` holds N lanes in its :class:`~trt_runtime.lease.ContextPool`;
a call leases one. The lane keeps what the core knows of its context (the context handle,
the settings it was made with, the outer graphs, the fast entry) and runs the general
path; everything the backend keeps per context (streams, events, bindings, caches) lives
in the lane's :attr:`Lane.ops`, a plain object of the backend's that the engine's
``_new_ops(lane)`` made. Backends read and write lane state only through the public
attributes and methods below.

Not thread-safe: a lane is leased by one call at a time; engine-wide changes hold every
lane (``EngineBase._exclusive``) and apply to each through its methods.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from trt_runtime.errors import EngineError, TrtRuntimeError
from trt_runtime.outer import GraphSlot, OuterGraphs

if TYPE_CHECKING:
    from trt_runtime.engine import EngineBase
    from trt_runtime.graphs import OuterGraph
    from trt_runtime.protocols import DeviceGuard
    from trt_runtime.settings import RuntimeSettings

__all__ = ["FastEntry", "GraphOps", "Lane", "LaneOps"]

#: What the pipeline calls first on a lane: ``(inputs, stream, outputs) -> results or None``.
FastEntry = Callable[[tuple[Any, ...], Any, "Sequence[Any] | None"], "list[Any] | None"]


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


class LaneOps(Protocol):
    """The backend's side of one lane: what it keeps and does per execution context.

    A backend's class may subclass it explicitly to keep the defaults below (each says
    what it does); :meth:`create_context`, :meth:`destroy_context` and :meth:`run` have
    none. ``graphs``: the lane's :class:`GraphOps` (``None``: no outer graph)."""

    graphs: GraphOps | None = None

    def create_context(self, settings: RuntimeSettings, cache: Any) -> Any:
        """Create an execution context for ``settings`` on the engine's device.

        A backend with a cache calls ``cache.ensure_materialized(config, backend=...)`` and
        attaches the native cache it returns to its runtime config. Any exception leaves the
        lane without a context (the core names the engine in the error)."""
        ...

    def destroy_context(self, context: Any) -> None:
        """Release ``context`` (the lane's work is done)."""
        ...

    def run(self, context: Any, call: Any, stream: Any, outputs: Sequence[Any] | None) -> list[Any]:
        """Run a validated ``call`` eagerly (bind, enqueue, outputs)."""
        ...

    def validate_inputs(self, inputs: Sequence[Any], profile: int | None) -> Any:
        """Check count, kind, dtype, shape, device and profile of ``inputs`` before any
        context exists (raise :class:`~trt_runtime.InputError`, with the shared checks of
        :mod:`trt_runtime.contract`); return what :meth:`run` takes as ``call`` (default:
        the inputs as given)."""
        return inputs

    def validate_outputs(self, context: Any, outputs: Sequence[Any], call: Any) -> None:
        """Check preallocated ``outputs`` (count, dtype, device, contiguity; shapes where
        ``call`` or the lane's ``context``, ``None`` before the first, tell them) before any
        work; checks that need output shapes from the context stay in :meth:`run`
        (default: none here)."""

    def call_fast(self, inputs: tuple[Any, ...], stream: Any, outputs: Sequence[Any] | None
                  ) -> list[Any] | None:
        """The fast path for a call like one validated before: its results, or ``None`` for
        the general path (default: always). It must not raise for bad input. The pipeline
        calls :attr:`Lane.fast_entry`, which is this method unless the backend put a more
        specific function there (:meth:`Lane.switch_fast`)."""
        return None

    def thread_start(self) -> None:
        """Before the first call a thread makes on this lane's engine: per-thread setup,
        such as making the engine's device current (default: nothing)."""

    def sync(self) -> None:
        """Wait for the work this lane queued (default: nothing to wait for)."""

    def release(self) -> None:
        """Release what the lane holds, after its context (default: nothing)."""

    def after_fork(self) -> None:
        """In a forked child: stop whatever would release native objects there, such as a
        ``weakref.finalize`` (default: nothing)."""


class Lane:
    """One execution context of an engine: its context, settings, outer graphs and entry.

    Made by the engine (its first lane at construction, others for ``contexts = N``);
    ``ops`` is the backend's :class:`LaneOps` for it."""

    __slots__ = (
        "closed", "context", "creations", "device_guard", "engine", "fast_entry", "graph_captures", "ops",
        "outer_graph", "outer_graphs", "settings",
    )

    def __init__(self, engine: EngineBase, make_ops: Callable[[Lane], LaneOps],
                 device_guard: DeviceGuard | None = None) -> None:
        self.engine = engine
        #: The execution context (the backend's object); ``None`` until a call needs one.
        self.context: Any = None
        #: Contexts this lane created.
        self.creations = 0
        #: The settings the next context is made with (the engine's, applied by :meth:`apply_settings`).
        self.settings: RuntimeSettings = engine.runtime_settings
        self.outer_graph: OuterGraph | None = engine.outer_graph
        self.graph_captures = 0
        self.closed = False
        #: Set where calls could leave the caller on the engine's device: every call runs in it.
        self.device_guard = device_guard
        self.ops = make_ops(self)
        graphs = self.ops.graphs
        #: The core's outer-graph manager of this lane (``None`` for a backend without graphs).
        self.outer_graphs: OuterGraphs | None = None if graphs is None else OuterGraphs(self, graphs)
        #: What the pipeline calls first (see :meth:`reset_fast` and :meth:`switch_fast`).
        self.fast_entry: FastEntry = self.ops.call_fast

    # -- the general path -------------------------------------------------------------------
    def call(self, inputs: Sequence[Any], stream: Any, outputs: Sequence[Any] | None, profile: int | None
             ) -> list[Any]:
        """One call on this lane when its fast entry declined: validate, context, outer graph
        or eager."""
        engine = self.engine
        if self.closed:
            raise EngineError(f"engine {engine.name!r} is closed")
        if outputs is not None or profile is not None:
            engine._check_call_capabilities(outputs, profile)
        ops = self.ops
        call = ops.validate_inputs(inputs, profile)
        if outputs is not None:
            ops.validate_outputs(self.context, outputs, call)
        context = self.context
        if context is None:
            context = self.ensure_context()
        outer = self.outer_graphs
        if self.outer_graph is not None and outer is not None:
            return outer.run(context, call, stream, outputs)
        return ops.run(context, call, stream, outputs)

    # -- the context ------------------------------------------------------------------------
    def ensure_context(self) -> Any:
        """This lane's context, created now if it has none. A failure (out of memory, say)
        raises an error naming the engine and leaves the lane without one: the next call
        tries again."""
        context = self.context
        if context is not None:
            return context
        engine = self.engine
        try:
            context = self.ops.create_context(self.settings, engine._resolve_cache(self.settings))
        except TrtRuntimeError:
            raise
        except Exception as exc:
            raise EngineError(
                f"engine {engine.name!r}: creating an execution context failed "
                f"({type(exc).__name__}: {exc}); the next call tries again"
            ) from exc
        if context is None:
            raise EngineError(f"engine {engine.name!r}: the backend created no execution context")
        self.context = context
        self.creations += 1
        return context

    def drop_context(self) -> None:
        """Release the context (after the lane's work), and the graphs that hold it."""
        context = self.context
        if context is not None:
            self.context = None
            self.ops.sync()
            self.drop_graphs()  # graphs hold the context's addresses and kernels
            self.ops.destroy_context(context)

    def apply_settings(self, settings: RuntimeSettings) -> None:
        """Make the next context with ``settings``; the context of other settings goes."""
        if settings != self.settings:
            self.settings = settings
            self.drop_context()

    # -- the outer graph ----------------------------------------------------------------------
    def apply_outer_graph(self, graph: OuterGraph | None) -> None:
        """Use the outer-graph wrap ``graph`` from now on; the graphs captured under the old one go."""
        self.outer_graph = graph
        self.ops.sync()
        self.drop_graphs()

    def drop_graphs(self) -> None:
        """Release this lane's outer graphs (the caller made sure its work is done)."""
        self.reset_fast()
        if self.outer_graphs is not None:
            self.outer_graphs.drop()

    # -- the fast entry -------------------------------------------------------------------------
    def reset_fast(self) -> None:
        """Forget the function in :attr:`fast_entry` (the next call starts at the ops'
        ``call_fast``): done when the context, the graphs or the wrap change, and by a
        backend whenever what it put there may no longer hold."""
        self.fast_entry = self.ops.call_fast

    def switch_fast(self, plan: FastEntry, inputs: tuple[Any, ...], stream: Any,
                    outputs: Sequence[Any] | None) -> list[Any] | None:
        """Make ``plan`` (a function the backend made for calls like this one) the
        :attr:`fast_entry` and run the call through it; ``None`` (the general path) when it
        is the entry already: it declined this very call a moment ago."""
        if plan is self.fast_entry:
            return None
        self.fast_entry = plan
        return plan(inputs, stream, outputs)

    # -- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        """Drop the context and release the backend's part; idempotent."""
        if not self.closed:
            self.drop_context()
            self.closed = True
            self.ops.release()

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("context" if self.context is not None else "no context")
        return f"<Lane of {self.engine.name!r}: {state}>"
