"""The torchbind backend's outer CUDA graph on a GPU (equal to eager on the tiny engine, the MLP,
the conv net and the dynamic engine across shape and settings changes, with capture counts,
copy nodes, LRU eviction) and the call overhead over the bare ``execute_engine`` op."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from _gpu_outer import check_host_inputs_and_preallocated_outputs, check_late_inputs_on_caller_streams
from _gpu_torchbind import assert_close_enough, assert_same, tiny_input, torchbind_version

from trt_runtime import EngineSource, RuntimeSettings

pytestmark = pytest.mark.gpu


# -- the outer CUDA graph ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tiny", "mlp_fp16", "convnet_fp16"])
@pytest.mark.parametrize("mode", ["copy", "view"])
def test_gpu_torchbind_outer_graph_equals_eager(
    open_torchbind: Any, torch: Any, name: str, mode: str
) -> None:
    from trt_runtime import enable_cudagraphs

    engine, built = open_torchbind(name)
    xs = [tiny_input(torch, built, seed=seed) for seed in range(4)]
    eager = [engine(x).clone() for x in xs]
    with enable_cudagraphs(engine, outer=mode):
        for _ in range(2):
            for x, want in zip(xs, eager, strict=True):
                assert_same(torch, engine(x), want)
    assert engine.graph_captures == 1
    assert engine.context_creations == 1
    assert engine.native_context_creations in (None, 1)  # None: before 2.13


@pytest.mark.parametrize("mode", ["copy", "view"])
@pytest.mark.parametrize("threads", [1, 4])
def test_gpu_torchbind_outer_replays_through_copy_nodes(
    open_torchbind: Any, torch: Any, threads: int, mode: str
) -> None:
    """A replay copies through memcpy nodes around torch's kept graph (the bridge's
    ``copy_nodes``): per call one address update per input (and per output in "copy" mode)
    whose address changed since the last call, and one launch of the built graph, from any
    thread, and neither the graph launcher's copy nor its launch. Outputs equal eager ones;
    "copy" outputs are new tensors that later replays leave alone. A call given the static
    input itself launches torch's graph.

    Only this engine is counted (tests/_replay_spy.py wraps its lanes' bridge, not the
    class: under ``pytest -n`` other tests' engines live in the same process); the threads
    run on the engine's device (a new thread starts on device 0) and their errors fail the
    test by name instead of as a short count."""
    import concurrent.futures

    from _replay_spy import ReplaySpy

    from trt_runtime import enable_cudagraphs

    engine, built = open_torchbind("mlp_fp16")
    spy = ReplaySpy(engine)
    xs = [tiny_input(torch, built, seed=seed) for seed in range(4)]
    eager = [engine(x).clone() for x in xs]
    results: dict[int, list[Any]] = {}
    with enable_cudagraphs(engine, outer=mode):
        engine(xs[0])  # the capture

        def body(index: int) -> None:
            torch.cuda.set_device(engine.device)
            results[index] = []
            for x, want in zip(xs, eager, strict=True):
                y = engine(x)
                if mode == "view" and threads == 1:  # the static output, until the next replay
                    assert_same(torch, y, want)
                results[index].append(y)
            torch.cuda.current_stream().synchronize()

        with concurrent.futures.ThreadPoolExecutor(threads) as pool:  # a thread's error raised here
            for _ in pool.map(body, range(threads)):
                pass
        torch.cuda.synchronize()
        assert len(spy.nodes) == 1, f"{len(spy.nodes)} sets of copy nodes (torch and cuda-python make one)"
        (nodes,) = spy.nodes
        replays = threads * len(xs)
        assert nodes.counts.get("cudaGraphLaunch") == replays, (nodes.counts, spy.plain)
        per_call = 2 if mode == "copy" else 1
        updates = nodes.counts.get("cudaGraphExecMemcpyNodeSetParams1D", 0)
        if threads == 1:  # each call's input differs from the last one's (and outputs are kept)
            assert updates == replays * per_call
        else:  # two threads may call with the same input one after the other: not set again
            assert replays * (per_call - 1) < updates <= replays * per_call
        assert spy.plain == {"launch": 0, "copy": 0}
        if mode == "copy":
            for index in range(threads):
                for got, want in zip(results[index], eager, strict=True):
                    assert_same(torch, got, want)
        (static,) = engine.static_inputs(tuple(xs[0].shape))
        static.copy_(xs[1])
        assert_same(torch, engine(static), eager[1])
        assert spy.plain == {"launch": 1, "copy": 0} and nodes.counts["cudaGraphLaunch"] == replays


def _needs_strategies(engine_or_backend: Any) -> None:
    backend = getattr(engine_or_backend, "backend", engine_or_backend)
    if not backend.capabilities.supports_dynamic_shapes_kernel_specialization_strategy:
        pytest.skip(f"torch-tensorrt-rtx {torchbind_version()} has no dynamic-shapes strategy (2.13+)")


@pytest.mark.parametrize("strategy", ["lazy", "eager"])
def test_gpu_torchbind_outer_graph_dynamic_engine_one_capture_per_shape(
    open_torchbind: Any, torchbind_backend: Any, torch: Any, strategy: str, report_measurement: Any
) -> None:
    """Graphs of both optimization profiles (batches 1..8 and 9..32) replayed in any order."""
    from trt_runtime import enable_cudagraphs

    settings = RuntimeSettings(dynamic_shapes_kernel_specialization_strategy=strategy)
    if strategy != "lazy":
        _needs_strategies(torchbind_backend)
    engine, built = open_torchbind("dynamic", settings=settings)
    batches = (3, 8, 20, 3, 8, 20, 1, 3)
    xs = [tiny_input(torch, built, batch=b, seed=i) for i, b in enumerate(batches)]
    eager = [engine(x).clone() for x in xs]
    bitwise: list[bool] = []
    with enable_cudagraphs(engine, outer=True):
        for x, want in zip(xs, eager, strict=True):
            assert_close_enough(torch, engine(x), want, bitwise)
        assert engine.graph_captures == 4  # batches 3, 8, 20 (profile 1) and 1
        for x, want in reversed(list(zip(xs, eager, strict=True))):
            assert_close_enough(torch, engine(x), want, bitwise)
        assert engine.graph_captures == 4
        engine.reset_graphs()
        assert_close_enough(torch, engine(xs[0]), eager[0], bitwise)
        assert engine.graph_captures == 5
    report_measurement(f"torchbind outer graph, dynamic engine, {strategy}: bitwise equal to eager",
                       f"{sum(bitwise)}/{len(bitwise)}")


def test_gpu_torchbind_outer_graph_lru_eviction_after_the_lanes_work(
    open_torchbind: Any, torchbind_backend: Any, torch: Any
) -> None:
    """max_graphs=2 over three shapes: every call evicts (after the lane's streams are
    synchronized, then CUDAGraph.reset) and captures again; results close to eager."""
    from trt_runtime import OuterGraph

    _needs_strategies(torchbind_backend)
    engine, built = open_torchbind("dynamic", settings=RuntimeSettings(
        dynamic_shapes_kernel_specialization_strategy="eager"))
    batches = (3, 8, 20) * 3
    xs = [tiny_input(torch, built, batch=b, seed=i) for i, b in enumerate(batches)]
    eager = [engine(x).clone() for x in xs]
    bitwise: list[bool] = []
    engine.outer_graph = OuterGraph(max_graphs=2)
    try:
        for x, want in zip(xs, eager, strict=True):
            assert_close_enough(torch, engine(x), want, bitwise)
        stats = engine.graph_stats()
        assert stats["graphs"] == 2 and stats["evictions"] == len(batches) - 2
        assert engine.graph_captures == len(batches)
    finally:
        engine.outer_graph = None


def test_gpu_torchbind_outer_graph_recaptures_on_settings_change(open_torchbind: Any, torch: Any) -> None:
    from trt_runtime import enable_cudagraphs, runtime_config

    engine, built = open_torchbind("mlp_dynamic")
    _needs_strategies(engine)
    x = tiny_input(torch, built, batch=8, seed=0)
    want = engine(x).clone()
    bitwise: list[bool] = []
    with enable_cudagraphs(engine, outer=True):
        assert_close_enough(torch, engine(x), want, bitwise)
        assert_close_enough(torch, engine(x), want, bitwise)
        assert engine.graph_captures == 1
        creations = engine.context_creations
        with runtime_config(engine, dynamic_shapes_kernel_specialization_strategy="eager"):
            assert_close_enough(torch, engine(x), want, bitwise)
            assert_close_enough(torch, engine(x), want, bitwise)
            assert engine.graph_captures == 2 and engine.context_creations == creations + 1
        assert_close_enough(torch, engine(x), want, bitwise)  # settings restored: a new context, a new graph
        assert engine.graph_captures == 3 and engine.context_creations == creations + 2
    assert engine.outer_graph is None
    assert_close_enough(torch, engine(x), want, bitwise)  # eager again
    assert engine.context_creations == engine.native_context_creations


def test_gpu_torchbind_outer_graph_host_inputs_static_inputs_and_outputs(
    open_torchbind: Any, torch: Any
) -> None:
    from trt_runtime import enable_cudagraphs

    engine, built = open_torchbind("mlp_fp16")
    host = built.random_inputs(seed=4)[0]
    want = engine(host)
    with enable_cudagraphs(engine, outer="view"):
        check_host_inputs_and_preallocated_outputs(torch, engine, host, want)
        (static,) = engine.static_inputs((8, 256))
        static.copy_(torch.from_numpy(host))
        np.testing.assert_array_equal(engine(static).cpu().numpy(), want)
    assert engine.graph_captures == 1


@pytest.mark.parametrize("mode", ["copy", "view"])
def test_gpu_torchbind_outer_graph_orders_with_the_callers_stream(
    open_torchbind: Any, torch: Any, mode: str
) -> None:
    from trt_runtime import enable_cudagraphs

    engine, built = open_torchbind("mlp_fp16")
    x = tiny_input(torch, built, seed=5)
    want = engine(x).clone()
    side = torch.cuda.Stream()
    with enable_cudagraphs(engine, outer=mode):
        engine(x)  # captured
        check_late_inputs_on_caller_streams(torch, engine, x, want, (side, torch.cuda.default_stream(), side))
    assert engine.graph_captures == 1


def test_gpu_torchbind_outer_graph_engine_without_user_allocation(
    open_torchbind: Any, python_backend: Any, tiny_plans: dict[bool, Any], torch: Any, report_measurement: Any
) -> None:
    """Never a wrong result: either TensorRT-RTX captures the context and replays match eager,
    or the call is a CapabilityError naming REQUIRE_USER_ALLOCATION."""
    from trt_runtime import CapabilityError, enable_cudagraphs

    x = tiny_input(torch, tiny_plans[False], seed=7)
    reference = python_backend.load_engine(EngineSource(tiny_plans[False].plan, name="tiny_uncapturable"))
    try:
        reference(x)
        context = getattr(getattr(reference, "_context", None), "trt_context", None)
        stream = torch.cuda.Stream()
        capturable = "unknown" if context is None else str(context.is_stream_capturable(stream.cuda_stream))
    finally:
        reference.close()
    engine, _ = open_torchbind("tiny_uncapturable")
    want = engine(x).clone()
    with enable_cudagraphs(engine, outer=True):
        try:
            first, second = engine(x), engine(x)
        except CapabilityError as exc:
            outcome = "CapabilityError"
            assert "REQUIRE_USER_ALLOCATION" in str(exc)
            assert engine.graph_captures == 0
        else:
            outcome = "captured, replays equal eager"
            assert_same(torch, first, want)
            assert_same(torch, second, want)
    report_measurement("torchbind outer graph, tiny without REQUIRE_USER_ALLOCATION",
                       f"is_stream_capturable={capturable}; {outcome}")
    assert_same(torch, engine(x), want)  # eager again


@pytest.mark.parametrize("name", ["mlp_fp16", "dynamic"])
def test_gpu_torchbind_outer_graph_agrees_with_python_backend(
    open_torchbind: Any,
    torchbind_backend: Any,
    python_backend: Any,
    torch: Any,
    name: str,
    report_measurement: Any,
) -> None:
    from trt_runtime import enable_cudagraphs

    settings = RuntimeSettings(dynamic_shapes_kernel_specialization_strategy="eager")
    _needs_strategies(torchbind_backend)
    engine, built = open_torchbind(name, settings=settings)
    python = python_backend.load_engine(EngineSource(built.plan, name=name), settings=settings)
    try:
        batches = (None,) if name == "mlp_fp16" else (3, 20)
        xs = [tiny_input(torch, built, batch=b, seed=30 + i) for i, b in enumerate(batches)]
        wants = [python(x).clone() for x in xs]
        bitwise: list[bool] = []
        with enable_cudagraphs(engine, outer=True):
            for _ in range(2):
                for x, want in zip(xs, wants, strict=True):
                    assert_close_enough(torch, engine(x), want, bitwise)
    finally:
        python.close()
    report_measurement(f"torchbind outer graph vs python backend eager, {name}: bitwise equal",
                       f"{sum(bitwise)}/{len(bitwise)}")
    if name == "mlp_fp16":
        assert all(bitwise), "same engine, same kernels, same GPU: outputs must be bitwise equal"


# -- call overhead ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tiny", "mlp_fp16"])
def test_gpu_torchbind_call_overhead_over_the_bare_op(
    open_torchbind: Any, torch: Any, name: str, report_measurement: Any
) -> None:
    """``engine(x)`` against ``torch.ops.tensorrt.execute_engine([x], engine.native)`` on the same
    engine, alternating batches of calls (CPU time per call, no synchronize between calls).
    The figures are reported, never asserted: speed goals are judged by the benchmark
    (benchmarks/) as ratios within one run. What is asserted is that both calls agree."""
    import statistics
    import time

    from trt_runtime import enable_cudagraphs

    engine, built = open_torchbind(name)
    x = tiny_input(torch, built, seed=11)
    op, native = torch.ops.tensorrt.execute_engine, engine.native
    calls = 2000

    def bare() -> None:
        for _ in range(calls):
            op([x], native)

    def ours() -> None:
        for _ in range(calls):
            engine(x)

    def timed(fn: Callable[[], None]) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
        torch.cuda.synchronize()
        return elapsed / calls

    for fn in (bare, ours):
        fn()  # warm: kernels compiled, allocator primed
    samples: dict[str, list[float]] = {"op": [], "engine": [], "graph": []}
    for rep in range(9):
        pair = [("op", bare), ("engine", ours)]
        for key, fn in pair if rep % 2 else reversed(pair):
            samples[key].append(timed(fn))
    with enable_cudagraphs(engine, outer=True):
        ours()
        samples["graph"] = [timed(ours) for _ in range(5)]
    med = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
    ratio = med["engine"] / med["op"]
    report_measurement(
        f"torchbind call overhead, {name} (median µs/call, no sync)",
        f"engine(x) {med['engine']:.1f}, execute_engine op {med['op']:.1f}: {ratio:.3f}x (target <= 1.10x); "
        f"outer graph replay engine(x) {med['graph']:.1f} ({med['graph'] / med['op']:.2f}x the op)",
    )
    expected = op([x], native)[0]
    assert torch.equal(engine(x), expected), "engine(x) and the bare op disagree on the same engine"
