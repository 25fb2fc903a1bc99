"""Device placement on the GPU host: what one GPU can prove (``device=0`` given, the device
from the blob, the per-model runtime-cache file, a caller thread without a CUDA context
keeping none) and, with two GPUs or more, a caller whose current device differs from the
engine's. docs/concurrency.md, "Device placement"."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

import trt_runtime
from trt_runtime import EngineError, runtime_cache
from trt_runtime.cache import decode
from trt_runtime.formats import pack_tr01

pytestmark = pytest.mark.gpu


def _device_count() -> int:
    from cuda.bindings import runtime

    err, count = runtime.cudaGetDeviceCount()
    return int(count) if int(err) == 0 else 0


def _current_context() -> int:
    from cuda.bindings import driver

    err, ctx = driver.cuCtxGetCurrent()
    assert int(err) == 0
    return int(ctx)


def _compute_capability(index: int) -> str:
    from cuda.core import Device

    cc = Device(index).compute_capability
    return f"{cc[0]}{cc[1]}"


def _check(engine: Any, built: Any) -> None:
    x = built.random_inputs()
    got = np.asarray(engine(*x), dtype=np.float64)
    want = built.reference(*x)[0]
    np.testing.assert_allclose(got, want, rtol=built.tolerance[0] * 10, atol=built.tolerance[1] * 10)


def _blob(built: Any, device_id: int) -> bytes:
    return pack_tr01(built.plan, (*built.inputs, *built.outputs), device_id=device_id)


def test_gpu_device_placement_explicit_device_zero(engines: Any, python_backend: Any) -> None:
    built = engines("mlp_fp32")
    with trt_runtime.load(built.plan, python_backend, device=0) as engine:
        assert engine.device == 0
        _check(engine, built)


def test_gpu_device_placement_device_from_blob(engines: Any, python_backend: Any) -> None:
    built = engines("mlp_fp32")
    with trt_runtime.load(_blob(built, 0), python_backend) as engine:
        assert engine.device == 0
        _check(engine, built)
    count = _device_count()
    with pytest.raises(EngineError, match=rf"names device_id {count}, but this machine has {count} CUDA"):
        trt_runtime.load(_blob(built, count), python_backend)
    with trt_runtime.load(_blob(built, count), python_backend, device=0) as engine:  # override verbatim
        assert engine.device == 0
        _check(engine, built)


def test_gpu_device_placement_cache_file_per_model(engines: Any, python_backend: Any, tmp_path: Any) -> None:
    built = engines("mlp_fp32")
    with trt_runtime.load(built.plan, python_backend, device=0) as engine:
        with runtime_cache(engine, tmp_path):
            _check(engine, built)
    files = list(tmp_path.glob("runtime-cache-*.bin"))
    assert len(files) == 1, files
    sm = _compute_capability(0)
    assert f"-sm{sm}-" in files[0].name
    key, _ = decode(files[0].read_bytes())
    assert key is not None and key.compute_capability.replace(".", "") == sm


def test_gpu_device_placement_load_leaves_a_bare_thread_bare(engines: Any, python_backend: Any) -> None:
    built = engines("mlp_fp32")
    seen: dict[str, Any] = {}

    def worker() -> None:
        seen["before"] = _current_context()
        engine = trt_runtime.load(built.plan, python_backend, device=0)
        seen["after_load"] = _current_context()
        try:
            _check(engine, built)
            seen["ok"] = True
        finally:
            engine.close()

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == {"before": 0, "after_load": 0, "ok": True}


def test_gpu_device_placement_torchbind_device_from_blob(engines: Any) -> None:
    status = trt_runtime.backend_status().get("torchbind")
    if not status:
        pytest.skip(f"the torchbind backend cannot run here: {getattr(status, 'reason', 'not installed')}")
    built = engines("mlp_fp32")
    torch = pytest.importorskip("torch")
    with trt_runtime.load(_blob(built, 0), "torchbind") as engine:
        assert engine.device == 0
        x = [torch.as_tensor(a).cuda() for a in built.random_inputs()]
        got = engine(*x).double().cpu().numpy()
        want = built.reference(*[a.cpu().numpy() for a in x])[0]
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)


# -- two GPUs or more ------------------------------------------------------------------------------
needs_two = pytest.mark.skipif("_device_count() < 2", reason="needs 2 GPUs")


@needs_two
def test_gpu_device_placement_engine_on_other_device_than_caller(engines: Any, python_backend: Any) -> None:
    from cuda.core import Device

    built = engines("mlp_fp32")
    Device(0).set_current()
    with trt_runtime.load(built.plan, python_backend, device=1) as engine:
        assert engine.device == 1
        assert Device().device_id == 0  # the caller is still on device 0 after the load
        _check(engine, built)


@needs_two
def test_gpu_device_placement_two_devices_two_cache_files_when_models_differ(
    engines: Any, python_backend: Any, tmp_path: Any
) -> None:
    built = engines("mlp_fp32")
    loaded = [trt_runtime.load(built.plan, python_backend, device=i) for i in (0, 1)]
    try:
        with runtime_cache(loaded, tmp_path):
            for engine in loaded:
                _check(engine, built)
    finally:
        for engine in loaded:
            engine.close()
    models = {_compute_capability(0), _compute_capability(1)}
    assert len(list(tmp_path.glob("runtime-cache-*.bin"))) == len(models)
