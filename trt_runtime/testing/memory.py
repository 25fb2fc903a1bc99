"""MemoryBackend: a small but complete backend that runs on any machine (numpy only).

Engines are a tiny serialized format of this module's own: the magic ``b"TRTMEM1\\0"``
followed by UTF-8 JSON naming the engine, its inputs (:class:`~trt_runtime.TensorSpec`
fields) and one affine output per entry, ``y = scale * x + bias`` of one input. An
output may be *data dependent*: it then keeps only the elements whose input is > 0,
flattened, so its shape is only known after the run.

The runtime cache is an in-memory native object holding "kernel" entries. Every run
with a cache adds an entry for the input shapes and settings seen (as TensorRT-RTX
adds JIT-compiled kernels), so :meth:`RuntimeCache.serialize` changes after a run.
``deserialize`` replaces the native contents (as TensorRT-RTX does) or merges them,
depending on ``MemoryBackend(cache_merges=...)``; the capability
``cache_deserialize_merges`` says which.

The backend is registered as the ``memory`` entry point of ``trt_runtime.backends``;
it is never chosen unless named (``get_backend("memory")``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from trt_runtime.dtypes import DTYPE_NAMES, normalize_dtype
from trt_runtime.engine import EngineBase
from trt_runtime.errors import CacheError, FormatError, InputError
from trt_runtime.protocols import Availability, BackendCapabilities, CacheKey, EngineSource, TensorSpec
from trt_runtime.settings import RuntimeSettings, SettingsLike

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
    "MemoryNativeCache",
    "MemoryRuntimeConfig",
]

ENGINE_MAGIC = b"TRTMEM1\0"
CACHE_MAGIC = b"TRTMEMC1"

_CAPABILITY_FLAGS = (
    "supports_runtime_cache",
    "supports_cuda_graph_strategy",
    "supports_dynamic_shapes_strategy",
    "supports_output_allocator",
    "supports_host_io",
)


@dataclasses.dataclass(frozen=True, slots=True)
class AffineOutput:
    """One output of a memory engine: ``scale * inputs[input] + bias``.

    ``dtype`` defaults to the input's dtype. ``data_dependent`` keeps only the
    elements whose input value is > 0, flattened to 1-D.
    """

    name: str
    input: str
    scale: float = 1.0
    bias: float = 0.0
    dtype: str | None = None
    data_dependent: bool = False


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
    raw = bytes(data)
    if not raw.startswith(CACHE_MAGIC):
        raise CacheError(f"memory runtime cache bytes must start with {CACHE_MAGIC!r}; got {raw[:8]!r}")
    try:
        entries = json.loads(raw[len(CACHE_MAGIC) :].decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CacheError(f"memory runtime cache bytes are malformed: {exc}") from exc
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
    destroyed: bool = False


class MemoryEngine(EngineBase):
    """An engine of the memory backend. Outputs are numpy arrays."""

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
        self._ops = tuple(ops)
        self.device = device
        #: Every context this engine created, in order (destroyed ones included).
        self.contexts: list[MemoryContext] = []
        #: How many times :meth:`_run` reached the numeric work (after validation).
        self.runs = 0
        super().__init__(backend, name=name, inputs=inputs, outputs=outputs, settings=settings)

    @property
    def context_settings(self) -> list[RuntimeSettings]:
        """The settings each context was created with, in creation order."""
        return [c.settings for c in self.contexts]

    @property
    def current_context(self) -> MemoryContext | None:
        return self._context  # type: ignore[no-any-return]

    def _create_context(self, settings: RuntimeSettings, cache: RuntimeCache | None) -> MemoryContext:
        config = MemoryRuntimeConfig(
            cuda_graph_strategy=settings.cuda_graph_strategy.value,
            dynamic_shapes_kernel_specialization_strategy=(
                settings.dynamic_shapes_kernel_specialization_strategy.value
            ),
        )
        if cache is not None:
            native = cache.ensure_materialized(config, backend=self.backend)
            if not isinstance(native, MemoryNativeCache):
                raise CacheError(
                    f"engine {self.name!r}: the runtime cache gave {type(native).__name__}, "
                    "not the memory backend's native cache"
                )
            config.runtime_cache = native
        context = MemoryContext(serial=len(self.contexts), settings=settings, config=config)
        self.contexts.append(context)
        return context

    def _destroy_context(self, context: Any) -> None:
        context.destroyed = True

    def _run(self, context: Any, inputs: Sequence[Any], stream: Any, outputs: Any = None) -> list[Any]:
        import numpy as np

        arrays = self._validate(inputs)
        self.runs += 1
        context.runs += 1
        by_name = {spec.name: arr for spec, arr in zip(self._inputs, arrays, strict=True)}
        results = []
        for op, spec in zip(self._ops, self._outputs, strict=True):
            x = by_name[op.input]
            y = (x.astype(np.float64) * op.scale + op.bias).astype(_np_dtype(spec.dtype))
            if op.data_dependent:
                y = y[x > 0].reshape(-1)
            results.append(y)
        native = context.config.runtime_cache
        if native is not None:
            shapes = ",".join(f"{n}={'x'.join(map(str, a.shape))}" for n, a in by_name.items())
            native.add_kernel(
                f"{self.name}|{shapes}|{context.config.cuda_graph_strategy}"
                f"|{context.config.dynamic_shapes_kernel_specialization_strategy}"
            )
        return results

    def _validate(self, inputs: Sequence[Any]) -> list[Any]:
        import numpy as np

        names = [s.name for s in self._inputs]
        if len(inputs) != len(self._inputs):
            raise InputError(
                f"engine {self.name!r} takes {len(self._inputs)} input(s) {names}; got {len(inputs)}"
            )
        arrays = []
        for spec, value in zip(self._inputs, inputs, strict=True):
            if not isinstance(value, np.ndarray):
                raise InputError(
                    f"input {spec.name!r} of engine {self.name!r} must be a numpy array; "
                    f"got {type(value).__name__}"
                )
            dtype = str(value.dtype)
            if dtype != spec.dtype:
                raise InputError(
                    f"input {spec.name!r} of engine {self.name!r} must have dtype {spec.dtype}; got {dtype}"
                )
            _check_shape(self.name, spec, tuple(value.shape))
            arrays.append(value)
        return arrays


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
    how callers behave when a capability is missing.
    """

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
            return Availability(False, "the 'memory' backend needs numpy: pip install 'trt-runtime[test]'")
        return Availability(True)

    def load_engine(
        self,
        source: EngineSource,
        *,
        device: int | None = None,
        settings: RuntimeSettings | None = None,
    ) -> MemoryEngine:
        name, inputs, ops = _parse_engine(source.data)
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
        return MemoryEngine(
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
        doc = {
            "name": name,
            "inputs": [
                {
                    "name": s.name,
                    "dtype": s.dtype,
                    "shape": list(s.shape),
                    "profiles": [[list(lo), list(opt), list(hi)] for lo, opt, hi in s.profiles],
                }
                for s in inputs
            ],
            "outputs": [dataclasses.asdict(op) for op in outputs],
        }
        data = ENGINE_MAGIC + json.dumps(doc).encode()
        _parse_engine(data)  # refuse to write what cannot be read back
        return data

    def __repr__(self) -> str:
        return f"<MemoryBackend name={self.name!r} cache_merges={self.cache_merges}>"


def _parse_engine(data: bytes | bytearray | memoryview) -> tuple[str, list[TensorSpec], list[AffineOutput]]:
    raw = bytes(data)
    if not raw.startswith(ENGINE_MAGIC):
        raise FormatError(f"not a memory engine: expected magic {ENGINE_MAGIC!r}; got {raw[:8]!r}")
    try:
        doc = json.loads(raw[len(ENGINE_MAGIC) :].decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"memory engine JSON is malformed: {exc}") from exc
    if not isinstance(doc, dict):
        raise FormatError(f"memory engine JSON must be an object; got {type(doc).__name__}")
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise FormatError(f"memory engine 'name' must be a non-empty string; got {name!r}")
    raw_inputs = _field(doc, "inputs", list)
    raw_outputs = _field(doc, "outputs", list)
    if not raw_inputs or not raw_outputs:
        raise FormatError(
            f"memory engine needs at least one input and one output; got "
            f"{len(raw_inputs)} input(s), {len(raw_outputs)} output(s)"
        )
    inputs = [_parse_input(item) for item in raw_inputs]
    input_names = [s.name for s in inputs]
    ops = [_parse_output(item, input_names) for item in raw_outputs]
    all_names = input_names + [op.name for op in ops]
    duplicates = sorted({n for n in all_names if all_names.count(n) > 1})
    if duplicates:
        raise FormatError(f"memory engine tensor names must be unique; repeated: {duplicates}")
    return name, inputs, ops


def _field(doc: Mapping[str, Any], key: str, kind: type) -> Any:
    value = doc.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise FormatError(f"memory engine field {key!r} must be a {kind.__name__}; got {value!r}")
    return value


def _dtype(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise FormatError(f"{where} dtype must be a string; got {value!r}")
    try:
        return normalize_dtype(value)
    except ValueError:
        raise FormatError(
            f"{where} dtype {value!r} is unknown; expected one of {', '.join(DTYPE_NAMES)}"
        ) from None


def _shape(value: Any, where: str, *, dynamic: bool) -> tuple[int, ...]:
    lowest = -1 if dynamic else 0
    if not isinstance(value, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= lowest for d in value
    ):
        raise FormatError(f"{where} must be a list of integers >= {lowest}; got {value!r}")
    return tuple(value)


def _parse_input(item: Any) -> TensorSpec:
    if not isinstance(item, dict):
        raise FormatError(f"memory engine input must be an object; got {item!r}")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise FormatError(f"memory engine input name must be a non-empty string; got {name!r}")
    where = f"input {name!r}"
    dtype = _dtype(item.get("dtype"), where)
    shape = _shape(item.get("shape"), f"{where} shape", dynamic=True)
    raw_profiles = item.get("profiles", [])
    if not isinstance(raw_profiles, list):
        raise FormatError(f"{where} profiles must be a list; got {raw_profiles!r}")
    profiles = []
    for triple in raw_profiles:
        if not isinstance(triple, list) or len(triple) != 3:
            raise FormatError(f"{where} profile must be [min, opt, max]; got {triple!r}")
        lo, opt, hi = (_shape(s, f"{where} profile shape", dynamic=False) for s in triple)
        if not len(lo) == len(opt) == len(hi) == len(shape):
            raise FormatError(f"{where} profile {triple!r} must have rank {len(shape)}")
        for d, a, o, b in zip(shape, lo, opt, hi, strict=True):
            if not a <= o <= b or (d >= 0 and not a == o == b == d):
                raise FormatError(
                    f"{where} profile {triple!r} must satisfy min <= opt <= max and match "
                    f"the static dims of {list(shape)}"
                )
        profiles.append((lo, opt, hi))
    if any(d < 0 for d in shape) and not profiles:
        raise FormatError(f"{where} has dynamic shape {list(shape)} but no optimization profile")
    return TensorSpec(name=name, dtype=dtype, shape=shape, is_input=True, profiles=tuple(profiles))


def _parse_output(item: Any, input_names: list[str]) -> AffineOutput:
    if not isinstance(item, dict):
        raise FormatError(f"memory engine output must be an object; got {item!r}")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise FormatError(f"memory engine output name must be a non-empty string; got {name!r}")
    where = f"output {name!r}"
    source = item.get("input")
    if source not in input_names:
        raise FormatError(f"{where} reads input {source!r}; the engine's inputs are {input_names}")
    numbers = {}
    for key, default in (("scale", 1.0), ("bias", 0.0)):
        value = item.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise FormatError(f"{where} {key} must be a number; got {value!r}")
        numbers[key] = float(value)
    dtype = item.get("dtype")
    flag = item.get("data_dependent", False)
    if not isinstance(flag, bool):
        raise FormatError(f"{where} data_dependent must be true or false; got {flag!r}")
    return AffineOutput(
        name=name,
        input=source,
        scale=numbers["scale"],
        bias=numbers["bias"],
        dtype=None if dtype is None else _dtype(dtype, where),
        data_dependent=flag,
    )
