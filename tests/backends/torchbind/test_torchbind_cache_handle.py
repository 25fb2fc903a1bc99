"""The torchbind backend's runtime cache handle on the CPU doubles: pending bytes drained exactly
once, serialized before materialization, refused from another backend, with the core's facade."""

from __future__ import annotations

import json
from typing import Any

import pytest
from _torchbind_doubles import inputs, make_backend, source
from trt_runtime_backends.torchbind import TorchbindCacheHandle

from trt_runtime.errors import CacheError
from trt_runtime.protocols import RuntimeCacheHandle
from trt_runtime.settings import RuntimeSettings


# -- the runtime cache handle ----------------------------------------------------------------------
def test_torchbind_cache_handle_is_a_runtime_cache_handle() -> None:
    backend, _ = make_backend("2.14.0")
    handle = backend.create_cache_handle()
    assert isinstance(handle, RuntimeCacheHandle) and isinstance(handle, TorchbindCacheHandle)
    assert not handle.has_cache()


@pytest.mark.parametrize("version", ["2.13.0", "2.14.0"])
def test_torchbind_cache_pending_bytes_drained_exactly_once(version: str) -> None:
    """The facade's drain goes into the C++ stash; C++ drains the stash once, at the first execute."""
    backend, _ = make_backend(version)
    warm = b"KC" + json.dumps({"old-kernel": "k"}).encode()
    handle = backend.create_cache_handle()

    class Facade:  # what trt_runtime.RuntimeCache does with a handle: attach, then drain pending
        def __init__(self) -> None:
            self.pending: bytes | None = warm
            self.drains = 0

        def ensure_materialized(self, config: Any, *, backend: Any = None, key: Any = None) -> Any:
            native = handle.ensure_materialized(config)
            if self.pending is not None and handle.has_cache():
                handle.deserialize(self.pending)
                self.pending, self.drains = None, self.drains + 1
            return native

    facade = Facade()
    engine = backend.load_engine(source(), settings=RuntimeSettings())
    ops = engine._lanes[0].ops
    ops.create_context = _with_cache(ops, facade)  # type: ignore[method-assign]
    assert handle.serialize() == b""  # nothing loaded yet
    engine.execute(*inputs())
    native = handle.native
    assert facade.drains == 1 and native.drained == 1 and native.loads == [warm]
    assert handle.native_has_cache()
    saved = json.loads(handle.serialize()[2:])
    assert "old-kernel" in saved and any(k.startswith("mlp|2x4,2x4") for k in saved)
    engine.execute(*inputs())
    assert native.drained == 1 and facade.drains == 1


def _with_cache(ops: Any, facade: Any) -> Any:
    original = ops.create_context

    def create(settings: RuntimeSettings, cache: Any) -> Any:
        return original(settings, facade)

    return create


@pytest.mark.parametrize("version", ["2.13.0", "2.14.0"])
def test_torchbind_cache_serialize_before_materialization_returns_loaded_bytes(version: str) -> None:
    backend, _ = make_backend(version)
    handle = backend.create_cache_handle()
    handle.ensure_materialized(None)
    blob = b"KC" + json.dumps({"a": "b"}).encode()
    handle.deserialize(blob)
    assert not handle.native_has_cache()
    assert handle.serialize() == blob  # 2.13's C++ would give b""; the wrapper keeps the copy


def test_torchbind_cache_from_another_backend_is_refused() -> None:
    backend, _ = make_backend("2.14.0")
    engine = backend.load_engine(source())

    class Foreign:
        def ensure_materialized(self, config: Any, *, backend: Any = None, key: Any = None) -> Any:
            return object()

    with pytest.raises(CacheError, match="not torch-tensorrt's RuntimeCacheHandle"):
        engine._lanes[0].ops.create_context(RuntimeSettings(), Foreign())  # type: ignore[arg-type]


def test_torchbind_cache_with_core_facade_drains_once() -> None:
    from trt_runtime.cache import RuntimeCache

    backend, _ = make_backend("2.14.0")
    warm = b"KC" + json.dumps({"old-kernel": "k"}).encode()
    cache = RuntimeCache()
    try:
        cache.load_bytes(warm)
    except NotImplementedError:
        pytest.skip("trt_runtime.RuntimeCache is still the skeleton (cache issue not landed)")
    engine = backend.load_engine(source(), settings=RuntimeSettings(runtime_cache=cache))
    assert cache.serialize() == warm  # pending, before any engine ran
    engine.execute(*inputs())
    engine.execute(*inputs())
    native = engine.native.settings[2]
    assert native.drained == 1 and native.loads == [warm]
    assert b"old-kernel" in cache.serialize() and b"mlp|2x4,2x4" in cache.serialize()
