"""Ray Serve on the GPU: the mlp engine (python backend) in two replicas sharing one GPU.

Proves on real TensorRT-RTX what the CPU tests prove with the memory backend: concurrent
handle and HTTP clients get their own results (against the builder's float64 reference),
batches larger than one form, torch tensors come back as torch tensors, and each replica
warmed the per-node runtime cache.
"""

from __future__ import annotations

import io
import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only (before Ray is imported)
pytest.importorskip("ray.serve",
                    reason="Ray Serve is not installed: pip install -c constraints.txt -e '.[serve]'")

PORT = 18625


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    import ray
    from ray import serve

    from trt_runtime import builders
    from trt_runtime.serve import ServeOptions, build_app

    built = builders.build_mlp(width=256, layers=8, batch=None, dtype="float16", max_batch=64)
    cache = tmp_path_factory.mktemp("serve-cache") / "runtime.cache"
    ray.init(address="local", include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1",
             num_gpus=1)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    options = ServeOptions(backend="python", max_batch=32, batch_wait_ms=20, runtime_cache=cache)
    handle = serve.run(build_app(built.plan, options, replicas=2, gpus_per_replica=0.5, cpus_per_replica=1),
                       name="mlp", route_prefix="/mlp")
    yield built, handle, cache
    serve.shutdown()
    ray.shutdown()


def test_gpu_serve_concurrent_requests_match_the_reference(served: Any) -> None:
    built, handle, cache = served
    rtol, atol = built.tolerance
    inputs = [built.random_inputs(batch=1 + i % 3, seed=i)[0] for i in range(96)]
    responses = [handle.remote(x) for x in inputs]
    for x, response in zip(inputs, responses, strict=True):
        got = response.result(timeout_s=60)
        assert got.dtype == x.dtype and got.shape == (x.shape[0], 256)
        want = built.reference(x)[0]
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol * 10, atol=atol * 10)
    sizes: dict[str, int] = {}
    for _ in range(8):  # either replica may answer
        stats = handle.stats.remote().result()
        for k, v in stats["batch_sizes"].items():
            sizes[k] = max(sizes.get(k, 0), v)
    assert any(int(k) > 1 for k in sizes), sizes
    assert Path(cache).stat().st_size > 0


def test_gpu_serve_http_npy_and_torch_tensors(served: Any) -> None:
    built, handle, _cache = served
    x = built.random_inputs(batch=2, seed=7)[0]
    buffer = io.BytesIO()
    np.save(buffer, x)
    request = urllib.request.Request(f"http://127.0.0.1:{PORT}/mlp/", data=buffer.getvalue(),
                                     headers={"Content-Type": "application/x-npy"})
    with urllib.request.urlopen(request, timeout=60) as response:
        got = np.load(io.BytesIO(response.read()))
    rtol, atol = built.tolerance
    np.testing.assert_allclose(got.astype(np.float64), built.reference(x)[0], rtol=rtol * 10, atol=atol * 10)
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/mlp/ready", timeout=60) as response:
        assert json.loads(response.read())["backend"] == "python"
    torch = pytest.importorskip("torch")
    out = handle.infer.remote(torch.from_numpy(x)).result(timeout_s=60)
    assert isinstance(out, torch.Tensor) and tuple(out.shape) == (2, 256)
