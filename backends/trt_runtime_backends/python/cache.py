"""The python backend's native runtime cache handle: a wrapper over ``IRuntimeCache``."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from trt_runtime.errors import CacheError

__all__ = ["IRuntimeCacheHandle"]


class IRuntimeCacheHandle:
    """Creates one TensorRT-RTX ``IRuntimeCache`` (from the first runtime config it is
    given) and moves bytes in and out of it.

    The core :class:`~trt_runtime.RuntimeCache` owns pending bytes and decides when to
    drain them; this handle only wraps the native object. Thread-safe.
    """

    def __init__(self, logger: Any = None, driver: Any = None) -> None:
        self._lock = threading.Lock()
        self._native: Any = None
        self._logger = logger
        self._driver = driver
        #: The CUDA context current when the native cache was made (``None``: unknown). TensorRT-RTX
        #: serializes a cache only with a context current (its device fingerprint), and engines
        #: give a thread back the context it had after each call, so a save from a thread that
        #: never had one (a finalizer, an engine process's main thread) finds none.
        self._context: Any = None
        #: How many times bytes were loaded into the native cache (for tests).
        self.deserialize_count = 0

    @property
    def native(self) -> Any:
        """The ``IRuntimeCache``, or ``None`` before :meth:`ensure_materialized`."""
        return self._native

    def has_cache(self) -> bool:
        return self._native is not None

    def ensure_materialized(self, config: Any) -> Any:
        """``config.create_runtime_cache()`` the first time; the same object afterwards."""
        with self._lock:
            if self._native is None:
                create = getattr(config, "create_runtime_cache", None)
                if create is None:
                    raise CacheError(
                        f"the runtime config {type(config).__name__} cannot create a runtime cache "
                        "(TensorRT-RTX is needed)"
                    )
                native = create()
                if native is None:
                    raise CacheError("TensorRT-RTX returned no runtime cache" + self._log_suffix())
                self._native = native
                self._context = self._current_context()
            return self._native

    def serialize(self) -> bytes:
        with self._lock:
            if self._native is None:
                raise CacheError("the runtime cache is not materialized yet; nothing to serialize")
            with self._made_current():
                data = self._native.serialize()
            if data is None:
                raise CacheError("TensorRT-RTX could not serialize the runtime cache" + self._log_suffix())
            return bytes(data)

    def deserialize(self, data: bytes) -> None:
        """Load ``data``; TensorRT-RTX replaces the cache's contents (it does not merge)."""
        with self._lock:
            if self._native is None:
                raise CacheError("the runtime cache is not materialized yet; cannot load bytes into it")
            mark = self._logger.mark() if self._logger is not None else None
            with self._made_current():
                ok = self._native.deserialize(bytes(data))
            if not ok:
                raise CacheError(
                    f"TensorRT-RTX rejected {len(data)} bytes of runtime cache"
                    + self._log_suffix(mark)
                )
            self.deserialize_count += 1

    def _driver_api(self) -> Any:
        if self._driver is None:
            try:
                from cuda.bindings import driver
            except ImportError:
                return None
            self._driver = driver
        return self._driver

    def _current_context(self) -> Any:
        """The calling thread's current CUDA context, or ``None`` (none, or no driver here)."""
        driver = self._driver_api()
        if driver is None:
            return None
        try:
            err, context = driver.cuCtxGetCurrent()
        except Exception:  # no libcuda on this machine
            return None
        return context if int(err) == 0 and int(context) else None

    @contextlib.contextmanager
    def _made_current(self) -> Iterator[None]:
        """The cache's context current while TensorRT-RTX reads or writes it; the caller's after."""
        wanted = self._context
        if wanted is None:
            yield
            return
        driver = self._driver_api()
        err, previous = driver.cuCtxGetCurrent()
        if int(err) == 0 and int(previous) == int(wanted):
            yield
            return
        driver.cuCtxSetCurrent(wanted)
        try:
            yield
        finally:
            if int(err) == 0:
                driver.cuCtxSetCurrent(previous)

    def _log_suffix(self, mark: Any = None) -> str:
        if self._logger is None:
            return ""
        messages = self._logger.errors_since(mark)
        return f": {'; '.join(messages)}" if messages else ""

    def __repr__(self) -> str:
        state = "materialized" if self._native is not None else "empty"
        return f"<IRuntimeCacheHandle {state}>"
