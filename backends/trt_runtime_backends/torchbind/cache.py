"""The torchbind runtime-cache handle: ``torch.classes.tensorrt.RuntimeCacheHandle`` wrapped
as a :class:`trt_runtime.RuntimeCacheHandle` for the core :class:`~trt_runtime.RuntimeCache`.

When the native cache exists
----------------------------
With the Python backend, ``ensure_materialized(config)`` creates the ``IRuntimeCache``
at once. The torchbind handle cannot: the C++ engine creates its ``IRuntimeCache``
from its own ``IRuntimeConfig`` when it builds an execution context, i.e. inside the
first ``execute_engine`` after ``update_runtime_settings`` handed it the handle.

What makes this safe is that the C++ handle accepts bytes before then:
``RuntimeCacheHandle.deserialize`` stashes them, and the C++ ``ensure_materialized``
drains the stash into the new ``IRuntimeCache`` exactly once, under the handle's mutex.
So this wrapper reports :meth:`has_cache` true as soon as an engine attached it (in
:meth:`ensure_materialized`); the core facade then drains its pending bytes into
:meth:`deserialize` exactly once, the C++ side keeps them until its cache exists and
drains them exactly once more, into TensorRT-RTX. No byte is loaded twice and none is
dropped. :meth:`native_has_cache` says whether the ``IRuntimeCache`` itself exists yet.

``serialize`` before the C++ cache exists returns the stashed bytes (torch-tensorrt-rtx
2.14 does this itself; 2.13 returned an empty blob, so the wrapper keeps its own copy
until the native cache is live), so a save never empties a file that was only loaded.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from trt_runtime.errors import CacheError

if TYPE_CHECKING:
    from .runtime import TorchbindRuntime

__all__ = ["TorchbindCacheHandle"]


class TorchbindCacheHandle:
    """A :class:`trt_runtime.RuntimeCacheHandle` over one native torchbind handle.

    Thread-safety: the wrapper's state is guarded by a lock; the native handle guards
    its own. One handle may be shared by many engines (they share one ``IRuntimeCache``).
    """

    def __init__(self, runtime: TorchbindRuntime, path: str = "") -> None:
        self._runtime = runtime
        self._native = runtime.new_native_cache_handle(path)
        self._lock = threading.Lock()
        self._attached = False
        self._stash: bytes | None = None

    @property
    def native(self) -> Any:
        """The ``torch.classes.tensorrt.RuntimeCacheHandle`` engines are given."""
        return self._native

    def has_cache(self) -> bool:
        """True once an engine attached this handle (bytes are then accepted and kept)."""
        return self._attached

    def native_has_cache(self) -> bool:
        """Whether torch-tensorrt created the ``IRuntimeCache`` (after the first execute)."""
        return bool(self._native.has_cache())

    def ensure_materialized(self, config: Any) -> Any:
        """Attach the handle; return the native handle for ``update_runtime_settings``.

        ``config`` (the engine asking) is not needed: the C++ engine materializes the
        ``IRuntimeCache`` itself, from its own runtime config.
        """
        with self._lock:
            self._attached = True
            return self._native

    def serialize(self) -> bytes:
        with self._lock:
            if self.native_has_cache():
                self._stash = None
                return self._to_bytes(self._native.serialize())
            if self._stash is not None:
                return self._stash
            return self._to_bytes(self._native.serialize())

    def deserialize(self, data: bytes) -> None:
        blob = bytes(data)
        if not blob:
            return  # the C++ handle only warns about empty input
        with self._lock:
            try:
                self._native.deserialize(self._runtime.bridge.bytes_to_tensor(blob))
            except Exception as exc:
                raise CacheError(
                    f"torch-tensorrt's RuntimeCacheHandle refused {len(blob)} bytes: {exc}"
                ) from exc
            self._stash = None if self.native_has_cache() else blob

    def _to_bytes(self, tensor: Any) -> bytes:
        try:
            return self._runtime.bridge.tensor_to_bytes(tensor)
        except Exception as exc:
            raise CacheError(f"could not read torch-tensorrt's runtime cache bytes: {exc}") from exc

    def __repr__(self) -> str:
        state = "native" if self._attached and self.native_has_cache() else (
            "attached" if self._attached else "detached"
        )
        return f"<TorchbindCacheHandle {state}>"
