"""A context per input shape (backends/trt_runtime_backends/python/shapes.py) on a real GPU:
a dynamic engine fed shapes in turn, across both of its optimization profiles, gives the float64 reference's
results through swapped contexts that share one scratch buffer, by every kind of call."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from trt_runtime import enable_cudagraphs

pytestmark = pytest.mark.gpu

#: Batches of the "dynamic" engine's two profiles (1..8 and 9..32), fed in turn.
BATCHES = (1, 3, 8, 9, 20, 32)


def _torch() -> Any:
    return pytest.importorskip("torch", reason="torch is not installed on this GPU host")


def _close(actual: Any, expected: Any, tol: tuple[float, float]) -> None:
    np.testing.assert_allclose(np.asarray(actual, dtype=np.float64), expected, rtol=tol[0], atol=tol[1])


def _rounds(built: Any, rounds: int) -> list[tuple[int, np.ndarray]]:
    """(batch, input) for every call: fresh inputs each round, batches in turn."""
    return [(b, built.random_inputs(batch=b, seed=100 * r + b)[0]) for r in range(rounds) for b in BATCHES]


@pytest.mark.parametrize("limit", [4, 6])
def test_gpu_shape_contexts_natural_calls_in_turn_give_the_reference(load, engines, limit: int) -> None:
    torch = _torch()
    built = engines("dynamic")
    engine = load("dynamic")
    engine.shape_contexts = limit
    calls = _rounds(built, 4)
    outs = [engine(torch.from_numpy(x).cuda()) for _, x in calls]
    torch.cuda.synchronize()
    for (_, x), y in zip(calls, outs, strict=True):
        _close(y.cpu().numpy(), built.reference(x)[0], built.tolerance)
    stats = engine.shape_context_stats
    assert stats["contexts"] == limit and stats["made"] == limit - 1
    # each call after the first round whose shapes a context holds is a swap
    assert stats["swaps"] >= 2 * len(BATCHES) if limit == 6 else stats["swaps"] > 0


def test_gpu_shape_contexts_prebound_and_host_calls_give_the_reference(load, engines) -> None:
    torch = _torch()
    built = engines("dynamic")
    engine = load("dynamic")
    calls = _rounds(built, 3)
    ins = {b: torch.empty((b, 16), device="cuda") for b in BATCHES}
    outs = {b: torch.empty((b, 16), device="cuda") for b in BATCHES}
    for b, x in calls:  # the same arrays per shape: the pre-bound plans, switching contexts
        ins[b].copy_(torch.from_numpy(x))
        (y,) = engine.execute(ins[b], outputs=[outs[b]])  # ordered after torch's current stream
        assert y is outs[b]
        torch.cuda.synchronize()
        _close(y.cpu().numpy(), built.reference(x)[0], built.tolerance)
    for _, x in calls:  # host arrays: the full path
        _close(engine.execute(x)[0], built.reference(x)[0], built.tolerance)
    assert engine.shape_context_stats["swaps"] > len(BATCHES)


def test_gpu_shape_contexts_under_the_outer_graph(load, engines) -> None:
    torch = _torch()
    built = engines("dynamic")
    engine = load("dynamic")
    calls = _rounds(built, 3)
    with enable_cudagraphs(engine, outer=True):
        outs = [engine(torch.from_numpy(x).cuda()).clone() for _, x in calls]
        torch.cuda.synchronize()
        for (_, x), y in zip(calls, outs, strict=True):
            _close(y.cpu().numpy(), built.reference(x)[0], built.tolerance)
        assert engine.graph_stats()["graphs"] == len(BATCHES)
    after = [engine(torch.from_numpy(x).cuda()) for _, x in calls]  # eager again, contexts kept
    torch.cuda.synchronize()
    for (_, x), y in zip(calls, after, strict=True):
        _close(y.cpu().numpy(), built.reference(x)[0], built.tolerance)


def test_gpu_shape_contexts_one_context_when_turned_off_same_results(load, engines,
                                                                      report_measurement) -> None:
    """The same calls with ``shape_contexts = 1`` (one context changing its shapes) give the
    same results. The time of a call each way is reported, for 3 shapes (a context each)
    and 6 (more than the 4 contexts: the first one takes the rest), timed in alternating
    chunks after a warm-up (the benchmark's dynamic rows are the measurement of record)."""
    torch = _torch()
    built = engines("dynamic")
    swapping, changing = load("dynamic"), load("dynamic")
    changing.shape_contexts = 1
    calls = _rounds(built, 2)
    xs = [torch.from_numpy(x).cuda() for _, x in calls]
    for _ in range(5):  # both warm: contexts made, kernels specialized
        for x in xs:
            swapping(x)
            changing(x)
    torch.cuda.synchronize()
    for x in xs:
        assert torch.equal(swapping(x), changing(x))
    assert changing.shape_context_stats == {"contexts": 1, "made": 0, "swaps": 0}
    assert swapping.shape_context_stats["contexts"] == 4
    few = [x for x in xs if x.shape[0] in BATCHES[:3]]
    for label, feed in (("3 shapes", few), ("6 shapes", xs)):
        samples: dict[str, list[float]] = {"4 contexts": [], "1 context": []}
        for _ in range(5):
            for name, engine in (("4 contexts", swapping), ("1 context", changing)):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(20):
                    for x in feed:
                        engine(x)
                torch.cuda.synchronize()
                samples[name].append((time.perf_counter() - t0) / (20 * len(feed)) * 1e6)
        report_measurement(f"shape contexts, dynamic engine, {label} in turn, us a call (median of 5)",
                           ", ".join(f"{k} {sorted(v)[2]:.1f}" for k, v in samples.items()))
