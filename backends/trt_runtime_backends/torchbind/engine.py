"""TorchbindEngine: one ``torch.classes.tensorrt.Engine`` behind the core engine lifecycle.

What "execution context" means here
-----------------------------------
torch-tensorrt's C++ engine owns its ``IExecutionContext``. The context this class
creates (what :class:`~trt_runtime.EngineBase` counts) is the *configured* torchbind
engine: ``Engine.update_runtime_settings(ds, cg, cache_handle)`` applied with the
current settings. A settings change drops it; the next :meth:`execute` applies the
new settings, and torch-tensorrt (2.13+) then builds one new ``IExecutionContext`` in
that same ``execute_engine`` call, lazily, as the Python backend does. Dropping a
context also asks torch-tensorrt to drop its own (``disable_profiling`` is the
torchbind method that invalidates it), so both sides count the same creations.

Inputs and outputs
------------------
The device contract of every backend (docs/device-contract.md, enforced in
:mod:`.contract`): CUDA torch tensors in, CUDA torch tensors out; host arrays in, host
arrays out (staged through the device on the caller's stream, logged once per engine);
other CUDA arrays in, device arrays out (torch CUDA tensors). ``outputs=`` are written
with a device-to-device copy on the caller's stream. Everything is checked before the
C++ op runs. The common call (torch CUDA tensors on torch's current stream, no
``outputs=``) takes a hot path: a few attribute reads per input, a lookup of the shapes
among those already validated, and the op itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from trt_runtime.contract import KIND_HOST
from trt_runtime.engine import EngineBase
from trt_runtime.errors import CacheError, CapabilityError, EngineError, TrtRuntimeError
from trt_runtime.outer import graph_hooks_from
from trt_runtime.protocols import Backend, TensorSpec
from trt_runtime.settings import (
    CudaGraphStrategy,
    DynamicShapesKernelSpecializationStrategy,
    RuntimeSettings,
    SettingsLike,
)

from . import graphs
from .contract import Call, Contract
from .graphs import GraphOps

if TYPE_CHECKING:
    from trt_runtime.cache import RuntimeCache

    from .runtime import TorchbindRuntime

__all__ = ["NativeState", "TorchbindEngine", "translate_errors"]

logger = logging.getLogger("trt_runtime.torchbind")


@contextlib.contextmanager
def translate_errors(engine: str, what: str) -> Iterator[None]:
    """Turn an exception from torch / torch-tensorrt into :class:`EngineError`."""
    try:
        yield
    except TrtRuntimeError:
        raise
    except Exception as exc:
        raise EngineError(f"engine {engine!r}: {what} failed in torch-tensorrt's runtime: {exc}") from exc


#: ``_last_stream`` value meaning "torch's current stream on the engine's device".
_CURRENT = object()

#: Per thread: whether a CUDA context was made current in it (see TorchBridge.bind_thread).
_THREAD = threading.local()
_LAZY = DynamicShapesKernelSpecializationStrategy.LAZY


@dataclasses.dataclass
class NativeState:
    """The "execution context" of a torchbind engine: the settings it was configured with."""

    serial: int
    settings: RuntimeSettings
    cache_handle: Any = None
    applied: bool = False  # whether update_runtime_settings was called for it


@graph_hooks_from(graphs)
class TorchbindEngine(EngineBase):
    """An engine run by torch-tensorrt's C++ runtime; outputs follow the kind of the inputs."""

    def __init__(
        self,
        backend: Backend,
        *,
        runtime: TorchbindRuntime,
        native: Any,
        name: str,
        inputs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec],
        device: int,
        settings: SettingsLike = None,
        make_native: Callable[[], Any] | None = None,
    ) -> None:
        self._runtime = runtime
        self._native = native
        self._device = device
        #: Builds another torch.classes.tensorrt.Engine of the same bytes (a new lane).
        self._make_native = make_native
        self._made_with = (backend, runtime, name, inputs, outputs, device)
        bridge = self._bridge = runtime.bridge
        self._can_update = runtime.has_runtime_settings and bridge.has_method(
            native, "update_runtime_settings"
        )
        self._lazy_native_context = bridge.has_method(native, "num_execution_contexts_created")
        self._switches_profiles = False
        inputs = self._select_profiles(name, inputs)
        self._contract = Contract(name, inputs, outputs, device, bridge)
        # What the hot path reads (see _fast): all of it fixed for the engine's life.
        self._op = bridge.execute_op()
        self._tensor_type = bridge.tensor_type
        self._torch_dtypes = tuple(bridge.torch_dtype(s.dtype) for s in inputs)
        self._good_shapes = self._contract.good_shapes
        self._n_in = len(inputs)
        self._dynamic_inputs = any(s.is_dynamic for s in inputs)
        self._n_out = len(outputs)
        self._single_device = bridge.device_count() == 1
        self._get_device = bridge.current_device_fn()
        self._last_stream: Any = None
        #: The one stream every execute_engine call of this lane runs on (see _call_op).
        self._lane_stream: Any = None
        self._staged = False
        self._strategy_warned = False
        self._lazy_noted = False
        self._graphs = GraphOps(device, bridge)
        self._serial = 0
        #: How many times ``update_runtime_settings`` was called (diagnostics, tests).
        self.native_updates = 0
        super().__init__(backend, name=name, inputs=inputs, outputs=outputs, settings=settings)
        if not self._single_device:  # the caller's device is given back after each call
            self._device_guard = bridge.device_guard()

    def _select_profiles(self, name: str, inputs: Sequence[TensorSpec]) -> list[TensorSpec]:
        """Let torch-tensorrt pick the optimization profile per call (2.14+); before it
        could, only profile 0 is ever active, so only its ranges are advertised."""
        if not any(len(s.profiles) > 1 for s in inputs):
            return list(inputs)
        bridge = self._runtime.bridge
        if bridge.has_method(self._native, "set_active_profile"):
            with translate_errors(name, "enabling optimization-profile selection"):
                self._native._auto_select_profiles = True
            self._switches_profiles = True
            return list(inputs)
        logger.info(
            "engine %r: %s %s cannot switch optimization profiles; only profile 0 is used",
            name,
            self._runtime.library.distribution,
            self._runtime.library.version,
        )
        return [dataclasses.replace(s, profiles=s.profiles[:1]) for s in inputs]

    @property
    def device(self) -> int:
        """The CUDA device the engine runs on."""
        return self._device

    # -- what torch-tensorrt sees ---------------------------------------------------------
    @property
    def native(self) -> Any:
        """The ``torch.classes.tensorrt.Engine`` (None once closed)."""
        return self._native

    @property
    def native_context_creations(self) -> int | None:
        """torch-tensorrt's own count of ``IExecutionContext`` creations (2.13+), else None."""
        if self._native is None or not self._lazy_native_context:
            return None
        return int(self._native.num_execution_contexts_created())

    @property
    def _shape_checker(self) -> Any:
        return self._contract.shapes

    def _clone_lane(self) -> TorchbindEngine:
        """Another ``torch.classes.tensorrt.Engine`` of the same bytes: its own
        IExecutionContext and outer graphs, its own copy of the engine (weights included);
        the runtime cache is shared through the settings."""
        if self._make_native is None:
            raise CapabilityError(f"engine {self.name!r} was not loaded by the backend; it cannot be cloned")
        backend, runtime, name, inputs, outputs, device = self._made_with
        return TorchbindEngine(
            backend, runtime=runtime, native=self._make_native(), name=name, inputs=inputs,
            outputs=outputs, device=device, settings=self._settings, make_native=self._make_native,
        )

    def _memory_usage(self) -> tuple[int, int]:
        # torch-tensorrt reports neither; each lane holds a whole copy of the engine.
        return 0, 0

    # -- EngineBase hooks ---------------------------------------------------------------
    def _create_context(self, settings: RuntimeSettings, cache: RuntimeCache | None) -> NativeState:
        handle = None
        if cache is not None:
            # The key of this engine's device: a cache never serves two GPU models. One that
            # cannot be read gets no stale check, as in RuntimeCache.bind.
            try:
                key = self.backend.cache_key(self._device)
            except Exception:
                key = None
            handle = cache.ensure_materialized(self, backend=self.backend, key=key)
            bridge = self._runtime.bridge
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
        if self._can_update:
            ds, cg = settings.to_codes()
            with translate_errors(self.name, "update_runtime_settings"):
                self._native.update_runtime_settings(ds, cg, handle)
            self.native_updates += 1
            state.applied = True
        elif settings != RuntimeSettings():
            # The backend claimed the capability but this engine object lacks the method.
            raise CapabilityError(
                f"engine {self.name!r}: torch.classes.tensorrt.Engine has no update_runtime_settings "
                f"in {self._runtime.library.distribution} {self._runtime.library.version}; "
                "torch-tensorrt-rtx >= 2.13 adds it"
            )
        if self._switches_profiles:
            self._resync_profile()
        return state

    def _resync_profile(self) -> None:
        """torch-tensorrt keeps its active-profile index when it rebuilds its execution
        context, but a new context starts on profile 0; its per-call selection then trusts
        the stale index and TensorRT refuses the shapes. Re-pin profile 0 so index and
        context agree (this builds the context now instead of in the next execute: one
        creation either way); the next call selects the profile its shapes need."""
        with translate_errors(self.name, "re-selecting the optimization profile"):
            if int(self._native._active_profile_index) != 0:
                self._native.set_active_profile(0)

    def _destroy_context(self, context: Any) -> None:
        if self._native is not None and self._lazy_native_context:
            # Invalidates torch-tensorrt's IExecutionContext (rebuilt lazily at the next
            # execute); this engine never enables profiling, so nothing else changes.
            with translate_errors(self.name, "dropping the execution context"):
                self._native.disable_profiling()

    # -- execution: hooks of the core pipeline -----------------------------------------------
    def _call_fast(self, inputs: tuple[Any, ...], stream: Any, outputs: Sequence[Any] | None
                   ) -> list[Any] | None:
        if stream is None and outputs is None:
            if self._outer_graph is None:
                return self._fast(inputs)
            if self._outer_graphs.shortcuts:
                return self._replay_fast(inputs)
        return None

    def _thread_start(self) -> None:
        """A thread's first call on this engine: torch's device binding for the thread (a
        replay plan, called before ``_call_fast``, does not check it)."""
        if "bound" not in _THREAD.__dict__:
            self._bridge.bind_thread(self._device)
            _THREAD.bound = True

    def _validate_inputs(self, inputs: Sequence[Any], profile: int | None) -> Call:
        return self._contract.inspect(inputs)

    def _validate_outputs(self, outputs: Sequence[Any], call: Call) -> None:
        call.views = self._contract.check_outputs(outputs, call.shapes)

    def _run(self, context: Any, call: Call, stream: Any, outputs: Sequence[Any] | None) -> list[Any]:
        return self._run_call(call, stream, outputs, call.views)

    # -- the outer graph: the core's GraphHooks (static inputs are torch CUDA tensors whatever
    # static_inputs(as_torch=) says: this backend has no other kind) ------------------------
    # (the other hooks are graphs.py's functions: graph_hooks_from)

    def _graph_enter(self, stream: Any, call: Call) -> Any:
        """The caller's torch stream (``stream``, or torch's current one on the engine's
        device), made current for the call; it waits for the graphs' last stream."""
        bridge = self._bridge
        ops = self._graphs
        ops.caller_stream = stream is not None
        if stream is None and (self._single_device or self._get_device() == self._device):
            current = bridge.current_stream(self._device)
            ops.follow(current)
            return current
        with translate_errors(self.name, "resolving the stream"):
            current = bridge.resolve_stream(stream, self._device)
        ops.follow(current)
        scope = bridge.stream_scope(current)
        scope.__enter__()
        ops.scope = scope
        return current

    def _graph_exit(self, stream: Any) -> None:
        scope, self._graphs.scope = self._graphs.scope, None
        if scope is None:
            self._last_stream = _CURRENT
        else:
            self._last_stream = stream
            scope.__exit__(None, None, None)

    def _torch_key(self, inputs: tuple[Any, ...]) -> tuple[Any, ...] | None:
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
        key = self._torch_key(inputs)
        if key is None:
            return None
        slot = self._outer_graphs.shortcuts.get(key)
        if slot is None or slot.graph is None:
            return None
        plan = slot.plan
        if plan is None:
            view = self._outer_graph.outputs == "view"  # type: ignore[union-attr]
            plan = slot.plan = self._graphs.replay_plan(self, slot, key, view, _CURRENT)
        return self._switch_fast(plan, inputs, None, None)

    def _fast(self, inputs: tuple[Any, ...]) -> list[Any] | None:
        """The hot path: contiguous CUDA torch tensors of the right dtypes, on the engine's
        device and current there, with shapes validated before, no outer graph and a live
        context. None sends the call down the general path (which says what is wrong)."""
        if self._context is None:
            return None
        key = self._torch_key(inputs)
        if key is None or key not in self._good_shapes:
            return None
        try:
            # Tensor[] takes the tuple as it is (the C++ argument parser accepts any sequence).
            results = self._call_op(inputs)
        except Exception as exc:
            raise EngineError(
                f"engine {self.name!r}: execute_engine failed in torch-tensorrt's runtime: {exc}"
            ) from exc
        self._last_stream = _CURRENT
        return results  # type: ignore[no-any-return]

    def _run_call(self, call: Call, stream: Any, outputs: Sequence[Any] | None, views: list[Any] | None
                  ) -> list[Any]:
        """Run a checked call on the caller's stream: torch's current stream (switching to
        the engine's device if another is current) or ``stream``."""
        bridge = self._bridge
        try:
            if stream is None and (self._single_device or self._get_device() == self._device):
                result = self._dispatch(call, outputs, views, caller_stream=False)
                self._last_stream = _CURRENT
                return result
            with translate_errors(self.name, "resolving the stream"):
                torch_stream = bridge.resolve_stream(stream, self._device)
            with bridge.stream_scope(torch_stream):
                result = self._dispatch(call, outputs, views, caller_stream=stream is not None)
        except TrtRuntimeError:
            raise
        except Exception as exc:  # staging, copies, stream switches: torch's own errors
            raise EngineError(f"engine {self.name!r}: the call failed in torch: {exc}") from exc
        self._last_stream = torch_stream
        return result

    def _dispatch(self, call: Call, outputs: Sequence[Any] | None, views: list[Any] | None, *,
                  caller_stream: bool) -> list[Any]:
        """Run ``call`` on the current stream (eagerly or under the outer graph) and hand the
        results over in the kind the contract says."""
        bridge = self._bridge
        if call.host:
            self._log_staging(call)
        tensors = call.tensors
        if call.host:
            tensors = list(tensors)
            for i in call.host:
                tensors[i] = bridge.to_device(tensors[i], self._device)
        results = self._execute_now(tensors)
        if len(results) != self._n_out:
            raise EngineError(
                f"engine {self.name!r}: torch-tensorrt returned {len(results)} output(s); "
                f"expected {self._n_out} {[o.name for o in self._outputs]}"
            )
        if self._contract.learns_output_shapes:
            self._contract.learn(call.shapes, results)
        if views is not None:
            assert outputs is not None
            self._contract.check_results(results, views)
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
        the op only ever sees one stream per lane; the outputs are marked used on the caller's
        stream, so the allocator does not hand their memory out again before it is done.
        """
        lane = self._lane_stream
        if lane is None:
            lane = self._lane_stream = self._bridge.lane_stream(self._device)
        return self._bridge.execute_on(lane, self._op, tensors, self._native, self._device)

    def _execute_now(self, tensors: list[Any]) -> list[Any]:
        """One ``execute_engine`` call (on the lane's stream); errors become EngineError."""
        try:
            return self._call_op(tensors)
        except Exception as exc:
            raise EngineError(
                f"engine {self.name!r}: execute_engine failed in torch-tensorrt's runtime: {exc}"
            ) from exc

    def _raw_execute(self, tensors: list[Any]) -> list[Any]:
        """``execute_engine`` on the current stream, errors untouched (the outer graph's own)."""
        return self._op(tensors, self._native)  # type: ignore[no-any-return]

    def _log_staging(self, call: Call) -> None:
        if not self._staged:
            self._staged = True
            names = ", ".join(repr(self._inputs[i].name) for i in call.host)
            logger.info(
                "engine %r: host input(s) %s copied to cuda:%d on the caller's stream "
                "(pass CUDA tensors to stay zero-copy)", self.name, names, self._device,
            )

    def _graph_capturable(self) -> bool:
        """Whether calls go through the outer graph.

        With TensorRT-RTX's own capture on (``cuda_graph_strategy``) they run eagerly with
        it instead: torch-tensorrt turns its engine's strategy off for good when it meets
        an outer capture.
        """
        settings = self._settings
        if settings.cuda_graph_strategy is CudaGraphStrategy.DISABLED:
            if (
                not self._lazy_noted
                and self._dynamic_inputs
                and settings.dynamic_shapes_kernel_specialization_strategy is _LAZY
            ):
                self._lazy_noted = True
                logger.info(
                    "engine %r: dynamic input shapes with dynamic_shapes_kernel_specialization_strategy="
                    "'lazy': each outer graph keeps the kernels TensorRT-RTX ran when it was captured "
                    "(shape-specialized kernels compiled later are not picked up; torch-tensorrt's own "
                    "wrapper refuses this combination); 'eager' compiles them before the capture",
                    self.name,
                )
            return True
        if not self._strategy_warned:
            self._strategy_warned = True
            logger.warning(
                "engine %r: cuda_graph_strategy=%r is TensorRT-RTX's own CUDA graph capture, which "
                "torch-tensorrt cannot run inside an outer graph; calls run eagerly with it "
                "(enable_cudagraphs(engine, outer=True) sets 'disabled')",
                self.name, str(settings.cuda_graph_strategy),
            )
        return False

    def _sync(self) -> None:
        """Wait for the work this lane queued on the last stream it ran on and on its
        graphs' streams; never the whole device (another lane may be capturing, and a device
        synchronize then fails: "operation not permitted when stream is capturing")."""
        bridge = self._bridge
        stream = self._last_stream
        if stream is _CURRENT:
            stream = bridge.current_stream(self._device)
        done: list[Any] = []
        for s in (stream, *self._graphs.streams()):
            if s is not None and not any(s is d for d in done):
                bridge.synchronize(s)
                done.append(s)

    def _release(self) -> None:
        self._drop_graphs()  # static inputs handed out before any capture
        self._native = None  # the C++ engine is freed with its last reference
