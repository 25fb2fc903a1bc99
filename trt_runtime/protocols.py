"""The backend boundary: what a backend, its engines and its cache handles must provide."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload, runtime_checkable

from typing_extensions import Self

from trt_runtime.errors import SettingsError

if TYPE_CHECKING:  # for the types of an engine call only: never imported at run time
    import numpy
    import torch

    from trt_runtime.cache.key import CacheKey
    from trt_runtime.graphs import OuterGraph
    from trt_runtime.settings import RuntimeSettings

#: The array kind an engine call takes and returns (numpy, torch, cupy, ...).
ArrayT = TypeVar("ArrayT")

__all__ = [
    "Availability",
    "Backend",
    "BackendCapabilities",
    "DeviceGuard",
    "Engine",
    "EngineSource",
    "RuntimeCacheHandle",
    "TensorSpec",
]


@dataclasses.dataclass(frozen=True, slots=True)
class Availability:
    """Whether a backend can run here, and if not, why (with the install hint)."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


@dataclasses.dataclass(frozen=True, slots=True)
class BackendCapabilities:
    """What a backend can do. Callers and tests branch on these, never on names."""

    supports_runtime_cache: bool = False
    supports_cuda_graph_strategy: bool = False
    #: ``RuntimeSettings.dynamic_shapes_kernel_specialization_strategy`` other than ``lazy``.
    supports_dynamic_shapes_kernel_specialization_strategy: bool = False
    supports_output_allocator: bool = False
    supports_host_io: bool = False
    #: ``execute(..., outputs=[...])`` writes into caller-preallocated device arrays.
    supports_preallocated_outputs: bool = False
    #: ``execute(..., profile=N)`` / ``engine.profile`` select an optimization profile.
    supports_profile_selection: bool = False
    #: The runtime's own CUDA-graph wrap (:class:`~trt_runtime.graphs.OuterGraph`).
    supports_outer_cuda_graph: bool = False
    #: ``trt_runtime.load(..., contexts=N)`` / ``engine.contexts = N``: N execution contexts
    #: serve concurrent callers (its engines make a lane for each: ``EngineBase._new_ops``).
    supports_multiple_contexts: bool = False
    #: ``deserialize`` into a cache that already has entries keeps them (merges).
    cache_deserialize_merges: bool = False
    #: A human-readable note on why a capability is missing (e.g. which version adds it).
    notes: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def flags(cls) -> tuple[str, ...]:
        """Every flag, in declaration order: the one list the core, the backends, the kit
        and docs/backends.md's table (checked by a test) follow."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.name != "notes")

    @classmethod
    def all_on(cls) -> BackendCapabilities:
        """Every flag on; turn off what a backend lacks with :meth:`without`."""
        on: dict[str, Any] = dict.fromkeys(cls.flags(), True)
        return dataclasses.replace(cls(), **on)

    @classmethod
    def all_off(cls, reason: str) -> BackendCapabilities:
        """Nothing supported, every flag noted with ``reason`` (a backend that cannot run)."""
        return cls(notes={flag: reason for flag in cls.flags()})

    def without(self, *flags: str, note: str = "") -> BackendCapabilities:
        """A copy with ``flags`` turned off (each noted with ``note`` when given)."""
        unknown = sorted(set(flags) - set(self.flags()))
        if unknown:
            raise SettingsError(
                f"unknown capability flag(s) {unknown}; expected some of {list(self.flags())}"
            )
        notes = dict(self.notes)
        if note:
            notes.update(dict.fromkeys(flags, note))
        off: dict[str, Any] = dict.fromkeys(flags, False)
        return dataclasses.replace(self, notes=notes, **off)

    @property
    def supports_dynamic_shapes_strategy(self) -> bool:
        """Deprecated alias of :attr:`supports_dynamic_shapes_kernel_specialization_strategy`."""
        import warnings

        warnings.warn(
            "BackendCapabilities.supports_dynamic_shapes_strategy is deprecated; use "
            "supports_dynamic_shapes_kernel_specialization_strategy",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.supports_dynamic_shapes_kernel_specialization_strategy

    def require(self, capability: str, backend: str) -> None:
        """Raise :class:`CapabilityError` naming the missing capability and why."""
        from trt_runtime.errors import CapabilityError

        if not getattr(self, capability):
            note = self.notes.get(capability, "")
            raise CapabilityError(
                f"the {backend!r} backend does not support {capability.removeprefix('supports_')}"
                + (f": {note}" if note else "")
            )


@dataclasses.dataclass(frozen=True, slots=True)
class TensorSpec:
    """One engine input or output.

    ``shape`` uses -1 for dynamic dimensions; ``profiles`` holds one
    ``(min, opt, max)`` triple of shapes per optimization profile (inputs only).
    ``dtype`` is a numpy-style name: ``float32``, ``float16``, ``bfloat16``, ``int8``,
    ``int32``, ``int64``, ``bool``, ``uint8``, ``float8_e4m3fn``.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    is_input: bool
    profiles: tuple[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]], ...] = ()
    #: Output shape depends on the data (needs an output allocator).
    data_dependent: bool = False

    @property
    def is_dynamic(self) -> bool:
        return any(d < 0 for d in self.shape)


@dataclasses.dataclass(frozen=True)
class EngineSource:
    """A serialized engine and what its container said about it.

    ``data`` may be a ``memoryview`` over an ``mmap``: backends must not copy it
    into a Python ``bytes`` or ``str`` unless they must.
    """

    data: bytes | bytearray | memoryview
    name: str = "engine"
    device_id: int | None = None
    format: str = "plan"  # "plan", "TR01", "TR02", "pte"
    bindings: tuple[TensorSpec, ...] = ()
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class DeviceGuard(Protocol):
    """Keeps the calling thread's current CUDA device and context as the caller had them.

    An engine whose backend sets one (``EngineBase._device_guard``) has every call and every
    change of its state (settings, contexts, outer graph, static inputs, ``close()``) run
    between :meth:`enter` and :meth:`exit` in the calling thread. A backend sets one only
    where it is needed (several GPUs visible): a call costs two method calls more.
    """

    def enter(self) -> object:
        """Before the work: make the engine's device current if need be; a token for :meth:`exit`."""
        ...

    def exit(self, token: object) -> None:
        """After the work (also after an error): give the caller its device and context back."""
        ...


@runtime_checkable
class RuntimeCacheHandle(Protocol):
    """A backend's own runtime cache (``IRuntimeCache`` or torchbind ``RuntimeCacheHandle``).

    The core :class:`~trt_runtime.RuntimeCache` owns pending bytes and the drain; a
    handle only creates the native cache and moves bytes in and out of it.
    """

    def serialize(self) -> bytes:
        """Bytes of the native cache; only called when :meth:`has_cache` is true."""
        ...

    def deserialize(self, data: bytes) -> bool | None:
        """Load bytes into the native cache; ``False`` if the native cache rejected them.

        Only called when :meth:`has_cache` is true.
        """
        ...

    def has_cache(self) -> bool:
        """Whether the native cache exists yet."""
        ...

    def ensure_materialized(self, config: Any) -> Any:
        """Create the native cache (if not yet) with the backend's config; return it."""
        ...


@runtime_checkable
class Engine(Protocol):
    """A deserialized engine with lazily created execution contexts.

    ``contexts`` execution contexts (default 1) serve concurrent callers: a call leases a
    free one (FIFO among waiters; :class:`~trt_runtime.ContextLeaseTimeout` after
    ``lease_timeout`` seconds). :class:`~trt_runtime.EngineBase` implements all of this;
    a backend gives each lane its ops (docs/writing-a-backend.md).

    ``with trt_runtime.load(...) as engine:`` closes the engine at the end of the block.
    :meth:`execute` returns arrays of the kind it was given (numpy in, numpy out; torch in,
    torch out; see the device contract); calling the engine returns one output bare and
    several as a tuple, which depends on the engine, so its static type is ``Any``.
    """

    name: str

    @property
    def backend(self) -> Backend: ...

    @property
    def device(self) -> int:
        """The CUDA device every execution context of the engine is created on (0 for a
        backend without devices)."""
        ...

    @property
    def inputs(self) -> tuple[TensorSpec, ...]: ...

    @property
    def outputs(self) -> tuple[TensorSpec, ...]: ...

    @property
    def runtime_settings(self) -> RuntimeSettings: ...

    @runtime_settings.setter
    def runtime_settings(self, value: RuntimeSettings) -> None: ...

    @property
    def context_creations(self) -> int:
        """How many execution contexts this engine has created so far."""
        ...

    @property
    def has_data_dependent_outputs(self) -> bool: ...

    def has_context(self) -> bool: ...

    def invalidate_context(self) -> None: ...

    @property
    def outer_graph(self) -> OuterGraph | None:
        """The outer CUDA-graph wrap in force (``None``: calls run eagerly)."""
        ...

    @outer_graph.setter
    def outer_graph(self, value: OuterGraph | bool | str | None) -> None: ...

    def reset_graphs(self) -> None:
        """Drop every captured outer graph; the next call under the wrap captures again."""
        ...

    @property
    def data_dependent_outputs(self) -> list[str]:
        """Names of outputs whose shapes are only known after execution."""
        ...

    @property
    def graph_captures(self) -> int:
        """How many CUDA graphs the outer wrap has captured so far."""
        ...

    @property
    def profile(self) -> int | None:
        """The optimization profile calls use (``None``: the first holding the shapes)."""
        ...

    @profile.setter
    def profile(self, value: int | None) -> None: ...

    @property
    def contexts(self) -> int:
        """How many execution contexts serve concurrent calls (settable)."""
        ...

    @contexts.setter
    def contexts(self, value: int) -> None: ...

    @property
    def lease_timeout(self) -> float | None:
        """Seconds a call waits for a free context (``None``: no limit; settable)."""
        ...

    @lease_timeout.setter
    def lease_timeout(self, value: float | None) -> None: ...

    def memory_usage(self) -> dict[str, int]:
        """Device bytes: ``weights``, ``activations_per_context``, ``activations_total``,
        and the number of ``contexts``."""
        ...

    def static_inputs(
        self, *shapes: Sequence[int], profile: int | None = None, as_torch: bool | None = None
    ) -> list[Any]:
        """The static input buffers of the outer graph for these shapes."""
        ...

    def execute(
        self, *inputs: ArrayT, stream: Any = None, outputs: Sequence[ArrayT] | None = None,
        profile: int | None = None,
    ) -> list[ArrayT]: ...

    @overload
    def __call__(
        self, x: numpy.ndarray[Any, Any], /, *, stream: Any = None, outputs: Sequence[Any] | None = None,
        profile: int | None = None,
    ) -> numpy.ndarray[Any, Any]: ...

    @overload
    def __call__(
        self, x: torch.Tensor, /, *, stream: Any = None, outputs: Sequence[Any] | None = None,
        profile: int | None = None,
    ) -> torch.Tensor: ...

    @overload
    def __call__(
        self, *inputs: Any, stream: Any = None, outputs: Sequence[Any] | None = None,
        profile: int | None = None,
    ) -> Any: ...

    def __call__(
        self, *inputs: Any, stream: Any = None, outputs: Sequence[Any] | None = None,
        profile: int | None = None,
    ) -> Any:
        """Like :meth:`execute`, but a single output is returned bare, several as a tuple.

        Typed for the common call, one array in and one out: a numpy array gives a
        ``numpy.ndarray``, a torch tensor a ``torch.Tensor``; other calls are ``Any``.
        """
        ...

    def synchronize(self) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc_info: object) -> None: ...


@runtime_checkable
class Backend(Protocol):
    """A way of running engines. Found through the ``trt_runtime.backends`` entry points."""

    name: str

    @property
    def capabilities(self) -> BackendCapabilities: ...

    def is_available(self) -> Availability:
        """Cheap check; never raises. ``reason`` says what is missing and how to install it."""
        ...

    def load_engine(
        self,
        source: EngineSource,
        *,
        device: int | None = None,
        settings: RuntimeSettings | None = None,
    ) -> Engine:
        """Deserialize ``source``; ``device`` overrides ``source.device_id`` verbatim."""
        ...

    def create_cache_handle(self) -> RuntimeCacheHandle:
        """A new, not yet materialized native cache handle."""
        ...

    def cache_key(self, device: int | None = None) -> CacheKey:
        """What a cache made by this backend on ``device`` is keyed by."""
        ...


def tensor_names(specs: Sequence[TensorSpec]) -> list[str]:
    """Names of ``specs`` in order (for error messages)."""
    return [s.name for s in specs]
