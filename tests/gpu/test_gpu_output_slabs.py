"""The python backend's output slabs on the GPU (backends/trt_runtime_backends/python/plans.py): repeat
``engine(x)`` calls with CUDA torch tensors get views of one ``torch.empty`` per
``SLAB_CALLS`` calls; every output kept is still its own call's result after the others ran
(one thread, and 8 threads on their own streams); a caller on another current stream gets a
slab made on that stream.

Run: ``python -m pytest -m gpu tests/gpu/test_gpu_output_slabs.py -rA -q``.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _torch() -> Any:
    torch = pytest.importorskip("torch", reason="torch is not installed on this GPU host")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA support here")
    return torch


def _cases(torch: Any, built: Any, count: int, seed: int) -> list[tuple[Any, Any]]:
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(count):
        host = rng.standard_normal((8, 256)).astype(np.float16)
        want = np.asarray(built.reference(host.astype(np.float64))[0], dtype=np.float32)
        cases.append((torch.from_numpy(host).cuda(), torch.from_numpy(want).cuda()))
    return cases


def _right(torch: Any, built: Any, got: Any, want: Any) -> bool:
    rtol, atol = (max(t * 10, 1e-3) for t in built.tolerance)
    return bool(torch.allclose(got.float(), want, rtol=rtol, atol=atol))


def test_gpu_slab_outputs_are_views_of_one_allocation_and_each_keeps_its_result(
    load: Any, engines: Any, report_measurement: Any
) -> None:
    from trt_runtime_backends.python import plans

    torch = _torch()
    built = engines("mlp_fp16")
    engine = load("mlp_fp16")
    calls = plans.SLAB_CALLS * 2 + 5
    cases = _cases(torch, built, calls, seed=1)
    engine(cases[0][0])  # the full path validates; repeat calls take the plan
    outs = [engine(x) for x, _ in cases]  # kept: every slab stays alive
    torch.cuda.synchronize()
    wrong = [i for i, (out, (_, want)) in enumerate(zip(outs, cases, strict=True))
             if not _right(torch, built, out, want)]
    assert wrong == []
    assert len({o.data_ptr() for o in outs}) == calls
    bases = [o._base for o in outs[1:]]  # outs[0] may be the first slab's first output, or not
    assert all(b is not None and tuple(b.shape) == (plans.SLAB_CALLS, 8, 256) for b in bases)
    slabs = {id(b) for b in bases}
    assert 2 <= len(slabs) <= 3  # one torch.empty per SLAB_CALLS calls
    one = outs[10]
    assert one.storage_offset() % (8 * 256) == 0 and one.is_contiguous() and one.shape == (8, 256)
    report_measurement("output slabs", f"{calls} calls, {len(slabs)} slabs, 0 wrong")


def _threads_keep_outputs(torch: Any, built: Any, engine: Any, threads: int, calls: int, cases: int,
                          seed: int) -> list[tuple[int, int]]:
    """``threads`` threads, each on a stream of its own, call ``engine`` ``calls`` times on
    ``cases`` inputs of their own in turn and keep every output; the (thread, call) of the
    outputs that are not their own call's result once all ran."""
    per_thread = [_cases(torch, built, cases, seed=seed + t) for t in range(threads)]
    engine(per_thread[0][0][0])  # validated once: the threads' calls take the plans
    kept: list[list[Any]] = [[] for _ in range(threads)]
    errors: list[str] = []
    barrier = threading.Barrier(threads)

    def work(t: int) -> None:
        try:
            torch.cuda.set_stream(torch.cuda.Stream())
            barrier.wait(timeout=60)
            for i in range(calls):
                kept[t].append(engine(per_thread[t][i % cases][0]))
            torch.cuda.current_stream().synchronize()
        except Exception as exc:
            errors.append(f"thread {t}: {type(exc).__name__}: {exc}")

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert errors == [] and sum(map(len, kept)) == threads * calls
    return [(t, i) for t in range(threads) for i, out in enumerate(kept[t])
            if not _right(torch, built, out, per_thread[t][i % cases][1])]


def test_gpu_slab_outputs_under_threads_on_their_own_streams(engines: Any, load: Any) -> None:
    torch = _torch()
    wrong = _threads_keep_outputs(torch, engines("mlp_fp16"), load("mlp_fp16"), 8, 100, cases=4, seed=10)
    assert wrong == []


def test_gpu_slab_is_made_on_the_callers_current_stream(engines: Any, load: Any) -> None:
    torch = _torch()
    built = engines("mlp_fp16")
    engine = load("mlp_fp16")
    (x, want), = _cases(torch, built, 1, seed=3)
    engine(x)
    a = engine(x)
    b = engine(x)
    assert a._base is b._base  # same stream: the same slab
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        c = engine(x)
        side.synchronize()
    assert c._base is not a._base  # another current stream: a slab made there
    d = engine(x)  # back on the first stream: its slab again
    assert d._base is a._base
    torch.cuda.synchronize()
    assert all(_right(torch, built, out, want) for out in (a, b, c, d))


def test_gpu_slab_outputs_with_fewer_contexts_than_threads(engines: Any, load: Any) -> None:
    """Threads on their own streams taking turns on 2 contexts: each lane keeps a slab per
    stream, and every output kept is its own call's."""
    torch = _torch()
    engine = load("mlp_fp16")
    engine.contexts = 2
    assert _threads_keep_outputs(torch, engines("mlp_fp16"), engine, 6, 80, cases=3, seed=40) == []


@pytest.mark.parametrize("backend", ["python", "torchbind"])
def test_gpu_slab_outputs_of_outer_graph_replays_keep_their_results(engines: Any, backend: str) -> None:
    """Under ``enable_cudagraphs(engine, outer=True)`` ("copy" mode) the outputs copied out of
    the graph by its memcpy node come from slabs, on both backends: every output kept is its
    own call's result, from one thread and from 8 threads on streams of their own."""
    from trt_runtime_backends.python import plans

    import trt_runtime

    torch = _torch()
    built = engines("mlp_fp16")
    status = trt_runtime.backend_status().get(backend)
    if status is None or not status:
        pytest.skip(f"the {backend} backend cannot run here: {getattr(status, 'reason', 'not installed')}")
    engine = trt_runtime.load(built.plan, backend, name="mlp_fp16")
    with engine, trt_runtime.enable_cudagraphs(engine, outer=True):
        calls = plans.SLAB_CALLS * 2 + 5
        cases = _cases(torch, built, calls, seed=50)
        engine(cases[0][0])  # the capture; the next calls replay through the slot's plan
        outs = [engine(x) for x, _ in cases]
        torch.cuda.synchronize()
        wrong = [i for i, (out, (_, want)) in enumerate(zip(outs, cases, strict=True))
                 if not _right(torch, built, out, want)]
        assert wrong == []
        assert len({o.data_ptr() for o in outs}) == calls
        bases = [o._base for o in outs[1:]]
        assert all(b is not None and tuple(b.shape) == (plans.SLAB_CALLS, 8, 256) for b in bases)
        assert engine.graph_stats()["captures"] == 1
        assert _threads_keep_outputs(torch, built, engine, 8, 100, cases=4, seed=60) == []
