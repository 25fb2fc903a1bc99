"""Stress: 16 threads x 500 calls on one engine with mixed shapes, both backends, eager and
under the outer CUDA graph, with one context and with several; every output is compared
with the float64 reference and the wrong ones counted (issue 18's target: 0).

Each thread calls on its own torch stream (made current in that thread) with inputs of its
own, cycling five batch sizes of the dynamic MLP (``mlp_dynamic``: fp32, batch 1..64).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import numpy as np
import pytest

import trt_runtime
from trt_runtime import enable_cudagraphs

pytestmark = pytest.mark.gpu

THREADS = 16
CALLS = 500
BATCHES = (1, 3, 8, 17, 64)


def _backend(name: str) -> Any:
    status = trt_runtime.backend_status().get(name)
    if status is None:
        pytest.skip(f"the {name!r} backend is not installed")
    if not status:
        pytest.skip(f"the {name!r} backend cannot run here: {status.reason}")
    return trt_runtime.get_backend(name)


@pytest.mark.parametrize("contexts", [1, 4], ids=["1-context", "4-contexts"])
@pytest.mark.parametrize("mode", ["eager", "outer"])
@pytest.mark.parametrize("backend_name", ["python", "torchbind"])
def test_gpu_concurrency_stress(
    backend_name: str, mode: str, contexts: int, engines: Any, report_measurement: Any
) -> None:
    torch = pytest.importorskip("torch", reason="the stress test calls with torch CUDA tensors")
    backend = _backend(backend_name)
    caps = backend.capabilities
    if contexts > 1 and not caps.supports_multiple_contexts:
        pytest.skip(f"backend {backend_name!r} lacks supports_multiple_contexts")
    if mode == "outer" and not caps.supports_outer_cuda_graph:
        pytest.skip(f"backend {backend_name!r} lacks supports_outer_cuda_graph")
    built = engines("mlp_dynamic")
    kwargs = {"contexts": contexts} if contexts > 1 else {}
    engine = trt_runtime.load(built.plan, backend, name="mlp_dynamic", **kwargs)
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
                host = (
                    np.random.default_rng(index * 100 + batch).standard_normal((batch, 64)).astype(np.float32)
                )
                want = np.asarray(built.reference(host.astype(np.float64))[0], dtype=np.float32)
                cases.append((torch.from_numpy(host).cuda(), torch.from_numpy(want).cuda()))
            stream.synchronize()
            barrier.wait(timeout=120)
            for call in range(CALLS):
                x, want = cases[(index + call) % len(cases)]
                y = engine(x)
                if not torch.allclose(y.float(), want, rtol=rtol, atol=atol):  # syncs the stream
                    wrong[index] += 1
        except Exception as exc:
            errors.append(f"thread {index}: {type(exc).__name__}: {exc}")

    try:
        with enable_cudagraphs(engine, outer="copy") if mode == "outer" else contextlib.nullcontext():
            started = time.perf_counter()
            threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(THREADS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=600)
            seconds = time.perf_counter() - started
            assert not any(t.is_alive() for t in threads), "stress threads did not finish in 600 s"
    finally:
        engine.close()
    report_measurement(
        f"stress {backend_name} {mode} contexts={contexts}",
        f"{THREADS}x{CALLS} calls, batches {BATCHES}: {sum(wrong)} wrong, {len(errors)} errors, "
        f"{THREADS * CALLS / seconds:,.0f} calls/s",
    )
    assert not errors, errors[:3]
    assert sum(wrong) == 0, f"{sum(wrong)} wrong outputs of {THREADS * CALLS} (per thread {wrong})"
