"""The python backend's outer CUDA-graph wrap and its natural call path on a real GPU.

Proves: outputs under capture equal eager outputs (tiny, MLP, dynamic engine across shape
changes); one capture per shape key; re-capture after a settings change and under a
nested ``runtime_config``; ``view`` mode aliasing; static input buffers skip the copy;
caller-stream ordering for every stream-ordering mode; an engine built without
``REQUIRE_USER_ALLOCATION`` is refused (or TensorRT says it is capturable, recorded);
nothing is ever captured on the legacy default stream.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest
from _gpu_outer import (
    check_host_inputs_and_preallocated_outputs,
    check_late_inputs_on_caller_streams,
    engine_opener,
)

from trt_runtime import (
    CapabilityError,
    enable_cudagraphs,
    runtime_config,
)

pytestmark = pytest.mark.gpu

#: Handles of the legacy default stream (0, cudaStreamLegacy) and the per-thread one.
_DEFAULT_STREAMS = (0, 1, 2)


def _torch() -> Any:
    torch = pytest.importorskip("torch", reason="torch is not installed on this GPU host")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA support here")
    return torch


@pytest.fixture(scope="module")
def own_builds(python_backend: Any) -> dict[str, Any]:
    """Engines built here: the tiny engine with and without BuilderFlag.REQUIRE_USER_ALLOCATION,
    and the dynamic engine without it (TensorRT-RTX 1.6.1 crashes at the first execute of a
    dynamic-shape engine built with that flag, whatever the context's allocation strategy;
    measured with benchmarks/probes/gpu_call_overhead.py)."""
    from trt_runtime import builders

    original = builders._build
    log = python_backend.logger
    try:
        builders._build = functools.partial(original, require_user_allocation=True)  # type: ignore[assignment]
        built = {"tiny": builders.build_tiny(16, 8, "float16", logger=log)}
        builders._build = functools.partial(original, require_user_allocation=False)  # type: ignore[assignment]
        built["tiny_uncapturable"] = builders.build_tiny(16, 8, "float16", logger=log)
        built["dynamic"] = builders.build_dynamic(16, "float32", logger=log)
    finally:
        builders._build = original  # type: ignore[assignment]
    return built


@pytest.fixture
def open_engine(python_backend: Any, engines: Any, own_builds: dict[str, Any]) -> Any:
    """``open_engine(name)``: ``tiny``, ``tiny_uncapturable`` and ``dynamic`` built here,
    else conftest's engines."""
    with engine_opener(python_backend, lambda name: own_builds.get(name) or engines(name)) as open_:
        yield open_


def _inputs(torch: Any, built: Any, batch: int | None, seed: int) -> Any:
    host = built.random_inputs(batch=batch, seed=seed)[0]
    return torch.from_numpy(host).cuda()


def _assert_same(torch: Any, got: Any, want: Any) -> None:
    torch.cuda.synchronize()
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(got, want), f"max abs diff {float((got.float() - want.float()).abs().max())}"


def _assert_close(torch: Any, got: Any, want: Any, tolerance: tuple[float, float]) -> None:
    """Equal within the build's float tolerance: TensorRT-RTX may run another kernel for the
    same shapes later (its dynamic-shape kernels are specialized lazily)."""
    torch.cuda.synchronize()
    rtol, atol = tolerance
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.allclose(got.float(), want.float(), rtol=rtol, atol=atol), (
        f"max abs diff {float((got.float() - want.float()).abs().max())}"
    )


class _Spy:
    """Stands in for cuda.bindings.runtime in one engine and records some calls."""

    def __init__(self, rt: Any) -> None:
        self._rt = rt
        self.calls: list[tuple[Any, ...]] = []

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._rt, name)
        if name not in ("cudaMemcpyAsync", "cudaStreamBeginCapture", "cudaGraphLaunch",
                        "cudaGraphExecMemcpyNodeSetParams1D"):
            return target

        def spy(*args: Any) -> Any:
            self.calls.append((name, *args))
            return target(*args)

        return spy

    def named(self, name: str) -> list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] == name]


@pytest.mark.parametrize("name", ["tiny", "mlp_fp16", "convnet_fp16"])
@pytest.mark.parametrize("mode", ["copy", "view"])
def test_outer_graph_outputs_equal_eager_outputs(open_engine, name, mode) -> None:
    torch = _torch()
    engine, built = open_engine(name)
    xs = [_inputs(torch, built, None, seed) for seed in range(4)]
    eager = [engine(x).clone() for x in xs]
    with enable_cudagraphs(engine, outer=mode):
        for _ in range(2):
            for x, want in zip(xs, eager, strict=True):
                got = engine(x)
                _assert_same(torch, got, want)
    assert engine.graph_captures == 1
    np.testing.assert_allclose(eager[0].float().cpu().numpy(),
                               built.reference(xs[0].float().cpu().numpy().astype(np.float64))[0],
                               rtol=built.tolerance[0] * 5, atol=built.tolerance[1] * 5)


def test_outer_graph_dynamic_engine_one_capture_per_shape(open_engine) -> None:
    torch = _torch()
    engine, built = open_engine("dynamic")
    batches = (3, 8, 20, 3, 8, 20, 1, 3)
    xs = [_inputs(torch, built, b, seed) for seed, b in enumerate(batches)]
    eager = [engine(x).clone() for x in xs]
    with enable_cudagraphs(engine, outer=True):
        first = []
        for x, want in zip(xs, eager, strict=True):
            first.append(engine(x).clone())
            _assert_close(torch, first[-1], want, built.tolerance)
        assert engine.graph_captures == 4  # batches 3, 8, 20 (profile 1) and 1
        for x, want in reversed(list(zip(xs, first, strict=True))):  # replays, other order
            _assert_same(torch, engine(x), want)  # the same graph: bit for bit
        assert engine.graph_captures == 4
        engine.reset_graphs()
        _assert_close(torch, engine(xs[0]), eager[0], built.tolerance)
        assert engine.graph_captures == 5


def test_outer_graph_lru_eviction_after_the_lanes_work(open_engine, report_measurement) -> None:
    """max_graphs=2 over three shapes: every call evicts (after the lane's stream is
    synchronized) and captures again, into the evicted executable graph where CUDA accepts
    the update (else a new one); results equal eager, replays of updated graphs too."""
    from trt_runtime import OuterGraph

    torch = _torch()
    engine, built = open_engine("dynamic")
    batches = (3, 8, 20) * 3
    xs = [_inputs(torch, built, b, seed) for seed, b in enumerate(batches)]
    eager = [engine(x).clone() for x in xs]
    engine.outer_graph = OuterGraph(max_graphs=2)
    try:
        for x, want in zip(xs, eager, strict=True):
            _assert_same(torch, engine(x), want)
        stats = engine.graph_stats()
        assert stats["graphs"] == 2 and stats["evictions"] == len(batches) - 2
        assert engine.graph_captures == len(batches)
        assert stats["updates"] <= len(batches) - 2
        # the two graphs kept, and the spare while the last capture did not consume it; each
        # kept graph has its copying graph (the copies as memcpy nodes), the spare none
        assert len(_plain_execs(engine)) == 2 + (engine._lanes[0].ops.graphs.spare is not None)
        assert len(engine._lanes[0].ops.graphs.copying) == 2
        for x, want in zip(xs[-2:], eager[-2:], strict=True):  # replays of the last captures
            _assert_same(torch, engine(x), want)
        assert engine.graph_stats()["captures"] == len(batches)
        report_measurement("dynamic_graph_updates", f"{stats['updates']} of {len(batches) - 2} captures "
                           "after an eviction updated the evicted executable graph")
    finally:
        engine.outer_graph = None


@pytest.mark.parametrize("name", ["tiny", "convnet_fp16"])
def test_outer_graph_recapture_updates_the_released_graph(open_engine, name) -> None:
    """After reset_graphs the same shapes are captured again into the released executable
    graph (cudaGraphExecUpdate: the same topology), with other inputs: results right."""
    torch = _torch()
    engine, built = open_engine(name)
    xs = [_inputs(torch, built, None, seed) for seed in range(3)]
    eager = [engine(x).clone() for x in xs]
    engine.outer_graph = True
    try:
        _assert_same(torch, engine(xs[0]), eager[0])  # eager warm-up, then the capture
        _assert_same(torch, engine(xs[1]), eager[1])  # a replay
        (first,) = _plain_execs(engine)
        engine.reset_graphs()
        _assert_same(torch, engine(xs[2]), eager[2])  # captured again: the update
        assert engine.graph_stats()["updates"] == 1 and engine.graph_captures == 2
        assert _plain_execs(engine) == [first]
        assert len(engine._lanes[0].ops.graphs.copying) == 1  # its copying graph built again
        _assert_same(torch, engine(xs[0]), eager[0])  # replays of the updated graph
        _assert_same(torch, engine(xs[1]), eager[1])
    finally:
        engine.outer_graph = None


def _plain_execs(engine: Any) -> list[Any]:
    """The lane's executable graphs other than the copying ones (trt_runtime.graphs.CopyNodes)."""
    copying = {int(c.exec) for c in engine._lanes[0].ops.graphs.copying.values()}
    return [e for e in engine._lanes[0].ops._res.graph_execs if int(e) not in copying]


class _ContextSpy:
    """Stands in for a TensorRT execution context and records every method called on it."""

    def __init__(self, context: Any) -> None:
        self.context = context
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.context, name)
        if callable(target):
            self.calls.append(name)
        return target


@pytest.mark.parametrize("mode", ["copy", "view"])
def test_outer_graph_replay_touches_no_context_state(open_engine, mode) -> None:
    """Replays alternating shapes of two profiles call nothing on the TensorRT context (no
    set_input_shape, memory call or profile switch: the graph holds its shapes) and stay
    right; eager calls after them start from the context's real state."""
    torch = _torch()
    engine, built = open_engine("dynamic")
    xs = [_inputs(torch, built, b, seed) for seed, b in enumerate((1, 8, 20))]
    eager = [engine(x).clone() for x in xs]
    with enable_cudagraphs(engine, outer=mode):
        for x in xs:
            engine(x)  # captures
        ctx = engine._lanes[0].context
        key, spy = ctx.shape_key, _ContextSpy(ctx.trt_context)
        ctx.trt_context = spy
        try:
            for _ in range(20):
                for x, want in zip(xs, eager, strict=True):
                    _assert_close(torch, engine(x), want, built.tolerance)
        finally:
            ctx.trt_context = spy.context
        assert spy.calls == [] and ctx.shape_key == key and engine.graph_captures == 3
    for x, want in zip(reversed(xs), reversed(eager), strict=True):
        _assert_close(torch, engine(x), want, built.tolerance)


def test_outer_graph_recaptures_after_settings_change_and_nested_runtime_config(open_engine) -> None:
    torch = _torch()
    engine, built = open_engine("dynamic")
    x = _inputs(torch, built, 8, 0)
    want = engine(x).clone()
    with enable_cudagraphs(engine, outer=True):
        _assert_same(torch, engine(x), want)
        _assert_same(torch, engine(x), want)
        assert engine.graph_captures == 1
        creations = engine.context_creations
        with runtime_config(engine, dynamic_shapes_kernel_specialization_strategy="eager"):
            _assert_same(torch, engine(x), want)
            _assert_same(torch, engine(x), want)
            assert engine.graph_captures == 2
            assert engine.context_creations == creations + 1
        _assert_same(torch, engine(x), want)  # settings restored: a new context, a new graph
        assert engine.graph_captures == 3
        engine.runtime_settings = engine.runtime_settings.merge(
            dynamic_shapes_kernel_specialization_strategy="none"
        )
        _assert_same(torch, engine(x), want)
        assert engine.graph_captures == 4
    assert engine.outer_graph is None
    _assert_same(torch, engine(x), want)  # eager again


def test_outer_graph_view_mode_aliases_static_outputs(open_engine) -> None:
    torch = _torch()
    engine, built = open_engine("mlp_fp16")
    x1, x2 = _inputs(torch, built, None, 1), _inputs(torch, built, None, 2)
    want1, want2 = engine(x1).clone(), engine(x2).clone()
    with enable_cudagraphs(engine, outer="view"):
        y1 = engine(x1)
        _assert_same(torch, y1, want1)
        y2 = engine(x2)
        assert y2.data_ptr() == y1.data_ptr()  # the static output buffer, overwritten
        _assert_same(torch, y1, want2)
    with enable_cudagraphs(engine, outer="copy"):
        y1 = engine(x1)
        y2 = engine(x2)
        assert y1.data_ptr() != y2.data_ptr()
        _assert_same(torch, y1, want1)
        _assert_same(torch, y2, want2)


def test_outer_graph_static_inputs_skip_the_copy(open_engine) -> None:
    torch = _torch()
    engine, built = open_engine("mlp_fp16")
    x = _inputs(torch, built, None, 3)
    want = engine(x).clone()
    with enable_cudagraphs(engine, outer="view"):
        (static,) = engine.static_inputs(tuple(x.shape), as_torch=True)
        static.copy_(x)
        _assert_same(torch, engine(static), want)  # capture
        ops = engine._lanes[0].ops
        spy = ops._rt = ops.graphs.rt = _Spy(ops._rt)
        for nodes in ops.graphs.copying.values():  # the copy nodes call CUDA through their own rt
            nodes.rt = spy
        for _ in range(3):
            _assert_same(torch, engine(static), want)
        assert spy.named("cudaMemcpyAsync") == []  # nothing copied in or out
        assert spy.named("cudaGraphExecMemcpyNodeSetParams1D") == []
        assert len(spy.named("cudaGraphLaunch")) == 3
        _assert_same(torch, engine(x), want)  # another tensor: copied in by the graph's memcpy node
        assert spy.named("cudaMemcpyAsync") == []
        (set_in,) = spy.named("cudaGraphExecMemcpyNodeSetParams1D")
        assert set_in[3:6] == (static.data_ptr(), x.data_ptr(), x.numel() * x.element_size())
        (device_static,) = engine.static_inputs(tuple(x.shape))
        assert device_static.ptr == static.data_ptr()


def test_outer_graph_host_inputs_and_preallocated_outputs(open_engine) -> None:
    torch = _torch()
    engine, built = open_engine("dynamic")
    host = built.random_inputs(batch=5, seed=4)[0]
    want = engine(host)
    with enable_cudagraphs(engine, outer="view"):
        check_host_inputs_and_preallocated_outputs(torch, engine, host, want)
    assert engine.graph_captures == 1


@pytest.mark.parametrize("mode", ["copy", "view"])
def test_outer_graph_orders_with_the_callers_stream(open_engine, mode) -> None:
    torch = _torch()
    engine, built = open_engine("mlp_fp16")
    x = _inputs(torch, built, None, 5)
    want = engine(x).clone()
    side = torch.cuda.Stream()
    with enable_cudagraphs(engine, outer=mode):
        engine(x)  # captured
        check_late_inputs_on_caller_streams(torch, engine, x, want, (side, torch.cuda.default_stream()))


def test_outer_graph_never_captures_on_the_legacy_stream(open_engine) -> None:
    torch = _torch()
    engine, built = open_engine("tiny")
    ops = engine._lanes[0].ops
    spy = ops._rt = _Spy(ops._rt)
    x = _inputs(torch, built, None, 6)
    engine(x)
    engine(x)
    assert spy.named("cudaStreamBeginCapture") == []  # eager calls never capture
    with enable_cudagraphs(engine, outer=True):
        engine(x)
        engine(x)
    begins = spy.named("cudaStreamBeginCapture")
    assert len(begins) == 1
    stream = int(begins[0][1])
    assert stream not in _DEFAULT_STREAMS and stream != engine._lanes[0].ops._stream_handle


def test_outer_graph_engine_built_without_user_allocation(open_engine, report_measurement) -> None:
    """The backend's USER_MANAGED contexts are what TensorRT-RTX needs for capture; an engine
    built without REQUIRE_USER_ALLOCATION is captured if TensorRT says it can be, else
    refused with CapabilityError."""
    torch = _torch()
    engine, built = open_engine("tiny_uncapturable")
    x = _inputs(torch, built, None, 7)
    want = engine(x).clone()
    trt_context = engine._lanes[0].context.trt_context
    capturable = bool(trt_context.is_stream_capturable(int(torch.cuda.Stream().cuda_stream)))
    report_measurement("is_stream_capturable without REQUIRE_USER_ALLOCATION (tiny)", str(capturable))
    with enable_cudagraphs(engine, outer=True):
        if capturable:
            _assert_same(torch, engine(x), want)
            _assert_same(torch, engine(x), want)
        else:
            with pytest.raises(CapabilityError, match="REQUIRE_USER_ALLOCATION"):
                engine(x)
            assert engine.graph_captures == 0
    _assert_same(torch, engine(x), want)


def test_outer_graph_engine_with_user_allocation_is_capturable(open_engine, report_measurement) -> None:
    torch = _torch()
    engine, built = open_engine("tiny")
    engine(_inputs(torch, built, None, 8))
    stream = torch.cuda.Stream()
    capturable = bool(engine._lanes[0].context.trt_context.is_stream_capturable(int(stream.cuda_stream)))
    legacy = bool(engine._lanes[0].context.trt_context.is_stream_capturable(0))
    report_measurement("is_stream_capturable with REQUIRE_USER_ALLOCATION (tiny): own stream, legacy",
                       f"{capturable}, {legacy}")
    assert capturable


# -- the natural call path and the stream-ordering modes ---------------------------------------


@pytest.mark.parametrize("ordering", ["events", "implicit"])
def test_natural_call_orders_with_torchs_current_stream(open_engine, monkeypatch, ordering) -> None:
    torch = _torch()
    from trt_runtime_backends.python import stream_order

    monkeypatch.setattr(stream_order, "DEFAULT_MODE", ordering)
    engine, built = open_engine("dynamic")
    assert engine._lanes[0].ops._order.mode == ordering
    side = torch.cuda.Stream()
    for batch in (8, 3, 20, 8, 3):
        x = _inputs(torch, built, batch, batch)
        want = built.reference(x.cpu().numpy().astype(np.float64))[0]
        for stream in (torch.cuda.default_stream(), side):
            with torch.cuda.stream(stream):
                torch.cuda._sleep(20_000_000)
                late = x * 1
                got = engine(late) * 1
            stream.synchronize()
            np.testing.assert_allclose(got.cpu().numpy(), want, rtol=1e-2, atol=1e-2)
    assert len(engine._lanes[0].ops._fast_paths.natural) == 3  # one remembered call per input shape


@pytest.mark.parametrize("ordering", ["events", "implicit"])
def test_natural_call_with_whole_graph_capture(open_engine, monkeypatch, ordering) -> None:
    torch = _torch()
    from trt_runtime_backends.python import stream_order

    monkeypatch.setattr(stream_order, "DEFAULT_MODE", ordering)
    engine, built = open_engine("dynamic")
    with enable_cudagraphs(engine):  # TensorRT-RTX's own whole_graph_capture
        for batch in (8, 8, 3, 20, 3, 8) * 2:
            x = _inputs(torch, built, batch, batch)
            want = built.reference(x.cpu().numpy().astype(np.float64))[0]
            np.testing.assert_allclose(engine(x).cpu().numpy(), want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("name", ["tiny", "mlp_fp16", "convnet_fp16"])
def test_outer_graph_copy_mode_copies_through_graph_nodes(open_engine, name: str) -> None:
    """The default outer mode ("copy"): each replay sets the addresses of the graph's memcpy
    nodes (input in, output out) and launches it once, with no cudaMemcpyAsync; every output
    equals the eager one for new inputs and is a new tensor."""
    torch = _torch()
    engine, built = open_engine(name)
    xs = [_inputs(torch, built, None, seed) for seed in range(4)]
    eager = [engine(x).clone() for x in xs]
    with enable_cudagraphs(engine, outer=True):
        engine(xs[0])  # the capture
        (slot,) = engine._lanes[0].outer_graphs.shortcuts.values()
        assert int(slot.graph) in engine._lanes[0].ops.graphs.copying, "the copying graph was built"
        ops = engine._lanes[0].ops
        spy = ops._rt = ops.graphs.rt = _Spy(ops._rt)
        for nodes in ops.graphs.copying.values():  # the copy nodes call CUDA through their own rt
            nodes.rt = spy
        slot.plan = None  # made again, through the spy
        results = []
        for _ in range(2):
            for x, want in zip(xs, eager, strict=True):
                y = engine(x)
                results.append(y)
                _assert_same(torch, y, want)
        assert spy.named("cudaMemcpyAsync") == []
        assert len(spy.named("cudaGraphExecMemcpyNodeSetParams1D")) == 2 * len(results)
        assert len(spy.named("cudaGraphLaunch")) == len(results)
        assert len({y.data_ptr() for y in results[-4:]}) == 4  # new tensors, alive together
    torch.cuda.synchronize()
    for y, want in zip(results, eager + eager, strict=True):  # not overwritten by later replays
        _assert_same(torch, y, want)
