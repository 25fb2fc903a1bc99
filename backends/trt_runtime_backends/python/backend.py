"""``PythonBackend``: TensorRT-RTX (or TensorRT) through its Python API, CUDA through cuda-python."""

from __future__ import annotations

import collections
import itertools
import logging
import threading
from typing import Any

from trt_runtime.cache import CacheKey
from trt_runtime.errors import BackendUnavailableError, EngineError
from trt_runtime.extras import install_hint
from trt_runtime.protocols import (
    Availability,
    BackendCapabilities,
    EngineSource,
)
from trt_runtime.settings import RuntimeSettings

__all__ = ["PythonBackend", "RTX_HINT", "CUDA_HINT"]

RTX_HINT = "the 'python' backend needs tensorrt-rtx: " + install_hint("rtx")
CUDA_HINT = "the 'python' backend needs cuda-python: " + install_hint("cuda")

_log = logging.getLogger("trt_runtime.python")
_trt_log = logging.getLogger("trt_runtime.python.tensorrt")

_RTX_CAPS = BackendCapabilities.all_on().without(
    "cache_deserialize_merges", note="IRuntimeCache.deserialize replaces the cache's contents"
)
_TRT_NOTE = "needs TensorRT-RTX (tensorrt-rtx); only full TensorRT is installed"
# Full TensorRT: no runtime config; the outer wrap is its only CUDA-graph mechanism.
_TRT_CAPS = _RTX_CAPS.without(
    "supports_runtime_cache",
    "supports_cuda_graph_strategy",
    "supports_dynamic_shapes_kernel_specialization_strategy",
    note=_TRT_NOTE,
)


def _import_trt() -> tuple[Any, str] | None:
    try:
        import tensorrt_rtx as trt

        return trt, "tensorrt_rtx"
    except ImportError:
        pass
    try:
        import tensorrt as trt

        return trt, "tensorrt"
    except ImportError:
        return None


def _make_logger(trt: Any) -> Any:
    """An ``ILogger`` that keeps recent errors (to attach to EngineError) and forwards
    warnings to the ``trt_runtime.python.tensorrt`` logger."""
    severity = trt.ILogger.Severity

    class CapturingLogger(trt.ILogger):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self._lock = threading.Lock()
            self._seq = itertools.count()
            self._errors: collections.deque[tuple[int, str]] = collections.deque(maxlen=64)
            self._error_levels = {severity.INTERNAL_ERROR, severity.ERROR}
            self.min_severity = severity.WARNING

        def log(self, level: Any, msg: str) -> None:
            if level in self._error_levels:
                with self._lock:
                    self._errors.append((next(self._seq), msg))
                _trt_log.debug("%s", msg)
            elif level == severity.WARNING:
                _trt_log.warning("%s", msg)
            else:
                _trt_log.debug("%s", msg)

        def mark(self) -> int:
            """A position in the error log; :meth:`errors_since` returns what came after."""
            with self._lock:
                return self._errors[-1][0] + 1 if self._errors else -1

        def errors_since(self, mark: int | None) -> list[str]:
            with self._lock:
                if mark is None:
                    return [m for _, m in self._errors]
                if mark == -1:
                    return [m for _, m in self._errors]
                return [m for seq, m in self._errors if seq >= mark]

    return CapturingLogger()


class PythonBackend:
    """Runs engines with the TensorRT-RTX Python API and cuda-python streams and events.

    One instance per process (the registry makes it); the TensorRT runtime and logger
    are created on first use and shared by all engines. Thread-safe.
    """

    name = "python"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._trt: Any = None
        self._flavour: str | None = None
        self._runtimes: dict[int, Any] = {}
        self._logger: Any = None

    # -- discovery ---------------------------------------------------------------------
    def _load_trt(self) -> tuple[Any, str]:
        if self._trt is None:
            found = _import_trt()
            if found is None:
                raise BackendUnavailableError(RTX_HINT)
            with self._lock:
                if self._trt is None:
                    self._logger = _make_logger(found[0])
                    self._trt, self._flavour = found
        return self._trt, self._flavour  # type: ignore[return-value]

    @property
    def flavour(self) -> str:
        """``"tensorrt_rtx"`` or ``"tensorrt"`` (which Python package runs the engines)."""
        return self._load_trt()[1]

    @property
    def tensorrt(self) -> Any:
        """The imported ``tensorrt_rtx`` (or ``tensorrt``) module."""
        return self._load_trt()[0]

    @property
    def logger(self) -> Any:
        """The ``ILogger`` shared by every runtime of this backend."""
        self._load_trt()
        return self._logger

    def is_available(self) -> Availability:
        try:
            if _import_trt() is None:
                return Availability(False, RTX_HINT)
            try:
                from cuda.bindings import runtime  # noqa: F401
                from cuda.core import Device  # noqa: F401
            except ImportError:
                return Availability(False, CUDA_HINT)
            from trt_runtime_backends.python.cuda import device_count

            try:
                count = device_count()
            except Exception as exc:
                return Availability(False, f"the 'python' backend cannot query CUDA devices: {exc}")
            if count == 0:
                return Availability(
                    False, "the 'python' backend needs an NVIDIA GPU: no CUDA device is visible"
                )
            return Availability(True)
        except Exception as exc:  # never raise from a cheap check
            return Availability(False, f"the 'python' backend failed to initialize: {exc}")

    @property
    def capabilities(self) -> BackendCapabilities:
        found = _import_trt() if self._flavour is None else (self._trt, self._flavour)
        if found is not None and found[1] == "tensorrt":
            return _TRT_CAPS
        return _RTX_CAPS

    # -- caches ------------------------------------------------------------------------
    def create_cache_handle(self) -> Any:
        from trt_runtime_backends.python.cache import IRuntimeCacheHandle

        self.capabilities.require("supports_runtime_cache", self.name)
        return IRuntimeCacheHandle(self.logger)

    def cache_key(self, device: int | None = None) -> CacheKey:
        """The key of ``device`` (else the current device): one cache file per GPU model, so
        kernels compiled for one SM are never fed to another."""
        from trt_runtime_backends.python import cuda

        trt, flavour = self._load_trt()
        index = cuda.resolve_device(device)
        return CacheKey(
            flavour=flavour,
            version=str(trt.__version__),
            compute_capability=cuda.get_device(index).compute_capability,
            driver=str(cuda.driver_version()),
        )

    # -- engines -----------------------------------------------------------------------
    def runtime(self, device: int) -> Any:
        """The ``trt.Runtime`` of ``device`` (one per device, created on first use)."""
        trt, _ = self._load_trt()
        with self._lock:
            rt = self._runtimes.get(device)
            if rt is None:
                rt = self._runtimes[device] = trt.Runtime(self._logger)
            return rt

    def load_engine(
        self,
        source: EngineSource,
        *,
        device: int | None = None,
        settings: RuntimeSettings | None = None,
    ) -> Any:
        """Deserialize ``source`` on ``device`` (verbatim), else ``source.device_id``, else
        the current device. TensorRT's error messages are attached to :class:`EngineError`."""
        from trt_runtime_backends.python import cuda
        from trt_runtime_backends.python.engine import PythonEngine

        availability = self.is_available()
        if not availability:
            raise BackendUnavailableError(availability.reason)
        index = cuda.resolve_device(device, source.device_id, source.name)
        state = cuda.get_device(index)
        data = source.data
        if len(data) == 0:
            raise EngineError(f"engine {source.name!r}: the plan is empty (0 bytes)")
        # The engine's device for the load, whatever the caller's is; the caller's back after.
        with state.scope():
            trt_engine = self.deserialize(source, state)
            _log.debug("loaded engine %r on device %d", source.name, index)
            return PythonEngine._create(self, trt_engine, state, source, settings)

    def deserialize(self, source: EngineSource, state: Any) -> Any:
        """A new ``ICudaEngine`` of ``source`` on ``state``'s device (current in the caller);
        :class:`EngineError` with TensorRT's messages when it fails."""
        trt, flavour = self._load_trt()
        index = state.index
        runtime = self.runtime(index)
        mark = self._logger.mark()
        try:
            trt_engine = runtime.deserialize_cuda_engine(source.data)
        except Exception as exc:
            raise EngineError(
                f"engine {source.name!r}: TensorRT failed to deserialize it: {exc}"
                + _suffix(self._logger.errors_since(mark))
            ) from exc
        if trt_engine is None:
            messages = self._logger.errors_since(mark)
            detail = "; ".join(messages) if messages else "TensorRT logged no error"
            raise EngineError(
                f"engine {source.name!r} could not be deserialized by {flavour} {trt.__version__} "
                f"on device {index} (sm {state.compute_capability}): {detail}"
            )
        return trt_engine

    def __repr__(self) -> str:
        return f"<PythonBackend flavour={self._flavour or 'not loaded'}>"


def _suffix(messages: list[str]) -> str:
    return f" ({'; '.join(messages)})" if messages else ""
