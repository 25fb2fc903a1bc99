"""The local server on the GPU: the mlp engine (python backend), one engine process per GPU, its
calls overlapped (``--overlap``).

What the CPU tests prove with the memory backend, on real TensorRT-RTX: concurrent clients
(binary KServe requests and ``.npy`` bodies) get answers within the builder's tolerance of
the float64 reference, batches larger than one form, every visible GPU has its engine
process, SIGINT exits 0.
"""

from __future__ import annotations

import concurrent.futures
import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serve"))
from _local_server import ServerProcess
from _serve_support import load_npy, post
from _serve_support import npy as npy_bytes

pytest.importorskip("uvicorn", reason="the local server needs the serve extra: pip install -e '.[serve]'")
PORT = 18627


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from trt_runtime import builders

    built = builders.build_mlp(width=256, layers=8, batch=None, dtype="float16", max_batch=64)
    where = tmp_path_factory.mktemp("serve-local")
    (where / "mlp.plan").write_bytes(built.plan)
    server = ServerProcess(where / "mlp.plan", PORT, "--workers", "2", "--gpus", "all", "--backend", "python",
                           "--overlap",
                           "--runtime-cache", str(where / "runtime.cache"), "--max-queue-delay-us", "2000",
                           ready_s=300)
    yield built, server
    assert server.stop() == 0, "".join(server.stderr)[-3000:]


def test_gpu_serve_local_one_engine_process_per_gpu(served: Any) -> None:
    from cuda.bindings import runtime

    _built, server = served
    _err, count = runtime.cudaGetDeviceCount()
    assert len(server.doc["pids"]["engines"]) == count == len(server.doc["gpus"])
    # the default for an engine that can batch: its batches padded and run under the outer CUDA graph
    assert (server.doc["outer_graph"], server.doc["pad_batches"]) == (True, True)
    assert server.doc["overlap"] is True  # (--overlap: the loop starts each call and collects it later)


def test_gpu_serve_local_concurrent_answers_match_the_reference(served: Any) -> None:
    """Binary KServe requests (the GPU host has no tritonclient: the request is built here)
    and ``.npy`` bodies on ``POST /``, from 32 threads at once."""
    built, server = served
    rtol, atol = built.tolerance
    inputs = [built.random_inputs(batch=1, seed=i)[0] for i in range(256)]
    output = str(built.outputs[0].name)

    def kserve(x: np.ndarray) -> np.ndarray:
        header = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP16",
                                         "parameters": {"binary_data_size": x.nbytes}}],
                             "outputs": [{"name": output, "parameters": {"binary_data": True}}]}).encode()
        request = urllib.request.Request(
            f"{server.url}/v2/models/mlp/infer", data=header + x.tobytes(), method="POST",
            headers={"Content-Type": "application/octet-stream",
                     "Inference-Header-Content-Length": str(len(header))})
        with urllib.request.urlopen(request, timeout=60) as response:
            length = int(response.headers["Inference-Header-Content-Length"])
            body = response.read()
        doc = json.loads(body[:length])
        (meta,) = doc["outputs"]
        return np.frombuffer(body[length:], np.float16).reshape(meta["shape"])

    def npy(x: np.ndarray) -> np.ndarray:
        status, body, _ = post(server.url + "/", npy_bytes(x), "application/x-npy")
        assert status == 200, body
        return load_npy(body)

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(lambda ix: (kserve if ix[0] % 2 else npy)(ix[1]), enumerate(inputs)))
    for x, got in zip(inputs, answers, strict=True):
        np.testing.assert_allclose(got.astype(np.float64), built.reference(x)[0], rtol=rtol, atol=atol)
    _status, metrics = server.get("/metrics")
    counts = {line.split(" ")[0]: float(line.rsplit(" ", 1)[1]) for line in metrics.decode().splitlines()
              if line.startswith("trt_runtime_batch_size_") and not line.startswith("#")}
    ones = sum(v for k, v in counts.items()
               if k.startswith("trt_runtime_batch_size_bucket") and 'le="1.0"' in k)
    total = sum(v for k, v in counts.items() if k.startswith("trt_runtime_batch_size_count"))
    assert total > 0 and ones < total, counts  # some engine calls ran several requests
