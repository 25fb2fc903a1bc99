"""The engine lifecycle every backend shares: settings, lazy execution context, cache binding."""

from __future__ import annotations

import abc
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from typing_extensions import Self

from trt_runtime.errors import CapabilityError, EngineError
from trt_runtime.graphs import OuterGraph
from trt_runtime.protocols import Backend, TensorSpec
from trt_runtime.settings import (
    CudaGraphStrategy,
    DynamicShapesKernelSpecializationStrategy,
    RuntimeSettings,
    SettingsLike,
)

if TYPE_CHECKING:
    from trt_runtime.cache import RuntimeCache

__all__ = ["EngineBase"]


class EngineBase(abc.ABC):
    """Base class for backend engines.

    It owns what the conformance suite checks: settings changes invalidate the
    execution context, which is created lazily on the next :meth:`execute`, once per
    distinct settings value, counted by :attr:`context_creations`. Subclasses provide
    :meth:`_create_context`, :meth:`_destroy_context` and :meth:`_run`.

    Thread-safety: settings changes and context creation are serialized by a lock;
    concurrent :meth:`execute` calls on one engine are serialized as well, since a
    TensorRT execution context is not re-entrant.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        name: str,
        inputs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec],
        settings: SettingsLike = None,
    ) -> None:
        self.name = name
        self._backend = backend
        self._inputs = tuple(inputs)
        self._outputs = tuple(outputs)
        self._lock = threading.RLock()
        self._context: Any = None
        self._creations = 0
        self._closed = False
        self._outer_graph: OuterGraph | None = None
        self._graph_captures = 0
        self._settings = RuntimeSettings()
        self.runtime_settings = RuntimeSettings.coerce(settings)

    # -- metadata ---------------------------------------------------------------
    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self._inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self._outputs

    @property
    def has_data_dependent_outputs(self) -> bool:
        return any(o.data_dependent for o in self._outputs)

    @property
    def data_dependent_outputs(self) -> list[str]:
        """Names of outputs whose shapes are only known after execution."""
        return [o.name for o in self._outputs if o.data_dependent]

    # -- settings and context -----------------------------------------------------
    @property
    def runtime_settings(self) -> RuntimeSettings:
        return self._settings

    @runtime_settings.setter
    def runtime_settings(self, value: SettingsLike) -> None:
        settings = RuntimeSettings.coerce(value)
        self._check_capabilities(settings)
        with self._lock:
            if settings == self._settings:
                return
            self._settings = settings
            self._drop_context()

    def _check_capabilities(self, settings: RuntimeSettings) -> None:
        caps = self._backend.capabilities
        if settings.cuda_graph_strategy is not CudaGraphStrategy.DISABLED:
            caps.require("supports_cuda_graph_strategy", self._backend.name)
        if (
            settings.dynamic_shapes_kernel_specialization_strategy
            is not DynamicShapesKernelSpecializationStrategy.LAZY
        ):
            caps.require("supports_dynamic_shapes_kernel_specialization_strategy", self._backend.name)
        if settings.runtime_cache is not None:
            caps.require("supports_runtime_cache", self._backend.name)

    @property
    def context_creations(self) -> int:
        return self._creations

    def has_context(self) -> bool:
        return self._context is not None

    def invalidate_context(self) -> None:
        """Drop the execution context; the next call creates a new one."""
        with self._lock:
            self._drop_context()

    def _drop_context(self) -> None:
        if self._context is not None:
            context, self._context = self._context, None
            self.synchronize()
            self._drop_graphs()  # graphs hold the context's addresses and kernels
            self._destroy_context(context)

    # -- the outer CUDA-graph wrap -------------------------------------------------
    @property
    def outer_graph(self) -> OuterGraph | None:
        """The outer CUDA-graph wrap in force; ``None`` (default): calls run eagerly.

        Accepts ``None``, a bool, an output mode (``"copy"``, ``"view"``) or an
        :class:`~trt_runtime.graphs.OuterGraph`. Changing it drops the captured graphs,
        never the execution context. Needs ``supports_outer_cuda_graph``.
        """
        return self._outer_graph

    @outer_graph.setter
    def outer_graph(self, value: OuterGraph | bool | str | None) -> None:
        graph = OuterGraph.coerce(value)
        if graph is not None:
            self._backend.capabilities.require("supports_outer_cuda_graph", self._backend.name)
            if self.has_data_dependent_outputs:
                raise CapabilityError(
                    f"engine {self.name!r}: outputs {self.data_dependent_outputs} have data-dependent "
                    "shapes; a CUDA graph cannot capture them (run it without the outer graph wrap)"
                )
        with self._lock:
            if graph == self._outer_graph:
                return
            self._outer_graph = graph
            self.synchronize()
            self._drop_graphs()

    @property
    def graph_captures(self) -> int:
        """How many CUDA graphs the outer wrap has captured (a replay is not a capture)."""
        return self._graph_captures

    def reset_graphs(self) -> None:
        """Drop every captured graph; the next call under the outer wrap captures again."""
        with self._lock:
            self.synchronize()
            self._drop_graphs()

    def _resolve_cache(self) -> RuntimeCache | None:
        from trt_runtime.cache import RuntimeCache

        cache = self._settings.runtime_cache
        if isinstance(cache, Path):
            return RuntimeCache.shared(cache)
        return cache

    def ensure_context(self) -> Any:
        """Create the execution context now if there is none (normally done by execute)."""
        with self._lock:
            self._check_open()
            if self._context is None:
                context = self._create_context(self._settings, self._resolve_cache())
                if context is None:
                    raise EngineError(f"engine {self.name!r}: the backend created no execution context")
                self._context = context
                self._creations += 1
            return self._context

    # -- execution ----------------------------------------------------------------
    def execute(self, *inputs: Any, stream: Any = None, outputs: Sequence[Any] | None = None) -> list[Any]:
        """Run the engine; returns one array per output, in :attr:`outputs` order.

        ``outputs``: preallocated arrays to write into, returned as given (needs
        ``supports_preallocated_outputs``).
        """
        with self._lock:
            self._check_open()
            if outputs is not None:
                self._backend.capabilities.require("supports_preallocated_outputs", self._backend.name)
            self._validate_inputs(inputs)
            if outputs is not None:
                self._validate_outputs(outputs)
            context = self.ensure_context()
            if outputs is None:
                return self._run(context, inputs, stream)
            return self._run(context, inputs, stream, outputs)

    def __call__(self, *inputs: Any, stream: Any = None, outputs: Sequence[Any] | None = None) -> Any:
        """Like :meth:`execute`, but a single output is returned bare, several as a tuple."""
        result = self.execute(*inputs, stream=stream, outputs=outputs)
        return result[0] if len(result) == 1 else tuple(result)

    def synchronize(self) -> None:  # noqa: B027 - optional hook
        """Wait for work this engine queued (default: nothing to wait for)."""

    # -- lifetime -----------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise EngineError(f"engine {self.name!r} is closed")

    def close(self) -> None:
        """Release the context and the engine; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._drop_context()
            self._closed = True
            self._release()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        io = ", ".join(f"{s.name}:{s.dtype}{list(s.shape)}" for s in (*self._inputs, *self._outputs))
        return f"<{type(self).__name__} {self.name!r} backend={self._backend.name!r} [{io}]>"

    # -- subclass hooks -----------------------------------------------------------
    @abc.abstractmethod
    def _create_context(self, settings: RuntimeSettings, cache: RuntimeCache | None) -> Any:
        """Create an execution context for ``settings``.

        A backend with a cache calls ``cache.ensure_materialized(config, backend=self.backend)``
        and attaches the native cache it returns to its runtime config.
        """

    @abc.abstractmethod
    def _destroy_context(self, context: Any) -> None:
        """Release ``context``."""

    @abc.abstractmethod
    def _run(self, context: Any, inputs: Sequence[Any], stream: Any, outputs: Sequence[Any] | None = None
             ) -> list[Any]:
        """Execute (eagerly, or under :attr:`outer_graph`); return outputs.

        ``outputs`` is only passed by backends declaring ``supports_preallocated_outputs``.
        A backend with ``supports_outer_cuda_graph`` counts each capture in
        ``self._graph_captures``.
        """

    def _drop_graphs(self) -> None:  # noqa: B027 - optional hook
        """Release captured outer graphs (called with the lock held, after synchronize)."""

    def _validate_inputs(self, inputs: Sequence[Any]) -> None:  # noqa: B027 - optional hook
        """Check count, dtype, shape and device of ``inputs`` before any context exists.

        Raise :class:`~trt_runtime.InputError`. Backends that can check inputs without a
        context override this, so bad input never creates a context or materializes a
        cache; checks that need the context stay in :meth:`_run`.
        """

    def _validate_outputs(self, outputs: Sequence[Any]) -> None:  # noqa: B027 - optional hook
        """Check preallocated ``outputs`` (count, dtype, device, contiguity) before any context
        exists; checks that need output shapes from the context stay in :meth:`_run`."""

    def _release(self) -> None:  # noqa: B027 - optional hook
        """Release the engine itself (after the context)."""
