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

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from trt_runtime.errors import CapabilityError, EngineError, InputError, TrtRuntimeError
from trt_runtime.outer import GraphOps, OuterGraphs
from trt_runtime.protocols import Engine

if TYPE_CHECKING:
    from trt_runtime.cache import RuntimeCache
    from trt_runtime.graphs import OuterGraph
    from trt_runtime.protocols import DeviceGuard
    from trt_runtime.settings import RuntimeSettings

__all__ = ["FastEntry", "GraphOps", "Lane", "LaneOps", "LaneOwner"]

#: What the pipeline calls first on a lane: ``(inputs, stream, outputs) -> results or None``.
FastEntry = Callable[[tuple[Any, ...], Any, "Sequence[Any] | None"], "list[Any] | None"]


class LaneOwner(Engine, Protocol):
    """What a lane reads of the engine it belongs to (an :class:`~trt_runtime.EngineBase`):
    the :class:`~trt_runtime.protocols.Engine` it is, and two of its private methods."""

    def _resolve_cache(self, settings: RuntimeSettings) -> RuntimeCache | None: ...

    def _check_call_capabilities(self, outputs: Sequence[Any] | None, profile: int | None) -> None: ...


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
        return None

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
        return None

    def sync(self) -> None:
        """Wait for the work this lane queued (default: nothing to wait for)."""
        return None

    def release(self) -> None:
        """Release what the lane holds, after its context (default: nothing)."""
        return None

    def after_fork(self) -> None:
        """In a forked child: stop whatever would release native objects there, such as a
        ``weakref.finalize`` (default: nothing)."""
        return None


class Lane:
    """One execution context of an engine: its context, settings, outer graphs and entry.

    Made by the engine (its first lane at construction, others for ``contexts = N``);
    ``ops`` is the backend's :class:`LaneOps` for it."""

    __slots__ = (
        "closed", "context", "creations", "device_guard", "engine", "fast_entry", "ops", "outer_graph",
        "outer_graphs", "settings",
    )

    def __init__(self, engine: LaneOwner, make_ops: Callable[[Lane], LaneOps],
                 device_guard: DeviceGuard | None = None) -> None:
        self.engine = engine
        #: The execution context (the backend's object); ``None`` until a call needs one.
        self.context: Any = None
        #: Contexts this lane created.
        self.creations = 0
        #: The settings the next context is made with (the engine's, applied by :meth:`apply_settings`).
        self.settings: RuntimeSettings = engine.runtime_settings
        self.outer_graph: OuterGraph | None = engine.outer_graph
        self.closed = False
        #: Set where calls could leave the caller on the engine's device: every call runs in it.
        self.device_guard = device_guard
        self.ops = make_ops(self)
        graphs = self.ops.graphs
        #: The core's outer-graph manager of this lane (``None`` for a backend without graphs).
        self.outer_graphs: OuterGraphs | None = None
        if graphs is not None:
            self.outer_graphs = OuterGraphs(graphs, engine.inputs, engine.outputs, self.ops.sync)
            if self.outer_graph is not None:
                self.outer_graphs.cache.max_graphs = self.outer_graph.max_graphs
        #: What the pipeline calls first (see :meth:`reset_fast` and :meth:`switch_fast`).
        self.fast_entry: FastEntry = self.ops.call_fast

    # -- the general path -------------------------------------------------------------------
    def guarded_call(self, first: bool, inputs: tuple[Any, ...], stream: Any, outputs: Sequence[Any] | None,
                     profile: int | None) -> list[Any]:
        """One call inside the lane's device guard (if any), after the ops' ``thread_start``
        when it is the calling thread's ``first`` on the engine: the fast entry, else
        :meth:`call`."""
        guard = self.device_guard
        token = None if guard is None else guard.enter()
        try:
            if first:
                self.ops.thread_start()
            result = self.fast_entry(inputs, stream, outputs) if profile is None else None
            if result is None:
                result = self.call(inputs, stream, outputs, profile)
        finally:
            if guard is not None:
                guard.exit(token)
        return result

    def call(self, inputs: Sequence[Any], stream: Any, outputs: Sequence[Any] | None, profile: int | None
             ) -> list[Any]:
        """One call on this lane when its fast entry declined: validate, context, outer graph
        or eager."""
        engine = self.engine
        if self.closed:
            raise EngineError(f"engine {engine.name!r} is closed")
        if outputs is not None and not isinstance(outputs, (list, tuple)):
            raise InputError(
                f"engine {engine.name!r}: outputs= must be a list or tuple of arrays, one per output; "
                f"got {type(outputs).__name__}"
            )
        if outputs is not None or profile is not None:
            engine._check_call_capabilities(outputs, profile)
        ops = self.ops
        call = ops.validate_inputs(inputs, profile)
        if outputs is not None:
            ops.validate_outputs(self.context, outputs, call)
        context = self.context
        if context is None:
            context = self.ensure_context()
        graph = self.outer_graph
        if graph is not None:
            outer = self.outer_graphs
            if outer is None:
                raise self.no_graphs()
            if outer.ops.graph_capturable():
                return outer.run(context, call, stream, outputs, outputs is None and graph.outputs == "view")
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
        if graph is not None and self.outer_graphs is not None:
            self.outer_graphs.cache.max_graphs = graph.max_graphs

    def drop_graphs(self) -> None:
        """Release this lane's outer graphs (the caller made sure its work is done)."""
        self.reset_fast()
        if self.outer_graphs is not None:
            self.outer_graphs.drop()

    def no_graphs(self) -> CapabilityError:
        """The error of an outer-graph wrap on a lane whose ops have no ``graphs`` (a backend
        that declares ``supports_outer_cuda_graph`` without them): never a silent eager run."""
        return CapabilityError(
            f"the {self.engine.backend.name!r} backend does not support outer_cuda_graph "
            "(its lane ops have no graphs)"
        )

    @property
    def graph_captures(self) -> int:
        """How many outer graphs this lane captured (a replay is not a capture)."""
        return 0 if self.outer_graphs is None else self.outer_graphs.captures

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
