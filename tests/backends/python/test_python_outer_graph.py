"""The python backend's outer CUDA-graph wrap, driven with test doubles for TensorRT, the CUDA
runtime and torch: capture once per shape key, replay, re-capture, copy vs view outputs,
static input buffers, refusals."""

from __future__ import annotations

import gc
import re
import sys
from typing import Any

import numpy as np
import pytest
from _python_doubles import (
    _CAI,
    FakeTorch,
    _fake_engine,
    _FakeBuffer,
    _FakeRuntimeNodes,
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


@pytest.fixture
def torch(monkeypatch: pytest.MonkeyPatch) -> FakeTorch:
    fake = FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", fake)
    return fake


def test_python_outer_graph_captures_once_per_shape_and_replays() -> None:
    engine = _fake_engine()
    engine.outer_graph = True
    rt, calls = engine._rt, None
    out = engine.execute(np.ones((2, 4), np.float32))[0]
    assert isinstance(out, np.ndarray) and out.shape == (2, 4)
    calls = _trt_calls(engine)
    capture_stream = engine._graphs.capture_stream.handle
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
    (slot,) = engine._outer_graphs.cache.values()
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
    (slot,) = engine._outer_graphs.cache.values() if engine._outer_graphs.cache else (None,)
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
    (slot,) = engine._outer_graphs.cache.values()
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
    ctx.trt_context.fail_streams.add(engine._graphs.capture_handle())
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
        (first_exec,) = engine._res.graph_execs
        with runtime_config(engine, dynamic_shapes_kernel_specialization_strategy="eager"):
            assert ("exec_destroy", first_exec) in engine._rt.calls
            assert len(engine._outer_graphs.cache) == 0
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
    assert engine.outer_graph is None and engine._res.graph_execs == []


def test_python_outer_graph_preallocated_outputs_are_written() -> None:
    engine = _fake_engine()
    engine.outer_graph = "view"
    x, y = _device(), _device()
    assert engine.execute(x, outputs=[y])[0] is y
    engine._rt.copies.clear()
    assert engine.execute(x, outputs=[y])[0] is y
    (slot,) = engine._outer_graphs.cache.values()
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
        assert engine._outer_graphs.shortcuts
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
    (graph_exec,) = engine._res.graph_execs
    engine.close()
    assert ("exec_destroy", graph_exec) in rt.calls
    assert engine._graphs.capture_stream is None
    collected = _fake_engine()
    collected.outer_graph = True
    collected.execute(_device())
    rt = collected._rt
    (graph_exec,) = collected._res.graph_execs
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
    (first,) = engine._res.graph_execs
    rt.calls.clear()
    engine.execute(np.ones((3, 4), np.float32))  # evicts 2; its executable graph is updated
    update = [c for c in rt.calls if c[0] == "exec_update"]
    assert len(update) == 1 and update[0][1] == first
    assert _count(rt.calls, "instantiate") == 0 and _count(rt.calls, "exec_destroy") == 0
    assert engine._res.graph_execs == [first]
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
    (first,) = engine._res.graph_execs
    rt.update_refused = True  # another topology
    rt.calls.clear()
    out = engine.execute(np.ones((3, 4), np.float32))[0]
    assert out.shape == (3, 4)
    assert _count(rt.calls, "exec_update") == 1 and ("exec_destroy", first) in rt.calls
    assert _count(rt.calls, "instantiate") == 1
    (second,) = engine._res.graph_execs
    assert second != first and engine.graph_stats()["updates"] == 0


def test_python_outer_graph_spare_goes_before_its_context() -> None:
    """A spare executable graph (kept from reset_graphs) is destroyed when its context is
    dropped, and a context created later never updates a graph of the old one."""
    engine = _fake_engine()
    rt = engine._rt
    engine.outer_graph = True
    x = _device()
    engine.execute(x)
    (first,) = engine._res.graph_execs
    engine.reset_graphs()
    assert engine._graphs.spare is not None and engine._res.graph_execs == [first]
    rt.calls.clear()
    engine.invalidate_context()
    assert ("exec_destroy", first) in rt.calls and engine._graphs.spare is None
    assert engine._res.graph_execs == []
    engine.execute(x)
    assert _count(rt.calls, "exec_update") == 0 and _count(rt.calls, "instantiate") == 1
    # a spare kept from the old context is not updated by the new one's capture
    engine.reset_graphs()
    stale = engine._graphs.spare
    engine._graphs.spare = (stale[0], object())
    rt.calls.clear()
    engine.execute(x)
    assert _count(rt.calls, "exec_update") == 0 and ("exec_destroy", stale[0]) in rt.calls
    engine.close()
    assert engine._graphs.spare is None and engine._res.graph_execs == []


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
    shape's plan (no way round ``_call_fast``), launching that shape's graph; a shape never
    captured still goes the full way and is captured."""
    from trt_runtime_backends.python.graphs import GraphOps

    looked_up = count_lookups(monkeypatch, GraphOps, "replay_torch")
    engine = _fake_engine()
    a, b = torch.cuda_tensor((2, 4)), torch.cuda_tensor((3, 4))
    with enable_cudagraphs(engine, outer="view"):
        for x in (a, b, a, b):  # captures, then a plan made for each shape
            engine(x)
        assert engine.graph_captures == 2
        plans = {shape: slot.plan for shape, slot in engine._outer_graphs.shortcuts.items()}
        assert all(plans.values())
        looked_up.clear()
        engine._rt.calls.clear()
        for x in (a, b, a, b, a):
            out = engine(x)
            assert out.shape == x.shape
        assert looked_up == []  # every switch went plan to plan
        launched = [c[1] for c in engine._rt.calls if c[0] == "launch"]
        slots = engine._outer_graphs.shortcuts
        assert launched == [slots[(x.shape,)].graph for x in (a, b, a, b, a)]
        assert engine._fast_entry is plans[(a.shape,)]
        engine(torch.cuda_tensor((5, 4)))  # a new shape: captured through the full path
        assert engine.graph_captures == 3 and looked_up == [(5, 4)]


# -- copies as nodes of the graph (trt_runtime.graphs.CopyNodes) -------------------------------------
def _nodes_engine(refuse: str | None = None) -> Any:
    runtime = _FakeRuntimeNodes()
    runtime.refuse = refuse
    return _fake_engine(runtime=runtime), runtime


def test_python_outer_graph_copy_mode_copies_through_graph_nodes(torch: FakeTorch) -> None:
    """In "copy" mode the capture also builds a graph with a memcpy node into the static input
    and one out of the static output around the captured graph; a replay then sets their
    addresses and launches that graph once: no cudaMemcpyAsync, a new output each call."""
    engine, rt = _nodes_engine()
    with enable_cudagraphs(engine, outer="copy"):
        engine(torch.cuda_tensor((2, 4)))  # the capture (the general path)
        (slot,) = engine._outer_graphs.shortcuts.values()
        copying = engine._graphs.copying[int(slot.graph)]
        added = [c for c in rt.calls if c[0] in ("add_memcpy", "add_child")]
        (node_in,), (node_out,) = copying.ins, copying.outs
        assert [c[0] for c in added] == ["add_memcpy", "add_child", "add_memcpy"]
        assert added[1][2] == (node_in,) and added[2][2] == (added[1][4],)  # in -> child -> out
        # built on the static buffers and, for the side that changes, on torch memory (a node
        # can later be set only to memory of the kind it was built with)
        assert added[0][3] == slot.in_ptrs[0] and added[0][4] not in (slot.in_ptrs[0], slot.out_ptrs[0])
        assert added[2][4] == slot.out_ptrs[0] and added[2][3] == added[0][4]
        outs = []
        for _ in range(3):
            x = torch.cuda_tensor((2, 4))
            rt.calls.clear()
            (y,) = engine.execute(x)
            outs.append(y)
            assert [c[0] for c in rt.calls] == ["set_copy", "set_copy", "launch"]
            assert rt.calls[0][1:] == (copying.exec, node_in, slot.in_ptrs[0], x.data_ptr(), 32)
            assert rt.calls[1][1:] == (copying.exec, node_out, y.data_ptr(), slot.out_ptrs[0], 32)
            assert rt.calls[2][1] == copying.exec
        assert len({y.data_ptr() for y in outs}) == 3  # new tensors, not the static output


def test_python_outer_graph_copy_mode_outputs_come_from_slabs(torch: FakeTorch) -> None:
    """In "copy" mode the outputs copied out through the node come from slabs: one
    ``torch.empty`` per SLAB_CALLS replays, each call's output its own view at a new
    address, the node pointed at it before the one launch; streams keep slabs of their own."""
    from trt_runtime_backends.python import plans

    engine, rt = _nodes_engine()
    with enable_cudagraphs(engine, outer="copy"):
        x = torch.cuda_tensor((2, 4))
        engine(x)  # the capture
        engine(x)  # the plan
        (slot,) = engine._outer_graphs.shortcuts.values()
        copying = engine._graphs.copying[int(slot.graph)]
        (node_out,) = copying.outs
        torch.empty_calls.clear()
        calls = plans.SLAB_CALLS + 3
        outs = []
        for _ in range(calls):
            rt.calls.clear()
            outs.append(engine(x))
            assert [c[0] for c in rt.calls] == ["set_copy", "launch"]
            assert rt.calls[0][1:3] == (copying.exec, node_out) and rt.calls[0][3] == outs[-1].data_ptr()
        # the plan's pool had SLAB_CALLS - 1 outputs left from the first plan call's slab
        assert torch.empty_calls == [((plans.SLAB_CALLS, 2, 4), torch.float32, ("cuda", 0))]
        assert len({o.data_ptr() for o in outs}) == calls
        assert all(o.shape == (2, 4) and o.dtype is torch.float32 for o in outs)
        torch.current_stream = 0x5000
        engine(x)
        assert len(torch.empty_calls) == 2  # another current stream: a slab made there
        torch.current_stream = 0


def test_python_outer_graph_copy_nodes_set_only_addresses_that_changed(torch: FakeTorch) -> None:
    """A node whose changing side is the address it already has is not set again (an input
    buffer reused call after call); an address CUDA refused is not remembered."""
    engine, rt = _nodes_engine()
    with enable_cudagraphs(engine, outer="copy"):
        x = torch.cuda_tensor((2, 4))
        engine(x)  # the capture
        (slot,) = engine._outer_graphs.shortcuts.values()
        copying = engine._graphs.copying[int(slot.graph)]
        (node_in,), (node_out,) = copying.ins, copying.outs
        kept = []
        for expected in ([node_in, node_out], [node_out], [node_out]):
            rt.calls.clear()
            kept.append(engine(x))  # kept: each output at a new address
            assert [c[2] for c in rt.calls if c[0] == "set_copy"] == expected
            assert rt.calls[-1][0] == "launch"
        assert copying.last == [x.data_ptr(), kept[-1].data_ptr()]
        other = torch.cuda_tensor((2, 4))
        rt.calls.clear()
        engine(other)
        assert [c[2] for c in rt.calls if c[0] == "set_copy"] == [node_in, node_out]
        rt.refuse = "cudaGraphExecMemcpyNodeSetParams1D"
        engine(x)  # refused: the plain way
        assert copying.last[0] is None
        rt.refuse = None
        rt.calls.clear()
        engine(x)
        assert [c[2] for c in rt.calls if c[0] == "set_copy"] == [node_in, node_out]


def test_python_outer_graph_static_input_replays_the_plain_graph(torch: FakeTorch) -> None:
    """An input that is its static buffer itself needs no copy in: the plain graph runs
    (a memcpy node from a buffer into itself would overlap), the output copied out."""
    engine, rt = _nodes_engine()
    with enable_cudagraphs(engine, outer="copy"):
        engine(torch.cuda_tensor((2, 4)))
        engine(torch.cuda_tensor((2, 4)))  # the plan
        (slot,) = engine._outer_graphs.shortcuts.values()
        (static,) = engine.static_inputs((2, 4), as_torch=True)
        rt.calls.clear()
        engine(static)
        assert [c[0] for c in rt.calls] == ["launch", "memcpy"]
        assert rt.calls[0][1] == slot.graph


@pytest.mark.parametrize("mode", ["copy", "view"])
def test_python_outer_graph_static_and_fresh_inputs_each_go_straight_to_their_plan(
        torch: FakeTorch, mode: str) -> None:
    """A slot with copy nodes has two plans: static inputs make the plain one the lane's
    current plan, other inputs the copying one (the slot's own) again. A run of calls of one
    kind then goes to its plan directly, not through the other plan's checks every call."""
    engine, rt = _nodes_engine()
    with enable_cudagraphs(engine, outer=mode):
        engine(torch.cuda_tensor((2, 4)))
        fresh = torch.cuda_tensor((2, 4))
        engine(fresh)
        (slot,) = engine._outer_graphs.shortcuts.values()
        copying = slot.plan
        assert engine._fast_entry is copying
        (static,) = engine.static_inputs((2, 4), as_torch=True)
        engine(static)
        plain = engine._fast_entry
        assert plain is not copying and plain is not engine._call_fast
        for call in range(3):
            rt.calls.clear()
            engine(static)
            assert engine._fast_entry is plain and rt.calls[0][:2] == ("launch", slot.graph)
            rt.calls.clear()
            engine(torch.cuda_tensor((2, 4)) if call % 2 else fresh)
            assert engine._fast_entry is copying
            assert rt.calls[-1][:2] == ("launch", engine._graphs.copying[int(slot.graph)].exec)


def test_python_outer_graph_static_inputs_of_shapes_in_turn_switch_plain_plan_to_plain_plan(
        torch: FakeTorch) -> None:
    """Static buffers of two shapes in turn: a plain plan's shape switch lands on the other
    slot's plain plan (not on its copying plan, which would hand the call on once more),
    and fresh inputs of shapes in turn still go copying plan to copying plan."""
    engine, rt = _nodes_engine()
    with enable_cudagraphs(engine, outer="view"):
        shapes = [(2, 4), (3, 4)]
        for shape in shapes:
            engine(torch.cuda_tensor(shape))
            engine(torch.cuda_tensor(shape))
        statics = [engine.static_inputs(shape, as_torch=True)[0] for shape in shapes]
        slots = [engine._outer_graphs.shortcuts[(torch.Size(shape),)] for shape in shapes]
        copyings = [slot.plan for slot in slots]
        for static in statics:
            engine(static)
        plains = [copying.plain for copying in copyings]
        assert len({*map(id, plains), *map(id, copyings)}) == 4
        for turn in range(4):
            i = turn % 2
            rt.calls.clear()
            engine(statics[i])
            assert engine._fast_entry is plains[i]
            assert [c[:2] for c in rt.calls] == [("launch", slots[i].graph)]
        for turn in range(4):
            i = turn % 2
            engine(torch.cuda_tensor(shapes[i]))
            assert engine._fast_entry is copyings[i]
        # a plan hands a call to another (a shape switch, static to fresh inputs and back)
        # past its input checks (the other's ``go``): each call checks its input once
        checked: list[Any] = []
        contiguous = torch.Tensor.is_contiguous
        torch.Tensor.is_contiguous = lambda self: checked.append(self) or contiguous(self)
        try:
            for turn in range(8):
                i = turn % 2
                fresh = turn % 3 == 0
                x = torch.cuda_tensor(shapes[i]) if fresh else statics[i]
                engine(x)
                assert checked == [x] and engine._fast_entry is (copyings if fresh else plains)[i]
                checked.clear()
        finally:
            torch.Tensor.is_contiguous = contiguous


def test_python_outer_graph_view_mode_copies_inputs_through_a_node(torch: FakeTorch) -> None:
    engine, rt = _nodes_engine()
    with enable_cudagraphs(engine, outer="view"):
        first = engine(torch.cuda_tensor((2, 4)))
        (slot,) = engine._outer_graphs.shortcuts.values()
        copying = engine._graphs.copying[int(slot.graph)]
        assert len(copying.ins) == 1 and copying.outs == []
        for _ in range(2):
            rt.calls.clear()
            y = engine(torch.cuda_tensor((2, 4)))
            assert [c[0] for c in rt.calls] == ["set_copy", "launch"]
            assert y is not None and y.data_ptr() == first.data_ptr()  # the static output's view


def test_python_outer_graph_copying_graphs_go_with_their_graphs(torch: FakeTorch) -> None:
    """Released with the slot's graph (reset, close): the executable and the built graph are
    destroyed once, and nothing is left for the finalizer."""
    engine, rt = _nodes_engine()
    with enable_cudagraphs(engine, outer="copy"):
        engine(torch.cuda_tensor((2, 4)))
        (slot,) = engine._outer_graphs.shortcuts.values()
        copying = engine._graphs.copying[int(slot.graph)]
        assert copying.exec in engine._res.graph_execs and copying.graph in engine._res.graphs
        engine.reset_graphs()
        assert ("exec_destroy", copying.exec) in rt.calls
        assert rt.calls.count(("graph_destroy", copying.graph)) == 1
        assert engine._graphs.copying == {} and copying.graph not in engine._res.graphs
        engine(torch.cuda_tensor((2, 4)))  # captured again: built again
        (copying,) = engine._graphs.copying.values()
    engine.close()
    assert engine._res.graph_execs == [] and engine._res.graphs == []
    assert rt.calls.count(("graph_destroy", copying.graph)) == 1


@pytest.mark.parametrize(
    "refuse", ["cudaGraphCreate", "cudaGraphAddMemcpyNode1D", "cudaGraphAddChildGraphNode"]
)
def test_python_outer_graph_without_copying_graphs_copies_as_before(torch: FakeTorch, refuse: str) -> None:
    """A runtime that refuses to build the graph (or lacks the calls): replays copy with
    cudaMemcpyAsync, and a half-built graph is destroyed."""
    engine, rt = _nodes_engine(refuse)
    with enable_cudagraphs(engine, outer="copy"):
        engine(torch.cuda_tensor((2, 4)))
        assert engine._graphs.copying == {}
        (created,) = [c[1] for c in rt.calls if c[0] == "graph_create"]
        if refuse != "cudaGraphCreate":  # a graph was made: it is destroyed
            assert ("graph_destroy", created) in rt.calls
        engine(torch.cuda_tensor((2, 4)))  # the plan
        rt.calls.clear()
        engine(torch.cuda_tensor((2, 4)))
        assert [c[0] for c in rt.calls] == ["memcpy", "launch", "memcpy"]


def test_python_outer_graph_refused_node_address_takes_the_plain_way(torch: FakeTorch) -> None:
    """CUDA refuses a node address of another kind of memory (from a pool, say): that call
    copies with cudaMemcpyAsync and launches the plain graph; its output is still right."""
    engine, rt = _nodes_engine("cudaGraphExecMemcpyNodeSetParams1D")
    with enable_cudagraphs(engine, outer="copy"):
        engine(torch.cuda_tensor((2, 4)))
        (slot,) = engine._outer_graphs.shortcuts.values()
        assert int(slot.graph) in engine._graphs.copying
        engine(torch.cuda_tensor((2, 4)))  # the plan
        rt.calls.clear()
        y = engine(torch.cuda_tensor((2, 4)))
        assert [c[0] for c in rt.calls] == ["set_copy", "memcpy", "launch", "memcpy"]
        assert rt.calls[2][1] == slot.graph and y.shape == (2, 4)


def test_python_outer_graph_no_copying_graph_before_torch(torch: FakeTorch) -> None:
    """Captured from numpy inputs (no torch tensor seen yet): no copying graph is built."""
    engine, rt = _nodes_engine()
    with enable_cudagraphs(engine, outer="copy"):
        engine(np.ones((2, 4), np.float32))
        assert engine.graph_captures == 1 and engine._graphs.copying == {}
        assert not [c for c in rt.calls if c[0] == "graph_create"]
