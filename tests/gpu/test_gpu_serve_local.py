"""The local server on the GPU: the mlp engine (python backend), one engine process per GPU.

What the CPU tests prove with the memory backend, on real TensorRT-RTX: tritonclient gets
answers within the builder's tolerance of the float64 reference from concurrent clients,
batches larger than one form, every visible GPU has its engine process, SIGINT exits 0.
"""

from __future__ import annotations

import concurrent.futures
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serve"))
from _local_server import ServerProcess

pytest.importorskip("uvicorn", reason="the local server needs the serve extra: pip install -e '.[serve]'")
PORT = 18627


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from trt_runtime import builders

    built = builders.build_mlp(width=256, layers=8, batch=None, dtype="float16", max_batch=64)
    where = tmp_path_factory.mktemp("serve-local")
    (where / "mlp.plan").write_bytes(built.plan)
    server = ServerProcess(where / "mlp.plan", PORT, "--workers", "2", "--gpus", "all", "--backend", "python",
                           "--runtime-cache", str(where / "runtime.cache"), "--max-queue-delay-us", "2000",
                           ready_s=300)
    yield built, server
    assert server.stop() == 0, "".join(server.stderr)[-3000:]


def test_gpu_serve_local_one_engine_process_per_gpu(served: Any) -> None:
    from cuda.bindings import runtime

    _built, server = served
    _err, count = runtime.cudaGetDeviceCount()
    assert len(server.doc["pids"]["engines"]) == count == len(server.doc["gpus"])


def test_gpu_serve_local_tritonclient_concurrent_answers_match_the_reference(served: Any) -> None:
    import tritonclient.http as httpclient

    built, server = served
    rtol, atol = built.tolerance
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"), concurrency=16)
    inputs = [built.random_inputs(batch=1, seed=i)[0] for i in range(256)]

    def one(x: np.ndarray) -> np.ndarray:
        tensor = httpclient.InferInput("x", list(x.shape), "FP16")
        tensor.set_data_from_numpy(x, binary_data=True)
        return client.infer("mlp", [tensor]).as_numpy(server_output_name(built))

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(one, inputs))
    for x, got in zip(inputs, answers, strict=True):
        np.testing.assert_allclose(got.astype(np.float64), built.reference(x)[0], rtol=rtol, atol=atol)
    client.close()
    _status, metrics = server.get("/metrics")
    counts = {line.split(" ")[0]: float(line.rsplit(" ", 1)[1]) for line in metrics.decode().splitlines()
              if line.startswith("trt_runtime_batch_size_") and not line.startswith("#")}
    ones = sum(v for k, v in counts.items()
               if k.startswith("trt_runtime_batch_size_bucket") and 'le="1.0"' in k)
    total = sum(v for k, v in counts.items() if k.startswith("trt_runtime_batch_size_count"))
    assert total > 0 and ones < total, counts  # some engine calls ran several requests


def server_output_name(built: Any) -> str:
    return str(built.outputs[0].name)
