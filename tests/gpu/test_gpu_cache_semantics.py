"""What TensorRT-RTX's IRuntimeCache does when bytes are loaded into a live cache (issue 7.3)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def _runtime():
    trt = pytest.importorskip("tensorrt_rtx", reason="tensorrt_rtx is not installed")
    core = pytest.importorskip("cuda.core", reason="cuda-core is not installed")
    try:
        device = core.Device(0)
        device.set_current()
    except Exception as exc:  # no driver, no device
        pytest.skip(f"no CUDA GPU: {exc}")
    return trt, device


def _engine(trt):
    import numpy as np

    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    x = network.add_input("x", trt.float16, (-1, 128))
    rng = np.random.default_rng(1)
    t = x
    for _ in range(3):
        weights = rng.standard_normal((128, 128)).astype(np.float16)
        w = network.add_constant((128, 128), trt.Weights(weights))
        none = trt.MatrixOperation.NONE
        t = network.add_matrix_multiply(t, none, w.get_output(0), none)
        t = t.get_output(0)
    t.name = "y"
    network.mark_output(t)
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    profile.set_shape("x", (1, 128), (8, 128), (64, 128))
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    return trt.Runtime(logger).deserialize_cuda_engine(plan)


def _run(engine, device, cache, batch):
    config = engine.create_runtime_config()
    config.set_runtime_cache(cache)
    context = engine.create_execution_context(config)
    stream = device.create_stream()
    x = device.allocate(batch * 128 * 2, stream=stream)
    y = device.allocate(batch * 128 * 2, stream=stream)
    context.set_input_shape("x", (batch, 128))
    context.set_tensor_address("x", int(x.handle))
    context.set_tensor_address("y", int(y.handle))
    assert context.execute_async_v3(int(stream.handle))
    stream.sync()


def test_gpu_cache_deserialize_replaces_live_entries():
    trt, device = _runtime()
    engine = _engine(trt)

    def fresh():
        return engine.create_runtime_config().create_runtime_cache()

    cache_a, cache_b = fresh(), fresh()
    _run(engine, device, cache_a, batch=8)
    _run(engine, device, cache_b, batch=3)
    a, b = bytes(cache_a.serialize()), bytes(cache_b.serialize())
    assert a != b

    live = fresh()
    assert live.deserialize(a)
    assert live.deserialize(b)
    after = bytes(live.serialize())
    print(f"cache sizes: a={len(a)} b={len(b)} a-then-b={len(after)}")
    # Merging would keep A's entries (the result would differ from B alone);
    # replacing leaves exactly B. The runtime cache code relies on this finding
    # (PythonBackend.capabilities.cache_deserialize_merges is False).
    assert after == b
