"""``TorchbindLane``: one lane of a :class:`~.engine.TorchbindEngine`, the backend's
:class:`~trt_runtime.lane.LaneOps`.

A lane holds its own ``torch.classes.tensorrt.Engine`` (torch-tensorrt's C++ engine owns
its ``IExecutionContext``), the one stream its ``execute_engine`` calls run on, the stream
the caller's work last ran on, and its outer graphs' side (:class:`.graphs.TorchbindGraphs`).
What the hot path reads (the op, the tensor type, the dtypes, the shapes validated) is bound
here once, from the engine.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from trt_runtime.contract import KIND_HOST
from trt_runtime.errors import CacheError, CapabilityError, EngineError, TrtRuntimeError
from trt_runtime.lane import GraphOps, Lane, LaneOps
from trt_runtime.outer import GraphSlot
from trt_runtime.protocols import Backend, TensorSpec
from trt_runtime.settings import (
    CudaGraphStrategy,
    DynamicShapesKernelSpecializationStrategy,
    RuntimeSettings,
)

from .bridge import LaneStream, translate_errors
from .contract import Call, Contract

if TYPE_CHECKING:
    from trt_runtime.cache import RuntimeCache

    from .runtime import TorchbindRuntime

__all__ = ["CURRENT", "Features", "LaneGraphs", "NativeState", "Shared", "TorchbindLane"]

logger = logging.getLogger("trt_runtime.torchbind")

#: Per thread: whether a CUDA context was made current in it (see TorchBridge.bind_thread).
_THREAD = threading.local()
_LAZY = DynamicShapesKernelSpecializationStrategy.LAZY

#: ``TorchbindLane.last_stream`` value meaning "torch's current stream on the engine's device".
CURRENT = object()


@dataclasses.dataclass(frozen=True)
class Features:
    """What this torch-tensorrt's engine objects can do (read once, at load)."""

    can_update: bool  # update_runtime_settings (settings per context)
    lazy_context: bool  # a lazily built IExecutionContext it counts (2.13+)
    switches_profiles: bool  # per-call optimization-profile selection (2.14+)


@dataclasses.dataclass
class Shared:
    """What the lanes of one :class:`~.engine.TorchbindEngine` share: the backend and
    runtime, the device, the tensors and their contract, what torch-tensorrt can do, and
    what was logged once or counted for the engine."""

    backend: Backend
    runtime: TorchbindRuntime
    device: int
    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    contract: Contract
    features: Features
    #: What was logged once for the engine ("staged", "strategy", "lazy").
    said: set[str] = dataclasses.field(default_factory=set)
    #: How many times ``update_runtime_settings`` was called, by every lane.
    native_updates: int = 0

    def log_staging(self, call: Call) -> None:
        """Log once per engine that host inputs are staged on the device."""
        if "staged" not in self.said:
            self.said.add("staged")
            names = ", ".join(repr(self.inputs[i].name) for i in call.host)
            logger.info(
                "engine %r: host input(s) %s copied to cuda:%d on the caller's stream "
                "(pass CUDA tensors to stay zero-copy)", self.name, names, self.device,
            )

    def graph_capturable(self, settings: RuntimeSettings) -> bool:
        """Whether calls of a lane with ``settings`` go through the outer graph.

        With TensorRT-RTX's own capture on (``cuda_graph_strategy``) they run eagerly with
        it instead: torch-tensorrt turns its engine's strategy off for good when it meets
        an outer capture.
        """
        if settings.cuda_graph_strategy is CudaGraphStrategy.DISABLED:
            if (
                "lazy" not in self.said
                and any(s.is_dynamic for s in self.inputs)
                and settings.dynamic_shapes_kernel_specialization_strategy is _LAZY
            ):
                self.said.add("lazy")
                logger.info(
                    "engine %r: dynamic input shapes with dynamic_shapes_kernel_specialization_strategy="
                    "'lazy': each outer graph keeps the kernels TensorRT-RTX ran when it was captured "
                    "(shape-specialized kernels compiled later are not picked up; torch-tensorrt's own "
                    "wrapper refuses this combination); 'eager' compiles them before the capture",
                    self.name,
                )
            return True
        if "strategy" not in self.said:
            self.said.add("strategy")
            logger.warning(
                "engine %r: cuda_graph_strategy=%r is TensorRT-RTX's own CUDA graph capture, which "
                "torch-tensorrt cannot run inside an outer graph; calls run eagerly with it "
                "(enable_cudagraphs(engine, outer=True) sets 'disabled')",
                self.name, str(settings.cuda_graph_strategy),
            )
        return False


class LaneGraphs(GraphOps, Protocol):
    """What a lane asks of its outer graphs' side (:class:`.graphs.TorchbindGraphs`) besides
    the core's :class:`~trt_runtime.lane.GraphOps`."""

    def replay_plan(self, slot: GraphSlot, shapes: tuple[Any, ...], view: bool
                    ) -> Callable[[tuple[Any, ...], Any, Any], list[Any] | None]:
        """The replay fast path of ``slot``, captured for torch inputs of ``shapes``."""
        ...

    def streams(self) -> tuple[Any, ...]:
        """The streams the graphs ran on."""
        ...

    def release(self) -> None:
        """The lane is closed (its graphs dropped, its work waited for): give the streams the
        graphs own back."""
        ...


@dataclasses.dataclass
class NativeState:
    """The "execution context" of a torchbind lane: the settings it was configured with."""

    serial: int
    settings: RuntimeSettings
    cache_handle: Any = None
    applied: bool = False  # whether update_runtime_settings was called for it


class TorchbindLane(LaneOps):
    """One lane: its ``torch.classes.tensorrt.Engine`` (``native``), streams and outer graphs."""

    def __init__(self, shared: Shared, lane: Lane, native: Any,
                 make_graphs: Callable[[TorchbindLane], LaneGraphs]) -> None:
        self.shared = shared
        self.lane = lane
        self.name = shared.name
        #: The ``torch.classes.tensorrt.Engine`` of this lane (None once released).
        self.native = native
        bridge = self._bridge = shared.runtime.bridge
        self._device = shared.device
        # What the hot path reads (see _fast): all of it fixed for the engine's life.
        self._op = bridge.execute_op()
        self._tensor_type = bridge.tensor_type
        self._torch_dtypes = tuple(bridge.torch_dtype(s.dtype) for s in shared.inputs)
        self._good_shapes = shared.contract.good_shapes
        self._n_in = len(shared.inputs)
        self._n_out = len(shared.outputs)
        self._single_device = bridge.device_count() == 1
        self._get_device = bridge.current_device_fn()
        self.last_stream: Any = None
        #: The one stream every execute_engine call of this lane runs on (see _call_op),
        #: made at the first call.
        self._lane_stream: LaneStream | None = None
        #: Whether that stream is to be blocking: yes, unless TensorRT-RTX's own capture
        #: (``cuda_graph_strategy``) is on (see _pick_stream). The lane's streams by that wish.
        self._want_blocking = True
        self._lane_streams: dict[bool, LaneStream] = {}
        self._serial = 0
        self.graphs: LaneGraphs = make_graphs(self)

    # -- the context ------------------------------------------------------------------------
    def _pick_stream(self, settings: RuntimeSettings) -> None:
        """TensorRT-RTX's ``cuda_graph_strategy`` captures inside the op on the stream it runs
        on. A capture on a *blocking* stream makes every call on the legacy default stream in
        the process fail meanwhile (``CUDA_ERROR_STREAM_CAPTURE_IMPLICIT``, seen with the
        python backend on an H100). So while the strategy is on the lane runs on a
        non-blocking stream, every caller ordered with events; with it off, on a blocking
        stream, which needs no events for a caller on the legacy default stream
        (:meth:`.bridge.TorchBridge.execute_on`). A switch waits for the lane's work first:
        the op sees one stream at a time, and the stream left behind is idle."""
        want = settings.cuda_graph_strategy is CudaGraphStrategy.DISABLED
        if want == self._want_blocking:
            return
        if self._lane_stream is not None:
            self.sync()
        self._want_blocking = want
        self._lane_stream = None  # the next call takes the stream of that kind (_new_lane_stream)

    def _new_lane_stream(self) -> LaneStream:
        """The lane's stream of the kind :attr:`_want_blocking` asks for, made once."""
        want = self._want_blocking
        stream = self._lane_streams.get(want)
        if stream is None:
            stream = self._lane_streams[want] = self._bridge.lane_stream(self._device, blocking=want)
        return stream

    def create_context(self, settings: RuntimeSettings, cache: RuntimeCache | None) -> NativeState:
        self._pick_stream(settings)
        shared = self.shared
        handle = None
        if cache is not None:
            # The key of this engine's device: a cache never serves two GPU models. One that
            # cannot be read gets no stale check, as in RuntimeCache.bind.
            try:
                key = shared.backend.cache_key(self._device)
            except Exception:
                key = None
            handle = cache.ensure_materialized(self, backend=shared.backend, key=key)
            bridge = self._bridge
            native_handle = bridge.qualified_name(handle).endswith("RuntimeCacheHandle") or (
                bridge.has_method(handle, "has_cache") and bridge.has_method(handle, "deserialize")
            )
            if not native_handle:
                raise CacheError(
                    f"engine {self.name!r}: the runtime cache gave {type(handle).__name__}, "
                    "not torch-tensorrt's RuntimeCacheHandle (was it materialized by another backend?)"
                )
        state = NativeState(serial=self._serial, settings=settings, cache_handle=handle)
        self._serial += 1
        features = shared.features
        if features.can_update:
            ds, cg = settings.to_codes()
            with translate_errors(self.name, "update_runtime_settings"):
                self.native.update_runtime_settings(ds, cg, handle)
            shared.native_updates += 1
            state.applied = True
        elif settings != RuntimeSettings():
            # The backend claimed the capability but this engine object lacks the method.
            library = shared.runtime.library
            raise CapabilityError(
                f"engine {self.name!r}: torch.classes.tensorrt.Engine has no update_runtime_settings "
                f"in {library.distribution} {library.version}; torch-tensorrt-rtx >= 2.13 adds it"
            )
        if features.switches_profiles:
            self._resync_profile()
        return state

    def _resync_profile(self) -> None:
        """torch-tensorrt keeps its active-profile index when it rebuilds its execution
        context, but a new context starts on profile 0; its per-call selection then trusts
        the stale index and TensorRT refuses the shapes. Re-pin profile 0 so index and
        context agree (this builds the context now instead of in the next execute: one
        creation either way); the next call selects the profile its shapes need."""
        with translate_errors(self.name, "re-selecting the optimization profile"):
            if int(self.native._active_profile_index) != 0:
                self.native.set_active_profile(0)

    def destroy_context(self, context: Any) -> None:
        if self.native is not None and self.shared.features.lazy_context:
            # Invalidates torch-tensorrt's IExecutionContext (rebuilt lazily at the next
            # execute); this engine never enables profiling, so nothing else changes.
            with translate_errors(self.name, "dropping the execution context"):
                self.native.disable_profiling()

    # -- calls ------------------------------------------------------------------------------
    def call_fast(self, inputs: tuple[Any, ...], stream: Any, outputs: Sequence[Any] | None
                  ) -> list[Any] | None:
        if stream is None and outputs is None:
            lane = self.lane
            if lane.outer_graph is None:
                return self._fast(inputs)
            if lane.outer_graphs is not None and lane.outer_graphs.shortcuts:
                return self._replay_fast(inputs)
        return None

    def thread_start(self) -> None:
        """A thread's first call on this engine: torch's device binding for the thread (a
        replay plan, called before ``call_fast``, does not check it)."""
        if "bound" not in _THREAD.__dict__:
            self._bridge.bind_thread(self._device)
            _THREAD.bound = True

    def validate_inputs(self, inputs: Sequence[Any], profile: int | None) -> Call:
        return self.shared.contract.inspect(inputs)

    def validate_outputs(self, context: Any, outputs: Sequence[Any], call: Call) -> None:
        call.views = self.shared.contract.check_outputs(outputs, call.shapes)

    def run(self, context: Any, call: Call, stream: Any, outputs: Sequence[Any] | None) -> list[Any]:
        return self._run_call(call, stream, outputs, call.views)

    def torch_key(self, inputs: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """The shape key of contiguous CUDA torch tensors of the right dtypes on the engine's
        device and current there; ``None`` for anything else."""
        if len(inputs) != self._n_in:
            return None
        tensor_type = self._tensor_type
        for x, dtype in zip(inputs, self._torch_dtypes):  # noqa: B905 - lengths checked above
            if type(x) is not tensor_type or x.dtype is not dtype or not x.is_cuda or not x.is_contiguous():
                return None
        if not self._single_device:
            device = self._device
            if self._get_device() != device or any(x.get_device() != device for x in inputs):
                return None
        return (inputs[0].shape,) if self._n_in == 1 else tuple([x.shape for x in inputs])

    def _replay_fast(self, inputs: tuple[Any, ...]) -> list[Any] | None:
        """An outer-graph replay of a graph already captured for these shapes, on torch's
        current stream: copy the inputs in, replay, outputs by mode."""
        key = self.torch_key(inputs)
        if key is None:
            return None
        lane = self.lane
        slot = lane.outer_graphs.shortcuts.get(key)  # type: ignore[union-attr]
        if slot is None or slot.graph is None:
            return None
        plan = slot.plan
        if plan is None:
            view = lane.outer_graph.outputs == "view"  # type: ignore[union-attr]
            plan = slot.plan = self.graphs.replay_plan(slot, key, view)
        return lane.switch_fast(plan, inputs, None, None)

    def _fast(self, inputs: tuple[Any, ...]) -> list[Any] | None:
        """The hot path: contiguous CUDA torch tensors of the right dtypes, on the engine's
        device and current there, with shapes validated before, no outer graph and a live
        context. None sends the call down the general path (which says what is wrong)."""
        if self.lane.context is None:
            return None
        key = self.torch_key(inputs)
        if key is None or key not in self._good_shapes:
            return None
        try:
            # Tensor[] takes the tuple as it is (the C++ argument parser accepts any sequence).
            results = self._call_op(inputs)
        except Exception as exc:
            raise EngineError(
                f"engine {self.name!r}: execute_engine failed in torch-tensorrt's runtime: {exc}"
            ) from exc
        self.last_stream = CURRENT
        return results  # type: ignore[no-any-return]

    def _run_call(self, call: Call, stream: Any, outputs: Sequence[Any] | None, views: list[Any] | None
                  ) -> list[Any]:
        """Run a checked call on the caller's stream: torch's current stream (switching to
        the engine's device if another is current) or ``stream``."""
        bridge = self._bridge
        try:
            if stream is None and (self._single_device or self._get_device() == self._device):
                result = self._dispatch(call, outputs, views, caller_stream=False)
                self.last_stream = CURRENT
                return result
            with translate_errors(self.name, "resolving the stream"):
                torch_stream = bridge.resolve_stream(stream, self._device)
            with bridge.stream_scope(torch_stream):
                result = self._dispatch(call, outputs, views, caller_stream=stream is not None)
        except TrtRuntimeError:
            raise
        except Exception as exc:  # staging, copies, stream switches: torch's own errors
            raise EngineError(f"engine {self.name!r}: the call failed in torch: {exc}") from exc
        self.last_stream = torch_stream
        return result

    def _dispatch(self, call: Call, outputs: Sequence[Any] | None, views: list[Any] | None, *,
                  caller_stream: bool) -> list[Any]:
        """Run ``call`` on the current stream and hand the results over in the kind the
        contract says."""
        bridge = self._bridge
        shared = self.shared
        contract = shared.contract
        tensors = call.tensors
        if call.host:
            shared.log_staging(call)
            tensors = list(tensors)
            for i in call.host:
                tensors[i] = bridge.to_device(tensors[i], self._device)
        results = self._execute_now(tensors)
        if len(results) != self._n_out:
            raise EngineError(
                f"engine {self.name!r}: torch-tensorrt returned {len(results)} output(s); "
                f"expected {self._n_out} {[o.name for o in shared.outputs]}"
            )
        if contract.learns_output_shapes:
            contract.learn(call.shapes, results)
        if views is not None:
            assert outputs is not None
            contract.check_results(results, views)
            for view, result in zip(views, results, strict=True):
                bridge.copy_(view, result)
            if call.kind == KIND_HOST and not caller_stream:  # host inputs promise ready results
                bridge.synchronize(bridge.current_stream(self._device))
            return list(outputs)
        if call.kind == KIND_HOST:
            host = [bridge.to_host(r) for r in results]  # waits for the copies
            return host if call.torch_host else [bridge.to_numpy(t) for t in host]
        return results

    def _call_op(self, tensors: Sequence[Any]) -> list[Any]:
        """``execute_engine`` on this lane's own stream, ordered after the caller's current
        stream and before it again.

        torch-tensorrt's op keeps the caller's stream of the call in the engine object; called
        from threads on different streams while the GPU is busy it returned wrong outputs
        (H100, 2026-11-24, ``benchmarks/probes/gpu_torchbind_race_probe.py``: 6,238 of 8,000 from 16
        threads on their own streams under a GPU load; 0 with every call on one stream). So
        the op only ever sees one stream per lane (one at a time: see _pick_stream), ordered
        with the caller's as :meth:`.bridge.TorchBridge.execute_on` says.
        """
        stream = self._lane_stream
        if stream is None:
            stream = self._lane_stream = self._new_lane_stream()
        return self._bridge.execute_on(stream, self._op, tensors, self.native, self._device)

    def _execute_now(self, tensors: list[Any]) -> list[Any]:
        """One ``execute_engine`` call (on the lane's stream); errors become EngineError."""
        try:
            return self._call_op(tensors)
        except Exception as exc:
            raise EngineError(
                f"engine {self.name!r}: execute_engine failed in torch-tensorrt's runtime: {exc}"
            ) from exc

    def raw_execute(self, tensors: list[Any]) -> list[Any]:
        """``execute_engine`` on the current stream, errors untouched (the outer graph's own)."""
        return self._op(tensors, self.native)  # type: ignore[no-any-return]

    # -- lifetime -----------------------------------------------------------------------------
    def sync(self) -> None:
        """Wait for the work this lane queued on the last stream it ran on, on its own stream
        (a caller on the legacy default stream has no event to wait for it) and on its
        graphs' streams; never the whole device (another lane may be capturing, and a device
        synchronize then fails: "operation not permitted when stream is capturing")."""
        bridge = self._bridge
        stream = self.last_stream
        if stream is CURRENT:
            stream = bridge.current_stream(self._device)
        own = None if self._lane_stream is None else self._lane_stream.stream
        done: list[Any] = []
        for s in (stream, own, *self.graphs.streams()):
            if s is not None and not any(s is d for d in done):
                bridge.synchronize(s)
                done.append(s)

    def release(self) -> None:
        self.lane.drop_graphs()  # static inputs handed out before any capture
        self.native = None  # the C++ engine is freed with its last reference
        # The streams go back to the pool now, not when the collector frees this lane (the
        # core lane waited for their work when it dropped the context).
        self.graphs.release()
        for lane_stream in self._lane_streams.values():
            self._bridge.give_back(lane_stream.stream)
        self._lane_streams.clear()
        self._lane_stream = None
