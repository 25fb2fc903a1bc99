"""Stress by TensorRT's rule for dynamic shapes: a dynamic engine (``dynamic``: float32, two
optimization profiles, batches 1..8 and 9..32) called from 8 threads with batches of both
profiles, at contexts 1, 4 and 8, on both backends; every output is compared with the
float64 reference (0 wrong of 20,400 per backend). With several contexts no two of them
may share a profile while in use: the python backend deserializes the plan once per
context, which ``memory_usage()`` counts (weights x contexts)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from _gpu_stress import report_and_check, stress, usable_backend

import trt_runtime
from trt_runtime import ContextOverlapWarning

pytestmark = pytest.mark.gpu

THREADS = 8
CALLS = 850  # x 8 threads x 3 context counts = 20,400 outputs per backend
BATCHES = (2, 5, 8, 12, 20, 32)  # both profiles


@pytest.mark.parametrize("contexts", [1, 4, 8])
@pytest.mark.parametrize("backend_name", ["python", "torchbind"])
def test_gpu_dynamic_contexts_stress(
    backend_name: str, contexts: int, engines: Any, report_measurement: Any
) -> None:
    torch = pytest.importorskip("torch", reason="the stress test calls with torch CUDA tensors")
    backend = usable_backend(backend_name)
    built = engines("dynamic")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ContextOverlapWarning)
        engine = trt_runtime.load(built.plan, backend, name="dynamic", contexts=contexts)
    with trt_runtime.load(built.plan, backend, name="dynamic") as single:
        one = single.memory_usage()["weights"]  # the weights of one deserialized engine
    try:
        result = stress(torch, engine, built, threads=THREADS, calls=CALLS, batches=BATCHES, width=16)
        usage = engine.memory_usage()
    finally:
        engine.close()
    report_and_check(report_measurement, f"dynamic stress {backend_name} contexts={contexts}", result,
                     threads=THREADS, calls=CALLS, batches=BATCHES, extra=f", memory_usage {usage}")
    if backend_name == "python" and usage["weights"]:  # an ICudaEngine per context, counted
        assert usage["weights"] == one * contexts, usage
