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


@pytest.mark.parametrize("backend_name", ["python", "torchbind"])
def test_gpu_serve_auto_pads_batches_under_the_outer_graph(served: Any, backend_name: str) -> None:
    """``trt-runtime serve``'s default on each backend: an engine that can batch opens with the outer
    graph on and its batches padded to powers of two; batches of mixed row counts come back right,
    each padded size captured once."""
    from _gpu_stress import usable_backend

    from trt_runtime.serve import ServeOptions, open_engine
    from trt_runtime.serve.batching import BatchRunner
    from trt_runtime.serve.replica import call_modes

    usable_backend(backend_name)
    built, model, _server = served
    options = ServeOptions(backend=backend_name, outer_graph="auto", pad_batches="auto", max_batch=64,
                           runtime_cache=None)
    engine, _ = open_engine(built.plan, options)
    try:
        modes = call_modes(engine, options)
        assert modes.outer_graph and modes.pad_batches and not modes.copy_outputs
        runner = BatchRunner(engine.execute, model.checker, copy_outputs=False, pad_rows=True)
        rtol, atol = built.tolerance
        captured = engine.graph_captures
        for rows in ([1, 2, 2], [3], [1, 1, 1, 1, 1], [2, 2, 3], [4]):  # 5, 3, 5, 7, 4 rows -> 8, 4, 8, 8, 4
            requests = [(built.random_inputs(batch=n, seed=10 * n + i)[0],) for i, n in enumerate(rows)]
            answers = runner.run(requests)
            for (x,), answer in zip(requests, answers, strict=True):
                assert not isinstance(answer, BaseException), answer
                np.testing.assert_allclose(np.asarray(answer[0]).astype(np.float64), built.reference(x)[0],
                                           rtol=rtol, atol=atol)
        assert engine.graph_captures - captured <= 2, "one capture per padded size (4 and 8) at most"
    finally:
        engine.close()


@pytest.mark.parametrize("backend_name", ["python", "torchbind"])
def test_gpu_overlapped_calls_in_flight_together_match_the_reference(served: Any, backend_name: str) -> None:
    """The engine process's overlapped calls (:class:`CudaStager`) on each backend: five batches
    started back to back before any is collected, two of them of the same padded size (the same
    static buffers, reused in stream order), each answer within tolerance of the reference."""
    from _gpu_stress import usable_backend

    from trt_runtime.serve import ServeOptions, open_engine
    from trt_runtime.serve.batching import BatchRunner
    from trt_runtime.serve.local.staging import open_stager, stager_refusal

    usable_backend(backend_name)
    built, model, _server = served
    options = ServeOptions(backend=backend_name, outer_graph="auto", pad_batches="auto", max_batch=64,
                           runtime_cache=None)
    engine, _ = open_engine(built.plan, options)
    stager = None
    try:
        assert stager_refusal(engine, 64) is None
        stager = open_stager(engine, 64)
        assert stager is not None and engine.outer_graph.outputs == "view"
        runner = BatchRunner(engine.execute, model.checker, pad_rows=True, stager=stager)
        rtol, atol = built.tolerance
        batches = [[1, 2, 2], [3], [1, 1, 1, 1, 1], [2, 2, 3], [40, 9]]  # 8, 4, 8, 8, 64 rows
        requests = [[(built.random_inputs(batch=n, seed=100 * b + i)[0],) for i, n in enumerate(rows)]
                    for b, rows in enumerate(batches)]
        started = [runner.start(batch) for batch in requests]
        assert all(s.calls for s in started) and stager.in_use() == 5
        for batch, run in zip(requests, started, strict=True):
            while not run.done():
                pass
            for (x,), answer in zip(batch, run.finish(), strict=True):  # (read before the buffers go back)
                assert not isinstance(answer, BaseException), answer
                np.testing.assert_allclose(np.asarray(answer[0]).astype(np.float64), built.reference(x)[0],
                                           rtol=rtol, atol=atol)
            run.release()
        assert stager.in_use() == 0
    finally:
        engine.close()  # (first: the engine may still hold the stager's stream, which closing it destroys)
        if stager is not None:
            stager.close()
