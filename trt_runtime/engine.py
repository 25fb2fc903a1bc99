"""The call pipeline every backend shares: :class:`EngineBase`.

:meth:`EngineBase.execute` (and ``__call__``) is the only way into a call, written once:
lease an execution context (a *lane*, see :mod:`trt_runtime.lease`) -> the backend's fast
path for a call it validated before -> else validate inputs and outputs, make sure the
lane has a context, and run it under the outer CUDA graph or eagerly. A backend fills
hooks (see docs/writing-a-backend.md); none overrides ``execute`` or ``__call__``.

Settings, the outer graph and the number of contexts apply to every lane exactly once,
with every lane leased (so in-flight calls finish first).
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from typing_extensions import Self

from trt_runtime import forking
from trt_runtime.errors import CapabilityError, EngineError, SettingsError
from trt_runtime.graphs import OuterGraph
from trt_runtime.hazards import warn_overlap
from trt_runtime.lease import ContextPool, exiting
from trt_runtime.outer import GraphHooks, OuterGraphs
from trt_runtime.protocols import Backend, DeviceGuard, TensorSpec
from trt_runtime.settings import (
    CudaGraphStrategy,
    DynamicShapesKernelSpecializationStrategy,
    RuntimeSettings,
    SettingsLike,
)
from trt_runtime.validation import seconds, show

if TYPE_CHECKING:
    from trt_runtime.cache import RuntimeCache

__all__ = ["EngineBase"]


class EngineBase(GraphHooks, abc.ABC):
    """Base class for backend engines: owns the call pipeline and the lifecycle.

    Settings changes invalidate the execution context(s), created lazily on the next
    call, once per distinct settings value, counted by :attr:`context_creations`.

    Thread-safety: any number of threads may call one engine. A call leases one of
    :attr:`contexts` execution contexts (FIFO among waiters, at most
    :attr:`lease_timeout` seconds); settings changes, ``outer_graph``, ``contexts`` and
    ``close()`` wait for the calls in flight and apply to every context once.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        name: str,
        inputs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec],
        settings: SettingsLike = None,
    ) -> None:
        self.name = name
        self._backend = backend
        #: The backend's capabilities, read once (a backend's do not change after a load).
        self._caps = backend.capabilities
        self._inputs = tuple(inputs)
        self._outputs = tuple(outputs)
        #: Serializes administrative changes (not calls: those lease a lane).
        self._lock = threading.RLock()
        self._exclusive_owner: int | None = None
        self._context: Any = None
        self._creations = 0
        self._closed = False
        self._outer_graph: OuterGraph | None = None
        #: This lane's outer graphs (the core's manager; the backend fills GraphHooks).
        self._outer_graphs = OuterGraphs()
        self._graph_captures = 0
        self._settings = RuntimeSettings()
        self._lease_timeout: float | None = None
        #: The lanes: this engine first, then clones made by :meth:`_clone_lane`.
        self._pool: ContextPool[EngineBase] = ContextPool(name, [self])
        #: What the pipeline tries first on this lane: :meth:`_call_fast`, or a function the
        #: backend put here for the calls it expects next (see :meth:`_reset_fast`).
        self._fast_entry: Any = self._call_fast
        #: Set by a backend whose calls could leave the caller on the engine's device
        #: (several GPUs): every call and state change runs inside it.
        self._device_guard: DeviceGuard | None = None
        forking.track(self)
        self.runtime_settings = RuntimeSettings.coerce(settings)

    # -- metadata ---------------------------------------------------------------
    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self._inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self._outputs

    @property
    def has_data_dependent_outputs(self) -> bool:
        return any(o.data_dependent for o in self._outputs)

    @property
    def data_dependent_outputs(self) -> list[str]:
        """Names of outputs whose shapes are only known after execution."""
        return [o.name for o in self._outputs if o.data_dependent]

    @property
    def device(self) -> int:
        """The CUDA device the engine runs on (every context is created there)."""
        return 0

    @property
    def profile(self) -> int | None:
        """The optimization profile calls use; ``None`` picks the first that fits."""
        return None

    @profile.setter
    def profile(self, value: int | None) -> None:
        if value is not None:
            self._backend.capabilities.require("supports_profile_selection", self._backend.name)

    # -- lanes: N execution contexts ------------------------------------------------
    @property
    def contexts(self) -> int:
        """How many execution contexts serve concurrent calls (settable; >1 needs
        ``supports_multiple_contexts``). Lowering it waits for calls in flight. Above 1,
        calls overlap on the GPU: check the engine with ``trt-runtime check-contexts``
        first (some engines give wrong outputs then; docs/concurrency.md): on builds where
        that was seen the first value above 1 warns (:class:`~trt_runtime.ContextOverlapWarning`)."""
        return len(self._pool)

    @contexts.setter
    def contexts(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SettingsError(f"contexts must be an int >= 1; got {show(value)}")
        if value > 1:
            self._backend.capabilities.require("supports_multiple_contexts", self._backend.name)
        with self._exclusive():
            self._check_open()
            lanes = list(self._pool.lanes)
            made: list[EngineBase] = []
            try:
                while len(lanes) < value:
                    made.append(self._new_lane())
                    lanes.append(made[-1])
            except BaseException:  # (out of memory, say): the engine keeps the contexts it had
                for lane in made:
                    lane._close_lane()
                raise
            for lane in lanes[value:]:
                lane._close_lane()
            self._pool.resize(lanes[:value])
        if value > 1:
            warn_overlap(self, value)  # once per engine, on builds with a known hazard

    @property
    def lease_timeout(self) -> float | None:
        """Seconds a call waits for a free context before
        :class:`~trt_runtime.ContextLeaseTimeout`; ``None`` (default): no limit."""
        return self._lease_timeout

    @lease_timeout.setter
    def lease_timeout(self, value: float | None) -> None:
        if value is None:
            self._lease_timeout = None
            return
        try:
            self._lease_timeout = seconds(value, "lease_timeout")
        except SettingsError:
            raise SettingsError(
                f"lease_timeout must be None or a number of seconds >= 0; got {show(value)}"
            ) from None

    def _new_lane(self) -> EngineBase:
        lane = self._clone_lane()
        lane._settings = self._settings
        lane._outer_graph = self._outer_graph
        return lane

    @property
    def _lanes(self) -> tuple[EngineBase, ...]:
        return self._pool.lanes

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Hold every lane (calls in flight finish first); re-entrant in one thread."""
        me = threading.get_ident()
        if self._exclusive_owner == me:
            yield
            return
        guard = self._device_guard
        token = None if guard is None else guard.enter()
        try:
            with self._lock, self._pool.all_lanes():
                self._exclusive_owner = me
                try:
                    yield
                finally:
                    self._exclusive_owner = None
        finally:
            if guard is not None:
                guard.exit(token)

    def memory_usage(self) -> dict[str, int]:
        """Device bytes: ``weights`` (once per deserialized engine: contexts that each have
        an engine of their own, as a dynamic-shape engine's do in the python backend, count
        them each), ``activations_per_context``, ``activations_total`` (all contexts) and
        ``contexts``."""
        weights, per = self._memory_usage()
        n = len(self._pool)
        return {
            "weights": weights, "activations_per_context": per, "activations_total": per * n, "contexts": n,
        }

    def _memory_usage(self) -> tuple[int, int]:
        """(weights bytes of every deserialized engine the contexts use, activation bytes of
        one context); 0 where unknown."""
        return 0, 0

    # -- settings and context -----------------------------------------------------
    @property
    def runtime_settings(self) -> RuntimeSettings:
        return self._settings

    @runtime_settings.setter
    def runtime_settings(self, value: SettingsLike) -> None:
        settings = RuntimeSettings.coerce(value)
        self._check_capabilities(settings)
        with self._exclusive():
            if settings == self._settings:
                return
            for lane in self._pool.lanes:
                lane._settings = settings
                lane._drop_context()

    def _check_capabilities(self, settings: RuntimeSettings) -> None:
        caps = self._backend.capabilities
        if settings.cuda_graph_strategy is not CudaGraphStrategy.DISABLED:
            caps.require("supports_cuda_graph_strategy", self._backend.name)
        if (
            settings.dynamic_shapes_kernel_specialization_strategy
            is not DynamicShapesKernelSpecializationStrategy.LAZY
        ):
            caps.require("supports_dynamic_shapes_kernel_specialization_strategy", self._backend.name)
        if settings.runtime_cache is not None:
            caps.require("supports_runtime_cache", self._backend.name)

    @property
    def context_creations(self) -> int:
        """Execution contexts created so far, by every lane."""
        return sum(lane._creations for lane in self._pool.lanes)

    def has_context(self) -> bool:
        return any(lane._context is not None for lane in self._pool.lanes)

    def invalidate_context(self) -> None:
        """Drop the execution context(s); the next call creates a new one."""
        with self._exclusive():
            for lane in self._pool.lanes:
                lane._drop_context()

    def _drop_context(self) -> None:
        if self._context is not None:
            context, self._context = self._context, None
            self._sync()
            self._drop_graphs()  # graphs hold the context's addresses and kernels
            self._destroy_context(context)

    # -- the outer CUDA-graph wrap -------------------------------------------------
    @property
    def outer_graph(self) -> OuterGraph | None:
        """The outer CUDA-graph wrap in force; ``None`` (default): calls run eagerly.

        Accepts ``None``, a bool, an output mode (``"copy"``, ``"view"``) or an
        :class:`~trt_runtime.graphs.OuterGraph`. Changing it drops the captured graphs,
        never the execution context. Needs ``supports_outer_cuda_graph``.
        """
        return self._outer_graph

    @outer_graph.setter
    def outer_graph(self, value: OuterGraph | bool | str | None) -> None:
        graph = OuterGraph.coerce(value)
        if graph is not None:
            self._backend.capabilities.require("supports_outer_cuda_graph", self._backend.name)
            if self.has_data_dependent_outputs:
                raise CapabilityError(
                    f"engine {self.name!r}: outputs {self.data_dependent_outputs} have data-dependent "
                    "shapes; a CUDA graph cannot capture them (run it without the outer graph wrap)"
                )
        with self._exclusive():
            if graph == self._outer_graph:
                return
            for lane in self._pool.lanes:
                lane._outer_graph = graph
                lane._sync()
                lane._drop_graphs()

    def static_inputs(self, *shapes: Sequence[int], profile: int | None = None,
                      as_torch: bool | None = None) -> list[Any]:
        """The engine's static input buffers for inputs of these shapes, under the outer graph.

        Passing them (or arrays at the same addresses) as a call's inputs skips the copy
        into them: the call is then one graph launch plus stream ordering. ``as_torch``:
        torch views (the backend's default when ``None``). They stay the engine's until the
        graphs are dropped (a settings change, ``outer_graph`` changing, ``reset_graphs()``,
        ``close()``); ask again after. With several contexts they are the first context's
        (other contexts copy them in). Raises :class:`~trt_runtime.EngineError` when
        ``outer_graph`` is not set, :class:`~trt_runtime.InputError` for shapes the engine
        does not take.
        """
        from trt_runtime.contract import require_outer_graph

        with self._exclusive():
            self._check_open()
            self._backend.capabilities.require("supports_outer_cuda_graph", self._backend.name)
            if profile is not None:
                self._backend.capabilities.require("supports_profile_selection", self._backend.name)
            require_outer_graph(self.name, self._outer_graph)
            checker = self._shape_checker
            if len(shapes) != len(self._inputs):
                checker.check_count(len(shapes), "static_inputs()")
            key = tuple(tuple(int(d) for d in shape) for shape in shapes)
            chosen = checker.select(key, self.profile if profile is None else profile)
            return self._outer_graphs.static_inputs(self, (key, chosen), as_torch)

    @property
    def _shape_checker(self) -> Any:
        """The :class:`~trt_runtime.contract.ShapeChecker` of this engine's inputs."""
        from trt_runtime.contract import ShapeChecker

        checker = self.__dict__.get("_default_checker")
        if checker is None:
            checker = self.__dict__["_default_checker"] = ShapeChecker(self.name, self._inputs)
        return checker

    @property
    def graph_captures(self) -> int:
        """How many CUDA graphs the outer wrap has captured (a replay is not a capture)."""
        return sum(lane._graph_captures for lane in self._pool.lanes)

    def graph_stats(self) -> dict[str, int]:
        """The outer graphs of every context: ``graphs`` kept, ``max_graphs`` per context,
        and ``hits``, ``misses``, ``captures``, ``evictions``, ``updates`` counted by the
        core's :class:`~trt_runtime.graphs.GraphCache` (all zero for a backend without one)."""
        totals = {"graphs": 0, "hits": 0, "misses": 0, "captures": 0, "evictions": 0, "updates": 0}
        limit = 0
        for lane in self._pool.lanes:
            stats = lane._outer_graphs.cache.stats()
            limit = stats["max_graphs"]
            for key in totals:
                totals[key] += stats[key]
        return {**totals, "max_graphs": self._outer_graph.max_graphs if self._outer_graph else limit}

    def reset_graphs(self) -> None:
        """Drop every captured graph; the next call under the outer wrap captures again."""
        with self._exclusive():
            for lane in self._pool.lanes:
                lane._sync()
                lane._drop_graphs()

    def _resolve_cache(self) -> RuntimeCache | None:
        from trt_runtime.cache import RuntimeCache

        cache = self._settings.runtime_cache
        if isinstance(cache, Path):
            return RuntimeCache.shared(cache)
        return cache

    def ensure_context(self) -> Any:
        """Create the execution context now if there is none (normally done by a call)."""
        with self._exclusive():
            self._check_open()
            return self._lane_context()

    def _lane_context(self) -> Any:
        """This lane's context, created if needed (the caller holds the lane)."""
        if self._context is None:
            context = self._create_context(self._settings, self._resolve_cache())
            if context is None:
                raise EngineError(f"engine {self.name!r}: the backend created no execution context")
            self._context = context
            self._creations += 1
        return self._context

    # -- the call pipeline ------------------------------------------------------------
    def execute(
        self, *inputs: Any, stream: Any = None, outputs: Sequence[Any] | None = None,
        profile: int | None = None,
    ) -> list[Any]:
        """Run the engine; returns one array per output, in :attr:`outputs` order.

        ``stream``: the caller's stream (anything :func:`trt_runtime.contract.stream_handle`
        takes), which the work is ordered after and before. ``outputs``: preallocated
        arrays to write into, returned as given (``supports_preallocated_outputs``).
        ``profile``: an optimization profile for this call (``supports_profile_selection``).
        """
        raise NotImplementedError  # replaced below by _entry(bare=False)

    def __call__(
        self, *inputs: Any, stream: Any = None, outputs: Sequence[Any] | None = None,
        profile: int | None = None,
    ) -> Any:
        """Like :meth:`execute`, but a single output is returned bare, several as a tuple."""
        raise NotImplementedError  # replaced below by _entry(bare=True)

    def _call(self, inputs: Sequence[Any], stream: Any, outputs: Sequence[Any] | None, profile: int | None
              ) -> list[Any]:
        """The general path of one call on this lane: validate, context, outer graph or eager."""
        self._check_open()
        caps = self._caps
        if outputs is not None and not caps.supports_preallocated_outputs:
            caps.require("supports_preallocated_outputs", self._backend.name)
        if profile is not None and not caps.supports_profile_selection:
            caps.require("supports_profile_selection", self._backend.name)
        call = self._validate_inputs(inputs, profile)
        if outputs is not None:
            self._validate_outputs(outputs, call)
        context = self._context
        if context is None:
            context = self._lane_context()
        if self._outer_graph is not None:
            return self._run_outer(context, call, stream, outputs)
        return self._run(context, call, stream, outputs)

    def _run_outer(self, context: Any, call: Any, stream: Any, outputs: Sequence[Any] | None) -> list[Any]:
        """Run a validated ``call`` under :attr:`outer_graph` (the core's
        :class:`~trt_runtime.outer.OuterGraphs`; not a hook)."""
        return self._outer_graphs.run(self, context, call, stream, outputs)

    def _drop_graphs(self) -> None:
        """Release this lane's outer graphs (not a hook; the caller ran :meth:`_sync`)."""
        self._reset_fast()
        self._outer_graphs.drop(self)

    def _switch_fast(self, plan: Any, inputs: tuple[Any, ...], stream: Any, outputs: Sequence[Any] | None
                     ) -> list[Any] | None:
        """Make ``plan`` (a function the backend made for calls like this one) the lane's
        :attr:`_fast_entry` and run the call through it; ``None`` (the general path) when it
        is the entry already: it declined this very call a moment ago."""
        if plan is self._fast_entry:
            return None
        self._fast_entry = plan
        return plan(inputs, stream, outputs)  # type: ignore[no-any-return]

    def _reset_fast(self) -> None:
        """Forget the function in :attr:`_fast_entry` (the next call starts at :meth:`_call_fast`):
        called when the context, the graphs or the outer-graph wrap change, and by a backend
        whenever what it put there may no longer hold."""
        self._fast_entry = self._call_fast

    def synchronize(self) -> None:
        """Wait for the work every context of this engine queued."""
        for lane in self._pool.lanes:
            lane._sync()

    # -- lifetime -----------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise EngineError(f"engine {self.name!r} is closed")

    def close(self) -> None:
        """Release the contexts and the engine; idempotent. Calls in flight finish first;
        calls waiting for a context then raise :class:`~trt_runtime.EngineError`."""
        if exiting():  # the exit hook holds every lane: closed, the process releases the rest
            for lane in self._pool.lanes:
                lane._closed = True
            return
        with self._lock:
            if self._closed:
                return
            with self._exclusive():
                self._pool.close()
                for lane in reversed(self._pool.lanes):  # clones first, this engine last
                    lane._close_lane()

    def _orphan_after_fork(self, parent: int) -> None:
        """In a process forked from ``parent``: closed without releasing anything (see
        :mod:`trt_runtime.forking`), calls and changes raise EngineError."""
        self._closed = True
        self._lock = threading.RLock()  # (another thread of the parent may have held it)
        self._exclusive_owner = None
        self._pool.orphan(
            f"engine {self.name!r} was loaded in process {parent}, before this process was forked "
            "from it; CUDA does not cross fork(): start workers with the 'spawn' or 'forkserver' "
            "method (multiprocessing.set_start_method) and load the engine again in them"
        )
        self._after_fork()

    def _after_fork(self) -> None:
        """Backend hook, in a forked child: stop whatever would release native objects
        there (a ``weakref.finalize``); they are never released in the child."""

    def _close_lane(self) -> None:
        if not self._closed:
            self._drop_context()
            self._closed = True
            self._release()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        io = ", ".join(f"{s.name}:{s.dtype}{list(s.shape)}" for s in (*self._inputs, *self._outputs))
        return f"<{type(self).__name__} {self.name!r} backend={self._backend.name!r} [{io}]>"

    # -- hooks a backend implements ------------------------------------------------
    @abc.abstractmethod
    def _create_context(self, settings: RuntimeSettings, cache: RuntimeCache | None) -> Any:
        """Create an execution context for ``settings`` on :attr:`device`.

        A backend with a cache calls ``cache.ensure_materialized(config, backend=self.backend)``
        and attaches the native cache it returns to its runtime config.
        """

    @abc.abstractmethod
    def _destroy_context(self, context: Any) -> None:
        """Release ``context``."""

    def _validate_inputs(self, inputs: Sequence[Any], profile: int | None) -> Any:
        """Check count, kind, dtype, shape, device and profile of ``inputs`` before any
        context exists (raise :class:`~trt_runtime.InputError`, with the shared checks of
        :mod:`trt_runtime.contract`); return what :meth:`_run` takes as ``call``
        (default: the inputs as given)."""
        return inputs

    def _validate_outputs(self, outputs: Sequence[Any], call: Any) -> None:
        """Check preallocated ``outputs`` (count, dtype, device, contiguity; shapes where
        ``call`` tells them) before any context exists; checks that need output shapes from
        the context stay in :meth:`_run`."""

    def _call_fast(self, inputs: tuple[Any, ...], stream: Any, outputs: Sequence[Any] | None
                   ) -> list[Any] | None:
        """The backend's fast path for a call like one it validated before (same shapes,
        same arrays...): its results, or ``None`` to take the general path. It must not
        raise for bad input (the general path says what is wrong). The pipeline calls
        :attr:`_fast_entry`, which is this method unless the backend put a more specific function
        there (one that calls this method for calls it does not take)."""
        return None

    def _thread_start(self) -> None:
        """Called on a lane before the first call a thread makes on this engine (and
        before that call's :attr:`_fast_entry`): per-thread setup, such as making the engine's
        device current in that thread (default: nothing)."""

    @abc.abstractmethod
    def _run(self, context: Any, call: Any, stream: Any, outputs: Sequence[Any] | None) -> list[Any]:
        """Run a validated ``call`` eagerly (bind, enqueue, outputs)."""

    def _clone_lane(self) -> EngineBase:
        """A new lane over the same deserialized engine: its own (lazy) context, stream and
        buffers, on the same device. Needed for ``supports_multiple_contexts``."""
        raise CapabilityError(f"the {self._backend.name!r} backend does not support multiple_contexts")

    def _sync(self) -> None:
        """Wait for the work this lane queued (default: nothing to wait for)."""

    def _release(self) -> None:
        """Release this lane's engine object (after its context)."""


from trt_runtime.calls import make_entry  # noqa: E402 - needs EngineBase defined

EngineBase.execute = make_entry(False, "execute", EngineBase.execute.__doc__)  # type: ignore[method-assign]
EngineBase.__call__ = make_entry(True, "__call__", EngineBase.__call__.__doc__)  # type: ignore[method-assign]
