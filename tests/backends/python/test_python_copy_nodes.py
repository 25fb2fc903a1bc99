"""The python backend's outer CUDA graph copying through graph nodes (trt_runtime.graphs.CopyNodes),
with test doubles for TensorRT, the CUDA runtime and torch: slabs, changed addresses only, static
inputs going straight to their plan, and the plain way when a node is refused."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _python_doubles import FakeTorch, _fake_engine, _FakeRuntimeNodes

from trt_runtime import enable_cudagraphs


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
        (slot,) = engine._lanes[0].outer_graphs.shortcuts.values()
        copying = engine._lanes[0].ops.graphs.copying[int(slot.graph)]
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
        (slot,) = engine._lanes[0].outer_graphs.shortcuts.values()
        copying = engine._lanes[0].ops.graphs.copying[int(slot.graph)]
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
        (slot,) = engine._lanes[0].outer_graphs.shortcuts.values()
        copying = engine._lanes[0].ops.graphs.copying[int(slot.graph)]
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
        (slot,) = engine._lanes[0].outer_graphs.shortcuts.values()
        (static,) = engine.static_inputs((2, 4), as_torch=True)
        rt.calls.clear()
        engine(static)
        assert [c[0] for c in rt.calls] == ["launch", "memcpy"]
        assert rt.calls[0][1] == slot.graph


def test_python_outer_graph_the_same_static_tensor_again_skips_its_checks_until_changed_in_place(
        torch: FakeTorch, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plain plan remembers the static buffer's tensor once a call gave it: the same object
    again is replayed without its type, dtype and contiguity checks. Moved or reshaped in place,
    it takes the general path (copied in, or a graph of its new shape), and is checked again."""
    from _python_doubles import _Size

    engine, rt = _nodes_engine()
    looks: list[int] = []
    original = torch.Tensor.is_contiguous
    monkeypatch.setattr(torch.Tensor, "is_contiguous", lambda self: looks.append(1) or original(self))
    with enable_cudagraphs(engine, outer="view"):
        engine(torch.cuda_tensor((2, 4)))
        engine(torch.cuda_tensor((2, 4)))  # the plan
        (slot,) = engine._lanes[0].outer_graphs.shortcuts.values()
        (static,) = engine.static_inputs((2, 4), as_torch=True)
        engine(static)  # checked once, remembered
        for _ in range(3):
            looks.clear()
            rt.calls.clear()
            engine(static)
            assert looks == [] and [c[:2] for c in rt.calls] == [("launch", slot.graph)]
        static._ptr += 1 << 12  # (its storage swapped in place: now another buffer)
        rt.calls.clear()
        engine(static)
        assert looks and any(c[0] == "set_copy" for c in rt.calls)  # checked in full, copied in
        static._ptr -= 1 << 12
        engine(static)  # (its static buffer again: remembered again)
        looks.clear()
        static.shape = _Size((1, 4))  # (reshaped in place)
        y = engine(static)
        assert looks and tuple(y.shape) == (1, 4)  # checked in full: the graph of its new shape


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
        (slot,) = engine._lanes[0].outer_graphs.shortcuts.values()
        copying = slot.plan
        assert engine._lanes[0].fast_entry is copying
        (static,) = engine.static_inputs((2, 4), as_torch=True)
        engine(static)
        plain = engine._lanes[0].fast_entry
        assert plain is not copying and plain is not engine._lanes[0].ops.call_fast
        for call in range(3):
            rt.calls.clear()
            engine(static)
            assert engine._lanes[0].fast_entry is plain and rt.calls[0][:2] == ("launch", slot.graph)
            rt.calls.clear()
            engine(torch.cuda_tensor((2, 4)) if call % 2 else fresh)
            assert engine._lanes[0].fast_entry is copying
            assert rt.calls[-1][:2] == ("launch", engine._lanes[0].ops.graphs.copying[int(slot.graph)].exec)


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
        slots = [engine._lanes[0].outer_graphs.shortcuts[(torch.Size(shape),)] for shape in shapes]
        copyings = [slot.plan for slot in slots]
        for static in statics:
            engine(static)
        plains = [slot.static_plan for slot in slots]
        assert len({*map(id, plains), *map(id, copyings)}) == 4
        for turn in range(4):
            i = turn % 2
            rt.calls.clear()
            engine(statics[i])
            assert engine._lanes[0].fast_entry is plains[i]
            assert [c[:2] for c in rt.calls] == [("launch", slots[i].graph)]
        for turn in range(4):
            i = turn % 2
            engine(torch.cuda_tensor(shapes[i]))
            assert engine._lanes[0].fast_entry is copyings[i]
        # a plan hands a call to another (a shape switch, static to fresh inputs and back)
        # past its input checks (the other's ``go``): each call checks its input once, and a
        # static buffer a plain plan hands to its own plain plan (the lane's ``statics``) not
        # at all: that very tensor object passed them before, as a pre-bound call's arrays did
        checked: list[Any] = []
        contiguous = torch.Tensor.is_contiguous
        torch.Tensor.is_contiguous = lambda self: checked.append(self) or contiguous(self)
        try:
            plain_before = False
            for turn in range(8):
                i = turn % 2
                fresh = turn % 3 == 0
                x = torch.cuda_tensor(shapes[i]) if fresh else statics[i]
                engine(x)
                assert checked == ([] if plain_before and not fresh else [x])
                assert engine._lanes[0].fast_entry is (copyings if fresh else plains)[i]
                checked.clear()
                plain_before = not fresh
        finally:
            torch.Tensor.is_contiguous = contiguous


def test_python_outer_graph_view_mode_copies_inputs_through_a_node(torch: FakeTorch) -> None:
    engine, rt = _nodes_engine()
    with enable_cudagraphs(engine, outer="view"):
        first = engine(torch.cuda_tensor((2, 4)))
        (slot,) = engine._lanes[0].outer_graphs.shortcuts.values()
        copying = engine._lanes[0].ops.graphs.copying[int(slot.graph)]
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
        (slot,) = engine._lanes[0].outer_graphs.shortcuts.values()
        copying = engine._lanes[0].ops.graphs.copying[int(slot.graph)]
        res = engine._lanes[0].ops._res
        assert copying.exec in res.graph_execs and copying.graph in res.graphs
        engine.reset_graphs()
        assert ("exec_destroy", copying.exec) in rt.calls
        assert rt.calls.count(("graph_destroy", copying.graph)) == 1
        assert engine._lanes[0].ops.graphs.copying == {} and copying.graph not in res.graphs
        engine(torch.cuda_tensor((2, 4)))  # captured again: built again
        (copying,) = engine._lanes[0].ops.graphs.copying.values()
    engine.close()
    assert engine._lanes[0].ops._res.graph_execs == [] and engine._lanes[0].ops._res.graphs == []
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
        assert engine._lanes[0].ops.graphs.copying == {}
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
        (slot,) = engine._lanes[0].outer_graphs.shortcuts.values()
        assert int(slot.graph) in engine._lanes[0].ops.graphs.copying
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
        assert engine.graph_captures == 1 and engine._lanes[0].ops.graphs.copying == {}
        assert not [c for c in rt.calls if c[0] == "graph_create"]
