"""A pure-Python reference model of what a correct backend does with settings and caches.

The model knows nothing of TensorRT. It states the rules every backend shares through
:class:`~trt_runtime.EngineBase` and :class:`~trt_runtime.RuntimeCache`:

* An engine has current settings and at most one execution context. The context is
  created lazily, at the next execute, and counted; it is dropped when the settings
  change to a *different* value (setting an equal value is a no-op) and by
  ``invalidate_context``.
* Settings that need a capability the backend lacks are refused (``CapabilityError``)
  and leave everything as it was.
* ``runtime_config`` / ``enable_cudagraphs`` apply overrides on enter and restore the
  saved settings on exit; nesting them only changes settings, so the number of contexts
  follows from the rule above (``runtime_config`` outside ``enable_cudagraphs`` with calls
  only in the inner block: exactly one context).
* A runtime cache has pending bytes until it is materialized, which happens when a
  context is created for settings that hold it. Materializing drains non-empty pending
  bytes into the native cache exactly once; ``serialize()`` before materialization
  returns the pending bytes, after it the native cache's bytes (not modelled).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import Any

from trt_runtime.protocols import BackendCapabilities
from trt_runtime.settings import (
    CudaGraphStrategy,
    DynamicShapesKernelSpecializationStrategy,
    RuntimeSettings,
    SettingsLike,
)

__all__ = ["CacheModel", "EngineModel", "missing_capability"]


def missing_capability(settings: RuntimeSettings, capabilities: BackendCapabilities) -> str | None:
    """The first capability flag ``settings`` need that ``capabilities`` lack, or ``None``."""
    needs = []
    if settings.cuda_graph_strategy is not CudaGraphStrategy.DISABLED:
        needs.append("supports_cuda_graph_strategy")
    if (
        settings.dynamic_shapes_kernel_specialization_strategy
        is not DynamicShapesKernelSpecializationStrategy.LAZY
    ):
        needs.append("supports_dynamic_shapes_strategy")
    if settings.runtime_cache is not None:
        needs.append("supports_runtime_cache")
    for flag in needs:
        if not getattr(capabilities, flag):
            return flag
    return None


@dataclasses.dataclass
class CacheModel:
    """What a :class:`~trt_runtime.RuntimeCache` must report, given what was done to it."""

    pending: bytes = b""
    materialized: bool = False
    drain_count: int = 0

    def load_bytes(self, data: bytes) -> None:
        """Bytes loaded before materialization become pending (replacing earlier ones)."""
        if self.materialized:
            raise ValueError("the model only covers load_bytes before materialization")
        self.pending = bytes(data)

    @property
    def has_pending(self) -> bool:
        return bool(self.pending)

    def has_cache(self) -> bool:
        return self.materialized

    def materialize(self) -> None:
        """First materialization drains non-empty pending bytes, once."""
        if self.materialized:
            return
        self.materialized = True
        if self.pending:
            self.drain_count += 1
            self.pending = b""

    def expected_serialize(self) -> bytes | None:
        """The bytes ``serialize()`` must return, or ``None`` once the backend owns them."""
        return None if self.materialized else self.pending


class EngineModel:
    """One engine of a backend with ``capabilities``, and the caches it has seen.

    Caches are tracked by the object that the real settings hold (by identity), so the
    model runs on the same :class:`~trt_runtime.RuntimeSettings` values as the engine.
    """

    def __init__(self, capabilities: BackendCapabilities, settings: SettingsLike = None) -> None:
        self.capabilities = capabilities
        self.settings = RuntimeSettings()
        self.has_context = False
        self.context_creations = 0
        self.closed = False
        self._caches: dict[int, tuple[Any, CacheModel]] = {}
        self._stack: list[RuntimeSettings] = []
        self.set_settings(settings)

    # -- caches -------------------------------------------------------------------
    def track_cache(self, cache: Hashable | Any, pending: bytes = b"") -> CacheModel:
        """Start modelling the cache object ``cache`` with ``pending`` bytes loaded."""
        model = CacheModel(pending=bytes(pending))
        self._caches[id(cache)] = (cache, model)
        return model

    def cache(self, cache: Any) -> CacheModel:
        """The model of a tracked cache object."""
        try:
            return self._caches[id(cache)][1]
        except KeyError:
            raise KeyError(f"cache {cache!r} is not tracked by the model") from None

    @property
    def caches(self) -> list[tuple[Any, CacheModel]]:
        """Every tracked (cache object, model) pair, in tracking order."""
        return list(self._caches.values())

    # -- settings -----------------------------------------------------------------
    def refusal(self, settings: SettingsLike) -> str | None:
        """The missing capability flag if ``settings`` must be refused, else ``None``."""
        return missing_capability(RuntimeSettings.coerce(settings), self.capabilities)

    def set_settings(self, settings: SettingsLike) -> bool:
        """Apply ``settings``; return whether they were accepted (refused ones change nothing)."""
        value = RuntimeSettings.coerce(settings)
        if self.refusal(value) is not None:
            return False
        if value != self.settings:
            self.settings = value
            self.has_context = False
        return True

    def enter_config(self, **overrides: Any) -> bool:
        """``runtime_config(engine, **overrides).__enter__()``; return whether it was accepted.

        A refused enter leaves the settings as they were and pushes nothing.
        """
        merged = self.settings.merge(**overrides)
        if self.refusal(merged) is not None:
            return False
        self._stack.append(self.settings)
        self.set_settings(merged)
        return True

    def enter_cudagraphs(
        self, strategy: str | CudaGraphStrategy = CudaGraphStrategy.WHOLE_GRAPH_CAPTURE
    ) -> bool:
        """``enable_cudagraphs(engine, strategy).__enter__()``."""
        return self.enter_config(cuda_graph_strategy=strategy)

    def exit_config(self) -> None:
        """Leave the innermost block: the settings saved on its enter come back."""
        if not self._stack:
            raise IndexError("no runtime_config block is open in the model")
        self.set_settings(self._stack.pop())

    @property
    def depth(self) -> int:
        """How many ``runtime_config`` / ``enable_cudagraphs`` blocks are open."""
        return len(self._stack)

    # -- context --------------------------------------------------------------------
    def execute(self) -> None:
        """A successful execute: creates the context if there is none."""
        if self.closed:
            raise ValueError("the modelled engine is closed")
        if not self.has_context:
            self.has_context = True
            self.context_creations += 1
            cache = self.settings.runtime_cache
            if cache is not None and id(cache) in self._caches:
                self._caches[id(cache)][1].materialize()

    def invalidate_context(self) -> None:
        self.has_context = False

    def close(self) -> None:
        self.has_context = False
        self.closed = True
