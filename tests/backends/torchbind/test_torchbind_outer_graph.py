"""The torchbind backend's outer CUDA graph on the CPU, against the doubles of
tests/_torchbind_doubles.py, whose CUDA graph replays the captured ``execute_engine`` calls
from the current contents of their static inputs: capture, replay, re-capture on shape
and settings changes, output modes, streams, and what is refused."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
from _torchbind_doubles import (
    DYNAMIC_X,
    DYNAMIC_Y,
    FakeBridge,
    FakeNodeRuntime,
    FakeStream,
    FakeTensor,
    cuda,
    inputs,
    make_backend,
    source,
)
from trt_runtime_backends.torchbind import graphs as graphs_module

from trt_runtime.contexts import enable_cudagraphs, runtime_config
from trt_runtime.errors import CapabilityError, EngineError, InputError
from trt_runtime.graphs import OuterGraph
from trt_runtime.protocols import TensorSpec
from trt_runtime.settings import CudaGraphStrategy, RuntimeSettings

WARMUP = graphs_module.WARMUP_RUNS


def dyn(rows: int, value: float = 1.0) -> FakeTensor:
    return FakeTensor(np.full((rows, 4), value, np.float32))


EAGER = RuntimeSettings(dynamic_shapes_kernel_specialization_strategy="eager")


def dynamic_engine(settings: RuntimeSettings = EAGER) -> tuple[Any, Any]:
    """An engine with a dynamic batch, with ``eager`` kernel specialization (``lazy`` is refused)."""
    backend, bridge = make_backend("2.14.0")
    return backend.load_engine(source(bindings=(DYNAMIC_X, DYNAMIC_Y)), settings=settings), bridge


# -- capability ----------------------------------------------------------------------------------
def test_torchbind_outer_graph_capability_follows_torch() -> None:
    backend, _ = make_backend("2.14.0")
    assert backend.capabilities.supports_outer_cuda_graph
    backend, _ = make_backend("2.14.0", graphs=False)
    caps = backend.capabilities
    assert not caps.supports_outer_cuda_graph
    engine = backend.load_engine(source())
    with pytest.raises(CapabilityError, match=r"outer_cuda_graph: this torch has no torch\.cuda\.CUDAGraph"):
        engine.outer_graph = True


def test_torchbind_outer_graph_refuses_data_dependent_outputs() -> None:
    backend, _ = make_backend("2.14.0")
    dd = TensorSpec("out", "float16", (-1,), False, data_dependent=True)
    engine = backend.load_engine(source(bindings=(*source().bindings[:2], dd)))
    with pytest.raises(CapabilityError, match=r"outputs \['out'\] have data-dependent shapes"):
        engine.outer_graph = "copy"


# -- capture and replay --------------------------------------------------------------------------
def test_torchbind_outer_graph_captures_once_then_replays() -> None:
    engine, bridge = dynamic_engine()
    (eager,) = engine.execute(dyn(3, 1.0))
    with enable_cudagraphs(engine, outer=True):
        assert engine.runtime_settings.cuda_graph_strategy is CudaGraphStrategy.DISABLED
        calls = len(bridge.ops.calls)
        bridge.events.clear()
        (first,) = engine.execute(dyn(3, 1.0))
        assert engine.graph_captures == 1
        assert len(bridge.ops.calls) == calls + WARMUP + 1  # warm-ups, then the captured call
        (graph,) = bridge.captured
        assert graph.stream.name.startswith("side:0")  # never the caller's or the default stream
        assert bridge.ops.streams[-WARMUP - 1:] == [graph.stream.name] * (WARMUP + 1)
        side = graph.stream.name
        assert bridge.events == [
            ("copy", "current:0"),  # inputs into the static inputs, on the caller's stream
            (f"wait {'current:0'}", side),  # the side stream waits for them
            ("replay", side),  # the check that the new graph writes its outputs (this call's results)
            (f"wait {side}", "current:0"),  # the caller waits for the side stream
        ]
        np.testing.assert_array_equal(first.array, eager.array)
        bridge.events.clear()
        (second,) = engine.execute(dyn(3, 5.0))
        assert len(bridge.ops.calls) == calls + WARMUP + 1, "a replay calls no op"
        assert bridge.events == [("copy", "current:0"), ("replay", "current:0")]
        np.testing.assert_array_equal(second.array, np.full((3, 4), 10.0, np.float32))
        np.testing.assert_array_equal(first.array, eager.array)  # "copy": earlier outputs stay
        assert engine.graph_captures == 1
    engine.execute(dyn(3))
    assert engine.outer_graph is None and graph.resets == 1  # leaving the block dropped the graph
    assert len(bridge.ops.calls) == calls + WARMUP + 2  # eager again


def test_torchbind_outer_graph_view_returns_the_static_outputs() -> None:
    engine, _ = dynamic_engine()
    with enable_cudagraphs(engine, outer="view"):
        (a,) = engine.execute(dyn(2, 1.0))
        (b,) = engine.execute(dyn(2, 3.0))
    assert a is b  # one static buffer, overwritten by each replay
    np.testing.assert_array_equal(b.array, np.full((2, 4), 6.0, np.float32))


def test_torchbind_outer_graph_per_shape_graphs() -> None:
    engine, bridge = dynamic_engine()
    with enable_cudagraphs(engine, outer=True):
        for rows in (2, 5, 2, 5, 8):
            (out,) = engine.execute(dyn(rows, float(rows)))
            np.testing.assert_array_equal(out.array, np.full((rows, 4), 2.0 * rows, np.float32))
        assert engine.graph_captures == 3 and len(bridge.captured) == 3


def test_torchbind_outer_graph_recaptured_after_settings_change_and_reset() -> None:
    engine, bridge = dynamic_engine()
    with enable_cudagraphs(engine, outer=True):
        engine.execute(dyn(2))
        assert engine.context_creations == 1
        with runtime_config(engine, dynamic_shapes_kernel_specialization_strategy="none"):
            (out,) = engine.execute(dyn(2, 2.0))
            assert engine.graph_captures == 2 and bridge.captured[0].resets == 1
            assert engine.context_creations == 2
            np.testing.assert_array_equal(out.array, np.full((2, 4), 4.0, np.float32))
        engine.execute(dyn(2))
        assert engine.graph_captures == 3 and engine.context_creations == 3
        engine.reset_graphs()
        engine.execute(dyn(2))
        assert engine.graph_captures == 4 and engine.context_creations == 3  # graphs only


def test_torchbind_outer_graph_static_inputs_skip_the_copy() -> None:
    engine, bridge = dynamic_engine()
    with pytest.raises(EngineError, match=r"static_inputs\(\) needs the outer CUDA-graph wrap"):
        engine.static_inputs((4, 4))
    with enable_cudagraphs(engine, outer=True):
        with pytest.raises(InputError, match=r"takes 1 input\(s\) \(x\); static_inputs\(\) got 2 shape"):
            engine.static_inputs((4, 4), (4, 4))
        with pytest.raises(InputError, match=r"input 'x' has shape \(9, 4\), outside every"):
            engine.static_inputs((9, 4))
        with pytest.raises(CapabilityError, match="profile_selection"):
            engine.static_inputs((4, 4), profile=0)
        # handed out before the capture: the capture reads them in place
        (static,) = engine.static_inputs((4, 4))
        static.array[...] = 3.0
        bridge.events.clear()
        out = engine(static)
        assert ("copy", "current:0") not in bridge.events
        np.testing.assert_array_equal(out.array, np.full((4, 4), 6.0, np.float32))
        assert engine.static_inputs((4, 4)) == [static] and engine.graph_captures == 1
        static.array[...] = 7.0
        bridge.events.clear()
        out = engine(static)
        assert bridge.events == [("replay", "current:0")]  # nothing copied in
        np.testing.assert_array_equal(out.array, np.full((4, 4), 14.0, np.float32))
        # after the capture of another shape, its static inputs are the graph's own
        engine(dyn(2, 1.0))
        (two,) = engine.static_inputs((2, 4))
        np.testing.assert_array_equal(two.array, np.ones((2, 4), np.float32))
    with enable_cudagraphs(engine, outer=True):
        assert engine.static_inputs((4, 4))[0] is not static  # dropped with the graphs


def test_torchbind_outer_graph_host_inputs_and_outputs() -> None:
    engine, bridge = dynamic_engine()
    with enable_cudagraphs(engine, outer=True):
        engine.execute(np.ones((3, 4), np.float32))
        bridge.events.clear()
        (out,) = engine.execute(np.full((3, 4), 2.0, np.float32))
        assert bridge.events == [("copy", "current:0"), ("replay", "current:0"), ("d2h", "current:0")]
    assert type(out) is np.ndarray
    np.testing.assert_array_equal(out, np.full((3, 4), 4.0, np.float32))


def test_torchbind_outer_graph_writes_preallocated_outputs() -> None:
    engine, bridge = dynamic_engine()
    y = FakeTensor(np.zeros((3, 4), np.float32))
    with enable_cudagraphs(engine, outer=True):
        engine.execute(dyn(3))
        bridge.events.clear()
        clones = bridge.clones
        assert engine.execute(dyn(3, 4.0), outputs=[y]) == [y]
        assert bridge.events == [("copy", "current:0"), ("replay", "current:0"), ("copy", "current:0")]
        assert bridge.clones == clones  # filled from the static outputs, nothing allocated
    np.testing.assert_array_equal(y.array, np.full((3, 4), 8.0, np.float32))


def test_torchbind_outer_graph_orders_replays_across_caller_streams() -> None:
    engine, bridge = dynamic_engine()
    a, b = FakeStream("a"), FakeStream("b")
    with enable_cudagraphs(engine, outer=True):
        engine.execute(dyn(2), stream=a)
        bridge.events.clear()
        engine.execute(dyn(2), stream=b)
        engine.execute(dyn(2), stream=b)
        assert bridge.events == [
            ("wait a", "b"),  # the graphs share the context's memory: b waits for a's replays
            ("copy", "b"), ("replay", "b"),
            ("copy", "b"), ("replay", "b"),
        ]  # fmt: skip
        engine.synchronize()
        assert b.syncs == 1


def test_torchbind_outer_graph_replays_through_the_graph_launcher() -> None:
    """Where the bridge has a launcher (cuda-python's cudaGraphLaunch of the executable
    graph), a replay launches through it on the current stream's handle, not replay()."""
    engine, bridge = dynamic_engine()
    launched: list[tuple[Any, int]] = []

    def factory(graph: Any) -> Any:
        def run(stream: int) -> None:
            launched.append((graph, stream))
            graph.replay()

        return run

    bridge.launcher_factory = factory
    with enable_cudagraphs(engine, outer=True):
        engine.execute(dyn(2, 1.0))  # the capture
        (graph,) = bridge.captured
        bridge.events.clear()
        (out,) = engine.execute(dyn(2, 2.0))
        assert launched == [(graph, id(bridge.active_stream(0)))]
        assert bridge.events == [("copy", "current:0")]  # no replay(): the launcher ran it
        np.testing.assert_array_equal(out.array, np.full((2, 4), 4.0, np.float32))
        other = FakeStream("other")
        with bridge.stream_scope(other):  # torch's current stream moved
            bridge.events.clear()
            engine.execute(dyn(2))
        assert bridge.events[0] == ("wait current:0", "other") and launched[-1] == (graph, id(other))
        bridge.events.clear()
        engine.execute(dyn(2))  # back: the current stream waits for "other"
        assert bridge.events[0] == ("wait other", "current:0")


def test_torchbind_outer_graph_least_recently_used_graph_evicted() -> None:
    engine, bridge = dynamic_engine()
    engine.outer_graph = OuterGraph(max_graphs=2)
    for rows in (1, 2, 1, 3):  # 1 was used after 2: 2 goes
        engine.execute(dyn(rows))
    assert [g.resets for g in bridge.captured] == [0, 1, 0]
    # Before the eviction: this lane's replay stream and capture stream are synchronized,
    # never the whole device (another lane may be capturing).
    assert ("sync", "current:0") in bridge.events and ("sync", "side:0:1") in bridge.events
    engine.execute(dyn(1))  # still there: replayed
    assert engine.graph_captures == 3
    engine.execute(dyn(2))
    assert engine.graph_captures == 4
    stats = engine._outer_graphs.cache.stats()
    assert stats["evictions"] == 2 and stats["captures"] == 4 and stats["graphs"] == 2


# -- what is refused, and the fallback -------------------------------------------------------------
def test_torchbind_outer_graph_not_capturable_is_a_capability_error() -> None:
    engine, bridge = dynamic_engine()
    bridge.ops.capturable = False  # TensorRT-RTX enqueued nothing under capture
    with enable_cudagraphs(engine, outer=True):
        pattern = (
            r"^engine 'mlp': the CUDA graph captured from torch-tensorrt's execute_engine did not write "
            r"output 'y'.*REQUIRE_USER_ALLOCATION.*is_stream_capturable"
        )
        with pytest.raises(CapabilityError, match=pattern):
            engine.execute(dyn(2))
        calls = len(bridge.ops.calls)
        with pytest.raises(CapabilityError, match=pattern):
            engine.execute(dyn(3))  # known: not tried again
        assert len(bridge.ops.calls) == calls and engine.graph_captures == 0
        bridge.ops.capturable = True
        engine.reset_graphs()
        engine.execute(dyn(2))
        assert engine.graph_captures == 1


def test_torchbind_outer_graph_lazy_specialization_of_dynamic_inputs_is_noted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As the python backend, lazy specialization is captured (torch-tensorrt refuses it);
    an INFO log says what the graph keeps."""
    engine, _ = dynamic_engine(RuntimeSettings())
    with caplog.at_level(logging.INFO, logger="trt_runtime.torchbind"), enable_cudagraphs(engine, outer=True):
        for rows in (2, 3, 2):
            (out,) = engine.execute(dyn(rows, 2.0))
            np.testing.assert_array_equal(out.array, np.full((rows, 4), 4.0, np.float32))
    assert engine.graph_captures == 2
    notes = [r.getMessage() for r in caplog.records if "specialization_strategy='lazy'" in r.getMessage()]
    assert len(notes) == 1 and "'eager' compiles them before the capture" in notes[0]


def test_torchbind_outer_graph_capture_failure_is_a_capability_error() -> None:
    engine, bridge = dynamic_engine()
    bridge.ops.capture_error = RuntimeError("operation not permitted when stream is capturing")
    with enable_cudagraphs(engine, outer=True), pytest.raises(
        CapabilityError,
        match=r"could not capture torch-tensorrt's execute_engine \(RuntimeError: operation not permitted",
    ):
        engine.execute(dyn(2))


def test_torchbind_outer_graph_replay_failure_is_a_capability_error() -> None:
    engine, bridge = dynamic_engine()
    bridge.replay_error = RuntimeError("CUDA error: invalid argument")
    with enable_cudagraphs(engine, outer=True), pytest.raises(
        CapabilityError, match=r"could not be replayed \(RuntimeError: CUDA error: invalid argument\)"
    ):
        engine.execute(dyn(2))


def test_torchbind_outer_graph_warmup_failure_is_an_engine_error() -> None:
    engine, bridge = dynamic_engine()
    with enable_cudagraphs(engine, outer=True):
        engine.execute(dyn(2))
        bridge.ops.fail_with = RuntimeError("out of memory")
        with pytest.raises(EngineError, match=r"execute_engine failed .*: out of memory"):
            engine.execute(dyn(3))


def test_torchbind_outer_graph_with_rtx_strategy_runs_eagerly(caplog: pytest.LogCaptureFixture) -> None:
    engine, bridge = dynamic_engine()
    with caplog.at_level(logging.WARNING, logger="trt_runtime.torchbind"), enable_cudagraphs(
        engine, "whole_graph_capture", outer=True
    ):
        for value in (1.0, 2.0):
            (out,) = engine.execute(dyn(2, value))
            np.testing.assert_array_equal(out.array, np.full((2, 4), 2 * value, np.float32))
    assert engine.graph_captures == 0 and bridge.captured == []
    warnings = [r.getMessage() for r in caplog.records if "TensorRT-RTX's own CUDA graph" in r.getMessage()]
    assert len(warnings) == 1 and "calls run eagerly" in warnings[0]


def test_torchbind_outer_graph_keeps_the_hot_path_out() -> None:
    backend, bridge = make_backend("2.14.0")
    engine = backend.load_engine(source())
    engine(*inputs())
    with enable_cudagraphs(engine, outer=True):
        engine(*inputs())
        calls = len(bridge.ops.calls)
        for _ in range(3):
            engine(*inputs())
        assert len(bridge.ops.calls) == calls  # replays only
    engine(cuda(np.ones((2, 4))), cuda(np.ones((2, 4))))
    assert len(bridge.ops.calls) == calls + 1


def test_torchbind_outer_graph_captures_hold_the_process_wide_capture_lock(monkeypatch: Any) -> None:
    # torch.cuda.graph synchronizes the device when it starts, which fails while another
    # lane captures (H100, several contexts): captures take one lock, replays none.
    from _recording_lock import RecordingLock

    from trt_runtime import outer

    lock = RecordingLock()
    held = lock.held
    monkeypatch.setattr(outer, "CAPTURE_LOCK", lock)
    engine, _bridge = dynamic_engine()
    engine.outer_graph = True
    engine.execute(dyn(1))
    assert held == [True, False] and engine.graph_captures == 1
    engine.execute(dyn(1))  # a replay
    assert held == [True, False]


# -- the replay plan ---------------------------------------------------------------------------------
def test_torchbind_outer_graph_replay_plan_becomes_the_fast_entry() -> None:
    """A replay found through the shortcut makes the slot's plan the lane's fast entry; later
    calls of those shapes go straight to it (no _call_fast), other shapes, a stream= or an
    evicted slot go back through _call_fast, and each result stays right."""
    engine, bridge = dynamic_engine()
    engine.outer_graph = OuterGraph(max_graphs=2)
    engine.execute(dyn(2, 1.0))  # the capture
    engine.execute(dyn(2, 1.0))  # through the shortcut: the plan is made
    (slot,) = [s for s in engine._outer_graphs.cache.values() if s.key[0] == ((2, 4),)]
    assert slot.plan is not None and engine._fast_entry is slot.plan
    missed: list[int] = []
    call_fast = engine._call_fast

    def spy(*args: Any) -> Any:
        missed.append(1)
        return call_fast(*args)

    engine._call_fast = spy  # type: ignore[method-assign]
    slot.plan = None  # the plan below binds the spy as its miss
    engine._fast_entry = engine._call_fast
    engine.execute(dyn(2, 1.0))
    plan = engine._fast_entry
    assert plan is slot.plan and missed == [1]
    for value in (2.0, 3.0):
        (out,) = engine.execute(dyn(2, value))
        np.testing.assert_array_equal(out.array, np.full((2, 4), 2.0 * value, np.float32))
    assert missed == [1], "repeat calls go straight to the plan"
    (out,) = engine.execute(dyn(5, 1.0))  # other shapes: through _call_fast, then captured
    np.testing.assert_array_equal(out.array, np.full((5, 4), 2.0, np.float32))
    assert len(missed) == 2
    (out,) = engine.execute(dyn(2, 4.0), stream=bridge.active_stream(0))  # declined: general path
    np.testing.assert_array_equal(out.array, np.full((2, 4), 8.0, np.float32))
    engine._fast_entry = plan
    engine.execute(dyn(8, 1.0))  # evicts the least recently used (shape 5)...
    engine.execute(dyn(7, 1.0))  # ...and then shape 2, whose plan now declines
    assert slot.graph is None
    engine._fast_entry = plan
    captures = engine.graph_captures
    (out,) = engine.execute(dyn(2, 6.0))
    np.testing.assert_array_equal(out.array, np.full((2, 4), 12.0, np.float32))
    assert engine.graph_captures == captures + 1  # captured again, not the released graph


def test_torchbind_outer_graph_replay_plans_switch_shapes_plan_to_plan() -> None:
    """Shapes in turn (a dynamic engine's usual load): a replay plan hands a call of another
    captured shape straight to that slot's plan, not round _call_fast; results stay right,
    and a shape never captured still goes through _call_fast."""
    engine, _ = dynamic_engine()
    missed: list[tuple[int, ...]] = []
    call_fast = engine._call_fast

    def spy(inputs: Any, *args: Any) -> Any:
        missed.append(tuple(inputs[0].shape))
        return call_fast(inputs, *args)

    engine._call_fast = spy  # type: ignore[method-assign]
    engine._fast_entry = spy
    with enable_cudagraphs(engine, outer=True):
        for rows in (2, 2, 5, 5):  # captures, then the plans are made through the shortcut
            engine.execute(dyn(rows))
        plans = {s.key[0][0][0]: s.plan for s in engine._outer_graphs.cache.values()}
        assert None not in plans.values()
        missed.clear()
        for rows, value in ((2, 3.0), (5, 4.0), (2, 5.0), (5, 6.0)):
            (out,) = engine.execute(dyn(rows, value))
            np.testing.assert_array_equal(out.array, np.full((rows, 4), 2.0 * value, np.float32))
            assert engine._fast_entry is plans[rows]
        assert missed == []
        # the switch enters the other plan past its checks (its ``go``): each call checks
        # its input once, in the plan it came to
        checked: list[Any] = []
        contiguous = FakeTensor.is_contiguous
        FakeTensor.is_contiguous = lambda self: checked.append(self) or contiguous(self)  # type: ignore[method-assign]
        try:
            for rows in (2, 5, 2):
                x = dyn(rows)
                engine.execute(x)
                assert checked == [x] and engine._fast_entry is plans[rows]
                checked.clear()
        finally:
            FakeTensor.is_contiguous = contiguous  # type: ignore[method-assign]
        engine.execute(dyn(7))  # never captured: through _call_fast
        assert missed == [(7, 4)]
        assert engine.graph_captures == 3


def test_torchbind_thread_start_binds_the_thread_before_a_plan_runs() -> None:
    """A thread's first call may go straight to a replay plan (no _call_fast): the core's
    _thread_start binds torch's device for that thread first."""
    import threading

    from trt_runtime_backends.torchbind import engine as engine_module

    engine, bridge = dynamic_engine()
    engine.outer_graph = True
    engine.execute(dyn(2))
    engine.execute(dyn(2))
    assert engine._fast_entry is not engine._call_fast
    bound: list[int] = []
    bind = bridge.bind_thread
    bridge.bind_thread = lambda index: (bound.append(index), bind(index))  # type: ignore[method-assign]
    results: list[Any] = []

    def work() -> None:
        assert "bound" not in engine_module._THREAD.__dict__
        results.append(engine.execute(dyn(2, 2.0))[0])

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert bound == [0]
    np.testing.assert_array_equal(results[0].array, np.full((2, 4), 4.0, np.float32))


def test_torchbind_outer_graph_copies_inputs_through_the_launchers_copy() -> None:
    """With the launcher's device copy (cuda-python's cudaMemcpyAsync), a replay copies each input
    into its static buffer through it, by address and size, on the current stream's handle,
    not with ``copy_``; an input that is the static buffer itself is not copied."""
    import ctypes

    engine, bridge = dynamic_engine()
    copies: list[tuple[int, int, int, int]] = []

    def copy(dst: int, src: int, nbytes: int, stream: int) -> int:
        copies.append((dst, src, nbytes, stream))
        ctypes.memmove(dst, src, nbytes)
        return 0

    def factory(graph: Any) -> Any:
        return (lambda stream: graph.replay()), copy

    bridge.launcher_factory = factory
    with enable_cudagraphs(engine, outer=True):
        engine.execute(dyn(2, 1.0))  # the capture
        bridge.events.clear()
        x = dyn(2, 3.0)
        (out,) = engine.execute(x)
        np.testing.assert_array_equal(out.array, np.full((2, 4), 6.0, np.float32))
        ((_dst, src, nbytes, stream),) = copies
        assert src == x.data_ptr() and nbytes == x.array.nbytes and stream == id(bridge.active_stream(0))
        assert ("copy", "current:0") not in bridge.events
        failing = copies.append  # a failed copy is an EngineError naming the error

        def broken(dst: int, src: int, nbytes: int, stream: int) -> int:
            failing((dst, src, nbytes, stream))
            return 700

        bridge.launcher_factory = lambda graph: ((lambda stream: graph.replay()), broken)
        engine.reset_graphs()
        engine.execute(dyn(2, 1.0))  # captured again: a new plan with the new copy
        with pytest.raises(EngineError, match=r"into its CUDA graph's static buffer failed: 700"):
            engine.execute(dyn(2, 5.0))


# -- copies as nodes of a second graph (GraphOps.copy_nodes) ------------------------------------
def nodes_engine(mode: str) -> tuple[Any, Any, FakeNodeRuntime]:
    """A dynamic engine whose bridge builds copy nodes (and launches through cuda-python),
    captured for two rows under ``outer=mode``; the caller leaves the wrap."""
    engine, bridge = dynamic_engine()
    rt = bridge.node_runtime = FakeNodeRuntime(bridge)
    bridge.launcher_factory = lambda graph: (lambda stream: graph.replay())
    engine.outer_graph = mode
    engine.execute(dyn(2, 1.0))  # the capture (the general path: no nodes yet)
    return engine, bridge, rt


@pytest.mark.parametrize("mode", ["copy", "view"])
def test_torchbind_outer_graph_replays_through_copy_nodes(mode: str) -> None:
    """A replay sets the input node's address (and in "copy" mode the new output's) and
    launches the built graph once, on the current stream: no copy_, no clone, no second
    launch; the built graph is memcpy in -> the captured graph -> memcpy out, its static side
    the static buffers; outputs are right, new tensors in "copy" mode, the static outputs in
    "view" mode."""
    engine, bridge, rt = nodes_engine(mode)
    (slot,) = engine._outer_graphs.shortcuts.values()
    (graph,) = bridge.captured
    clones = bridge.clones  # the capturing call's
    results = []
    xs = [dyn(2, value) for value in (2.0, 3.0, 4.0)]  # kept: each at an address of its own
    for x, value in zip(xs, (2.0, 3.0, 4.0), strict=True):
        bridge.events.clear()
        (out,) = engine.execute(x)
        assert bridge.events == [("launch nodes", "current:0")]
        np.testing.assert_array_equal(out.array, np.full((2, 4), 2 * value, np.float32))
        results.append(out)
    assert rt.named("cudaGraphLaunch") == 3
    per_call = 2 if mode == "copy" else 1
    assert rt.named("cudaGraphExecMemcpyNodeSetParams1D") == 3 * per_call
    xs[-1].array[...] = 5.0  # the same buffer again: its node already reads it, not set again
    (out,) = engine.execute(xs[-1])
    np.testing.assert_array_equal(out.array, np.full((2, 4), 10.0, np.float32))
    assert rt.named("cudaGraphExecMemcpyNodeSetParams1D") == 3 * per_call + per_call - 1
    first = 4.0 if mode == "copy" else 10.0  # "copy": not overwritten; "view": the static output
    np.testing.assert_array_equal(results[0].array, np.full((2, 4), first, np.float32))
    results.append(out)
    assert bridge.clones == clones and graph.replays == 1 + 4  # the capture's check, then the child node
    ((_built, nodes),) = rt.graphs.items()
    kinds = [kind for _, kind, _, _ in nodes]
    assert kinds == (["memcpy", "child", "memcpy"] if mode == "copy" else ["memcpy", "child"])
    (in_node, _, (dst, _, nbytes), deps), (child, _, captured, child_deps) = nodes[0], nodes[1]
    assert dst == slot.inputs[0].data_ptr() and nbytes == slot.inputs[0].array.nbytes and deps == []
    assert captured is graph and child_deps == [in_node]
    if mode == "copy":
        (_, _, (_, src, _), out_deps) = nodes[2]
        assert src == slot.outputs[0].data_ptr() and out_deps == [child]
        assert len({id(r) for r in results}) == 4 and all(r is not slot.outputs[0] for r in results)
    else:
        assert all(r is slot.outputs[0] for r in results)


def test_torchbind_outer_graph_copy_mode_outputs_come_from_slabs() -> None:
    """Through the copy nodes in "copy" mode the outputs come from slabs
    (``trt_runtime.slabs``): one ``torch.empty`` of ``(SLAB_CALLS, *shape)`` per SLAB_CALLS
    replays, each output a row of it at an address of its own that the output node is
    pointed at; every output kept is its own call's."""
    from trt_runtime.slabs import SLAB_CALLS

    engine, _, rt = nodes_engine("copy")
    FakeBridge.emptied.clear()
    sets = rt.named("cudaGraphExecMemcpyNodeSetParams1D")
    xs = [dyn(2, float(k)) for k in range(SLAB_CALLS + 2)]  # kept: each at an address of its own
    outs = [engine.execute(x)[0] for x in xs]
    assert FakeBridge.emptied == [(SLAB_CALLS, 2, 4)] * 2
    assert len({o.data_ptr() for o in outs}) == SLAB_CALLS + 2
    # every call points the input node at its input and the output node at its own row
    assert rt.named("cudaGraphExecMemcpyNodeSetParams1D") - sets == 2 * (SLAB_CALLS + 2)
    for k, out in enumerate(outs):
        np.testing.assert_array_equal(out.array, np.full((2, 4), 2.0 * k, np.float32))


def test_torchbind_outer_graph_copy_nodes_step_aside_for_static_inputs_and_refusals() -> None:
    """A call given the static input itself takes the plain replay (nothing to copy in); an
    address CUDA refuses sends that call the plain way too (copy_, launch, clone); both right."""
    engine, bridge, rt = nodes_engine("copy")
    (slot,) = engine._outer_graphs.shortcuts.values()
    static = slot.inputs[0]
    static.array[...] = 5.0
    clones = bridge.clones
    (out,) = engine.execute(static)
    np.testing.assert_array_equal(out.array, np.full((2, 4), 10.0, np.float32))
    assert rt.named("cudaGraphLaunch") == 0 and bridge.clones == clones + 1
    rt.refuse = "cudaGraphExecMemcpyNodeSetParams1D"
    bridge.events.clear()
    (out,) = engine.execute(dyn(2, 6.0))
    np.testing.assert_array_equal(out.array, np.full((2, 4), 12.0, np.float32))
    assert rt.named("cudaGraphLaunch") == 0 and ("copy", "current:0") in bridge.events
    rt.refuse = None
    (out,) = engine.execute(dyn(2, 7.0))  # the nodes again
    np.testing.assert_array_equal(out.array, np.full((2, 4), 14.0, np.float32))
    assert rt.named("cudaGraphLaunch") == 1


def test_torchbind_outer_graph_copy_nodes_not_built_when_cuda_refuses() -> None:
    """A build CUDA refuses leaves the replays copying with calls of their own; nothing kept."""
    engine, bridge = dynamic_engine()
    rt = bridge.node_runtime = FakeNodeRuntime(bridge)
    rt.refuse = "cudaGraphAddChildGraphNode"
    bridge.launcher_factory = lambda graph: (lambda stream: graph.replay())
    with enable_cudagraphs(engine, outer=True):
        engine.execute(dyn(2, 1.0))
        (out,) = engine.execute(dyn(2, 3.0))
    np.testing.assert_array_equal(out.array, np.full((2, 4), 6.0, np.float32))
    assert rt.graphs == {} and rt.execs == {} and engine._graphs.copying == {}
    assert rt.named("cudaGraphLaunch") == 0 and bridge.clones == 2  # the capturing call's, the replay's


def test_torchbind_outer_graph_copy_nodes_released_before_their_graph() -> None:
    """reset_graphs(), a mode change and close() destroy the built graph and its executable
    before the captured graph is reset; an engine collected without close() destroys them too."""
    import gc

    engine, bridge, rt = nodes_engine("copy")
    engine.execute(dyn(2, 2.0))
    (graph,) = bridge.captured
    assert len(rt.execs) == 1 and graph.resets == 0
    resets_seen: list[int] = []
    original = rt.cudaGraphExecDestroy

    def destroy(graph_exec: int) -> tuple[int]:
        resets_seen.append(graph.resets)
        return original(graph_exec)

    rt.cudaGraphExecDestroy = destroy  # type: ignore[method-assign]
    engine.reset_graphs()
    assert rt.execs == {} and rt.graphs == {} and resets_seen == [0] and graph.resets == 1
    engine.execute(dyn(2, 1.0))  # captured again
    engine.execute(dyn(2, 2.0))  # nodes again
    assert len(rt.execs) == 1
    engine.outer_graph = "view"  # a new mode: the graphs go
    assert rt.execs == {}
    engine.execute(dyn(2, 1.0))
    engine.execute(dyn(2, 2.0))
    assert len(rt.execs) == 1
    engine.close()
    assert rt.execs == {} and rt.graphs == {}
    engine, bridge, rt = nodes_engine("copy")
    engine.execute(dyn(2, 2.0))
    assert len(rt.execs) == 1
    del engine
    gc.collect()
    assert rt.execs == {} and rt.graphs == {}
