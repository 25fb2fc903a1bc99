"""MemoryBackend: a small but complete backend that runs on any machine (numpy only).

Engines are a tiny serialized format (:mod:`.memory_format`): the magic
``b"TRTMEM1\\0"`` followed by UTF-8 JSON naming the engine, its inputs and one affine
output per entry, ``y = scale * x + bias`` of one input. An output may be *data
dependent*: it then keeps only the elements whose input is > 0, flattened, so its shape
is only known after the run.

It honours the whole device contract (docs/device-contract.md) for the one array kind
it has, numpy: host arrays in, new numpy arrays out, dtypes never converted,
non-contiguous arrays refused, every check before an execution context exists;
``outputs=`` numpy arrays written and returned as given; and a simulated outer CUDA
graph through the core's outer-graph manager (:mod:`trt_runtime.outer`): its graph ops
allocate numpy static buffers, "capture" the enqueue (a :class:`MemoryGraph` that a launch
replays, computing from the static inputs into the static outputs) and copy with numpy.
It has no device and no stream: ``stream=`` is accepted and ignored, and nothing is staged.

The runtime cache is an in-memory native object holding "kernel" entries. Every run
with a cache adds an entry for the input shapes and settings seen (as TensorRT-RTX
adds JIT-compiled kernels), so :meth:`RuntimeCache.serialize` changes after a run.
``deserialize`` replaces the native contents (as TensorRT-RTX does) or merges them,
depending on ``MemoryBackend(cache_merges=...)``; the capability
``cache_deserialize_merges`` says which.

Thread-safety: calls on one engine are serialized by :class:`~trt_runtime.EngineBase`'s
lock. The backend is registered as the ``memory`` entry point of
``trt_runtime.backends``; the default order never picks it, but :func:`trt_runtime.load`
gives it files in its own format (``engine_magics``) when no backend is named.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from trt_runtime.cache.key import CacheKey
from trt_runtime.engine import EngineBase
from trt_runtime.errors import CacheError, EngineError, InputError
from trt_runtime.extras import install_hint
from trt_runtime.lane import GraphOps, Lane, LaneOps
from trt_runtime.outer import GraphSlot, default_graph_results
from trt_runtime.protocols import Availability, BackendCapabilities, EngineSource, TensorSpec
from trt_runtime.settings import RuntimeSettings, SettingsLike
from trt_runtime.testing.memory_format import (
    ENGINE_MAGIC,
    AffineOutput,
    build_engine,
    json_after_magic,
    parse_engine,
)

if TYPE_CHECKING:
    from trt_runtime.cache import RuntimeCache

__all__ = [
    "CACHE_MAGIC",
    "ENGINE_MAGIC",
    "AffineOutput",
    "MemoryBackend",
    "MemoryCacheHandle",
    "MemoryContext",
    "MemoryEngine",
    "MemoryGraph",
    "MemoryLane",
    "MemoryNativeCache",
    "MemoryRuntimeConfig",
]

CACHE_MAGIC = b"TRTMEMC1"

#: What the memory backend does not do (every other flag it supports).
_UNSUPPORTED = ("supports_profile_selection", "cache_deserialize_merges")
_CAPABILITY_FLAGS = tuple(f for f in BackendCapabilities.flags() if f not in _UNSUPPORTED)


# -- the native cache ------------------------------------------------------------------
class MemoryNativeCache:
    """The "native" runtime cache: a dict of kernel entries, like ``IRuntimeCache``."""

    def __init__(self, config: MemoryRuntimeConfig) -> None:
        self.created_for = config
        self.entries: dict[str, str] = {}

    def add_kernel(self, key: str) -> None:
        self.entries.setdefault(key, hashlib.sha256(key.encode()).hexdigest()[:16])

    def serialize(self) -> bytes:
        return CACHE_MAGIC + json.dumps(self.entries, sort_keys=True).encode()

    def deserialize(self, data: bytes, *, merge: bool) -> None:
        entries = _parse_cache_bytes(data)
        if merge:
            self.entries.update(entries)
        else:
            self.entries = dict(entries)


def _parse_cache_bytes(data: bytes) -> dict[str, str]:
    entries = json_after_magic(data, CACHE_MAGIC, CacheError,
                               f"memory runtime cache bytes must start with {CACHE_MAGIC!r}",
                               "memory runtime cache bytes")
    if not isinstance(entries, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in entries.items()
    ):
        raise CacheError(f"memory runtime cache must map strings to strings; got {entries!r}")
    return entries


class MemoryCacheHandle:
    """The backend's cache handle (:class:`~trt_runtime.RuntimeCacheHandle`).

    ``deserialize_calls`` counts the bytes loaded into the native cache, so tests can
    check that the core drains pending bytes exactly once.
    """

    def __init__(self, *, merges: bool = False) -> None:
        self.merges = merges
        self.native: MemoryNativeCache | None = None
        self.deserialize_calls = 0
        self.materialize_calls = 0

    def has_cache(self) -> bool:
        return self.native is not None

    def ensure_materialized(self, config: Any) -> MemoryNativeCache:
        self.materialize_calls += 1
        if self.native is None:
            if not isinstance(config, MemoryRuntimeConfig):
                raise CacheError(f"the memory cache needs a MemoryRuntimeConfig; got {type(config).__name__}")
            self.native = config.create_runtime_cache()
        return self.native

    def serialize(self) -> bytes:
        if self.native is None:
            raise CacheError("the memory runtime cache is not materialized yet")
        return self.native.serialize()

    def deserialize(self, data: bytes) -> Any:  # bool, as IRuntimeCache; the protocol says None
        """Load ``data`` into the native cache; ``False`` (nothing loaded) for foreign or
        corrupt bytes, as ``IRuntimeCache.deserialize`` does."""
        if self.native is None:
            raise CacheError("the memory runtime cache is not materialized yet")
        self.deserialize_calls += 1
        if len(data) == 0:
            return True
        try:
            self.native.deserialize(data, merge=self.merges)
        except CacheError:
            return False
        return True


# -- contexts and engines ----------------------------------------------------------------
@dataclasses.dataclass
class MemoryRuntimeConfig:
    """What ``IRuntimeConfig`` is to TensorRT-RTX: the settings a context is made with."""

    cuda_graph_strategy: str
    dynamic_shapes_kernel_specialization_strategy: str
    runtime_cache: MemoryNativeCache | None = None

    def create_runtime_cache(self) -> MemoryNativeCache:
        return MemoryNativeCache(self)


@dataclasses.dataclass
class MemoryContext:
    """An execution context: the settings and config it was created with."""

    serial: int
    settings: RuntimeSettings
    config: MemoryRuntimeConfig
    runs: int = 0
    captures: int = 0
    destroyed: bool = False


@dataclasses.dataclass
class MemoryGraph:
    """A simulated outer CUDA graph: the captured enqueue (``run``, replayed by a launch) of
    one context."""

    run: Callable[[Any], Any]
    context: MemoryContext
    replays: int = 0
    destroyed: bool = False


class MemoryLane(LaneOps):
    """One lane of a :class:`MemoryEngine`: its :class:`~trt_runtime.lane.LaneOps` and, for
    the simulated outer CUDA graph, its :class:`~trt_runtime.lane.GraphOps` (``graphs`` is
    itself). It keeps nothing of its own (no device, no stream: nothing to wait for or
    release) and has no fast path: every call is checked."""

    def __init__(self, engine: MemoryEngine, lane: Lane) -> None:
        self.engine = engine
        self.lane = lane
        self.graphs: GraphOps | None = self

    # -- LaneOps ---------------------------------------------------------------------------
    def create_context(self, settings: RuntimeSettings, cache: RuntimeCache | None) -> MemoryContext:
        engine = self.engine
        config = MemoryRuntimeConfig(
            cuda_graph_strategy=settings.cuda_graph_strategy.value,
            dynamic_shapes_kernel_specialization_strategy=(
                settings.dynamic_shapes_kernel_specialization_strategy.value
            ),
        )
        if cache is not None:
            # The key of this engine's device: a cache never serves two GPU models.
            key = engine.backend.cache_key(engine.device)
            native = cache.ensure_materialized(config, backend=engine.backend, key=key)
            if not isinstance(native, MemoryNativeCache):
                raise CacheError(
                    f"engine {engine.name!r}: the runtime cache gave {type(native).__name__}, "
                    "not the memory backend's native cache"
                )
            config.runtime_cache = native
        context = MemoryContext(serial=len(engine.created_contexts), settings=settings, config=config)
        engine.created_contexts.append(context)
        return context

    def destroy_context(self, context: Any) -> None:
        context.destroyed = True

    def validate_inputs(self, inputs: Sequence[Any], profile: int | None) -> list[Any]:
        return self.engine.validate(inputs)

    def validate_outputs(self, context: Any, outputs: Sequence[Any], call: Any) -> None:
        self.engine.check_outputs(call, outputs)

    def run(self, context: Any, call: Any, stream: Any, outputs: Sequence[Any] | None) -> list[Any]:
        return self.finish(context, call, self.engine.compute(call), outputs)

    def finish(self, context: Any, inputs: Sequence[Any], results: list[Any], outputs: Any) -> list[Any]:
        """Count the run, record its kernels, and write ``outputs=`` if given."""
        self.engine.runs += 1
        context.runs += 1
        self.record_kernels(context, inputs)
        if outputs is None:
            return results
        import numpy as np

        for given, result in zip(outputs, results, strict=True):
            np.copyto(given, result, casting="no")
        return list(outputs)

    def record_kernels(self, context: MemoryContext, arrays: Sequence[Any]) -> None:
        native = context.config.runtime_cache
        if native is not None:
            engine = self.engine
            shapes = ",".join(
                f"{spec.name}={'x'.join(map(str, a.shape))}"
                for spec, a in zip(engine.inputs, arrays, strict=True)
            )
            native.add_kernel(
                f"{engine.name}|{shapes}|{context.config.cuda_graph_strategy}"
                f"|{context.config.dynamic_shapes_kernel_specialization_strategy}"
            )

    # -- GraphOps: the simulated outer CUDA graph -------------------------------------------------
    def graph_call(self, call: Any) -> tuple[Any, list[Any], list[int], None]:
        shapes = tuple(tuple(int(d) for d in a.shape) for a in call)
        key = (shapes, self.engine._shape_checker.select(shapes, None))
        return key, call, [a.ctypes.data for a in call], None

    def alloc_static(self, shape: tuple[int, ...], spec: TensorSpec) -> tuple[Any, int]:
        import numpy as np

        buffer = np.empty(shape, _np_dtype(spec.dtype))
        return buffer, buffer.ctypes.data

    def bind_static(self, context: Any, slot: GraphSlot) -> None:
        engine = self.engine
        shapes = {spec.name: shape for spec, shape in zip(engine.inputs, slot.key[0], strict=True)}
        outer = self.lane.outer_graphs
        assert outer is not None
        outer.alloc_outputs(slot, [shapes[op.input] for op in engine._affine])

    def enqueue(self, context: Any, slot: GraphSlot, stream: Any) -> None:
        import numpy as np

        for static, result in zip(slot.outputs, self.engine.compute(slot.inputs), strict=True):
            np.copyto(static, result)
        self.engine.runs += 1
        context.runs += 1
        self.record_kernels(context, slot.inputs)

    def warm_up(self, context: Any, slot: GraphSlot, stream: Any) -> None:
        self.enqueue(context, slot, stream)

    def capture(self, fn: Callable[[Any], Any], stream: Any, slot: GraphSlot) -> tuple[MemoryGraph, None]:
        context = self.lane.context
        context.captures += 1
        return MemoryGraph(fn, context), None

    def launch(self, graph: MemoryGraph, stream: Any) -> None:
        # (the core drops graphs with their context)
        if graph.destroyed or graph.context is not self.lane.context:
            raise EngineError(
                f"engine {self.engine.name!r}: an outer graph outlived the context it was captured in"
            )
        graph.replays += 1
        graph.run(stream)

    def copy(self, dst: Any, src: Any, nbytes: int, stream: Any) -> None:
        import numpy as np

        np.copyto(dst, src, casting="no")

    def destroy_graph(self, graph: MemoryGraph) -> None:
        graph.destroyed = True

    def graph_enter(self, stream: Any, call: Any) -> Any:
        return stream

    def graph_exit(self, stream: Any) -> None:
        pass

    def graph_capturable(self) -> bool:
        return True

    def input_views(self, slot: GraphSlot, as_torch: bool | None) -> list[Any]:
        return list(slot.inputs)

    def graph_results(self, context: Any, slot: GraphSlot, call: Any, outputs: Sequence[Any] | None,
                      view: bool, stream: Any) -> list[Any]:
        return default_graph_results(self, self.engine.outputs, slot, outputs, view, stream)


class MemoryEngine(EngineBase):
    """An engine of the memory backend: numpy arrays in, numpy arrays out. Its lanes'
    ops are :attr:`lane_type` objects (tests subclass :class:`MemoryLane` to break the
    contract on purpose)."""

    #: The class of each lane's ops.
    lane_type: type[MemoryLane] = MemoryLane

    def __init__(
        self,
        backend: MemoryBackend,
        *,
        name: str,
        inputs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec],
        ops: Sequence[AffineOutput],
        device: int | None,
        settings: SettingsLike = None,
    ) -> None:
        self._affine = tuple(ops)
        self._device = device
        #: Every context this engine created, in order (destroyed ones included).
        self.created_contexts: list[MemoryContext] = []
        #: How many times a lane reached the numeric work (after validation).
        self.runs = 0
        super().__init__(backend, name=name, inputs=inputs, outputs=outputs, settings=settings)

    def _new_ops(self, lane: Lane) -> MemoryLane:
        return self.lane_type(self, lane)

    @property
    def device(self) -> int:  # type: ignore[override]
        """The device named at load (the memory backend runs on none); 0 when not named."""
        return 0 if self._device is None else self._device

    @property
    def context_settings(self) -> list[RuntimeSettings]:
        """The settings each context was created with, in creation order."""
        return [c.settings for c in self.created_contexts]

    @property
    def current_context(self) -> MemoryContext | None:
        """The first lane's context."""
        return self._lanes[0].context  # type: ignore[no-any-return]

    def compute(self, arrays: Sequence[Any]) -> list[Any]:
        """The outputs of ``arrays`` (checked inputs), as new numpy arrays."""
        import numpy as np

        by_name = {spec.name: arr for spec, arr in zip(self._inputs, arrays, strict=True)}
        results = []
        for op, spec in zip(self._affine, self._outputs, strict=True):
            x = by_name[op.input]
            y = (x.astype(np.float64) * op.scale + op.bias).astype(_np_dtype(spec.dtype))
            if op.data_dependent:
                y = y[x > 0].reshape(-1)
            results.append(y)
        return results

    def validate(self, inputs: Sequence[Any]) -> list[Any]:
        """Count, kind, dtype, shape and layout of ``inputs``; the arrays."""
        import numpy as np

        names = [s.name for s in self._inputs]
        if len(inputs) != len(self._inputs):
            raise InputError(
                f"engine {self.name!r} takes {len(self._inputs)} input(s) {names}; got {len(inputs)}"
            )
        host_io = self._backend.capabilities.supports_host_io
        arrays = []
        for spec, value in zip(self._inputs, inputs, strict=True):
            where = f"input {spec.name!r} of engine {self.name!r}"
            if not isinstance(value, np.ndarray):
                raise InputError(f"{where} must be a numpy array; got {type(value).__name__}")
            if not host_io:
                raise InputError(
                    f"{where} is a host array; the {self._backend.name!r} backend was made without "
                    "supports_host_io and has no other memory"
                )
            dtype = str(value.dtype)
            if dtype != spec.dtype:
                raise InputError(f"{where} must have dtype {spec.dtype}; got {dtype}")
            _check_shape(self.name, spec, tuple(value.shape))
            if not value.flags.c_contiguous:
                raise InputError(f"{where} is not C-contiguous; use numpy.ascontiguousarray")
            arrays.append(value)
        return arrays

    def check_outputs(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        """Count, kind, dtype, shape and layout of ``outputs=``, before anything runs."""
        import numpy as np

        names = [s.name for s in self._outputs]
        if len(outputs) != len(self._outputs):
            raise InputError(
                f"engine {self.name!r} has {len(names)} output(s) {names}; outputs= has {len(outputs)}"
            )
        shapes = {spec.name: tuple(a.shape) for spec, a in zip(self._inputs, inputs, strict=True)}
        for op, spec, given in zip(self._affine, self._outputs, outputs, strict=True):
            where = f"output {spec.name!r} of engine {self.name!r}"
            if spec.data_dependent:
                raise InputError(f"{where} has a data-dependent shape; it cannot be preallocated")
            if not isinstance(given, np.ndarray):
                raise InputError(
                    f"outputs= must hold numpy arrays (the memory backend has no device); "
                    f"{where} is {type(given).__name__}"
                )
            if str(given.dtype) != spec.dtype:
                raise InputError(f"{where} must have dtype {spec.dtype}; got {given.dtype}")
            if tuple(given.shape) != shapes[op.input]:
                raise InputError(
                    f"{where} must have shape {list(shapes[op.input])}; got {list(given.shape)}"
                )
            if not (given.flags.c_contiguous and given.flags.writeable):
                raise InputError(f"{where} must be a C-contiguous, writeable array")


def _check_shape(engine: str, spec: TensorSpec, shape: tuple[int, ...]) -> None:
    expected = "x".join("?" if d < 0 else str(d) for d in spec.shape) or "scalar"
    if len(shape) != len(spec.shape) or any(
        d >= 0 and d != s for d, s in zip(spec.shape, shape, strict=True)
    ):
        raise InputError(
            f"input {spec.name!r} of engine {engine!r} must have shape {list(spec.shape)} "
            f"({expected}); got {list(shape)}"
        )
    if spec.profiles:
        for lo, _opt, hi in spec.profiles:
            if all(a <= s <= b for a, s, b in zip(lo, shape, hi, strict=True)):
                return
        ranges = "; ".join(f"{list(lo)}..{list(hi)}" for lo, _o, hi in spec.profiles)
        raise InputError(
            f"input {spec.name!r} of engine {engine!r} has shape {list(shape)} outside every "
            f"optimization profile ({ranges})"
        )


def _np_dtype(name: str) -> Any:
    from trt_runtime.dtypes import to_numpy

    return to_numpy(name)


# -- the backend -----------------------------------------------------------------------------
class MemoryBackend:
    """An in-memory backend for tests and examples; every capability is on by default.

    ``cache_merges`` picks the cache ``deserialize`` semantics (replace, like
    TensorRT-RTX, or merge). ``without`` names capability flags to turn off, to test
    how callers behave when a capability is missing. :attr:`engine_class` is the engine
    type :meth:`load_engine` makes (tests subclass it to break the contract on purpose).
    """

    engine_class: type[MemoryEngine] = MemoryEngine
    #: The engine format it reads (see :func:`trt_runtime.registry.engine_magics`): ``trt_runtime.load``
    #: gives it ``.mem`` files without being told the backend.
    engine_magics: Mapping[bytes, str] = MappingProxyType({ENGINE_MAGIC: "memory test engine (.mem)"})
    #: What ``trt-runtime backends`` says it is.
    description = "test backend: numpy on the CPU, .mem engines"

    def __init__(
        self, *, cache_merges: bool = False, without: Iterable[str] = (), name: str = "memory"
    ) -> None:
        off = set(without)
        unknown = sorted(off - set(_CAPABILITY_FLAGS))
        if unknown:
            raise ValueError(
                f"unknown capability flag(s) {unknown}; expected some of {list(_CAPABILITY_FLAGS)}"
            )
        self.name = name
        self.cache_merges = cache_merges
        self._capabilities = BackendCapabilities(
            **{flag: flag not in off for flag in _CAPABILITY_FLAGS},
            cache_deserialize_merges=cache_merges,
            notes={flag: "turned off in MemoryBackend(without=...)" for flag in sorted(off)},
        )
        self.handles: list[MemoryCacheHandle] = []

    @property
    def capabilities(self) -> BackendCapabilities:
        return self._capabilities

    def is_available(self) -> Availability:
        try:
            import numpy  # noqa: F401
        except ImportError:
            return Availability(
                False, "the 'memory' backend needs numpy: " + install_hint("test")
            )
        return Availability(True)

    def load_engine(
        self,
        source: EngineSource,
        *,
        device: int | None = None,
        settings: RuntimeSettings | None = None,
    ) -> MemoryEngine:
        name, inputs, ops = parse_engine(source.data)
        by_name = {s.name: s for s in inputs}
        outputs = [
            TensorSpec(
                name=op.name,
                dtype=op.dtype or by_name[op.input].dtype,
                shape=(-1,) if op.data_dependent else by_name[op.input].shape,
                is_input=False,
                data_dependent=op.data_dependent,
            )
            for op in ops
        ]
        return self.engine_class(
            self,
            name=source.name if source.name != "engine" else name,
            inputs=inputs,
            outputs=outputs,
            ops=ops,
            device=device if device is not None else source.device_id,
            settings=settings,
        )

    def create_cache_handle(self) -> MemoryCacheHandle:
        handle = MemoryCacheHandle(merges=self.cache_merges)
        self.handles.append(handle)
        return handle

    def cache_key(self, device: int | None = None) -> CacheKey:
        return CacheKey("memory", "1", "0.0", "0")

    @staticmethod
    def build_engine(
        inputs: Sequence[TensorSpec], outputs: Sequence[AffineOutput], *, name: str = "memory_engine"
    ) -> bytes:
        """Serialize an engine; the bytes load with :meth:`load_engine` (validated both ways)."""
        return build_engine(inputs, outputs, name=name)

    def __repr__(self) -> str:
        return f"<MemoryBackend name={self.name!r} cache_merges={self.cache_merges}>"
