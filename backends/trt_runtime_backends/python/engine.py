"""``PythonEngine``: one deserialized engine, its own CUDA stream and a lazy execution context.

The call pipeline is :class:`~trt_runtime.EngineBase`'s; this engine fills its hooks
(``_call_fast``, ``_validate_inputs``, ``_run``, the outer graph's, ``_clone_lane``...). Each
lane holds its parts, each owning its state: a :class:`.contract.Contract` (input
checks), a :class:`.bridge.TorchBridge` (torch), an :class:`.output_binding.OutputBinding`
(outputs and host staging), :class:`.graphs.GraphOps` (capture and launch of the outer
CUDA graphs the core's :class:`~trt_runtime.outer.OuterGraphs` keeps),
:class:`.fast_path.FastPaths` (repeat calls that skip the checks) and a
:class:`.stream_order.StreamOrder` (ordering with the caller's stream) and
:class:`.shapes.ShapeContexts` (a context per recent input-shape signature). One
``PythonEngine`` object is one *lane*: one execution context with its stream, events,
bindings and caches; ``contexts=N`` makes
N-1 clones over the same ``ICudaEngine``.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trt_runtime_backends.python import cuda, graphs, stream_order
from trt_runtime_backends.python.arrays import DeviceArray
from trt_runtime_backends.python.bridge import TorchBridge
from trt_runtime_backends.python.contract import Contract, Inspection, TensorInfo, read_specs
from trt_runtime_backends.python.execution_context import (
    ExecutionContext,
    Resources,
    drop_context,
    finalize,
    trt_enum,
)
from trt_runtime_backends.python.fast_path import FastPaths
from trt_runtime_backends.python.graphs import GraphOps
from trt_runtime_backends.python.output_binding import OutputBinding, make_output_allocator
from trt_runtime_backends.python.shapes import ShapeContexts, apply_shapes

from trt_runtime.contract import KIND_DEVICE, KIND_HOST, KIND_TORCH, ShapeChecker
from trt_runtime.engine import EngineBase
from trt_runtime.errors import EngineError
from trt_runtime.outer import graph_hooks_from
from trt_runtime.protocols import EngineSource, TensorSpec
from trt_runtime.settings import CudaGraphStrategy, RuntimeSettings

if TYPE_CHECKING:
    from trt_runtime.cache import RuntimeCache

__all__ = ["MEMORY_PER_SHAPE", "PythonEngine"]

#: Whether a USER_MANAGED context's scratch memory is sized again after every change of
#: input shapes (``update_device_memory_size_for_shapes`` + ``set_device_memory``, as
#: TensorRT-RTX's sample does). False (default): one buffer of ``device_memory_size_v2``
#: bytes, the most any profile and shape needs, handed over at creation and after a profile
#: switch, so alternating among shapes sets only the shapes (benchmarks/probes/gpu_shape_switch_probe.py
#: measures the calls skipped and checks the results without them). Read at context creation.
MEMORY_PER_SHAPE = False


@graph_hooks_from(graphs)
class PythonEngine(EngineBase):
    """A TensorRT(-RTX) engine run by the python backend. Made by ``PythonBackend.load_engine``.

    Work is queued on the engine's own stream (:attr:`stream`); a caller's stream is
    ordered with events, or by CUDA itself for the legacy default stream (see
    :mod:`.stream_order`). See docs/device-contract.md for what goes in and comes out, and
    docs/python-backend.md for the fast paths and the outer CUDA-graph wrap.
    Thread-safety: calls on one engine are serialized (an execution context is not
    re-entrant).
    """

    @classmethod
    def _create(
        cls,
        backend: Any,
        trt_engine: Any,
        state: cuda.DeviceState,
        source: EngineSource,
        settings: RuntimeSettings | None,
    ) -> PythonEngine:
        self = cls.__new__(cls)
        self._init(backend, trt_engine, state, source, settings)
        return self

    def _init(
        self,
        backend: Any,
        trt_engine: Any,
        state: cuda.DeviceState,
        source: EngineSource,
        settings: RuntimeSettings | None,
        runtime: Any = None,
        ordering: str | None = None,
    ) -> None:
        # ``runtime`` replaces cuda.bindings.runtime (tests run the engine with a double);
        # ``ordering`` one of stream_order.MODES (default: stream_order.DEFAULT_MODE).
        self._made_with = (backend, trt_engine, state, source, runtime, ordering)
        self._trt = backend.tensorrt
        self._flavour = backend.flavour
        self._logger = backend.logger
        self._trt_engine = trt_engine
        self._state = state
        self._device = state.index
        self._multi_device = cuda.device_count() > 1 if runtime is None else False
        #: Threads in which the engine's device context was made current (see _execute).
        self._threads = threading.local()
        inputs, outputs = read_specs(self._trt, trt_engine)
        self._in = [TensorInfo(s, i) for i, s in enumerate(inputs)]
        self._out = [TensorInfo(s, i) for i, s in enumerate(outputs)]
        self._n_in = len(self._in)
        self._in_names = tuple(io.name for io in self._in)
        self._io_names = tuple(io.name for io in (*self._in, *self._out))
        self._num_profiles = max(1, int(trt_engine.num_optimization_profiles))
        self._profile: int | None = None
        self._rt = _cudart() if runtime is None else runtime
        self._res = Resources(self._rt)
        # An engine that is never closed still drops its context before its ICudaEngine;
        # not at interpreter exit, though: daemon threads may still be calling it then, and
        # the program's tensors outlive the atexit hooks. The process's end releases it all.
        self._finalizer = weakref.finalize(self, finalize, self._res)
        self._finalizer.atexit = False
        mode = stream_order.DEFAULT_MODE if ordering is None else ordering
        # A blocking stream is ordered with the legacy default stream by CUDA itself.
        blocking = stream_order.StreamOrder.blocking(mode)
        self._stream = state.create_stream(blocking=True) if blocking else state.create_stream()
        #: The other stream of an "implicit" lane: non-blocking, used while TensorRT-RTX's
        #: cuda_graph_strategy is on (see _pick_stream); made when first needed.
        self._spare_stream: Any = None
        self._stream_handle = int(self._stream.handle)
        self._res.stream_handle = self._stream_handle
        #: The parts, each owning its state: torch (bound on the first tensor seen), the
        #: ordering with caller streams, the remembered calls, the outer graphs, the input
        #: checks and the outputs.
        self._torch = TorchBridge(self._device, self._in, self._out)
        self._order = stream_order.StreamOrder(
            self._rt, self._stream_handle, mode, own=self._stream, bridge=self._torch, device=self._device
        )
        self._res.events = self._order.events()
        self._res.order = self._order
        self._fast_paths = FastPaths()
        self._shape_contexts = ShapeContexts()
        self._graphs = GraphOps(self._rt, state, self._res)
        self._output_allocator = "auto"
        self._cache_key: Any = None
        self._context_timings: dict[str, float] = {}
        self._contract = Contract(
            source.name, self._in, ShapeChecker(source.name, inputs, self._num_profiles), self._device,
            self._multi_device, self._torch,
        )
        self._binding = OutputBinding(self._contract, self._out, self._rt, state, self._stream)
        super().__init__(backend, name=source.name, inputs=inputs, outputs=outputs, settings=settings)
        if self._multi_device:  # the caller's device and context are given back after each call
            self._device_guard = cuda.CallerDevice(state)

    # -- metadata ------------------------------------------------------------------------
    @property
    def device(self) -> int:
        """The CUDA device id the engine runs on."""
        return self._device

    @property
    def stream(self) -> Any:
        """The engine's own cuda.core ``Stream``; passing it as ``stream=`` skips event ordering."""
        return self._stream

    @property
    def trt_engine(self) -> Any:
        """The ``ICudaEngine``."""
        return self._trt_engine

    @property
    def runtime_config(self) -> Any:
        """The live ``IRuntimeConfig`` of the current execution context (``None`` before
        the first call, after a settings change, or with full TensorRT)."""
        ctx = self._context
        return None if ctx is None else ctx.config

    @property
    def native_runtime_cache(self) -> Any:
        """The ``IRuntimeCache`` attached to the current context, if any."""
        ctx = self._context
        return None if ctx is None else ctx.native_cache

    @property
    def context_timings(self) -> dict[str, float]:
        """Seconds the last execution context creation spent creating the runtime config
        (``runtime_config_s``), materializing and loading the runtime cache
        (``runtime_cache_s``) and in ``create_execution_context`` (``execution_context_s``)."""
        return dict(self._context_timings)

    @property
    def output_allocator(self) -> str:
        """``"auto"`` (default): only data-dependent outputs go through an
        ``IOutputAllocator``; ``"always"``: every output does (TensorRT asks the allocator
        for memory and reports each shape). Changing it drops the execution context."""
        return self._output_allocator

    @output_allocator.setter
    def output_allocator(self, value: str) -> None:
        if value not in ("auto", "always"):
            raise ValueError(f"output_allocator must be one of 'auto', 'always'; got {value!r}")
        with self._exclusive():
            for lane in self._lanes:
                assert isinstance(lane, PythonEngine)
                if value != lane._output_allocator:
                    lane._output_allocator = value
                    lane._drop_context()

    @property
    def shape_contexts(self) -> int:
        """How many execution contexts each lane may hold, one per recent input-shape signature
        (default :data:`.shapes.SHAPE_CONTEXTS`): a change to shapes one of them holds costs no
        TensorRT call. ``1``: one context that changes its shapes. Changing it drops the
        execution contexts. See :mod:`.shapes`."""
        return self._shape_contexts.limit

    @shape_contexts.setter
    def shape_contexts(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"shape_contexts must be an int >= 1; got {value!r}")
        with self._exclusive():
            for lane in self._lanes:
                assert isinstance(lane, PythonEngine)
                part = lane._shape_contexts
                part.making = True  # (try again after a failure)
                if value != part.limit:
                    part.limit = value
                    lane._drop_context()

    @property
    def shape_context_stats(self) -> dict[str, int]:
        """Over all lanes: ``contexts`` held now, ``made`` for shapes that came back, and
        ``swaps``, changes of shapes served by a context already in them."""
        parts = [(lane._shape_contexts, lane._res.context) for lane in self._lanes]  # type: ignore[attr-defined]
        return {"contexts": sum(part.count(ctx) for part, ctx in parts),
                "made": sum(part.made for part, _ in parts), "swaps": sum(part.swaps for part, _ in parts)}

    @property
    def output_allocators(self) -> dict[str, Any]:
        """The ``IOutputAllocator`` of each output that has one, in the current context."""
        ctx = self._context
        return {} if ctx is None else dict(ctx.allocators)

    @property
    def num_profiles(self) -> int:
        return self._num_profiles

    @property
    def profile(self) -> int | None:
        """The optimization profile used by :meth:`execute`; ``None`` picks the first whose
        ranges contain every input shape."""
        return self._profile

    @profile.setter
    def profile(self, value: int | None) -> None:
        if value is not None:
            self._contract.shapes.check_profile_index(value)
        with self._exclusive():
            for lane in self._lanes:
                assert isinstance(lane, PythonEngine)
                lane._profile = value
                lane._fast_paths.forget()
                lane._outer_graphs.shortcuts.clear()
                lane._reset_fast()

    @property
    def _shape_checker(self) -> ShapeChecker:
        return self._contract.shapes

    # -- context lifecycle -------------------------------------------------------------------
    def _pick_stream(self, settings: RuntimeSettings) -> None:
        """TensorRT-RTX's ``cuda_graph_strategy`` captures inside ``execute_async_v3`` on the
        stream it is given. A capture on a *blocking* stream makes every call on the legacy
        default stream in the process fail meanwhile (``CUDA_ERROR_STREAM_CAPTURE_IMPLICIT``:
        seen on an H100 with 8 threads, one of them on torch's default stream). So while the
        strategy is on, an "implicit" lane runs on a non-blocking stream and orders callers on
        the legacy stream with events, as the "events" mode does; with it off, back to the
        blocking stream, which needs no events for them."""
        order = self._order
        if order.mode != "implicit":
            return
        capture = settings.cuda_graph_strategy is not CudaGraphStrategy.DISABLED
        on_spare = order.skip == ()  # legacy callers ordered with events: the non-blocking stream
        if capture == on_spare:
            return
        self._sync()  # the stream left behind is idle: its allocations are usable from the other
        if self._spare_stream is None:
            self._spare_stream = self._state.create_stream()  # non-blocking
        stream, self._spare_stream = self._spare_stream, self._stream
        self._stream = stream
        self._stream_handle = self._res.stream_handle = int(stream.handle)
        self._binding.stream = stream
        order.use_stream(self._stream_handle, stream, skip=() if capture else stream_order.LEGACY_STREAMS)

    def _create_context(self, settings: RuntimeSettings, cache: RuntimeCache | None) -> Any:
        self._pick_stream(settings)
        trt = self._trt
        clock = time.perf_counter
        t0 = clock()
        if self._device_guard is None:  # (with one, the engine's context is current already)
            self._state.activate()
        config = None
        native = None
        user_managed = None
        mark = self._logger.mark()
        t_config = t_cache = t0
        if self._flavour == "tensorrt_rtx":
            config = self._trt_engine.create_runtime_config()
            config.cuda_graph_strategy = trt_enum(trt.CudaGraphStrategy, settings.cuda_graph_strategy)
            config.dynamic_shapes_kernel_specialization_strategy = trt_enum(
                trt.DynamicShapesKernelSpecializationStrategy,
                settings.dynamic_shapes_kernel_specialization_strategy,
            )
            strategies = getattr(trt, "ExecutionContextAllocationStrategy", None)
            user_managed = getattr(strategies, "USER_MANAGED", None)
            if user_managed is not None:
                # Engines built with BuilderFlag.REQUIRE_USER_ALLOCATION accept only contexts
                # whose memory the application provides; other engines accept them too, and
                # TensorRT-RTX 1.6.1 reports such contexts stream-capturable (the outer
                # graph) where its default (STATIC) ones are not (measured on an H100).
                config.set_execution_context_allocation_strategy(user_managed)
            t_config = t_cache = clock()
            if cache is not None:
                if self._cache_key is None:
                    self._cache_key = self._backend.cache_key(self._device)
                native = cache.ensure_materialized(config, backend=self._backend, key=self._cache_key)
                config.set_runtime_cache(native)
                t_cache = clock()
            trt_context = self._trt_engine.create_execution_context(config)
        else:
            trt_context = self._trt_engine.create_execution_context()
        t_context = clock()
        self._context_timings = {
            "runtime_config_s": t_config - t0,
            "runtime_cache_s": t_cache - t_config,
            "execution_context_s": t_context - t_cache,
        }
        if trt_context is None:
            raise EngineError(
                f"engine {self.name!r}: TensorRT could not create an execution context"
                + _detail(self._logger.errors_since(mark))
            )
        ctx = ExecutionContext(trt_context, config, native)
        if user_managed is not None:
            self._provide_device_memory(ctx)
        for spec in self._outputs:
            if spec.data_dependent or self._output_allocator == "always":
                self._attach_allocator(ctx, spec.name)
        self._res.context = ctx
        return ctx

    def _provide_device_memory(self, ctx: ExecutionContext, need: int | None = None) -> None:
        """Give a USER_MANAGED context the scratch memory TensorRT asks for: at creation
        the engine's ``device_memory_size_v2`` (the most any profile and shape needs, so a
        change of shapes costs nothing more); with :data:`MEMORY_PER_SHAPE` (or an engine
        that reports 0), after each shape change what ``update_device_memory_size_for_shapes``
        says. The buffer only grows; growing drops the outer graphs, which hold the old
        address."""
        if need is None:
            need = int(self._trt_engine.device_memory_size_v2)
            ctx.user_managed = True
            ctx.per_shape = MEMORY_PER_SHAPE or need <= 0
            # A USER_MANAGED context sizes its memory for the profile selected explicitly
            # (TensorRT-RTX's sample does so for profile 0 too): the first call selects it.
            ctx.profile = -1
        memory = ctx.device_memory
        if memory is None or memory.size < need:
            if memory is not None and self._outer_graphs.cache:
                self._sync()
                self._drop_graphs()
            # The old buffer is freed on our stream, after the work that still uses it.
            self._order.to_ours()
            memory = ctx.device_memory = self._state.allocate(need, self._stream)
        ctx.trt_context.set_device_memory(int(memory.handle), int(memory.size))

    def _fit_device_memory(self, ctx: ExecutionContext) -> None:
        """After the input shapes changed: make the scratch memory fit them (only for a
        context sized per shape; the others have the largest size already)."""
        if ctx.per_shape:
            self._provide_device_memory(ctx, int(ctx.trt_context.update_device_memory_size_for_shapes()))

    def _attach_allocator(self, ctx: ExecutionContext, name: str) -> None:
        allocator = make_output_allocator(self._trt, self._state, self._stream)
        ctx.trt_context.set_output_allocator(name, allocator)
        ctx.allocators[name] = allocator
        self._fast_paths.natural.clear()  # natural calls are remembered only without allocators
        self._reset_fast()

    def _destroy_context(self, context: Any) -> None:
        self._fast_paths.forget()
        graphs.drop_spare(self)  # before its context: it holds the context's kernels
        if self._res.context is context:
            self._res.context = None
        drop_context(context)

    def _sync(self) -> None:
        """Wait for all work this lane queued: on its stream, and on the caller's stream
        its last fast-path call followed (see stream_order)."""
        if getattr(self, "_stream", None) is not None:
            self._order.to_ours()
            cuda.check(self._rt.cudaStreamSynchronize(self._stream_handle), "cudaStreamSynchronize")

    def _release(self) -> None:
        self._order.release()
        self._fast_paths.forget()
        self._drop_graphs()
        self._finalizer()
        self._trt_engine = None
        self._binding.release()
        self._graphs.close()
        stream, self._stream = self._stream, None
        cuda.close_quietly(stream)
        spare, self._spare_stream = self._spare_stream, None
        cuda.close_quietly(spare)

    def _after_fork(self) -> None:
        self._finalizer.detach()  # its CUDA and TensorRT objects belong to the parent

    # -- lanes ---------------------------------------------------------------------------------
    def _clone_lane(self) -> PythonEngine:
        """Another execution context: its own stream, events, USER_MANAGED activation
        memory, bindings, fast paths and outer graphs; of the same ``ICudaEngine``, unless
        the engine has dynamic input shapes: then of an ``ICudaEngine`` of its own.

        TensorRT's rule (``NvInferRuntime.h``): "If the engine supports dynamic shapes, each
        execution context in concurrent use must use a separate optimization profile." A
        profile covers its own range of shapes, so a lane pinned to one would refuse the
        others; a lane with its own deserialized engine has every profile to itself (what
        Triton's TensorRT backend does per instance), at the cost of the weights once more
        (:meth:`memory_usage` counts them)."""
        backend, trt_engine, state, source, runtime, ordering = self._made_with
        lane = PythonEngine.__new__(PythonEngine)
        # The lane's streams and events belong to the engine's device; the caller's
        # current device is given back after (``load(..., contexts=N)`` leaves it alone).
        with state.scope():
            if any(spec.is_dynamic for spec in self._inputs):
                trt_engine = backend.deserialize(source, state)
            lane._init(backend, trt_engine, state, source, self._settings, runtime, ordering)
        lane._profile = self._profile
        lane._output_allocator = self._output_allocator
        lane._shape_contexts.limit = self._shape_contexts.limit
        lane._outputs = self._outputs
        for mine, theirs in zip(lane._out, self._out, strict=True):
            mine.spec = theirs.spec  # outputs found data-dependent stay so
        return lane

    # -- the outer graph: the core's GraphHooks are graphs.py's functions (graph_hooks_from) ---------

    def _memory_usage(self) -> tuple[int, int]:
        trt_engine = self._trt_engine
        if trt_engine is None:
            return 0, 0
        per = max(
            (int(lane._res.context.device_memory.size) for lane in self._lanes  # type: ignore[attr-defined]
             if lane._res.context is not None and lane._res.context.device_memory is not None),  # type: ignore[attr-defined]
            default=int(getattr(trt_engine, "device_memory_size_v2", 0) or 0),
        )
        # Every distinct ICudaEngine of the lanes holds the weights once (see _clone_lane).
        engines = {id(e): e for e in (lane._trt_engine for lane in self._lanes) if e is not None}  # type: ignore[attr-defined]
        size = len(self._made_with[3].data)
        weights = sum(int(getattr(e, "streamable_weights_size", 0) or 0) or size for e in engines.values())
        return weights, per

    # -- execution -----------------------------------------------------------------------------
    def _call_fast(self, inputs: tuple[Any, ...], stream: Any, outputs: Sequence[Any] | None
                   ) -> list[Any] | None:
        if self._outer_graph is not None:
            outer = self._outer_graphs
            if outputs is None and outer.shortcuts:
                return self._graphs.replay_torch(self, inputs, stream, outer)
            return None
        fast = self._fast_paths
        if outputs is None:
            if fast.natural:
                return fast.call_natural(self, inputs, stream)
        elif fast.prebound:
            return fast.call_prebound(self, inputs, outputs, stream)
        return None

    def _validate_inputs(self, inputs: Sequence[Any], profile: int | None) -> Inspection:
        if not hasattr(self._threads, "ready"):
            self._activate_thread()
        return self._contract.inspect(
            inputs, self._profile if profile is None else profile, remember=profile is None
        )

    def _validate_outputs(self, outputs: Sequence[Any], call: Any) -> None:
        """``outputs=`` against the output shapes of ``call``'s input shapes when the lane ran
        them before: a wrong array is refused before any work is queued (an outer-graph
        replay included); else :meth:`_run` checks them once the context knows the shapes."""
        ctx = self._context
        shapes = None if ctx is None else ctx.out_shape_cache.get((call.shapes, call.profile))
        if shapes is not None:
            call.checked = self._binding.check_outputs(ctx, outputs, shapes)

    def _run(self, context: Any, call: Any, stream: Any, outputs: Sequence[Any] | None) -> list[Any]:
        self._order.to_ours()  # the general path works on our stream (see stream_order)
        return self._run_inspected(context, call.inputs, call, stream, outputs, remember=call.remember)

    def _thread_start(self) -> None:
        self._activate_thread()

    def _activate_thread(self) -> None:
        """A new thread has no current CUDA context until something makes one current;
        TensorRT's profile switch and cuda.core's allocations need it. With several GPUs the
        device guard makes it current for each call instead (and gives the caller's back)."""
        if self._device_guard is None:
            self._state.activate()
        self._threads.ready = True

    def _set_device(self) -> None:
        cuda.check(self._rt.cudaSetDevice(self._device), "cudaSetDevice")

    def _execute_failed(self) -> None:
        self._fast_paths.forget()
        self._reset_fast()
        raise EngineError(
            f"engine {self.name!r}: execute_async_v3 failed" + _detail(self._logger.errors_since(None)[-3:])
        )

    def _run_inspected(
        self,
        ctx: ExecutionContext,
        inputs: Sequence[Any],
        inspection: Inspection,
        stream: Any,
        outputs: Sequence[Any] | None,
        remember: bool = False,
    ) -> list[Any]:
        """The full path: shapes, caller ordering, staging, binding, execution, outputs."""
        rt = self._rt
        kind = inspection.kind
        ptrs = inspection.ptrs
        host = inspection.host
        if self._multi_device:
            self._set_device()
        if (inspection.shapes, inspection.profile) != ctx.shape_key:
            apply_shapes(self, ctx, inspection.shapes, inspection.profile)
        trt_context = ctx.trt_context  # (after: another context may be in these shapes)
        ours = self._stream_handle
        caller = self._order.caller(stream, kind == KIND_TORCH)
        if caller is not None:
            self._order.before(caller)
        if host is not None:
            self._binding.stage_inputs(host, ptrs, ours)
        bound = ctx.bound
        ctx.bound_ptrs = ()  # records forgotten before TensorRT is told (see plans._bind)
        for io, ptr in zip(self._in, ptrs, strict=False):
            if bound.get(io.name) != ptr:
                bound[io.name] = 0
                trt_context.set_tensor_address(io.name, ptr)
                bound[io.name] = ptr
        results, out_ptrs = self._binding.bind_outputs(ctx, kind, outputs, inspection.checked)
        for io, ptr in zip(self._out, out_ptrs, strict=False):
            if ptr and bound.get(io.name) != ptr:
                bound[io.name] = 0
                trt_context.set_tensor_address(io.name, ptr)
                bound[io.name] = ptr
        ctx.bound_ptrs = (*ptrs, *out_ptrs)
        for allocator in ctx.allocators.values():
            allocator.shapes.clear()
        if not trt_context.execute_async_v3(ours):
            self._execute_failed()
        if ctx.allocators:
            results = self._binding.collect_data_dependent(ctx, kind, results, ours)
        if kind == KIND_HOST and outputs is not None:
            if caller is None:  # host inputs promise ready results
                cuda.check(rt.cudaStreamSynchronize(ours), "cudaStreamSynchronize")
        elif kind == KIND_HOST:
            results = self._binding.to_host(results, ours, inspection.torch_host)
        if caller is not None:
            self._order.after(caller)
        elif kind == KIND_DEVICE and outputs is None:
            for r in results:
                if isinstance(r, DeviceArray):
                    r.stream = ours
        if remember and host is None and not ctx.allocators:
            if outputs is not None:
                self._fast_paths.remember_prebound(self, ctx, inputs, outputs, ptrs, out_ptrs, kind)
            elif kind == KIND_TORCH and self._torch.tensor is not None:
                self._fast_paths.remember_natural(self, ctx, inspection.shapes)
        return results

    def _mark_data_dependent(self, io: TensorInfo) -> None:
        spec = io.spec
        io.spec = TensorSpec(spec.name, spec.dtype, spec.shape, False, data_dependent=True)
        self._outputs = tuple(o.spec for o in self._out)


def _cudart() -> Any:
    from cuda.bindings import runtime

    return runtime


def _detail(messages: list[str]) -> str:
    return f": {'; '.join(messages)}" if messages else ""

