"""Stress by TensorRT's rule for dynamic shapes: a dynamic engine (``dynamic``: float32, two
optimization profiles, batches 1..8 and 9..32) called from 8 threads with batches of both
profiles, at contexts 1, 4 and 8, on both backends; every output is compared with the
float64 reference (0 wrong of 20,400 per backend). With several contexts no two of them
may share a profile while in use: the python backend deserializes the plan once per
context, which ``memory_usage()`` counts (weights x contexts)."""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any

import numpy as np
import pytest

import trt_runtime
from trt_runtime import ContextOverlapWarning

pytestmark = pytest.mark.gpu

THREADS = 8
CALLS = 850  # x 8 threads x 3 context counts = 20,400 outputs per backend
BATCHES = (2, 5, 8, 12, 20, 32)  # both profiles


def _backend(name: str) -> Any:
    status = trt_runtime.backend_status().get(name)
    if status is None:
        pytest.skip(f"the {name!r} backend is not installed")
    if not status:
        pytest.skip(f"the {name!r} backend cannot run here: {status.reason}")
    return trt_runtime.get_backend(name)


@pytest.mark.parametrize("contexts", [1, 4, 8])
@pytest.mark.parametrize("backend_name", ["python", "torchbind"])
def test_gpu_dynamic_contexts_stress(
    backend_name: str, contexts: int, engines: Any, report_measurement: Any
) -> None:
    torch = pytest.importorskip("torch", reason="the stress test calls with torch CUDA tensors")
    backend = _backend(backend_name)
    built = engines("dynamic")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ContextOverlapWarning)
        engine = trt_runtime.load(built.plan, backend, name="dynamic", contexts=contexts)
    rtol, atol = (max(t * 10, 1e-3) for t in built.tolerance)
    wrong = [0] * THREADS
    errors: list[str] = []
    barrier = threading.Barrier(THREADS)

    def work(index: int) -> None:
        try:
            stream = torch.cuda.Stream()
            torch.cuda.set_stream(stream)
            cases = []
            for batch in BATCHES:
                rng = np.random.default_rng(index * 100 + batch)
                host = rng.standard_normal((batch, 16)).astype(np.float32)
                want = np.asarray(built.reference(host)[0], dtype=np.float32)
                cases.append((torch.from_numpy(host).cuda(), torch.from_numpy(want).cuda()))
            stream.synchronize()
            barrier.wait(timeout=120)
            for call in range(CALLS):
                x, want = cases[(index + call) % len(cases)]
                if not torch.allclose(engine(x).float(), want, rtol=rtol, atol=atol):  # syncs
                    wrong[index] += 1
        except Exception as exc:
            errors.append(f"thread {index}: {type(exc).__name__}: {exc}")

    with trt_runtime.load(built.plan, backend, name="dynamic") as single:
        one = single.memory_usage()["weights"]  # the weights of one deserialized engine
    try:
        started = time.perf_counter()
        threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=600)
        seconds = time.perf_counter() - started
        assert not any(t.is_alive() for t in threads), "stress threads did not finish in 600 s"
        usage = engine.memory_usage()
    finally:
        engine.close()
    report_measurement(
        f"dynamic stress {backend_name} contexts={contexts}",
        f"{THREADS}x{CALLS} calls, batches {BATCHES}: {sum(wrong)} wrong, {len(errors)} errors, "
        f"{THREADS * CALLS / seconds:,.0f} calls/s, memory_usage {usage}",
    )
    assert not errors, errors[:3]
    assert sum(wrong) == 0, f"{sum(wrong)} wrong outputs of {THREADS * CALLS} (per thread {wrong})"
    if backend_name == "python" and usage["weights"]:  # an ICudaEngine per context, counted
        assert usage["weights"] == one * contexts, usage
