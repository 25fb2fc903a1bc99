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
* The outer CUDA-graph wrap (``outer_graph``) needs ``supports_outer_cuda_graph`` and an
  engine without data-dependent outputs. Setting it never creates or drops a context;
  changing it to a different value drops the captured graphs. Under it, a call captures
  a graph the first time its input-shape key is seen in the current context (counted by
  ``graph_captures``); later calls of that key replay it. Anything that drops the context
  (a settings change, ``invalidate_context``) drops the graphs too, so the next call of
  every key captures again; so does ``reset_graphs``. ``enable_cudagraphs(outer=...)``
  applies its settings first (strategy ``disabled`` unless given), then the wrap, and
  restores both on exit. The model assumes TensorRT-RTX's own ``cuda_graph_strategy`` is
  ``disabled`` while the wrap is on (a graph inside a graph is backend-defined).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import Any

from trt_runtime.graphs import OuterGraph
from trt_runtime.protocols import BackendCapabilities
from trt_runtime.settings import (
    CudaGraphStrategy,
    DynamicShapesKernelSpecializationStrategy,
    RuntimeSettings,
    SettingsLike,
)

__all__ = ["CacheModel", "EngineModel", "missing_capability"]

#: Stack entry of a ``runtime_config`` block: it saved no outer-graph value.
_NO_OUTER = object()


def missing_capability(settings: RuntimeSettings, capabilities: BackendCapabilities) -> str | None:
    """The first capability flag ``settings`` need that ``capabilities`` lack, or ``None``."""
    needs = []
    if settings.cuda_graph_strategy is not CudaGraphStrategy.DISABLED:
        needs.append("supports_cuda_graph_strategy")
    if (
        settings.dynamic_shapes_kernel_specialization_strategy
        is not DynamicShapesKernelSpecializationStrategy.LAZY
    ):
        needs.append("supports_dynamic_shapes_kernel_specialization_strategy")
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

    def __init__(
        self,
        capabilities: BackendCapabilities,
        settings: SettingsLike = None,
        *,
        data_dependent: bool = False,
    ) -> None:
        self.capabilities = capabilities
        #: Whether the engine has outputs with data-dependent shapes (no outer graph then).
        self.data_dependent = data_dependent
        self.settings = RuntimeSettings()
        self._has_context = False
        self.context_creations = 0
        self.closed = False
        self.outer_graph: OuterGraph | None = None
        self.graph_captures = 0
        #: Input-shape keys with a captured graph in the current context.
        self.graphs: set[Hashable] = set()
        self._caches: dict[int, tuple[Any, CacheModel]] = {}
        self._stack: list[tuple[RuntimeSettings, Any]] = []
        self.set_settings(settings)

    @property
    def has_context(self) -> bool:
        return self._has_context

    @has_context.setter
    def has_context(self, value: bool) -> None:
        if not value:
            self.graphs.clear()  # graphs hold the context's addresses and kernels
        self._has_context = value

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
        self._stack.append((self.settings, _NO_OUTER))
        self.set_settings(merged)
        return True

    def enter_cudagraphs(
        self,
        strategy: str | CudaGraphStrategy | None = None,
        *,
        outer: OuterGraph | bool | str | None = False,
    ) -> bool:
        """``enable_cudagraphs(engine, strategy, outer=outer).__enter__()``; return whether
        it was accepted. The strategy defaults to ``whole_graph_capture``, or ``disabled``
        with the outer wrap. A refused enter changes nothing and opens no block, except
        that an engine with data-dependent outputs has had the settings applied and
        restored (the wrap is refused after them), which drops a context if they differed.
        """
        graph = OuterGraph.coerce(outer)
        if strategy is None:
            strategy = CudaGraphStrategy.DISABLED if graph else CudaGraphStrategy.WHOLE_GRAPH_CAPTURE
        if graph is not None and not self.capabilities.supports_outer_cuda_graph:
            return False  # checked before any settings change
        saved = self.settings
        if not self.enter_config(cuda_graph_strategy=strategy):
            return False
        if graph is None:
            return True
        if self.outer_refusal(graph) is not None:
            self._stack.pop()
            self.set_settings(saved)
            return False
        self._stack[-1] = (saved, self.outer_graph)
        self.set_outer_graph(graph)
        return True

    def exit_config(self) -> None:
        """Leave the innermost block: the outer wrap (for ``enable_cudagraphs``) and the
        settings saved on its enter come back, in that order."""
        if not self._stack:
            raise IndexError("no runtime_config block is open in the model")
        settings, outer = self._stack.pop()
        if outer is not _NO_OUTER:
            self.set_outer_graph(outer)
        self.set_settings(settings)

    # -- the outer CUDA-graph wrap ------------------------------------------------------------
    def outer_refusal(self, value: OuterGraph | bool | str | None) -> str | None:
        """Why setting the outer wrap to ``value`` must raise ``CapabilityError`` (the missing
        flag, or ``"data_dependent"``), else ``None``."""
        if OuterGraph.coerce(value) is None:
            return None
        if not self.capabilities.supports_outer_cuda_graph:
            return "supports_outer_cuda_graph"
        if self.data_dependent:
            return "data_dependent"
        return None

    def set_outer_graph(self, value: OuterGraph | bool | str | None) -> bool:
        """``engine.outer_graph = value``; return whether it was accepted. Never touches the
        context; a different value drops the graphs."""
        if self.outer_refusal(value) is not None:
            return False
        graph = OuterGraph.coerce(value)
        if graph != self.outer_graph:
            self.outer_graph = graph
            self.graphs.clear()
        return True

    def reset_graphs(self) -> None:
        self.graphs.clear()

    @property
    def depth(self) -> int:
        """How many ``runtime_config`` / ``enable_cudagraphs`` blocks are open."""
        return len(self._stack)

    # -- context --------------------------------------------------------------------
    def execute(self, shape_key: Hashable = ()) -> None:
        """A successful execute with inputs of ``shape_key``: creates the context if there
        is none, and under the outer wrap captures a graph for a key not seen in it yet."""
        if self.closed:
            raise ValueError("the modelled engine is closed")
        if not self.has_context:
            self.has_context = True
            self.context_creations += 1
            cache = self.settings.runtime_cache
            if cache is not None and id(cache) in self._caches:
                self._caches[id(cache)][1].materialize()
        if self.outer_graph is not None and shape_key not in self.graphs:
            self.graphs.add(shape_key)
            self.graph_captures += 1

    def invalidate_context(self) -> None:
        self.has_context = False

    def close(self) -> None:
        self.has_context = False
        self.closed = True
