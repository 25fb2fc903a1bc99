"""``PythonEngine``: one deserialized engine and its lanes, each a
:class:`.lane.PythonLane` with its own CUDA stream and lazy execution context.

The call pipeline is :class:`~trt_runtime.EngineBase`'s; each lane's backend side is a
:class:`.lane.PythonLane` (``_new_ops``). The engine keeps what its lanes share: the
loaded ``ICudaEngine`` and device, the tensors, the input checks' shapes, and the
settings of this backend (``profile``, ``output_allocator``, ``shape_contexts``), which
each lane applies through its methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trt_runtime_backends.python import cuda
from trt_runtime_backends.python.contract import TensorInfo, read_specs
from trt_runtime_backends.python.graphs import PythonGraphs
from trt_runtime_backends.python.lane import MEMORY_PER_SHAPE, PythonLane, Shared

from trt_runtime.contract import ShapeChecker
from trt_runtime.engine import EngineBase
from trt_runtime.lane import Lane
from trt_runtime.protocols import EngineSource, TensorSpec
from trt_runtime.settings import RuntimeSettings

if TYPE_CHECKING:
    from trt_runtime_backends.python.execution_context import ExecutionContext

__all__ = ["MEMORY_PER_SHAPE", "PythonEngine"]


class PythonEngine(EngineBase):
    """A TensorRT(-RTX) engine run by the python backend. Made by ``PythonBackend.load_engine``.

    Work is queued on each lane's own stream (:attr:`stream`: the first lane's); a caller's
    stream is ordered with events, or by CUDA itself for the legacy default stream (see
    :mod:`.stream_order`). See docs/device-contract.md for what goes in and comes out, and
    docs/python-backend.md for the fast paths and the outer CUDA-graph wrap.
    Thread-safety: any number of threads may call it; each call leases one lane.
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
        from trt_runtime_backends.python import stream_order

        inputs, outputs = read_specs(backend.tensorrt, trt_engine)
        multi_device = cuda.device_count() > 1 if runtime is None else False
        #: What the lanes share (the load, the tensors, this backend's settings).
        self._shared = Shared(
            backend, trt_engine, state, source, _cudart() if runtime is None else runtime,
            stream_order.DEFAULT_MODE if ordering is None else ordering, multi_device,
            [TensorInfo(s, i) for i, s in enumerate(inputs)],
            [TensorInfo(s, i) for i, s in enumerate(outputs)],
            ShapeChecker(source.name, inputs, max(1, int(trt_engine.num_optimization_profiles))),
        )
        # With several GPUs, the caller's device and context are given back after each call.
        super().__init__(backend, name=source.name, inputs=inputs, outputs=outputs, settings=settings,
                         device_guard=cuda.CallerDevice(state) if multi_device else None)

    def _new_ops(self, lane: Lane) -> PythonLane:
        """A lane over the same ``ICudaEngine``, unless the engine has dynamic input shapes
        and this is not its first lane: then over an ``ICudaEngine`` of its own.

        TensorRT's rule (``NvInferRuntime.h``): "If the engine supports dynamic shapes, each
        execution context in concurrent use must use a separate optimization profile." A
        profile covers its own range of shapes, so a lane pinned to one would refuse the
        others; a lane with its own deserialized engine has every profile to itself (what
        Triton's TensorRT backend does per instance), at the cost of the weights once more
        (:meth:`memory_usage` counts them)."""
        shared = self._shared
        if "_pool" not in vars(self):  # the first lane, made by EngineBase.__init__ (the load's scope)
            return PythonLane(shared, lane, shared.trt_engine, PythonGraphs)
        # The lane's streams and events belong to the engine's device; the caller's
        # current device is given back after (``load(..., contexts=N)`` leaves it alone).
        with shared.state.scope():
            trt_engine = shared.trt_engine
            if any(spec.is_dynamic for spec in self._inputs):
                trt_engine = shared.backend.deserialize(shared.source, shared.state)
            return PythonLane(shared, lane, trt_engine, PythonGraphs)

    def _release(self) -> None:
        self._shared.trt_engine = None  # the lanes dropped theirs: the weights go now

    def _lane_ops(self) -> list[PythonLane]:
        return [lane.ops for lane in self._pool.lanes]  # type: ignore[misc]

    @property
    def _first(self) -> PythonLane:
        return self._pool.lanes[0].ops  # type: ignore[return-value]

    @property
    def _rt(self) -> Any:
        """The CUDA runtime the lanes call (``cuda.bindings.runtime``, or a test double)."""
        return self._shared.runtime

    @property
    def _state(self) -> cuda.DeviceState:
        return self._shared.state

    # -- metadata ------------------------------------------------------------------------
    @property
    def device(self) -> int:
        """The CUDA device id the engine runs on."""
        return self._shared.state.index

    @property
    def stream(self) -> Any:
        """The first lane's own cuda.core ``Stream``; passing it as ``stream=`` skips event
        ordering (on that lane)."""
        return self._first.stream

    @property
    def trt_engine(self) -> Any:
        """The ``ICudaEngine`` (the first lane's; None once closed)."""
        return self._first.trt_engine

    @property
    def runtime_config(self) -> Any:
        """The live ``IRuntimeConfig`` of the first lane's execution context (``None`` before
        the first call, after a settings change, or with full TensorRT)."""
        ctx = self._pool.lanes[0].context
        return None if ctx is None else ctx.config

    @property
    def native_runtime_cache(self) -> Any:
        """The ``IRuntimeCache`` attached to the first lane's context, if any."""
        ctx = self._pool.lanes[0].context
        return None if ctx is None else ctx.native_cache

    @property
    def context_timings(self) -> dict[str, float]:
        """Seconds the first lane's last execution context creation spent creating the
        runtime config (``runtime_config_s``), materializing and loading the runtime cache
        (``runtime_cache_s``) and in ``create_execution_context`` (``execution_context_s``)."""
        return dict(self._first.context_timings)

    @property
    def output_allocator(self) -> str:
        """``"auto"`` (default): only data-dependent outputs go through an
        ``IOutputAllocator``; ``"always"``: every output does (TensorRT asks the allocator
        for memory and reports each shape). Changing it drops the execution context."""
        return self._shared.output_allocator

    @output_allocator.setter
    def output_allocator(self, value: str) -> None:
        if value not in ("auto", "always"):
            raise ValueError(f"output_allocator must be one of 'auto', 'always'; got {value!r}")
        with self._exclusive():
            if value != self._shared.output_allocator:
                self._shared.output_allocator = value
                for lane in self._pool.lanes:
                    lane.drop_context()

    @property
    def shape_contexts(self) -> int:
        """How many execution contexts each lane may hold, one per recent input-shape signature
        (default :data:`.shapes.SHAPE_CONTEXTS`): a change to shapes one of them holds costs no
        TensorRT call. ``1``: one context that changes its shapes. Changing it drops the
        execution contexts. See :mod:`.shapes`."""
        return self._shared.shape_contexts

    @shape_contexts.setter
    def shape_contexts(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"shape_contexts must be an int >= 1; got {value!r}")
        with self._exclusive():
            self._shared.shape_contexts = value
            for ops in self._lane_ops():
                ops.apply_shape_contexts(value)

    @property
    def shape_context_stats(self) -> dict[str, int]:
        """Over all lanes: ``contexts`` held now, ``made`` for shapes that came back, and
        ``swaps``, changes of shapes served by a context already in them."""
        parts = [(ops._shape_contexts, ops._res.context) for ops in self._lane_ops()]
        return {"contexts": sum(part.count(ctx) for part, ctx in parts),
                "made": sum(part.made for part, _ in parts), "swaps": sum(part.swaps for part, _ in parts)}

    @property
    def output_allocators(self) -> dict[str, Any]:
        """The ``IOutputAllocator`` of each output that has one, in the first lane's context."""
        ctx: ExecutionContext | None = self._pool.lanes[0].context
        return {} if ctx is None else dict(ctx.allocators)

    @property
    def num_profiles(self) -> int:
        return self._shared.checker.num_profiles

    @property
    def profile(self) -> int | None:
        """The optimization profile used by :meth:`execute`; ``None`` picks the first whose
        ranges contain every input shape."""
        return self._shared.profile

    @profile.setter
    def profile(self, value: int | None) -> None:
        if value is not None:
            self._shared.checker.check_profile_index(value)
        with self._exclusive():
            self._shared.profile = value
            for ops in self._lane_ops():
                ops.forget_calls()

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        """The outputs (one a lane found data-dependent on a first run says so from then on)."""
        return self._shared.outputs

    @property
    def _shape_checker(self) -> ShapeChecker:
        return self._shared.checker

    def _memory_usage(self) -> tuple[int, int]:
        lanes = self._lane_ops()
        trt_engine = lanes[0].trt_engine
        if trt_engine is None:
            return 0, 0
        per = max(
            (int(ops._res.context.device_memory.size) for ops in lanes
             if ops._res.context is not None and ops._res.context.device_memory is not None),
            default=int(getattr(trt_engine, "device_memory_size_v2", 0) or 0),
        )
        # Every distinct ICudaEngine of the lanes holds the weights once (see _new_ops).
        engines = {id(e): e for e in (ops.trt_engine for ops in lanes) if e is not None}
        size = len(self._shared.source.data)
        weights = sum(int(getattr(e, "streamable_weights_size", 0) or 0) or size for e in engines.values())
        return weights, per


def _cudart() -> Any:
    from cuda.bindings import runtime

    return runtime
