"""The python backend's call plans (backends/trt_runtime_backends/python/plans.py), over the test doubles."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from _python_doubles import (
    FakeTorch,
    _fake_engine,
    _FakeBuffer,
    _trt_calls,
    count_lookups,
)
from trt_runtime_backends.python import plans
from trt_runtime_backends.python.arrays import DeviceArray

import trt_runtime.slabs
from trt_runtime import InputError


def _kinds(engine: Any) -> list[str]:
    return [c[0] for c in _trt_calls(engine)]


def test_plans_natural_call_becomes_the_lanes_current_plan(torch: FakeTorch) -> None:
    engine = _fake_engine()
    assert engine._lanes[0].fast_entry == engine._lanes[0].ops.call_fast  # nothing validated yet
    engine(torch.cuda_tensor((2, 4)))
    (entry,) = engine._lanes[0].ops._fast_paths.natural.values()
    assert engine._lanes[0].fast_entry is entry.plan
    _trt_calls(engine).clear()
    out = engine(torch.cuda_tensor((2, 4)))
    assert _kinds(engine) == ["address", "address", "execute"] and out.shape == (2, 4)


def test_plans_switch_between_shapes_and_decline_what_they_do_not_take(torch: FakeTorch) -> None:
    engine = _fake_engine()
    a, b = torch.cuda_tensor((2, 4)), torch.cuda_tensor((3, 4))
    engine(a)
    engine(b)
    plan_a, plan_b = (engine._lanes[0].ops._fast_paths.natural[k].plan for k in (((2, 4),), ((3, 4),)))
    assert engine._lanes[0].fast_entry is plan_b
    _trt_calls(engine).clear()
    assert engine(a).shape == (2, 4)  # plan_b declines, the table finds plan_a
    assert engine._lanes[0].fast_entry is plan_a
    assert [c for c in _trt_calls(engine) if c[0] == "shape"] == [("shape", "x", (2, 4))]
    # what no plan takes goes down the full path, which says what is wrong
    with pytest.raises(InputError, match=r"input 'x' must have dtype float32; got torch\.float16"):
        engine(torch.cuda_tensor((2, 4), torch.float16))
    with pytest.raises(InputError, match=r"input 'x' is not contiguous"):
        engine(torch.cuda_tensor((2, 4), contiguous=False))
    with pytest.raises(InputError, match=r"takes 1 input\(s\) \(x\); got 2"):
        engine(a, a)
    assert engine(np.ones((2, 4), np.float32)).shape == (2, 4)  # numpy: the full path


def test_plans_natural_switch_shapes_plan_to_plan(torch: FakeTorch, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shapes in turn (a dynamic engine's usual load): each natural plan hands a call of
    another shape seen before straight to that shape's plan, not through the table lookup
    of ``call_fast``; a shape never seen goes the full way."""
    from trt_runtime_backends.python.fast_path import FastPaths

    looked_up = count_lookups(monkeypatch, FastPaths, "call_natural")
    engine = _fake_engine()
    a, b = torch.cuda_tensor((2, 4)), torch.cuda_tensor((3, 4))
    engine(a)
    engine(b)
    by_shape = {k[0]: e.plan for k, e in engine._lanes[0].ops._fast_paths.natural.items()}
    looked_up.clear()
    _trt_calls(engine).clear()
    for x in (a, b, a, b):
        assert engine(x).shape == x.shape
        assert engine._lanes[0].fast_entry is by_shape[x.shape]
    assert looked_up == []
    assert [c[2] for c in _trt_calls(engine) if c[0] == "shape"] == [(2, 4), (3, 4), (2, 4), (3, 4)]
    engine(torch.cuda_tensor((5, 4)))
    assert looked_up == [(5, 4)]


def test_plans_prebound_checks_identity_pointer_and_shape(torch: FakeTorch) -> None:
    engine = _fake_engine()
    x, y = torch.cuda_tensor((2, 4)), torch.cuda_tensor((2, 4))
    engine.execute(x, outputs=[y])
    (fast,) = engine._lanes[0].ops._fast_paths.prebound.values()
    assert engine._lanes[0].fast_entry is fast.plan
    _trt_calls(engine).clear()
    assert engine.execute(x, outputs=[y])[0] is y
    assert _kinds(engine) == ["execute"]
    x._ptr += 4096  # the same object moved (set_(), a resize): the full path binds it again
    _trt_calls(engine).clear()
    engine.execute(x, outputs=[y])
    assert ("address", "x", x.data_ptr()) in _trt_calls(engine)
    other = torch.cuda_tensor((2, 4))  # another output object: the full path
    _trt_calls(engine).clear()
    assert engine.execute(x, outputs=[other])[0] is other
    assert ("address", "y", other.data_ptr()) in _trt_calls(engine)
    with pytest.raises(InputError, match="output"):
        engine.execute(x, outputs=[torch.cuda_tensor((3, 4))])


def test_plans_prebound_outputs_must_be_a_list_or_tuple(torch: FakeTorch) -> None:
    """``outputs=`` that is not a list or tuple is refused with its type named, before any
    work, on the general path and when a pre-bound plan is current (a bare tensor passed as
    ``outputs=`` is iterable: the plan hands it on, the general path refuses it)."""
    engine = _fake_engine()
    x, y = torch.cuda_tensor((2, 4)), torch.cuda_tensor((2, 4))
    with pytest.raises(InputError, match=r"outputs= must be a list or tuple of arrays, one per output; "
                                         r"got list_iterator"):
        engine.execute(x, outputs=iter([y]))
    assert engine.execute(x, outputs=[y])[0] is y
    _trt_calls(engine).clear()
    with pytest.raises(InputError, match="got Tensor"):
        engine.execute(x, outputs=y)
    assert _kinds(engine) == []
    assert engine.execute(x, outputs=(y,))[0] is y


def test_plans_prebound_switch_arrays_plan_to_plan(torch: FakeTorch, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pre-bound calls with arrays of several shapes in turn: each plan hands a call with
    other arrays remembered before straight to their plan (no lookup in ``call_fast``),
    which sets its shapes; arrays never seen go the full way."""
    from trt_runtime_backends.python.fast_path import FastPaths

    looked_up = count_lookups(monkeypatch, FastPaths, "call_prebound")
    engine = _fake_engine()
    pairs = [(torch.cuda_tensor((b, 4)), torch.cuda_tensor((b, 4))) for b in (2, 3)]
    for x, y in pairs:
        engine.execute(x, outputs=[y])
    plan_of = {id(f.arrays[0]): f.plan for f in engine._lanes[0].ops._fast_paths.prebound.values()}
    looked_up.clear()
    _trt_calls(engine).clear()
    for x, y in pairs + pairs:
        assert engine.execute(x, outputs=[y])[0] is y
        assert engine._lanes[0].fast_entry is plan_of[id(x)]
    assert looked_up == []
    assert [c[2] for c in _trt_calls(engine) if c[0] == "shape"] == [(2, 4), (3, 4), (2, 4), (3, 4)]
    assert _kinds(engine).count("execute") == 4
    x, y = pairs[0]
    fresh = torch.cuda_tensor((2, 4))
    assert engine.execute(x, outputs=[fresh])[0] is fresh  # not remembered: the full path
    assert looked_up == [(2, 4)]


def test_plans_go_when_the_context_or_profile_changes(torch: FakeTorch) -> None:
    engine = _fake_engine()
    x = torch.cuda_tensor((2, 4))
    engine(x)
    assert engine._lanes[0].fast_entry != engine._lanes[0].ops.call_fast
    engine.invalidate_context()
    (lane,) = engine._lanes
    assert lane.fast_entry == lane.ops.call_fast and not lane.ops._fast_paths.natural
    engine(x)  # a new context: the full path, then a new plan
    assert engine._lanes[0].fast_entry is engine._lanes[0].ops._fast_paths.natural[((2, 4),)].plan
    engine.profile = 0
    assert engine._lanes[0].fast_entry == engine._lanes[0].ops.call_fast
    engine.close()
    assert engine._lanes[0].fast_entry == engine._lanes[0].ops.call_fast


def test_plans_replay_a_captured_slot_and_go_with_the_graphs(torch: FakeTorch) -> None:
    engine = _fake_engine()
    engine.outer_graph = "view"
    x = torch.cuda_tensor((2, 4))
    engine(x)
    engine(x)  # the first call captured; the second finds the slot by its shapes
    (slot,) = engine._lanes[0].outer_graphs.shortcuts.values()
    assert slot.plan is not None and engine._lanes[0].fast_entry is slot.plan
    engine._rt.calls.clear()
    out = engine(x)
    assert [c[0] for c in engine._rt.calls if c[0] in ("launch", "memcpy")] == ["memcpy", "launch"]
    assert out is not None and engine.graph_stats()["hits"] >= 2
    (static,) = engine.static_inputs((2, 4), as_torch=True)
    engine._rt.calls.clear()
    engine(static)  # the static buffer itself: no copy
    assert [c[0] for c in engine._rt.calls if c[0] in ("launch", "memcpy")] == ["launch"]
    engine.reset_graphs()
    (lane,) = engine._lanes
    assert slot.plan is None and slot.graph is None and lane.fast_entry == lane.ops.call_fast
    engine.outer_graph = None
    assert engine(x).shape == (2, 4)


def test_plans_static_buffers_in_turn_go_straight_to_their_plain_plans_and_are_forgotten_with_them(
        torch: FakeTorch) -> None:
    """A dynamic engine fed its static buffers of two shapes in turn: each call goes from
    the current plain plan to the other slot's (the lane's ``statics``, by the tensor object)
    with no input check and no table lookup, one launch and no copy; the lane forgets them
    when the graphs go, when the profile changes and when a buffer changed in place."""
    engine = _fake_engine()
    engine.outer_graph = "view"
    (lane,) = engine._lanes
    graphs = lane.ops.graphs
    shapes = [(2, 4), (3, 4)]
    for shape in shapes:
        engine(torch.cuda_tensor(shape))  # captured
    statics = [engine.static_inputs(shape, as_torch=True)[0] for shape in shapes]
    for static in statics:
        engine(static)
    slots = [lane.outer_graphs.shortcuts[(torch.Size(shape),)] for shape in shapes]
    assert graphs.statics == {id(statics[0]): slots[0], id(statics[1]): slots[1]}
    checked: list[Any] = []
    contiguous = torch.Tensor.is_contiguous
    torch.Tensor.is_contiguous = lambda self: checked.append(self) or contiguous(self)
    try:
        engine._rt.calls.clear()
        for turn in range(6):
            out = engine(statics[turn % 2])
            assert out.shape == shapes[turn % 2] and lane.fast_entry is slots[turn % 2].static_plan
    finally:
        torch.Tensor.is_contiguous = contiguous
    assert checked == []
    assert [c[:2] for c in engine._rt.calls if c[0] in ("launch", "memcpy")] == [
        ("launch", slots[turn % 2].graph) for turn in range(6)]
    engine.profile = 0  # another profile's slots may run the same shapes: looked up again
    assert graphs.statics == {}
    for static in statics * 3:  # (the first call of each: the full path; a switch remembers it again)
        engine(static)
    assert len(graphs.statics) == 2
    statics[1]._ptr += 4096  # changed in place (set_(), a resize): the full path, and forgotten
    engine(statics[1])
    assert id(statics[1]) not in graphs.statics and id(statics[0]) in graphs.statics
    engine.reset_graphs()
    assert graphs.statics == {} and all(slot.static_plan is None for slot in slots)


def test_plans_a_threads_first_call_makes_the_device_current_even_on_a_plan(torch: FakeTorch) -> None:
    engine = _fake_engine()
    x = torch.cuda_tensor((2, 4))
    engine(x)
    state = engine._state
    before = state.activations
    engine(x)
    assert state.activations == before
    threads = [threading.Thread(target=engine, args=(torch.cuda_tensor((2, 4)),)) for _ in range(3)]
    for thread in threads:
        thread.start()
        thread.join()
    assert state.activations == before + 3  # each thread went straight to the plan


def test_plans_prebound_device_arrays_use_their_ptr() -> None:
    engine = _fake_engine()
    x = DeviceArray(_FakeBuffer(32), (2, 4), "float32", 0)
    y = DeviceArray(_FakeBuffer(32), (2, 4), "float32", 0)
    engine.execute(x, outputs=[y])
    _trt_calls(engine).clear()
    assert engine.execute(x, outputs=[y])[0] is y
    assert _kinds(engine) == ["execute"]


def test_plans_hold_no_context_and_die_with_their_tables(torch: FakeTorch) -> None:
    """Dropping a context frees its plans at once (no reference cycle waits for the garbage
    collector with a TensorRT context in it: drop_context's order is what TensorRT needs)."""
    import gc
    import weakref

    engine = _fake_engine()
    x, y = torch.cuda_tensor((2, 4)), torch.cuda_tensor((2, 4))
    engine.execute(x, outputs=[y])
    engine(x)
    engine.outer_graph = "view"
    engine(x)
    engine(x)
    refs = [weakref.ref(f.plan) for f in engine._lanes[0].ops._fast_paths.prebound.values()]
    refs += [weakref.ref(e.plan) for e in engine._lanes[0].ops._fast_paths.natural.values()]
    refs += [weakref.ref(s.plan) for s in engine._lanes[0].outer_graphs.shortcuts.values()]
    assert len(refs) == 3 and all(r() is not None for r in refs)
    for plan in (r() for r in refs):
        names = plan.__code__.co_freevars  # type: ignore[union-attr]
        assert "execute" not in names and "set_address" not in names  # read from ctx per call
    del plan
    gc.disable()
    try:
        engine.invalidate_context()
        assert [r() for r in refs] == [None, None, None]
    finally:
        gc.enable()


# -- slabs: one torch.empty for the outputs of many natural calls ------------------------------------
def test_plans_slab_calls_fit_the_outputs_in_the_slab_budget(torch: FakeTorch) -> None:
    f32, f16 = torch.float32, torch.float16
    assert plans.slab_calls([(8, 32)], [f16]) == plans.SLAB_CALLS  # 512 bytes a call
    assert plans.slab_calls([(2, 4), (3,)], [f32, f16]) == plans.SLAB_CALLS
    big = plans.SLAB_BYTES // 4  # a quarter of the budget a call: 4 calls a slab
    assert plans.slab_calls([(big // 4,)], [f32]) == 4
    assert plans.slab_calls([(plans.SLAB_BYTES,)], [f32]) == 1  # larger than a slab: torch.empty per call
    assert plans.slab_calls([()], [f32]) == plans.SLAB_CALLS  # a scalar output
    assert plans.slab_calls([(4,)], [object()]) == 1  # a dtype without itemsize: no slab
    assert plans.slab_calls([(-1, 4)], [f32]) == 1  # a shape not known yet
    # the plans' constants: none without a slab (no outputs, too large, no allocator)
    assert trt_runtime.slabs.slab_pools(torch.empty, "cuda", [], []) is None
    assert trt_runtime.slabs.slab_pools(torch.empty, "cuda", [(plans.SLAB_BYTES,)], [f32]) is None
    assert trt_runtime.slabs.slab_pools(None, "cuda", [(8, 32)], [f16]) is None
    pools, refill = trt_runtime.slabs.slab_pools(torch.empty, "cuda", [(8, 32)], [f16])
    assert pools == {} and callable(refill)


def test_plans_natural_outputs_come_from_one_slab_per_slab_calls_calls(torch: FakeTorch) -> None:
    engine = _fake_engine()
    engine(torch.cuda_tensor((2, 4)))  # the full path validates; the plan takes the next calls
    torch.empty_calls.clear()
    _trt_calls(engine).clear()
    calls = plans.SLAB_CALLS + 3
    outs = [engine(torch.cuda_tensor((2, 4))) for _ in range(calls)]
    # one slab for the first SLAB_CALLS calls, a second one for the 3 after them
    assert torch.empty_calls == [((plans.SLAB_CALLS, 2, 4), torch.float32, ("cuda", 0))] * 2
    assert torch.unbind_calls == 2
    assert all(o.shape == (2, 4) and o.dtype is torch.float32 and o.get_device() == 0 for o in outs)
    first = [o.data_ptr() for o in outs[: plans.SLAB_CALLS]]
    assert first == [first[0] + k * 2 * 4 * 4 for k in range(plans.SLAB_CALLS)]  # disjoint, in order
    assert len({o.data_ptr() for o in outs}) == calls
    # every call binds its own output's address before its enqueue
    bound = [c[2] for c in _trt_calls(engine) if c[0] == "address" and c[1] == "y"]
    assert bound == [o.data_ptr() for o in outs]


def test_plans_slabs_are_made_and_kept_per_current_stream(torch: FakeTorch) -> None:
    engine = _fake_engine()
    x = torch.cuda_tensor((2, 4))
    engine(x)
    engine(x)
    torch.empty_calls.clear()
    engine(x)  # same stream: from the slab
    assert torch.empty_calls == []
    torch.current_stream = 0x5000  # the caller moved to another stream: a slab made there
    y = engine(x)
    assert torch.empty_calls == [((plans.SLAB_CALLS, 2, 4), torch.float32, ("cuda", 0))]
    torch.current_stream = 0  # back: the first stream's slab still serves it (threads taking turns)
    z = engine(x)
    assert len(torch.empty_calls) == 1 and y.shape == z.shape == (2, 4)
    (entry,) = engine._lanes[0].ops._fast_paths.natural.values()
    pools, _ = _slab_fields(entry.plan)
    assert sorted(pools) == [0, 0x5000]
    assert len(pools[0x5000]) == plans.SLAB_CALLS - 1 and len(pools[0]) == plans.SLAB_CALLS - 3
    for stream in range(1, plans.SLAB_STREAMS + 1):  # many streams: the pools are dropped, then kept again
        torch.current_stream = 0x6000 + stream
        engine(x)
    assert len(pools) <= plans.SLAB_STREAMS and 0x6000 + plans.SLAB_STREAMS in pools


def test_plans_outputs_too_large_for_a_slab_are_made_per_call(torch: FakeTorch,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trt_runtime.slabs, "SLAB_BYTES", 32)  # one (2, 4) float32 output: 32 bytes
    engine = _fake_engine()
    x = torch.cuda_tensor((2, 4))
    engine(x)
    torch.empty_calls.clear()
    for _ in range(3):
        engine(x)
    assert [c[0] for c in torch.empty_calls] == [(2, 4)] * 3 and torch.unbind_calls == 0


def _slab_fields(plan: Any) -> tuple[Any, Any]:
    """The ``pools`` and ``refill`` constants a slab plan closes over."""
    cells = dict(zip(plan.__code__.co_freevars, (c.cell_contents for c in plan.__closure__), strict=True))
    return cells["pools"], cells["refill"]
