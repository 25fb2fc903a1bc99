"""``PythonLane``: one lane of a :class:`~.engine.PythonEngine`, the python backend's
:class:`~trt_runtime.lane.LaneOps`.

A lane holds its parts, each owning its state: a :class:`.contract.Contract` (input
checks), a :class:`.bridge.TorchBridge` (torch), an :class:`.output_binding.OutputBinding`
(outputs and host staging), :class:`.graphs.PythonGraphs` (capture and launch of the outer
CUDA graphs the core's :class:`~trt_runtime.outer.OuterGraphs` keeps),
:class:`.fast_path.FastPaths` (repeat calls that skip the checks), a
:class:`.stream_order.StreamOrder` (ordering with the caller's stream) and
:class:`.shapes.ShapeContexts` (a context per recent input-shape signature); and its own
CUDA stream, events and execution contexts, over the engine's ``ICudaEngine`` (or one of
its own, for an engine with dynamic shapes: see :meth:`.engine.PythonEngine._new_ops`),
and what the lanes share (:class:`Shared`).
The core's :class:`~trt_runtime.lane.Lane` (``self.lane``) keeps the context handle, the
settings, the outer graphs and the fast entry.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from trt_runtime_backends.python import cuda, stream_order
from trt_runtime_backends.python.arrays import DeviceArray
from trt_runtime_backends.python.bridge import TorchBridge
from trt_runtime_backends.python.contract import Contract, Inspection, TensorInfo
from trt_runtime_backends.python.execution_context import (
    ExecutionContext,
    Resources,
    drop_context,
    finalize,
    trt_enum,
)
from trt_runtime_backends.python.fast_path import FastPaths
from trt_runtime_backends.python.output_binding import OutputBinding, make_output_allocator
from trt_runtime_backends.python.shapes import SHAPE_CONTEXTS, ShapeContexts, apply_shapes

from trt_runtime.contract import KIND_DEVICE, KIND_HOST, KIND_TORCH, ShapeChecker, cuda_result
from trt_runtime.errors import EngineError
from trt_runtime.lane import GraphOps, Lane, LaneOps
from trt_runtime.outer import OuterGraphs
from trt_runtime.protocols import EngineSource, TensorSpec
from trt_runtime.settings import CudaGraphStrategy, RuntimeSettings

if TYPE_CHECKING:
    from trt_runtime.cache import RuntimeCache

__all__ = ["MEMORY_PER_SHAPE", "LaneGraphs", "PythonLane", "Shared"]

#: Whether a USER_MANAGED context's scratch memory is sized again after every change of
#: input shapes (``update_device_memory_size_for_shapes`` + ``set_device_memory``, as
#: TensorRT-RTX's sample does). False (default): one buffer of ``device_memory_size_v2``
#: bytes, the most any profile and shape needs, handed over at creation and after a profile
#: switch, so alternating among shapes sets only the shapes (benchmarks/probes/gpu_shape_switch_probe.py
#: measures the calls skipped and checks the results without them). Read at context creation.
MEMORY_PER_SHAPE = False


@dataclasses.dataclass
class Shared:
    """What the lanes of one :class:`~.engine.PythonEngine` share: what the load gave (the
    backend, the first ``ICudaEngine``, the device, the plan, the CUDA runtime, the
    stream-ordering mode), the tensors and their checks, and this backend's settings, which
    the engine changes (every lane held) and the lanes read."""

    backend: Any
    trt_engine: Any
    state: cuda.DeviceState
    source: EngineSource
    runtime: Any  # cuda.bindings.runtime, or a test double
    ordering: str
    multi_device: bool
    ins: list[TensorInfo]
    outs: list[TensorInfo]  # an output found data-dependent stays so, for every lane
    checker: ShapeChecker
    profile: int | None = None
    output_allocator: str = "auto"
    shape_contexts: int = SHAPE_CONTEXTS

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return tuple(o.spec for o in self.outs)


class LaneGraphs(GraphOps, Protocol):
    """What a lane asks of its outer graphs' side (:class:`.graphs.PythonGraphs`) besides the
    core's :class:`~trt_runtime.lane.GraphOps`."""

    #: The slots of the plain replay plans by the ``id`` of the static input buffer each was given last.
    statics: dict[int, Any]

    def replay_torch(self, inputs: tuple[Any, ...], stream: Any, graphs: OuterGraphs) -> list[Any] | None:
        """A replay of CUDA torch inputs of shapes captured before; ``None``: the general path."""
        ...

    def drop_spare(self) -> None:
        """Destroy the executable graph kept for an update (the context goes)."""
        ...

    def close(self) -> None:
        """Release what is left (the lane closes, after its graphs were dropped)."""
        ...


class PythonLane(LaneOps):
    """One execution context's side of the python backend: stream, events, bindings,
    caches and outer graphs over an ``ICudaEngine``. Made by the engine for each lane.
    Not thread-safe: a lane is leased by one call at a time."""

    def __init__(self, shared: Shared, lane: Lane, trt_engine: Any,
                 make_graphs: Callable[[PythonLane], LaneGraphs]) -> None:
        backend = shared.backend
        self.shared = shared
        self.lane = lane
        self.name = shared.name
        self._trt = backend.tensorrt
        self._flavour = backend.flavour
        self._logger = backend.logger
        self._trt_engine = trt_engine
        state = self._state = shared.state
        self._device = state.index
        self._multi_device = shared.multi_device
        #: Threads in which the engine's device context was made current (see validate_inputs).
        self._threads = threading.local()
        # (shared with the engine and its other lanes: an output found data-dependent stays so)
        self._in: list[TensorInfo] = shared.ins
        self._out: list[TensorInfo] = shared.outs
        self._n_in = len(self._in)
        self._in_names = tuple(io.name for io in self._in)
        self._io_names = tuple(io.name for io in (*self._in, *self._out))
        self._rt = shared.runtime
        self._res = Resources(self._rt)
        # A lane that is never closed still drops its context before its ICudaEngine;
        # not at interpreter exit, though: daemon threads may still be calling it then, and
        # the program's tensors outlive the atexit hooks. The process's end releases it all.
        self._finalizer = weakref.finalize(self, finalize, self._res)
        self._finalizer.atexit = False
        mode = shared.ordering
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
        self._shape_contexts.limit = shared.shape_contexts
        self.graphs: LaneGraphs = make_graphs(self)
        self._cache_key: Any = None
        #: Seconds the last context creation took, by step (``PythonEngine.context_timings``).
        self.context_timings: dict[str, float] = {}
        self._contract = Contract(
            shared.name, self._in, shared.checker, self._device, self._multi_device, self._torch,
        )
        self._binding = OutputBinding(self._contract, self._out, self._rt, state, self._stream)

    @property
    def stream(self) -> Any:
        """The lane's own cuda.core ``Stream``."""
        return self._stream

    @property
    def trt_engine(self) -> Any:
        """The ``ICudaEngine`` this lane's contexts are made from (None once released)."""
        return self._trt_engine

    def apply_shape_contexts(self, limit: int) -> None:
        """Hold up to ``limit`` contexts per shape from now on (the lane's context goes when
        it changes; a failed attempt is tried again)."""
        part = self._shape_contexts
        part.making = True
        if limit != part.limit:
            part.limit = limit
            self.lane.drop_context()

    def forget_calls(self) -> None:
        """Forget the remembered calls and shortcuts (the profile changed)."""
        self._fast_paths.forget()
        if self.lane.outer_graphs is not None:
            self.lane.outer_graphs.shortcuts.clear()
        self.graphs.statics.clear()
        self.lane.reset_fast()

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
        self.sync()  # the stream left behind is idle: its allocations are usable from the other
        if self._spare_stream is None:
            self._spare_stream = self._state.create_stream()  # non-blocking
        stream, self._spare_stream = self._spare_stream, self._stream
        self._stream = stream
        self._stream_handle = self._res.stream_handle = int(stream.handle)
        self._binding.stream = stream
        order.use_stream(self._stream_handle, stream, skip=() if capture else stream_order.LEGACY_STREAMS)

    def create_context(self, settings: RuntimeSettings, cache: RuntimeCache | None) -> Any:
        self._pick_stream(settings)
        trt = self._trt
        clock = time.perf_counter
        t0 = clock()
        if self.lane.device_guard is None:  # (with one, the engine's context is current already)
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
                    self._cache_key = self.shared.backend.cache_key(self._device)
                native = cache.ensure_materialized(config, backend=self.shared.backend, key=self._cache_key)
                config.set_runtime_cache(native)
                t_cache = clock()
            trt_context = self._trt_engine.create_execution_context(config)
        else:
            trt_context = self._trt_engine.create_execution_context()
        t_context = clock()
        self.context_timings = {
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
        always = self.shared.output_allocator == "always"
        for spec in self.shared.outputs:
            if spec.data_dependent or always:
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
            outer = self.lane.outer_graphs
            if memory is not None and outer is not None and outer.cache:
                self.sync()
                self.lane.drop_graphs()
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
        self.lane.reset_fast()

    def destroy_context(self, context: Any) -> None:
        self._fast_paths.forget()
        self.graphs.drop_spare()  # before its context: it holds the context's kernels
        if self._res.context is context:
            self._res.context = None
        drop_context(context)

    def sync(self) -> None:
        """Wait for all work this lane queued: on its stream, and on the caller's stream
        its last fast-path call followed (see stream_order)."""
        if getattr(self, "_stream", None) is not None:
            self._order.to_ours()
            cuda_result(self._rt.cudaStreamSynchronize(self._stream_handle), "cudaStreamSynchronize")

    def release(self) -> None:
        self._order.release()
        self._fast_paths.forget()
        self.lane.drop_graphs()
        self._finalizer()
        self._trt_engine = None
        self._binding.release()
        self.graphs.close()
        stream, self._stream = self._stream, None
        cuda.close_quietly(stream)
        spare, self._spare_stream = self._spare_stream, None
        cuda.close_quietly(spare)

    def after_fork(self) -> None:
        self._finalizer.detach()  # its CUDA and TensorRT objects belong to the parent

    # -- execution -----------------------------------------------------------------------------
    def call_fast(self, inputs: tuple[Any, ...], stream: Any, outputs: Sequence[Any] | None
                   ) -> list[Any] | None:
        lane = self.lane
        if lane.outer_graph is not None:
            outer = lane.outer_graphs
            if outputs is None and outer is not None and outer.shortcuts:
                return self.graphs.replay_torch(inputs, stream, outer)
            return None
        fast = self._fast_paths
        if outputs is None:
            if fast.natural:
                return fast.call_natural(self, inputs, stream)
        elif fast.prebound and type(outputs) in (list, tuple):  # (anything else: the general path says so)
            return fast.call_prebound(self, inputs, outputs, stream)
        return None

    def validate_inputs(self, inputs: Sequence[Any], profile: int | None) -> Inspection:
        if not hasattr(self._threads, "ready"):
            self._activate_thread()
        return self._contract.inspect(
            inputs, self.shared.profile if profile is None else profile, remember=profile is None
        )

    def validate_outputs(self, context: Any, outputs: Sequence[Any], call: Any) -> None:
        """``outputs=`` against the output shapes of ``call``'s input shapes when the lane ran
        them before: a wrong array is refused before any work is queued (an outer-graph
        replay included); else :meth:`run` checks them once the context knows the shapes."""
        ctx = context
        shapes = None if ctx is None else ctx.out_shape_cache.get((call.shapes, call.profile))
        if shapes is not None:
            call.checked = self._binding.check_outputs(ctx, outputs, shapes)

    def run(self, context: Any, call: Any, stream: Any, outputs: Sequence[Any] | None) -> list[Any]:
        self._order.to_ours()  # the general path works on our stream (see stream_order)
        return self._run_inspected(context, call.inputs, call, stream, outputs, remember=call.remember)

    def thread_start(self) -> None:
        self._activate_thread()

    def _activate_thread(self) -> None:
        """A new thread has no current CUDA context until something makes one current;
        TensorRT's profile switch and cuda.core's allocations need it. With several GPUs the
        device guard makes it current for each call instead (and gives the caller's back)."""
        if self.lane.device_guard is None:
            self._state.activate()
        self._threads.ready = True

    def execute_failed(self) -> None:
        self._fast_paths.forget()
        self.lane.reset_fast()
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
            self.execute_failed()
        if ctx.allocators:
            results = self._binding.collect_data_dependent(ctx, kind, results, ours)
        if kind == KIND_HOST and outputs is not None:
            if caller is None:  # host inputs promise ready results
                cuda_result(rt.cudaStreamSynchronize(ours), "cudaStreamSynchronize")
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


def _detail(messages: list[str]) -> str:
    return f": {'; '.join(messages)}" if messages else ""
