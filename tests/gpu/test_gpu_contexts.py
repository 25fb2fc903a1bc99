"""N execution contexts per engine on the GPU, both backends: 16 threads x 500 calls with
mixed shapes equal the reference (eager and under the outer graph, contexts 1 and 4), and
N contexts cost at most N activation buffers plus a constant.

Run: ``python -m pytest -m gpu tests/gpu/test_gpu_contexts.py -rA -q``.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from trt_runtime import EngineSource, RuntimeSettings

pytestmark = pytest.mark.gpu

THREADS = 16
CALLS = 500
#: Batches of the dynamic engine (two profiles: 1..8 and 9..32), mixed per thread.
BATCHES = (1, 3, 8, 12, 16)


def _torch() -> Any:
    torch = pytest.importorskip("torch", reason="torch is not installed on this GPU host")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA support here")
    return torch


def _backend(name: str) -> Any:
    from trt_runtime import backend_status, get_backend

    status = backend_status().get(name)
    if status is None or not status:
        pytest.skip(f"the {name} backend cannot run here: {getattr(status, 'reason', 'not installed')}")
    return get_backend(name)


@pytest.mark.parametrize("contexts", [1, 4])
@pytest.mark.parametrize("mode", ["eager", "outer"])
@pytest.mark.parametrize("backend_name", ["python", "torchbind"])
def test_gpu_contexts_threads_with_mixed_shapes_equal_the_reference(
    backend_name: str, mode: str, contexts: int, engines: Any, report_measurement: Any
) -> None:
    torch = _torch()
    backend = _backend(backend_name)
    built = engines("dynamic")
    # torchbind under the outer graph refuses lazy kernel specialization of dynamic inputs.
    settings = RuntimeSettings(dynamic_shapes_kernel_specialization_strategy="eager")
    engine = backend.load_engine(EngineSource(built.plan, name="dynamic"), settings=settings)
    try:
        engine.contexts = contexts
        if mode == "outer":
            engine.outer_graph = "copy"
        cases = []
        for t in range(THREADS):
            per_thread = []
            for j, batch in enumerate(BATCHES):
                host = built.random_inputs(batch=batch, seed=1000 * t + j)[0]
                want = built.reference(host)[0].astype(np.float32)
                per_thread.append((torch.from_numpy(host).cuda(), want))
            cases.append(per_thread)
        torch.cuda.synchronize()
        wrong: list[str] = []
        errors: list[BaseException] = []
        start = threading.Barrier(THREADS)
        rtol, atol = built.tolerance

        def caller(t: int) -> None:
            try:
                stream = torch.cuda.Stream()
                start.wait()
                with torch.cuda.stream(stream):
                    for i in range(CALLS):
                        x, want = cases[t][(i + t) % len(BATCHES)]
                        y = engine(x)
                        got = y.cpu().numpy()  # synchronizes the caller's stream
                        if got.shape != want.shape or not np.allclose(got, want, rtol=rtol, atol=atol):
                            wrong.append(f"thread {t} call {i} batch {x.shape[0]}")
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=caller, args=(t,)) for t in range(THREADS)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(600)
        assert errors == [], errors[:3]
        assert wrong == [], f"{len(wrong)} wrong outputs, first: {wrong[:5]}"
        report_measurement(
            f"contexts {backend_name} {mode} x{contexts}",
            f"{THREADS} threads x {CALLS} calls, 0 wrong; context_creations={engine.context_creations}, "
            f"graph_captures={engine.graph_captures}",
        )
    finally:
        engine.close()


def _used_bytes() -> int:
    """Device memory this process uses (``nvidia-smi``'s per-process figure: the suite runs
    with several workers on one GPU, so the device-wide free memory moves with theirs);
    the device-wide figure where nvidia-smi cannot tell."""
    import os
    import shutil
    import subprocess

    torch = _torch()
    torch.cuda.synchronize()
    if shutil.which("nvidia-smi"):
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, check=False,
        ).stdout
        for line in out.splitlines():
            pid, _, mib = line.partition(",")
            if pid.strip() == str(os.getpid()) and mib.strip().isdigit():
                return int(mib) << 20
    free, total = torch.cuda.mem_get_info()
    return int(total - free)


def test_gpu_contexts_memory_n_contexts_cost_n_activation_buffers(
    engines: Any, report_measurement: Any
) -> None:
    """python backend: N USER_MANAGED contexts of one ICudaEngine add N activation buffers,
    not N copies of the weights."""
    torch = _torch()
    backend = _backend("python")
    built = engines("mlp_fp16")
    x = torch.from_numpy(built.random_inputs(seed=1)[0]).cuda()
    engine = backend.load_engine(EngineSource(built.plan, name="mlp_fp16"))
    try:
        engine(x)
        before = _used_bytes()
        engine.contexts = 4
        lanes = [engine._pool.acquire() for _ in range(4)]  # run every context once
        try:
            for lane in lanes:
                lane.call((x,), None, None, None)
        finally:
            for lane in lanes:
                engine._pool.release(lane)
        after = _used_bytes()
        usage = engine.memory_usage()
        added = after - before
        per = usage["activations_per_context"]
        constant = 64 << 20  # streams, events, allocator granularity
        report_measurement(
            "contexts memory", f"3 more contexts took {added} B; memory_usage={usage}"
        )
        assert usage["contexts"] == 4 and usage["activations_total"] == 4 * per
        assert added <= 3 * per + constant, f"3 more contexts took {added} B > 3 x {per} B + {constant} B"
    finally:
        engine.close()


def test_gpu_contexts_are_created_on_the_engines_device(engines: Any) -> None:
    """Lanes made while another device is current still run on the engine's device."""
    torch = _torch()
    backend = _backend("python")
    built = engines("mlp_fp16")
    engine = backend.load_engine(EngineSource(built.plan, name="mlp_fp16"), device=0)
    try:
        engine.contexts = 2
        assert all(lane.ops._device == 0 for lane in engine._lanes)
        x = torch.from_numpy(built.random_inputs(seed=2)[0]).cuda(0)
        want = built.reference(built.random_inputs(seed=2)[0])[0]
        y = engine(x)
        rtol, atol = built.tolerance
        np.testing.assert_allclose(y.float().cpu().numpy(), want, rtol=rtol, atol=atol)
    finally:
        engine.close()
