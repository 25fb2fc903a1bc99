"""The call pipeline every backend shares: :class:`EngineBase`.

:meth:`EngineBase.execute` (and ``__call__``) is the only way into a call, written once:
lease an execution context (a :class:`~trt_runtime.lane.Lane`, see :mod:`trt_runtime.lease`)
-> the lane's fast entry for a call its backend validated before -> else the lane's general
path (:meth:`Lane.call <trt_runtime.lane.Lane.call>`: validate inputs and outputs, make
sure the lane has a context, run it under the outer CUDA graph or eagerly). A backend
gives each lane a :class:`~trt_runtime.lane.LaneOps` (``_new_ops``; see
docs/writing-a-backend.md); none overrides ``execute`` or ``__call__``.

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
from trt_runtime.lane import Lane, LaneOps
from trt_runtime.lease import ContextPool, Slot, exiting
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


class EngineBase(abc.ABC):
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
        device_guard: DeviceGuard | None = None,
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
        self._closed = False
        self._outer_graph: OuterGraph | None = None
        self._settings = RuntimeSettings()
        self._lease_timeout: float | None = None
        #: Set by a backend whose calls could leave the caller on the engine's device
        #: (several GPUs): every call and state change runs inside it.
        self._device_guard = device_guard
        #: The lanes, one per execution context; the first made now, others by ``contexts``.
        self._pool: ContextPool[Lane] = ContextPool(name, [self._new_lane()])
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
        return any(o.data_dependent for o in self.outputs)

    @property
    def data_dependent_outputs(self) -> list[str]:
        """Names of outputs whose shapes are only known after execution."""
        return [o.name for o in self.outputs if o.data_dependent]

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
            made: list[Lane] = []
            try:
                while len(lanes) < value:
                    made.append(self._new_lane())
                    lanes.append(made[-1])
            except BaseException:  # (out of memory, say): the engine keeps the contexts it had
                for lane in made:
                    lane.close()
                raise
            for lane in lanes[value:]:
                lane.close()
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

    def _new_lane(self) -> Lane:
        """A lane with the engine's settings and wrap, and its backend ops (``_new_ops``)."""
        return Lane(self, self._new_ops, self._device_guard)

    @property
    def _lanes(self) -> tuple[Lane, ...]:
        return self._pool.lanes

    def _set_device_guard(self, guard: DeviceGuard | None) -> None:
        """Run every call and change inside ``guard`` from now on (every lane, and lanes
        made later); for a backend that knows only after construction (and tests). Every
        lane is held meanwhile, outside any guard."""
        with self._lock, self._pool.all_lanes():
            self._device_guard = guard
            for lane in self._pool.lanes:
                lane.device_guard = guard

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
            self._settings = settings
            for lane in self._pool.lanes:
                lane.apply_settings(settings)

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
        return sum(lane.creations for lane in self._pool.lanes)

    def has_context(self) -> bool:
        return any(lane.context is not None for lane in self._pool.lanes)

    def invalidate_context(self) -> None:
        """Drop the execution context(s); the next call creates a new one."""
        with self._exclusive():
            for lane in self._pool.lanes:
                lane.drop_context()

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
            self._outer_graph = graph
            for lane in self._pool.lanes:
                lane.apply_outer_graph(graph)

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
            first = self._pool.lanes[0]
            if first.outer_graphs is None:
                raise first.no_graphs()
            return first.outer_graphs.static_inputs((key, chosen), as_torch)

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
        return sum(lane.graph_captures for lane in self._pool.lanes)

    def graph_stats(self) -> dict[str, int]:
        """The outer graphs of every context: ``graphs`` kept, ``max_graphs`` per context,
        and ``hits``, ``misses``, ``captures``, ``evictions``, ``updates`` counted by the
        core's :class:`~trt_runtime.graphs.GraphCache` (all zero for a backend without one)."""
        totals = {"graphs": 0, "hits": 0, "misses": 0, "captures": 0, "evictions": 0, "updates": 0}
        limit = 0
        for lane in self._pool.lanes:
            if lane.outer_graphs is None:
                continue
            stats = lane.outer_graphs.cache.stats()
            limit = stats["max_graphs"]
            for key in totals:
                totals[key] += stats[key]
        return {**totals, "max_graphs": self._outer_graph.max_graphs if self._outer_graph else limit}

    def reset_graphs(self) -> None:
        """Drop every captured graph; the next call under the outer wrap captures again."""
        with self._exclusive():
            for lane in self._pool.lanes:
                lane.ops.sync()
                lane.drop_graphs()

    def _resolve_cache(self, settings: RuntimeSettings) -> RuntimeCache | None:
        """The :class:`~trt_runtime.cache.RuntimeCache` of ``settings`` (a path: the shared one)."""
        from trt_runtime.cache import RuntimeCache

        cache = settings.runtime_cache
        if isinstance(cache, Path):
            return RuntimeCache.shared(cache)
        return cache

    def ensure_context(self) -> Any:
        """Create the execution context now if there is none (normally done by a call)."""
        with self._exclusive():
            self._check_open()
            return self._pool.lanes[0].ensure_context()

    # -- the call pipeline ------------------------------------------------------------------
    # ``execute`` and ``__call__`` share one body (a call is a few µs: a wrapper between them
    # would be a tenth). The uncontended lease is ContextPool.lease inlined: this thread's
    # lane of its previous call, if it is free (one thread-local read, its token taken).
    def execute(
        self, *inputs: Any, stream: Any = None, outputs: Sequence[Any] | None = None,
        profile: int | None = None,
    ) -> list[Any]:
        """Run the engine; returns one array per output, in :attr:`outputs` order.

        ``stream``: the caller's stream (anything :func:`trt_runtime.contract.stream_handle`
        takes), which the work is ordered after and before. ``outputs``: preallocated
        arrays to write into, a list or tuple with one per output, returned as given
        (``supports_preallocated_outputs``; anything else raises :class:`~trt_runtime.InputError`).
        ``profile``: an optimization profile for this call (``supports_profile_selection``).
        """
        return self._lease_call(inputs, stream, outputs, profile)

    def __call__(
        self, *inputs: Any, stream: Any = None, outputs: Sequence[Any] | None = None,
        profile: int | None = None,
    ) -> Any:
        """Like :meth:`execute`, but a single output is returned bare, several as a tuple."""
        result = self._lease_call(inputs, stream, outputs, profile)
        return result[0] if len(result) == 1 else tuple(result)

    def _lease_call(self, inputs: tuple[Any, ...], stream: Any, outputs: Sequence[Any] | None,
                    profile: int | None) -> list[Any]:
        """One call: lease a lane, then its fast entry or its general path (a thread's first
        call, or a call inside a device guard, through :meth:`Lane.guarded_call`)."""
        pool = self._pool
        try:
            slot: Slot[Lane] = pool.local.slot  # (an attribute read: cheaper than getattr)
            slot.free.pop()  # (Slot.take inline)
        except AttributeError:  # this thread's first call
            return self._first_call(inputs, stream, outputs, profile)
        except IndexError:  # its lane is leased: another
            slot = pool.lease(self._lease_timeout)
        lane = slot.lane
        result: list[Any] | None
        try:
            if lane.device_guard is not None or profile is not None:
                result = lane.guarded_call(False, inputs, stream, outputs, profile)
            elif (result := lane.fast_entry(inputs, stream, outputs)) is None:
                result = lane.call(inputs, stream, outputs, None)
        finally:
            if pool.waiters:  # (close() holds every lane: no call is in flight then)
                pool.give_back(slot)
            else:
                slot.free.append(True)  # (Slot.put inline)
        return result

    def _first_call(self, inputs: tuple[Any, ...], stream: Any, outputs: Sequence[Any] | None,
                    profile: int | None) -> list[Any]:
        """A thread's first call: any free lane, which becomes its own (:meth:`ContextPool.lease`),
        and the ops' ``thread_start`` before the call (:meth:`Lane.guarded_call`)."""
        pool = self._pool
        slot = pool.lease(self._lease_timeout)
        try:
            return slot.lane.guarded_call(True, inputs, stream, outputs, profile)
        finally:
            pool.give_back(slot)

    def _check_call_capabilities(self, outputs: Sequence[Any] | None, profile: int | None) -> None:
        """``outputs=`` and ``profile=`` need their capabilities."""
        caps = self._caps
        if outputs is not None and not caps.supports_preallocated_outputs:
            caps.require("supports_preallocated_outputs", self._backend.name)
        if profile is not None and not caps.supports_profile_selection:
            caps.require("supports_profile_selection", self._backend.name)

    def synchronize(self) -> None:
        """Wait for the work every context of this engine queued."""
        for lane in self._pool.lanes:
            lane.ops.sync()

    # -- lifetime -----------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise EngineError(f"engine {self.name!r} is closed")

    def close(self) -> None:
        """Release the contexts and the engine; idempotent. Calls in flight finish first, and
        the calls already waiting for a context (in arrival order); later calls raise
        :class:`~trt_runtime.EngineError`."""
        if exiting():  # the exit hook holds every lane: closed, the process releases the rest
            for lane in self._pool.lanes:
                lane.closed = True
            self._closed = True
            return
        with self._lock:
            if self._closed:
                return
            with self._exclusive():
                self._pool.close()
                for lane in reversed(self._pool.lanes):  # the first lane last
                    lane.close()
                self._closed = True
                self._release()

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
        for lane in self._pool.lanes:
            lane.closed = True
            lane.ops.after_fork()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        io = ", ".join(f"{s.name}:{s.dtype}{list(s.shape)}" for s in (*self.inputs, *self.outputs))
        return f"<{type(self).__name__} {self.name!r} backend={self._backend.name!r} [{io}]>"

    # -- what a backend implements ------------------------------------------------------
    def _release(self) -> None:
        """After :meth:`close` released every lane: drop what the engine itself holds of the
        backend (a TensorRT engine its lanes shared, say), so that a closed engine keeps no
        device memory while its Python objects wait for the garbage collector (an engine's
        objects reference each other: only a collection frees them, which can be thousands
        of loads later). Nothing by default."""
        return None

    @abc.abstractmethod
    def _new_ops(self, lane: Lane) -> LaneOps:
        """The backend's side of a new ``lane`` (its first at construction, others for
        ``contexts = N``: those need ``supports_multiple_contexts``). It may raise (out of
        memory, say): ``contexts`` then keeps the lanes it had."""
