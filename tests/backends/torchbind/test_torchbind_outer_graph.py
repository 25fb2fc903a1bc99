"""The torchbind backend's outer CUDA graph on the CPU, against the doubles of
tests/_torchbind_doubles.py, whose CUDA graph replays the captured ``execute_engine`` calls
from the current contents of their static inputs: capture, replay, re-capture on shape
and settings changes, output modes, streams, and what is refused."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
from _torchbind_doubles import cuda, inputs, make_backend, source
from _torchbind_fakes import FakeStream, FakeTensor
from _torchbind_graphs import WARMUP, dyn, dynamic_engine

from trt_runtime.contexts import enable_cudagraphs, runtime_config
from trt_runtime.errors import CapabilityError, EngineError, InputError
from trt_runtime.graphs import OuterGraph
from trt_runtime.protocols import TensorSpec
from trt_runtime.settings import CudaGraphStrategy, RuntimeSettings


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
    stats = engine._lanes[0].outer_graphs.cache.stats()
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
