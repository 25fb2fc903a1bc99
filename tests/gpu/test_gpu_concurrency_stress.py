"""Stress: 16 threads x 500 calls on one engine with mixed shapes, both backends, eager and
under the outer CUDA graph, with one context and with several; every output is compared
with the float64 reference and the wrong ones counted (issue 18's target: 0).

Each thread calls on its own torch stream (made current in that thread) with inputs of its
own, cycling five batch sizes of the dynamic MLP (``mlp_dynamic``: fp32, batch 1..64).
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from _gpu_stress import report_and_check, stress, usable_backend

import trt_runtime
from trt_runtime import enable_cudagraphs

pytestmark = pytest.mark.gpu

THREADS = 16
CALLS = 500
BATCHES = (1, 3, 8, 17, 64)


@pytest.mark.parametrize("contexts", [1, 4], ids=["1-context", "4-contexts"])
@pytest.mark.parametrize("mode", ["eager", "outer"])
@pytest.mark.parametrize("backend_name", ["python", "torchbind"])
def test_gpu_concurrency_stress(
    backend_name: str, mode: str, contexts: int, engines: Any, report_measurement: Any
) -> None:
    torch = pytest.importorskip("torch", reason="the stress test calls with torch CUDA tensors")
    backend = usable_backend(backend_name)
    caps = backend.capabilities
    if contexts > 1 and not caps.supports_multiple_contexts:
        pytest.skip(f"backend {backend_name!r} lacks supports_multiple_contexts")
    if mode == "outer" and not caps.supports_outer_cuda_graph:
        pytest.skip(f"backend {backend_name!r} lacks supports_outer_cuda_graph")
    built = engines("mlp_dynamic")
    kwargs = {"contexts": contexts} if contexts > 1 else {}
    engine = trt_runtime.load(built.plan, backend, name="mlp_dynamic", **kwargs)
    try:
        with enable_cudagraphs(engine, outer="copy") if mode == "outer" else contextlib.nullcontext():
            result = stress(torch, engine, built, threads=THREADS, calls=CALLS, batches=BATCHES, width=64)
    finally:
        engine.close()
    report_and_check(report_measurement, f"stress {backend_name} {mode} contexts={contexts}", result,
                     threads=THREADS, calls=CALLS, batches=BATCHES)
