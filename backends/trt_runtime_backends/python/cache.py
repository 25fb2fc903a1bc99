"""The python backend's native runtime cache handle: a wrapper over ``IRuntimeCache``."""

from __future__ import annotations

import threading
from typing import Any

from trt_runtime.errors import CacheError

__all__ = ["IRuntimeCacheHandle"]


class IRuntimeCacheHandle:
    """Creates one TensorRT-RTX ``IRuntimeCache`` (from the first runtime config it is
    given) and moves bytes in and out of it.

    The core :class:`~trt_runtime.RuntimeCache` owns pending bytes and decides when to
    drain them; this handle only wraps the native object. Thread-safe.
    """

    def __init__(self, logger: Any = None) -> None:
        self._lock = threading.Lock()
        self._native: Any = None
        self._logger = logger
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
            return self._native

    def serialize(self) -> bytes:
        with self._lock:
            if self._native is None:
                raise CacheError("the runtime cache is not materialized yet; nothing to serialize")
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
            ok = self._native.deserialize(bytes(data))
            if not ok:
                raise CacheError(
                    f"TensorRT-RTX rejected {len(data)} bytes of runtime cache"
                    + self._log_suffix(mark)
                )
            self.deserialize_count += 1

    def _log_suffix(self, mark: Any = None) -> str:
        if self._logger is None:
            return ""
        messages = self._logger.errors_since(mark)
        return f": {'; '.join(messages)}" if messages else ""

    def __repr__(self) -> str:
        state = "materialized" if self._native is not None else "empty"
        return f"<IRuntimeCacheHandle {state}>"
