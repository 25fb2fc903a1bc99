"""The python backend's outer CUDA-graph wrap, driven with test doubles for TensorRT, the CUDA
runtime and torch: capture once per shape key, replay, re-capture, copy vs view outputs,
static input buffers, refusals. Copies as nodes of the graph: test_python_copy_nodes.py."""

from __future__ import annotations

import gc
import re
from typing import Any

import numpy as np
import pytest
from _python_doubles import (
    _CAI,
    FakeTorch,
    _fake_engine,
    _FakeBuffer,
    _FakeRuntime,
    _trt_calls,
    count_lookups,
)
from trt_runtime_backends.python.arrays import DeviceArray

from trt_runtime import (
    CapabilityError,
    EngineError,
    InputError,
    RuntimeSettings,
    enable_cudagraphs,
    runtime_config,
)

H2D, D2H, D2D = 1, 2, 3


def _count(calls: list[tuple[Any, ...]], kind: str) -> int:
    return sum(1 for c in calls if c[0] == kind)


def _device(batch: int = 2) -> DeviceArray:
    return DeviceArray(_FakeBuffer(batch * 16), (batch, 4), "float32", 0)


def test_python_outer_graph_captures_once_per_shape_and_replays() -> None:
    engine = _fake_engine()
    engine.outer_graph = True
    rt, calls = engine._rt, None
    out = engine.execute(np.ones((2, 4), np.float32))[0]
    assert isinstance(out, np.ndarray) and out.shape == (2, 4)
    calls = _trt_calls(engine)
    capture_stream = engine._lanes[0].ops.graphs.capture_stream.handle
    assert capture_stream != 4242
    # one eager warm-up run on our stream, then the capture on the private stream
    assert [c for c in calls if c[0] == "execute"] == [("execute", 4242), ("execute", capture_stream)]
    assert ("capturable", capture_stream) in calls
    assert ("begin_capture", capture_stream, 1) in rt.calls  # cudaStreamCaptureModeThreadLocal
    assert engine.graph_captures == 1
    calls.clear()
    rt.calls.clear()
    engine.execute(np.ones((2, 4), np.float32))
    assert calls == []  # a replay calls no TensorRT function
    assert _count(rt.calls, "launch") == 1 and _count(rt.calls, "begin_capture") == 0
    engine.execute(np.ones((3, 4), np.float32))  # a new shape: a new graph
    assert engine.graph_captures == 2
    calls.clear()
    rt.calls.clear()
    engine.execute(np.ones((2, 4), np.float32))  # back: replayed; the graph holds its shapes
    assert engine.graph_captures == 2 and _count(rt.calls, "launch") == 1
    assert calls == []  # no set_input_shape, no memory call: the context is left as it was
    engine.execute(np.ones((20, 4), np.float32))  # another profile
    assert engine.graph_captures == 3
    calls.clear()
    engine.execute(np.ones((2, 4), np.float32))  # replayed: no profile switch either
    assert calls == [] and engine.graph_captures == 3
    engine.outer_graph = None
    engine.execute(np.ones((2, 4), np.float32))  # eager: from the context's real state
    assert ("profile", 0) in calls and ("shape", "x", (2, 4)) in calls


def test_python_outer_graph_host_inputs_are_copied_straight_into_static_buffers() -> None:
    engine = _fake_engine()
    engine.outer_graph = "view"
    engine.execute(np.ones((2, 4), np.float32))
    rt = engine._rt
    rt.copies.clear()
    out = engine.execute(np.ones((2, 4), np.float32))[0]
    assert isinstance(out, np.ndarray)  # host in, host out, also in view mode
    (slot,) = engine._lanes[0].outer_graphs.cache.values()
    assert [(k, dst) for k, dst, *_ in rt.copies] == [(H2D, slot.in_ptrs[0]), (D2H, out.ctypes.data)]
    assert rt.calls[-1] == ("sync", 4242)


def test_python_outer_graph_copy_mode_returns_new_arrays() -> None:
    engine = _fake_engine()
    x = _device()
    with enable_cudagraphs(engine, outer=True):
        first = engine.execute(x)[0]
        second = engine.execute(x)[0]
    assert isinstance(first, DeviceArray) and isinstance(second, DeviceArray)
    assert first.ptr != second.ptr
    (slot,) = engine._lanes[0].outer_graphs.cache.values() if engine._lanes[0].outer_graphs.cache else (None,)
    assert slot is None  # leaving the wrap dropped the graphs
    copies = [c for c in engine._rt.copies if c[0] == D2D]
    # per call: x into the static input, the static output into a new array
    assert [c[2] for c in copies[-2:]] == [x.ptr, copies[-1][2]]
    assert copies[-1][1] == second.ptr
    assert second.stream == 4242  # no caller stream: consumers wait on our stream


def test_python_outer_graph_view_mode_returns_the_static_buffers() -> None:
    engine = _fake_engine()
    engine.outer_graph = "view"
    first = engine.execute(_device())[0]
    second = engine.execute(_device())[0]
    assert first is second
    (slot,) = engine._lanes[0].outer_graphs.cache.values()
    assert first is slot.outputs[0]
    assert not [c for c in engine._rt.copies if c[2] == first.ptr]  # nothing copied out


def test_python_outer_graph_static_inputs_skip_the_copy() -> None:
    engine = _fake_engine()
    with pytest.raises(EngineError, match=r"static_inputs\(\) needs the outer CUDA-graph wrap"):
        engine.static_inputs((2, 4))
    engine.outer_graph = "view"
    with pytest.raises(InputError, match=r"takes 1 input\(s\) \(x\); static_inputs\(\) got 2"):
        engine.static_inputs((2, 4), (2, 4))
    with pytest.raises(InputError, match="outside every optimization profile"):
        engine.static_inputs((99, 4))
    (static,) = engine.static_inputs((2, 4))
    assert isinstance(static, DeviceArray) and static.shape == (2, 4)
    engine.execute(static)
    engine._rt.copies.clear()
    engine.execute(static)
    engine.execute(_CAI((2, 4), "<f4", ptr=static.ptr))  # any array at that address
    assert engine._rt.copies == []
    other = _device()
    engine.execute(other)
    assert [(c[0], c[1], c[2]) for c in engine._rt.copies] == [(D2D, static.ptr, other.ptr)]
    assert engine.static_inputs((2, 4))[0] is static
    assert engine.graph_captures == 1


def test_python_outer_graph_refused_when_not_capturable() -> None:
    engine = _fake_engine()
    engine.ensure_context().trt_context.capturable = False
    engine.outer_graph = True
    message = (
        "engine 'fake': TensorRT says its execution context cannot be captured into a CUDA graph "
        "(IExecutionContext.is_stream_capturable returned False). TensorRT-RTX captures only contexts "
        "whose memory the application provides (this backend creates them USER_MANAGED, which engines "
        "built with BuilderFlag.REQUIRE_USER_ALLOCATION need)"
    )
    with pytest.raises(CapabilityError, match=re.escape(message)):
        engine.execute(_device())
    assert engine.graph_captures == 0
    assert _count(engine._rt.calls, "begin_capture") == 0
    engine.outer_graph = None
    assert engine.execute(_device())[0].shape == (2, 4)  # eager still works


def test_python_outer_graph_refuses_output_allocators() -> None:
    engine = _fake_engine()
    engine.output_allocator = "always"
    engine.outer_graph = True
    with pytest.raises(CapabilityError, match=r"outputs \['y'\] go through an IOutputAllocator"):
        engine.execute(_device())


def test_python_outer_graph_failed_capture_ends_the_capture() -> None:
    engine = _fake_engine()
    engine.outer_graph = True
    ctx = engine.ensure_context()
    ctx.trt_context.fail_streams.add(engine._lanes[0].ops.graphs.capture_handle())
    with pytest.raises(EngineError, match=r"capturing execute_async_v3 into a CUDA graph failed: \[TRT\]"):
        engine.execute(_device())
    rt = engine._rt.calls
    assert _count(rt, "begin_capture") == _count(rt, "end_capture") == 1
    assert _count(rt, "graph_destroy") == 1 and engine.graph_captures == 0


def test_python_outer_graph_dropped_on_settings_change_and_recaptured() -> None:
    engine = _fake_engine()
    x = _device()
    with enable_cudagraphs(engine, outer=True):
        engine.execute(x)
        engine.execute(x)
        assert engine.graph_captures == 1
        (first_exec,) = engine._lanes[0].ops._res.graph_execs
        with runtime_config(engine, dynamic_shapes_kernel_specialization_strategy="eager"):
            assert ("exec_destroy", first_exec) in engine._rt.calls
            assert len(engine._lanes[0].outer_graphs.cache) == 0
            engine.execute(x)
            engine.execute(x)
            assert engine.graph_captures == 2
        engine.execute(x)
        assert engine.graph_captures == 3
        engine.runtime_settings = RuntimeSettings(cuda_graph_strategy="disabled",
                                                  dynamic_shapes_kernel_specialization_strategy="none")
        engine.execute(x)
        assert engine.graph_captures == 4
        engine.reset_graphs()
        engine.execute(x)
        assert engine.graph_captures == 5
        creations = engine.context_creations
        engine.outer_graph = "view"  # another mode: graphs dropped, context kept
        engine.execute(x)
        assert engine.graph_captures == 6 and engine.context_creations == creations
    assert engine.outer_graph is None and engine._lanes[0].ops._res.graph_execs == []


def test_python_outer_graph_preallocated_outputs_are_written() -> None:
    engine = _fake_engine()
    engine.outer_graph = "view"
    x, y = _device(), _device()
    assert engine.execute(x, outputs=[y])[0] is y
    engine._rt.copies.clear()
    assert engine.execute(x, outputs=[y])[0] is y
    (slot,) = engine._lanes[0].outer_graphs.cache.values()
    assert (D2D, y.ptr, slot.out_ptrs[0]) in [c[:3] for c in engine._rt.copies]
    with pytest.raises(InputError, match=r"output 'y' must have shape \(2, 4\); got \(3, 4\)"):
        engine.execute(x, outputs=[_device(3)])


def test_python_outer_graph_preallocated_outputs_of_a_replay_after_another_shape(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``outputs=`` of a replayed graph are checked against that graph's shapes, whatever
    shapes the context took since (another shape's capture; found by the conformance
    kit's state machine on the GPU)."""
    engine = _fake_engine()
    engine.outer_graph = True
    x2, x3 = _device(2), _device(3)
    engine.execute(x2)
    engine.execute(x3)  # captured last: the context is in (3, 4) now
    y2 = _device(2)
    assert engine.execute(x2, outputs=[y2])[0] is y2
    assert engine.graph_captures == 2  # a replay
    engine._rt.calls.clear()
    with pytest.raises(InputError, match=r"output 'y' must have shape \(2, 4\); got \(3, 4\)"):
        engine.execute(x2, outputs=[_device(3)])
    assert engine._rt.calls == []  # refused before anything was queued: no copy, no launch
    from trt_runtime_backends.python.output_binding import OutputBinding

    checks = count_lookups(monkeypatch, OutputBinding, "check_outputs")
    assert engine.execute(x2, outputs=[y2])[0] is y2
    assert len(checks) == 1  # checked once, before the replay, not again after it


def test_python_outer_graph_orders_the_callers_stream() -> None:
    engine = _fake_engine()
    engine.outer_graph = True
    engine.execute(_device(), stream=77)
    engine._rt.calls.clear()
    engine.execute(_device(), stream=77)
    kinds = [c[0] for c in engine._rt.calls if c[0] in ("record", "wait", "launch")]
    assert kinds == ["record", "wait", "launch", "record", "wait"]


def test_python_outer_graph_torch_replay_shortcut(torch: FakeTorch) -> None:
    engine = _fake_engine()
    x = torch.cuda_tensor((2, 4))
    engine(x)  # eager: no graph
    assert engine.graph_captures == 0
    with enable_cudagraphs(engine, outer=True):
        first = engine(x)
        assert engine.graph_captures == 1 and first.get_device() == 0
        assert engine._lanes[0].outer_graphs.shortcuts
        rt = engine._rt
        rt.calls.clear()
        again = engine(torch.cuda_tensor((2, 4)))  # another tensor of the same shape
        assert again.shape == (2, 4) and again.data_ptr() != first.data_ptr()
        # torch's legacy default stream: CUDA orders our blocking stream with it, no event
        assert [c[0] for c in rt.calls] == ["memcpy", "launch", "memcpy"]
        torch.current_stream = 55  # a side stream: the replay follows it, after our stream
        rt.calls.clear()
        engine(torch.cuda_tensor((2, 4)))
        assert [c[0] for c in rt.calls] == ["record", "wait", "memcpy", "launch", "memcpy"]
        assert [c[-1] for c in rt.calls if c[0] in ("memcpy", "launch")] == [55, 55, 55]
        rt.calls.clear()
        engine(torch.cuda_tensor((2, 4)))  # 55 again: nothing to order
        assert [c[0] for c in rt.calls] == ["memcpy", "launch", "memcpy"]
        with pytest.raises(InputError, match=r"input 'x' must have dtype float32; got torch\.float16"):
            engine(torch.cuda_tensor((2, 4), torch.float16))
        with pytest.raises(InputError, match="input 'x' is not contiguous"):
            engine(torch.cuda_tensor((2, 4), contiguous=False))
    with enable_cudagraphs(engine, outer="view"):
        (static,) = engine.static_inputs((2, 4), as_torch=True)
        y1 = engine(static)
        engine._rt.calls.clear()
        y2 = engine(static)
        assert y1 is y2  # the same torch view of the static output, every call
        assert [c[0] for c in engine._rt.calls] == ["record", "wait", "launch"]  # onto 55, once
        torch.current_stream = 0
        engine._rt.calls.clear()
        engine(static)  # the legacy stream: back on our (blocking) stream, after 55
        assert [c[0] for c in engine._rt.calls] == ["record", "wait", "launch"]
        engine._rt.calls.clear()
        engine(static)
        assert [c[0] for c in engine._rt.calls] == ["launch"]  # one graph launch, nothing else


def test_python_outer_graph_destroyed_with_the_engine() -> None:
    engine = _fake_engine()
    engine.outer_graph = True
    engine.execute(_device())
    rt = engine._rt
    (graph_exec,) = engine._lanes[0].ops._res.graph_execs
    engine.close()
    assert ("exec_destroy", graph_exec) in rt.calls
    assert engine._lanes[0].ops.graphs.capture_stream is None
    collected = _fake_engine()
    collected.outer_graph = True
    collected.execute(_device())
    rt = collected._rt
    (graph_exec,) = collected._lanes[0].ops._res.graph_execs
    del collected
    gc.collect()
    assert ("exec_destroy", graph_exec) in rt.calls


def test_python_outer_graph_lru_keeps_max_graphs_and_counts() -> None:
    from trt_runtime import OuterGraph

    engine = _fake_engine()
    rt = engine._rt
    del type(rt).cudaGraphExecUpdate  # an older cuda-python: every capture instantiates
    try:
        engine.outer_graph = OuterGraph(outputs="copy", max_graphs=2)
        for batch in (2, 3, 2, 4):  # 2 was used after 3: 3 is evicted when 4 comes
            engine.execute(np.ones((batch, 4), np.float32))
        stats = engine.graph_stats()
        assert stats == {"graphs": 2, "hits": 1, "misses": 3, "captures": 3, "evictions": 1, "updates": 0,
                         "max_graphs": 2}
        rt.calls.clear()
        engine.execute(np.ones((2, 4), np.float32))  # still there: a replay
        assert _count(rt.calls, "launch") == 1 and engine.graph_captures == 3
        engine.execute(np.ones((3, 4), np.float32))  # evicted: captured again
        assert engine.graph_captures == 4 and engine.graph_stats()["evictions"] == 2
        assert _count(rt.calls, "exec_destroy") == 1 and _count(rt.calls, "instantiate") == 1
    finally:
        type(rt).cudaGraphExecUpdate = _UPDATE
    with pytest.raises(ValueError, match="max_graphs must be an int >= 1; got 0"):
        OuterGraph(max_graphs=0)


_UPDATE = type(_fake_engine()._rt).cudaGraphExecUpdate


def test_python_outer_graph_capture_updates_the_evicted_executable_graph() -> None:
    """Beyond max_graphs a new shape's graph is captured and written into the executable
    graph just evicted (cudaGraphExecUpdate) instead of instantiating another one."""
    from trt_runtime import OuterGraph

    engine = _fake_engine()
    rt = engine._rt
    engine.outer_graph = OuterGraph(outputs="copy", max_graphs=1)
    engine.execute(np.ones((2, 4), np.float32))
    (first,) = engine._lanes[0].ops._res.graph_execs
    rt.calls.clear()
    engine.execute(np.ones((3, 4), np.float32))  # evicts 2; its executable graph is updated
    update = [c for c in rt.calls if c[0] == "exec_update"]
    assert len(update) == 1 and update[0][1] == first
    assert _count(rt.calls, "instantiate") == 0 and _count(rt.calls, "exec_destroy") == 0
    assert engine._lanes[0].ops._res.graph_execs == [first]
    rt.calls.clear()
    engine.execute(np.ones((3, 4), np.float32))  # the replay launches the updated graph
    assert [c[1] for c in rt.calls if c[0] == "launch"] == [first]
    stats = engine.graph_stats()
    assert stats["captures"] == 2 and stats["updates"] == 1 and stats["evictions"] == 1
    assert engine.graph_captures == 2


def test_python_outer_graph_refused_update_instantiates_and_destroys_the_spare() -> None:
    from trt_runtime import OuterGraph

    engine = _fake_engine()
    rt = engine._rt
    engine.outer_graph = OuterGraph(max_graphs=1)
    engine.execute(np.ones((2, 4), np.float32))
    (first,) = engine._lanes[0].ops._res.graph_execs
    rt.update_refused = True  # another topology
    rt.calls.clear()
    out = engine.execute(np.ones((3, 4), np.float32))[0]
    assert out.shape == (3, 4)
    assert _count(rt.calls, "exec_update") == 1 and ("exec_destroy", first) in rt.calls
    assert _count(rt.calls, "instantiate") == 1
    (second,) = engine._lanes[0].ops._res.graph_execs
    assert second != first and engine.graph_stats()["updates"] == 0


def test_python_outer_graph_spare_goes_before_its_context() -> None:
    """A spare executable graph (kept from reset_graphs) is destroyed when its context is
    dropped, and a context created later never updates a graph of the old one."""
    engine = _fake_engine()
    rt = engine._rt
    engine.outer_graph = True
    x = _device()
    engine.execute(x)
    (first,) = engine._lanes[0].ops._res.graph_execs
    engine.reset_graphs()
    assert engine._lanes[0].ops.graphs.spare is not None and engine._lanes[0].ops._res.graph_execs == [first]
    rt.calls.clear()
    engine.invalidate_context()
    assert ("exec_destroy", first) in rt.calls and engine._lanes[0].ops.graphs.spare is None
    assert engine._lanes[0].ops._res.graph_execs == []
    engine.execute(x)
    assert _count(rt.calls, "exec_update") == 0 and _count(rt.calls, "instantiate") == 1
    # a spare kept from the old context is not updated by the new one's capture
    engine.reset_graphs()
    stale = engine._lanes[0].ops.graphs.spare
    engine._lanes[0].ops.graphs.spare = (stale[0], object())
    rt.calls.clear()
    engine.execute(x)
    assert _count(rt.calls, "exec_update") == 0 and ("exec_destroy", stale[0]) in rt.calls
    engine.close()
    assert engine._lanes[0].ops.graphs.spare is None and engine._lanes[0].ops._res.graph_execs == []


def test_python_outer_graph_captures_hold_the_process_wide_capture_lock(monkeypatch: Any) -> None:
    # TensorRT-RTX 1.6.1 crashed when two contexts of one engine captured at once (H100):
    # the warm-up run and the capture happen under one lock, a replay takes none.
    from _recording_lock import RecordingLock

    from trt_runtime import outer

    lock = RecordingLock()
    held = lock.held
    monkeypatch.setattr(outer, "CAPTURE_LOCK", lock)
    engine = _fake_engine()
    engine.outer_graph = True
    engine.execute(np.ones((2, 4), np.float32))
    assert held == [True, False] and engine.graph_captures == 1
    engine.execute(np.ones((2, 4), np.float32))  # a replay
    assert held == [True, False]


def test_python_outer_graph_replay_plans_switch_shapes_directly(torch: FakeTorch, monkeypatch: Any) -> None:
    """Inputs of another shape captured before go from one replay plan straight to that
    shape's plan (no way round ``call_fast``), launching that shape's graph; a shape never
    captured still goes the full way and is captured."""
    from trt_runtime_backends.python.graphs import PythonGraphs

    looked_up = count_lookups(monkeypatch, PythonGraphs, "replay_torch", takes_lane=False)
    engine = _fake_engine()
    a, b = torch.cuda_tensor((2, 4)), torch.cuda_tensor((3, 4))
    with enable_cudagraphs(engine, outer="view"):
        for x in (a, b, a, b):  # captures, then a plan made for each shape
            engine(x)
        assert engine.graph_captures == 2
        plans = {shape: slot.plan for shape, slot in engine._lanes[0].outer_graphs.shortcuts.items()}
        assert all(plans.values())
        looked_up.clear()
        engine._rt.calls.clear()
        for x in (a, b, a, b, a):
            out = engine(x)
            assert out.shape == x.shape
        assert looked_up == []  # every switch went plan to plan
        launched = [c[1] for c in engine._rt.calls if c[0] == "launch"]
        slots = engine._lanes[0].outer_graphs.shortcuts
        assert launched == [slots[(x.shape,)].graph for x in (a, b, a, b, a)]
        assert engine._lanes[0].fast_entry is plans[(a.shape,)]
        engine(torch.cuda_tensor((5, 4)))  # a new shape: captured through the full path
        assert engine.graph_captures == 3 and looked_up == [(5, 4)]


class _StreamT(int):
    """cuda-python's ``cudaStream_t`` as the runtime double has it: the handle, of its own type."""


class _TypedRuntime(_FakeRuntime):
    cudaStream_t = _StreamT


def test_python_outer_graph_replays_hand_cuda_python_a_made_stream_object(torch: FakeTorch) -> None:
    """A replay on the lane's own stream gives the launch and the input copy the ``cudaStream_t``
    made once per lane stream, not the int (which cuda-python would turn into one on every
    call); a replay that follows a caller's stream gives the caller's handle."""
    engine = _fake_engine(runtime=_TypedRuntime())
    ours = engine._lanes[0].ops._order.ours
    with enable_cudagraphs(engine, outer=True):
        engine(torch.cuda_tensor((2, 4)))
        rt = engine._rt
        rt.calls.clear()
        engine(torch.cuda_tensor((2, 4)))  # the legacy stream: on ours
        on = [c[-1] for c in rt.calls if c[0] in ("memcpy", "launch")]
        assert [type(s) for s in on] == [_StreamT] * 3 and on == [ours] * 3  # copy in, launch, copy out
        torch.current_stream = 55
        engine(torch.cuda_tensor((2, 4)))
        rt.calls.clear()
        engine(torch.cuda_tensor((2, 4)))  # following 55
        on = [c[-1] for c in rt.calls if c[0] in ("memcpy", "launch")]
        assert on == [55] * 3 and {type(s) for s in on} == {int}
        order = engine._lanes[0].ops._order
        order.use_stream(99, None, ())  # another stream of the lane (see PythonLane._pick_stream)
        assert type(order.ours_t) is _StreamT and order.ours_t == 99


def test_python_outer_replay_of_none_is_refused_as_an_input(torch: FakeTorch) -> None:
    """A plain replay plan remembers the static buffer a call gave it; before any did, an input of
    ``None`` is not taken for it (an AttributeError once): the general path names the input."""
    engine = _fake_engine()
    with enable_cudagraphs(engine, outer="view"):
        engine(torch.cuda_tensor((2, 4)))
        engine(torch.cuda_tensor((2, 4)))  # a replay: the plain plan is the lane's current one
        with pytest.raises(InputError, match="input 'x'"):
            engine(None)
