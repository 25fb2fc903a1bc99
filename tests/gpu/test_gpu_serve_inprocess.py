"""The request layer on the GPU in one process: the mlp engine (python backend, fp16) behind
InProcessServer, spoken to in the Open Inference Protocol with binary FP16 tensors.

Raw HTTP (the GPU host has no tritonclient): concurrent clients get answers within the
builder's tolerance of the float64 reference, batches larger than one form, and a request
with the wrong datatype is refused with 400 before it reaches the engine.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import pytest

pytest.importorskip("uvicorn", reason="serving needs the extra: pip install -c constraints.txt -e '.[serve]'")


@pytest.fixture(scope="module")
def served() -> Any:
    import trt_runtime
    from trt_runtime import builders
    from trt_runtime.serve import InProcessServer, ModelInfo

    built = builders.build_mlp(width=256, layers=8, batch=None, dtype="float16", max_batch=64)
    engine = trt_runtime.load(built.plan, "python")
    engine.ensure_context()
    model = ModelInfo.from_engine(engine, "mlp", max_batch=64)
    with InProcessServer(engine, model, max_queue_delay_us=500) as server:
        yield built, model, server
    engine.close()


def _infer(url: str, name: str, x: np.ndarray, datatype: str = "FP16") -> tuple[int, Any]:
    head = json.dumps({
        "inputs": [{"name": name, "datatype": datatype, "shape": list(x.shape),
                    "parameters": {"binary_data_size": x.nbytes}}],
        "parameters": {"binary_data_output": True},
    }).encode()
    request = urllib.request.Request(
        url + "/v2/models/mlp/infer", data=head + x.tobytes(), method="POST",
        headers={"Content-Type": "application/octet-stream",
                 "Inference-Header-Content-Length": str(len(head))},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            body = response.read()
            split = int(response.headers["Inference-Header-Content-Length"])
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    doc = json.loads(body[:split])
    out = doc["outputs"][0]
    assert out["datatype"] == "FP16"
    return 200, np.frombuffer(body[split:], np.float16).reshape(out["shape"])


def test_gpu_inprocess_concurrent_binary_fp16_requests_match_the_reference(served: Any) -> None:
    built, model, server = served
    name = model.input_names[0]
    rtol, atol = built.tolerance
    inputs = [built.random_inputs(batch=1, seed=i)[0] for i in range(256)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=32) as pool:
        answers = list(pool.map(lambda x: _infer(server.url, name, x), inputs))
    for x, (status, got) in zip(inputs, answers, strict=True):
        assert status == 200, got
        want = built.reference(x)[0]
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol * 10, atol=atol * 10)
    text = urllib.request.urlopen(server.url + "/metrics", timeout=30).read().decode()
    found = re.search(r'trt_runtime_batch_size_count\{model="mlp"\} (\S+)', text)
    assert found, text
    calls = float(found.group(1))
    assert calls < 256, f"256 batch-1 requests from 32 clients took {calls} engine calls"


def test_gpu_inprocess_wrong_datatype_is_400(served: Any) -> None:
    built, model, server = served
    x = built.random_inputs(batch=1, seed=0)[0].astype(np.float32)
    status, answer = _infer(server.url, model.input_names[0], x, datatype="FP32")
    assert status == 400 and "has datatype FP16; got 'FP32'" in answer["error"]
