"""The python backend on a real GPU: settings in the live IRuntimeConfig and runtime caches.
Numerics, streams, staging, profiles and errors: test_gpu_python_calls.py."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
import threading
from typing import Any

import numpy as np
import pytest
from _threads import all_at_once

from trt_runtime import RuntimeCache, RuntimeSettings
from trt_runtime.settings import CudaGraphStrategy, DynamicShapesKernelSpecializationStrategy

pytestmark = pytest.mark.gpu


# -- settings through the live IRuntimeConfig -------------------------------------------------


def test_python_backend_settings_round_trip_through_live_runtime_config(load, python_backend) -> None:
    trt = python_backend.tensorrt
    engine = load("mlp_dynamic")
    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    for graph, shapes in itertools.product(CudaGraphStrategy, DynamicShapesKernelSpecializationStrategy):
        wanted = RuntimeSettings(graph, shapes)
        engine.runtime_settings = wanted
        engine.execute(x)
        config = engine.runtime_config
        assert config is not None
        assert config.cuda_graph_strategy == getattr(trt.CudaGraphStrategy, graph.name)
        assert int(config.cuda_graph_strategy) == graph.code
        got = config.dynamic_shapes_kernel_specialization_strategy
        assert got == getattr(trt.DynamicShapesKernelSpecializationStrategy, shapes.name)
        assert int(got) == shapes.code
        assert RuntimeSettings.from_codes(int(got), int(config.cuda_graph_strategy)) == wanted
        assert config.get_runtime_cache() is None  # no cache asked for
        assert engine.runtime_settings == wanted


# -- runtime caches ------------------------------------------------------------------------------


def _count_deserialize(monkeypatch: pytest.MonkeyPatch, cache: RuntimeCache) -> list[int]:
    """The sizes of the bytes loaded into ``cache``'s native handle, as they are loaded. The
    class is patched, so only calls on that cache's handle are kept: under ``pytest -n`` the
    worker's other engines and caches live in the same process."""
    from trt_runtime_backends.python.cache import IRuntimeCacheHandle

    calls: list[int] = []
    original = IRuntimeCacheHandle.deserialize

    def spy(self: Any, data: bytes) -> None:
        if self is cache._state.handle:
            calls.append(len(data))
        original(self, data)

    monkeypatch.setattr(IRuntimeCacheHandle, "deserialize", spy)
    return calls


def test_python_backend_pending_bytes_drained_once_into_live_cache(load, monkeypatch) -> None:
    built_x = np.random.default_rng(1).standard_normal((8, 256)).astype(np.float16)
    first = RuntimeCache()
    engine = load("mlp_fp16", settings=RuntimeSettings(runtime_cache=first))
    engine.execute(built_x)
    assert first.has_cache()
    payload = bytes(first.serialize())
    assert payload

    second = RuntimeCache()
    calls = _count_deserialize(monkeypatch, second)
    second.load_bytes(payload)
    engine.runtime_settings = engine.runtime_settings.merge(runtime_cache=second)
    other = load("mlp_fp16", settings=engine.runtime_settings)
    engine.execute(built_x)
    assert calls == [len(payload)]
    live = engine.runtime_config.get_runtime_cache()
    assert live is not None
    engine.invalidate_context()
    engine.execute(built_x)
    other.execute(built_x)
    assert calls == [len(payload)], "pending bytes must be drained exactly once"
    assert second.drain_count == 1
    assert other.native_runtime_cache is engine.native_runtime_cache


class _CountingConfig:
    """Wraps an IRuntimeConfig and counts create_runtime_cache calls."""

    def __init__(self, config: Any, counter: list[int], lock: threading.Lock) -> None:
        self._config = config
        self._counter = counter
        self._lock = lock

    def create_runtime_cache(self) -> Any:
        with self._lock:
            self._counter.append(1)
        return self._config.create_runtime_cache()


def test_python_backend_ensure_materialized_from_32_threads(load, python_backend, monkeypatch) -> None:
    engine = load("mlp_fp16", settings=RuntimeSettings(runtime_cache=RuntimeCache()))
    x = np.random.default_rng(2).standard_normal((8, 256)).astype(np.float16)
    engine.execute(x)
    payload = bytes(engine.runtime_settings.runtime_cache.serialize())

    shared = RuntimeCache()
    calls = _count_deserialize(monkeypatch, shared)
    shared.load_bytes(payload)
    key = python_backend.cache_key(engine.device)
    created: list[int] = []
    lock = threading.Lock()
    configs = [
        _CountingConfig(engine.trt_engine.create_runtime_config(), created, lock) for _ in range(32)
    ]
    results, errors = all_at_once(
        lambda i: shared.ensure_materialized(configs[i], backend=python_backend, key=key), 32)
    assert not errors, errors
    assert len(results) == 32
    assert len(created) == 1, f"{len(created)} IRuntimeCache objects were created"
    assert calls == [len(payload)], "pending bytes must be loaded exactly once"
    assert all(r is results[0] for r in results)
    assert shared.drain_count == 1


def test_python_backend_corrupt_cache_bytes_raise_cache_error(load) -> None:
    from trt_runtime_backends.python.cache import IRuntimeCacheHandle

    from trt_runtime import CacheError

    engine = load("mlp_fp16")
    handle = IRuntimeCacheHandle(engine.backend.logger)
    handle.ensure_materialized(engine.trt_engine.create_runtime_config())
    with pytest.raises(CacheError, match="rejected 70 bytes"):
        handle.deserialize(b"garbage" * 10)
    assert handle.deserialize_count == 0


_FIRST_RUN = textwrap.dedent(
    """
    import json, sys, time
    clock = time.perf_counter
    t0 = clock()
    import numpy as np
    import trt_runtime
    from trt_runtime import EngineSource, get_backend

    plan_path, cache_path = sys.argv[1], sys.argv[2]
    t_import = clock() - t0
    t0 = clock()
    backend = get_backend("python")
    engine = backend.load_engine(EngineSource(open(plan_path, "rb").read(), name="resnet18"))
    t_load = clock() - t0
    x = np.random.default_rng(0).standard_normal(engine.inputs[0].shape).astype(np.float16)
    t0 = clock()
    with trt_runtime.runtime_cache(engine, cache_path) as cache:
        t_cache_file = clock() - t0
        start = clock()
        engine.ensure_context()  # runtime config, runtime cache (drained here), context
        t_context = clock() - start
        start = clock()
        engine.execute(x)  # stage, first enqueue (kernel loading), copy back, sync
        t_execute = clock() - start
        start = clock()
        engine.execute(x)
        second = clock() - start
        drained = cache.drain_count
    breakdown = {
        "import_s": t_import, "load_engine_s": t_load, "cache_file_s": t_cache_file,
        **engine.context_timings, "first_execute_s": t_execute,
    }
    print(json.dumps({"first_s": t_context + t_execute, "second_s": second, "drained": drained,
                      "breakdown": breakdown}))
    """
)


def _first_run(plan: str, cache: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", _FIRST_RUN, plan, cache], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ms(breakdown: dict[str, float]) -> str:
    return ", ".join(f"{k.removesuffix('_s')} {v * 1e3:.1f} ms" for k, v in breakdown.items())


@pytest.mark.slow
def test_python_backend_warm_cache_first_inference_10x_faster(engines, tmp_path, report_measurement) -> None:
    """First inference (context creation + first execute) in a fresh process, without and
    then with the runtime cache the first process saved."""
    plan = str(engines.path("resnet18_fp16"))
    cache = str(tmp_path / "resnet18.trtcache")
    cold = _first_run(plan, cache)
    assert os.path.getsize(cache) > 0, "the cold run must save the cache"
    warm = _first_run(plan, cache)
    assert warm["drained"] == 1
    ratio = cold["first_s"] / warm["first_s"]
    summary = (
        f"cold first inference {cold['first_s'] * 1e3:.1f} ms, warm {warm['first_s'] * 1e3:.1f} ms, "
        f"ratio {ratio:.1f}x (steady state {cold['second_s'] * 1e3:.2f} ms)"
    )
    report_measurement("python backend cold vs warm runtime cache (resnet18 fp16, 224x224)", summary)
    report_measurement("python backend cold first inference breakdown", _ms(cold["breakdown"]))
    report_measurement("python backend warm first inference breakdown", _ms(warm["breakdown"]))
    assert ratio >= 10, summary
