"""runtime_config, enable_cudagraphs, set_* and runtime_cache on memory engines."""

from __future__ import annotations

import io

import numpy as np
import pytest

import trt_runtime
from trt_runtime import (
    CacheWarning,
    CapabilityError,
    CudaGraphStrategy,
    DynamicShapesKernelSpecializationStrategy,
    EngineSource,
    RuntimeCache,
    RuntimeSettings,
    TensorSpec,
    enable_cudagraphs,
    runtime_cache,
    runtime_config,
    set_cuda_graph_strategy,
    set_dynamic_shapes_kernel_specialization_strategy,
    set_dynamic_shapes_kernel_strategy,
)
from trt_runtime.contexts import engines_of
from trt_runtime.testing.memory import AffineOutput, MemoryBackend

ENGINE = MemoryBackend.build_engine(
    [TensorSpec("x", "float32", (2, 3), True)], [AffineOutput("y", "x", scale=3.0, bias=-1.0)], name="ctx"
)
X = np.arange(6, dtype=np.float32).reshape(2, 3)
WHOLE = CudaGraphStrategy.WHOLE_GRAPH_CAPTURE
DISABLED = CudaGraphStrategy.DISABLED


@pytest.fixture
def backend():
    return MemoryBackend()


@pytest.fixture
def engine(backend):
    engine = backend.load_engine(EngineSource(ENGINE))
    yield engine
    engine.close()


def run(engine, times=1):
    for _ in range(times):
        np.testing.assert_allclose(engine.execute(X)[0], 3 * X - 1)


class Model:
    """A module-like object exposing its engines."""

    def __init__(self, *engines):
        self._engines = engines

    def trt_engines(self):
        return list(self._engines)


def test_contexts_runtime_config_outside_enable_cudagraphs_one_context(engine):
    run(engine)
    with runtime_config(engine, dynamic_shapes_kernel_specialization_strategy="eager"):
        with enable_cudagraphs(engine):
            run(engine, times=3)
            assert engine.context_creations == 2  # one before, exactly one inside
            assert engine.runtime_settings == RuntimeSettings(WHOLE, "eager")
        assert engine.runtime_settings == RuntimeSettings(DISABLED, "eager")
        assert not engine.has_context()
    assert engine.runtime_settings == RuntimeSettings()
    assert engine.context_settings[-1] == RuntimeSettings(WHOLE, "eager")
    run(engine)
    assert engine.context_creations == 3


def test_contexts_calls_in_outer_block_add_a_context(engine):
    with runtime_config(engine, dynamic_shapes_kernel_specialization_strategy="eager"):
        run(engine)
        with enable_cudagraphs(engine):
            run(engine, times=2)
    assert engine.context_creations == 2
    assert [s.cuda_graph_strategy for s in engine.context_settings] == [DISABLED, WHOLE]


def test_contexts_enable_cudagraphs_outside_runtime_config_inner_wins(engine):
    with enable_cudagraphs(engine):
        with runtime_config(engine, cuda_graph_strategy="disabled"):
            run(engine)
            assert engine.runtime_settings.cuda_graph_strategy is DISABLED
        assert engine.runtime_settings.cuda_graph_strategy is WHOLE
        assert not engine.has_context()
        run(engine)
    assert engine.context_creations == 2
    assert [s.cuda_graph_strategy for s in engine.context_settings] == [DISABLED, WHOLE]
    assert engine.runtime_settings == RuntimeSettings()


def test_contexts_equal_nested_settings_keep_the_context(engine):
    with enable_cudagraphs(engine):
        run(engine)
        with enable_cudagraphs(engine), runtime_config(engine, cuda_graph_strategy=WHOLE.code):
            run(engine)
        assert engine.has_context()
        run(engine)
    assert engine.context_creations == 1


@pytest.mark.parametrize(
    "make_cm",
    [
        lambda e: enable_cudagraphs(e),
        lambda e: runtime_config(e, dynamic_shapes_kernel_specialization_strategy="none"),
    ],
)
def test_contexts_restore_on_exception(engine, make_cm):
    with pytest.raises(KeyError, match="inside"), make_cm(engine):
        run(engine)
        assert engine.runtime_settings != RuntimeSettings()
        raise KeyError("inside")
    assert engine.runtime_settings == RuntimeSettings()
    assert not engine.has_context()


def test_contexts_runtime_config_validates_before_changing(engine):
    with pytest.raises(TypeError, match="unknown runtime setting"), runtime_config(engine, cuda_graphs=True):
        pass
    with pytest.raises(ValueError, match="got 'fast'"), runtime_config(engine, cuda_graph_strategy="fast"):
        pass
    assert engine.runtime_settings == RuntimeSettings()


def test_contexts_capability_error_rolls_back_every_engine(engine):
    reduced = MemoryBackend(without=("supports_cuda_graph_strategy",)).load_engine(EngineSource(ENGINE))
    with pytest.raises(CapabilityError, match="does not support cuda_graph_strategy"):
        with enable_cudagraphs([engine, reduced]):
            pass
    assert engine.runtime_settings == RuntimeSettings()
    assert reduced.runtime_settings == RuntimeSettings()


def test_contexts_apply_to_module_and_iterables(backend):
    a, b = (backend.load_engine(EngineSource(ENGINE)) for _ in range(2))
    assert engines_of(Model(a, b)) == [a, b]
    assert engines_of([a, [b]]) == [a, b]
    with enable_cudagraphs(Model(a, b)) as target:
        assert isinstance(target, Model)
        assert a.runtime_settings.cuda_graph_strategy is WHOLE
        assert b.runtime_settings.cuda_graph_strategy is WHOLE
    assert a.runtime_settings == b.runtime_settings == RuntimeSettings()


def test_contexts_engines_of_rejects_other_things():
    with pytest.raises(TypeError, match="got int"):
        engines_of(3)


def test_contexts_setters_persist_and_drop_context(engine):
    run(engine)
    set_cuda_graph_strategy(engine, "whole_graph_capture")
    assert not engine.has_context()
    set_dynamic_shapes_kernel_specialization_strategy(engine, DynamicShapesKernelSpecializationStrategy.EAGER)
    run(engine)
    assert engine.runtime_settings == RuntimeSettings(WHOLE, "eager")
    assert engine.context_creations == 2
    set_cuda_graph_strategy(engine, WHOLE)  # same value: no-op
    assert engine.has_context()
    with pytest.raises(ValueError, match="cuda_graph_strategy must be one of"):
        set_cuda_graph_strategy(engine, "sometimes")


def test_contexts_setters_refuse_missing_capability():
    backend = MemoryBackend(without=("supports_dynamic_shapes_kernel_specialization_strategy",))
    engine = backend.load_engine(EngineSource(ENGINE))
    with pytest.raises(CapabilityError, match="dynamic_shapes_kernel_specialization_strategy"):
        set_dynamic_shapes_kernel_specialization_strategy(engine, "eager")
    assert engine.runtime_settings == RuntimeSettings()


def test_contexts_old_setting_names_warn_and_still_work(engine):
    with pytest.warns(DeprecationWarning, match="set_dynamic_shapes_kernel_specialization_strategy"):
        set_dynamic_shapes_kernel_strategy(engine, "eager")
    assert engine.runtime_settings.dynamic_shapes_kernel_specialization_strategy.value == "eager"
    caps = engine.backend.capabilities
    new = caps.supports_dynamic_shapes_kernel_specialization_strategy
    with pytest.warns(DeprecationWarning, match="supports_dynamic_shapes_kernel_specialization_strategy"):
        assert caps.supports_dynamic_shapes_strategy is new
    assert type(caps).supports_dynamic_shapes_strategy.fset is None  # read-only


# -- runtime_cache ---------------------------------------------------------------------------


def _payload(backend) -> bytes:
    cache = RuntimeCache()
    engine = backend.load_engine(EngineSource(ENGINE), settings={"runtime_cache": cache})
    run(engine)
    return cache.serialize()


def test_contexts_runtime_cache_loads_on_enter_and_saves_on_exit(backend, engine, tmp_path):
    path = tmp_path / "cache.bin"
    seed = RuntimeCache(path)
    seed.load_bytes(_payload(backend))
    seed.save()
    with runtime_cache(engine, path) as cache:
        assert isinstance(cache, RuntimeCache)
        assert engine.runtime_settings.runtime_cache is cache
        assert cache.has_pending and not cache.has_cache()
        assert cache.serialize() == seed.serialize()
        run(engine)
        assert cache.has_cache() and cache.drain_count == 1
        engine.execute(np.ones((2, 3), np.float32))
        saved_bytes = cache.serialize()
    assert engine.runtime_settings.runtime_cache is None
    reloaded = RuntimeCache(path)
    assert reloaded.load()
    assert reloaded.serialize() == saved_bytes


def test_contexts_runtime_cache_missing_file_is_empty(engine, tmp_path):
    path = tmp_path / "sub" / "new.bin"
    with runtime_cache(engine, path) as cache:
        assert not cache.has_pending
        run(engine)
        produced = cache.serialize()
    assert produced
    assert path.exists()


def test_contexts_runtime_cache_save_failure_warns(engine, tmp_path):
    blocker = tmp_path / "not_a_dir"
    blocker.write_bytes(b"")
    with pytest.warns(CacheWarning), runtime_cache(engine, blocker / "cache.bin"):
        run(engine)
    assert engine.runtime_settings.runtime_cache is None


def test_contexts_runtime_cache_save_failure_never_hides_block_error(engine, tmp_path):
    blocker = tmp_path / "not_a_dir"
    blocker.write_bytes(b"")
    with pytest.warns(CacheWarning), pytest.raises(ZeroDivisionError):
        with runtime_cache(engine, blocker / "cache.bin"):
            run(engine)
            1 / 0  # noqa: B018
    assert engine.runtime_settings == RuntimeSettings()


def test_contexts_runtime_cache_shared_by_engines(backend, tmp_path):
    a, b = (backend.load_engine(EngineSource(ENGINE)) for _ in range(2))
    path = tmp_path / "shared.bin"
    seed = RuntimeCache(path)
    seed.load_bytes(_payload(backend))
    seed.save()
    with runtime_cache(Model(a, b), path) as cache:
        assert a.runtime_settings.runtime_cache is cache is b.runtime_settings.runtime_cache
        run(a)
        run(b)
        assert cache.drain_count == 1
        assert backend.handles[-1].deserialize_calls == 1
    native_a = a.created_contexts[0].config.runtime_cache
    assert native_a is b.created_contexts[0].config.runtime_cache
    assert a.runtime_settings.runtime_cache is None and b.runtime_settings.runtime_cache is None


def test_contexts_runtime_cache_stream(backend, engine):
    stream = io.BytesIO()
    with runtime_cache(engine, stream) as cache:
        run(engine)
        produced = cache.serialize()
    again = RuntimeCache()
    stream.seek(0)
    assert again.load_from_stream(stream)
    assert again.serialize() == produced


def test_contexts_runtime_cache_existing_handle(engine):
    cache = RuntimeCache()
    with runtime_cache(engine, cache) as got:
        assert got is cache
        run(engine)
    assert cache.has_cache()


def test_contexts_runtime_cache_default_location(backend, engine, tmp_path, monkeypatch):
    seen = []

    def fake_default(cls, which, device=None):
        seen.append(which)
        return RuntimeCache(tmp_path / "default.bin")

    monkeypatch.setattr(RuntimeCache, "default", classmethod(fake_default))
    with runtime_cache(engine) as cache:
        run(engine)
    assert seen == [backend]
    assert cache.path == tmp_path / "default.bin"
    assert (tmp_path / "default.bin").exists()


def test_contexts_runtime_cache_needs_capability(tmp_path):
    engine = MemoryBackend(without=("supports_runtime_cache",)).load_engine(EngineSource(ENGINE))
    with pytest.raises(CapabilityError, match="runtime_cache"), runtime_cache(engine, tmp_path / "c.bin"):
        pass
    assert engine.runtime_settings == RuntimeSettings()


def test_contexts_exported_from_package():
    for name in ("runtime_config", "enable_cudagraphs", "runtime_cache", "set_cuda_graph_strategy"):
        assert getattr(trt_runtime, name) is globals()[name]


def test_contexts_cache_path_settings_share_one_cache(backend, tmp_path):
    path = tmp_path / "by_path.bin"
    a, b = (backend.load_engine(EngineSource(ENGINE), settings={"runtime_cache": path}) for _ in range(2))
    assert a.runtime_settings == b.runtime_settings  # paths compare by value
    run(a)
    run(b)
    assert a.created_contexts[0].config.runtime_cache is b.created_contexts[0].config.runtime_cache
    assert RuntimeCache.shared(path).has_cache()
    assert len(backend.handles) == 1
