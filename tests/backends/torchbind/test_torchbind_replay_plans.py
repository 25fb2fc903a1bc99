"""The torchbind backend's outer CUDA graph past its capture, on the CPU doubles: replay plans as
the fast entry, the thread start, copies through the launcher, and copy nodes of a second graph."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _torchbind_doubles import FakeBridge
from _torchbind_fakes import FakeNodeRuntime, FakeTensor
from _torchbind_graphs import dyn, dynamic_engine, nodes_engine

from trt_runtime.contexts import enable_cudagraphs
from trt_runtime.errors import EngineError
from trt_runtime.graphs import OuterGraph


# -- the replay plan ---------------------------------------------------------------------------------
def test_torchbind_outer_graph_replay_plan_becomes_the_fast_entry() -> None:
    """A replay found through the shortcut makes the slot's plan the lane's fast entry; later
    calls of those shapes go straight to it (no call_fast), other shapes, a stream= or an
    evicted slot go back through call_fast, and each result stays right."""
    engine, bridge = dynamic_engine()
    engine.outer_graph = OuterGraph(max_graphs=2)
    engine.execute(dyn(2, 1.0))  # the capture
    engine.execute(dyn(2, 1.0))  # through the shortcut: the plan is made
    (slot,) = [s for s in engine._lanes[0].outer_graphs.cache.values() if s.key[0] == ((2, 4),)]
    assert slot.plan is not None and engine._lanes[0].fast_entry is slot.plan
    missed: list[int] = []
    call_fast = engine._lanes[0].ops.call_fast

    def spy(*args: Any) -> Any:
        missed.append(1)
        return call_fast(*args)

    engine._lanes[0].ops.call_fast = spy  # type: ignore[method-assign]
    slot.plan = None  # the plan below binds the spy as its miss
    engine._lanes[0].fast_entry = engine._lanes[0].ops.call_fast
    engine.execute(dyn(2, 1.0))
    plan = engine._lanes[0].fast_entry
    assert plan is slot.plan and missed == [1]
    for value in (2.0, 3.0):
        (out,) = engine.execute(dyn(2, value))
        np.testing.assert_array_equal(out.array, np.full((2, 4), 2.0 * value, np.float32))
    assert missed == [1], "repeat calls go straight to the plan"
    (out,) = engine.execute(dyn(5, 1.0))  # other shapes: through call_fast, then captured
    np.testing.assert_array_equal(out.array, np.full((5, 4), 2.0, np.float32))
    assert len(missed) == 2
    (out,) = engine.execute(dyn(2, 4.0), stream=bridge.active_stream(0))  # declined: general path
    np.testing.assert_array_equal(out.array, np.full((2, 4), 8.0, np.float32))
    engine._lanes[0].fast_entry = plan
    engine.execute(dyn(8, 1.0))  # evicts the least recently used (shape 5)...
    engine.execute(dyn(7, 1.0))  # ...and then shape 2, whose plan now declines
    assert slot.graph is None
    engine._lanes[0].fast_entry = plan
    captures = engine.graph_captures
    (out,) = engine.execute(dyn(2, 6.0))
    np.testing.assert_array_equal(out.array, np.full((2, 4), 12.0, np.float32))
    assert engine.graph_captures == captures + 1  # captured again, not the released graph


def test_torchbind_outer_graph_replay_plans_switch_shapes_plan_to_plan() -> None:
    """Shapes in turn (a dynamic engine's usual load): a replay plan hands a call of another
    captured shape straight to that slot's plan, not round call_fast; results stay right,
    and a shape never captured still goes through call_fast."""
    engine, _ = dynamic_engine()
    missed: list[tuple[int, ...]] = []
    call_fast = engine._lanes[0].ops.call_fast

    def spy(inputs: Any, *args: Any) -> Any:
        missed.append(tuple(inputs[0].shape))
        return call_fast(inputs, *args)

    engine._lanes[0].ops.call_fast = spy  # type: ignore[method-assign]
    engine._lanes[0].fast_entry = spy
    with enable_cudagraphs(engine, outer=True):
        for rows in (2, 2, 5, 5):  # captures, then the plans are made through the shortcut
            engine.execute(dyn(rows))
        plans = {s.key[0][0][0]: s.plan for s in engine._lanes[0].outer_graphs.cache.values()}
        assert None not in plans.values()
        missed.clear()
        for rows, value in ((2, 3.0), (5, 4.0), (2, 5.0), (5, 6.0)):
            (out,) = engine.execute(dyn(rows, value))
            np.testing.assert_array_equal(out.array, np.full((rows, 4), 2.0 * value, np.float32))
            assert engine._lanes[0].fast_entry is plans[rows]
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
                assert checked == [x] and engine._lanes[0].fast_entry is plans[rows]
                checked.clear()
        finally:
            FakeTensor.is_contiguous = contiguous  # type: ignore[method-assign]
        engine.execute(dyn(7))  # never captured: through call_fast
        assert missed == [(7, 4)]
        assert engine.graph_captures == 3


def test_torchbind_thread_start_binds_the_thread_before_a_plan_runs() -> None:
    """A thread's first call may go straight to a replay plan (no call_fast): the core's
    thread_start binds torch's device for that thread first."""
    import threading

    from trt_runtime_backends.torchbind import lane as engine_module

    engine, bridge = dynamic_engine()
    engine.outer_graph = True
    engine.execute(dyn(2))
    engine.execute(dyn(2))
    assert engine._lanes[0].fast_entry is not engine._lanes[0].ops.call_fast
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
@pytest.mark.parametrize("mode", ["copy", "view"])
def test_torchbind_outer_graph_replays_through_copy_nodes(mode: str) -> None:
    """A replay sets the input node's address (and in "copy" mode the new output's) and
    launches the built graph once, on the current stream: no copy_, no clone, no second
    launch; the built graph is memcpy in -> the captured graph -> memcpy out, its static side
    the static buffers; outputs are right, new tensors in "copy" mode, the static outputs in
    "view" mode."""
    engine, bridge, rt = nodes_engine(mode)
    (slot,) = engine._lanes[0].outer_graphs.shortcuts.values()
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
    (slot,) = engine._lanes[0].outer_graphs.shortcuts.values()
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
    assert rt.graphs == {} and rt.execs == {} and engine._lanes[0].ops.graphs.copying == {}
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


def test_torchbind_replay_spy_counts_only_its_engine() -> None:
    """tests/_replay_spy.py (what the GPU copy-node test counts with), installed on one engine,
    sees that engine's copy nodes, node launches, address updates and plain launches only:
    not those of another engine of the same bridge (one TorchBridge serves every engine of a
    process) that captures and replays meanwhile. The GPU test patched the bridge's class
    instead, which counted both: under ``pytest -n`` another engine of its worker could add
    copy nodes or launches to its counts."""
    from _replay_spy import ReplaySpy
    from _torchbind_doubles import DYNAMIC_X, DYNAMIC_Y, make_backend, source
    from _torchbind_graphs import EAGER

    backend, bridge = make_backend("2.14.0")
    rt = bridge.node_runtime = FakeNodeRuntime(bridge)
    bridge.launcher_factory = lambda graph: (lambda stream: graph.replay())
    ours, other = (backend.load_engine(source(bindings=(DYNAMIC_X, DYNAMIC_Y)), settings=EAGER)
                   for _ in range(2))
    spy = ReplaySpy(ours)
    for engine in (other, ours):
        engine.outer_graph = "copy"
        engine.execute(dyn(2, 1.0))  # the capture
    xs = [dyn(2, value) for value in (2.0, 3.0, 4.0)]  # kept: each at an address of its own
    for x in xs:
        for engine in (other, ours, other):
            np.testing.assert_array_equal(engine.execute(x)[0].array, 2 * x.array)
    (static,) = other.static_inputs((2, 4))
    static.array[...] = 5.0
    other.execute(static)  # the other engine's plain launch
    assert rt.named("cudaGraphLaunch") == 9 and rt.named("cudaGraphInstantiate") == 2
    (nodes,) = spy.nodes
    assert nodes.counts == {"cudaGraphExecMemcpyNodeSetParams1D": 6, "cudaGraphLaunch": 3}
    assert spy.plain == {"launch": 0, "copy": 0}
    (static,) = ours.static_inputs((2, 4))
    static.array[...] = 5.0
    np.testing.assert_array_equal(ours.execute(static)[0].array, np.full((2, 4), 10.0, np.float32))
    assert spy.plain == {"launch": 1, "copy": 0} and nodes.counts["cudaGraphLaunch"] == 3
