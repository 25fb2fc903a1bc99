"""A context per input shape (backends/trt_runtime_backends/python/shapes.py), over the test doubles.

Every test checks what each enqueue ran on: the context that executed a call holds that
call's input shape and has that call's addresses bound. A swap that kept another shape or
stale addresses would fail here, as on the GPU it would give wrong results.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _python_doubles import FakeTorch, _FakeContext, _user_managed_engine
from trt_runtime_backends.python import shapes

from trt_runtime import ContextOverlapWarning


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, tuple[int, ...], int | None, int | None]]:
    """Each enqueue: (context, its input shape, the addresses of x and y it had bound)."""
    record: list[tuple[Any, tuple[int, ...], int | None, int | None]] = []
    execute = _FakeContext.execute_async_v3

    def audited(self: _FakeContext, stream: int) -> bool:
        bound = {c[1]: c[2] for c in self.calls if c[0] == "address"}
        record.append((self, self.shapes.get("x", ()), bound.get("x"), bound.get("y")))
        return execute(self, stream)

    monkeypatch.setattr(_FakeContext, "execute_async_v3", audited)
    return record


def _engine(limit: int | None = None) -> Any:
    engine = _user_managed_engine()
    engine.trt_engine.device_memory_size_v2 = 4096  # one buffer fits every shape
    if limit is not None:
        engine.shape_contexts = limit
    return engine


def _shape_calls(engine: Any) -> int:
    return sum(1 for c in engine.trt_engine.contexts for call in c.calls if call[0] == "shape")


def test_shape_contexts_are_made_when_shapes_come_back_then_swapped_in(torch: FakeTorch,
                                                                        ran: list[Any]) -> None:
    engine = _engine()
    xs = {b: torch.cuda_tensor((b, 4)) for b in (1, 8, 2)}
    for b in (1, 8, 2):  # each seen once: one context changes its shapes
        engine(xs[b])
    assert len(engine.trt_engine.contexts) == 1 and engine.shape_context_stats["made"] == 0
    for b in (1, 8):  # they come back: a context each
        engine(xs[b])
    assert engine.shape_context_stats == {"contexts": 3, "made": 2, "swaps": 0}
    before = _shape_calls(engine)
    outs = []
    for b in (2, 1, 8, 2, 1, 8):
        outs.append(engine(xs[b]))
    assert _shape_calls(engine) == before  # no TensorRT call changed a shape
    assert engine.shape_context_stats == {"contexts": 3, "made": 2, "swaps": 6}
    # every call ran on a context in its shape, with its input and its own output bound
    for (_, shape, x_ptr, y_ptr), b, out in zip(ran[-6:], (2, 1, 8, 2, 1, 8), outs, strict=True):
        assert shape == (b, 4) and x_ptr == xs[b].data_ptr() and y_ptr == out.data_ptr()
    assert len({id(r[0]) for r in ran[-6:]}) == 3
    # all three share the lane's one scratch buffer
    memory = engine._lanes[0].context.device_memory
    for context in engine.trt_engine.contexts:
        assert ("device_memory", memory.handle, memory.size) in context.calls


def test_shape_contexts_follow_prebound_and_host_calls(ran: list[Any]) -> None:
    engine = _engine()
    xs = {b: np.full((b, 4), b, np.float32) for b in (1, 8)}
    for b in (1, 8, 1, 8, 1, 8):  # host arrays: the full path each time
        engine(xs[b])
    assert engine.shape_context_stats["made"] == 1 and engine.shape_context_stats["swaps"] == 3
    assert [shape for _, shape, _, _ in ran] == [(b, 4) for b in (1, 8) * 3]
    from _python_doubles import _CAI  # device arrays, pre-bound: the plans' prepare step

    ins = {b: _CAI((b, 4), "<f4", ptr=1 << (20 + b)) for b in (1, 8)}
    outs = {b: _CAI((b, 4), "<f4", ptr=1 << (30 + b)) for b in (1, 8)}
    ran.clear()
    for b in (1, 8, 1, 8, 1, 8):
        engine.execute(ins[b], outputs=[outs[b]])
    for (_, shape, x_ptr, y_ptr), b in zip(ran, (1, 8) * 3, strict=True):
        assert shape == (b, 4) and x_ptr == 1 << (20 + b) and y_ptr == 1 << (30 + b)
    assert engine.shape_context_stats["contexts"] == 2


def test_shape_contexts_past_the_limit_change_shapes_as_before(torch: FakeTorch, ran: list[Any]) -> None:
    engine = _engine(limit=2)
    xs = {b: torch.cuda_tensor((b, 4)) for b in (1, 2, 4, 8)}
    for _ in range(3):
        for b in (1, 2, 4, 8):
            engine(xs[b])
    assert len(engine.trt_engine.contexts) == 2
    assert engine.shape_context_stats["contexts"] == 2
    for (_, shape, x_ptr, _), b in zip(ran, (1, 2, 4, 8) * 3, strict=True):
        assert shape == (b, 4) and x_ptr == xs[b].data_ptr()
    # the lane's first context takes the shapes without a context of their own; the one
    # made keeps its shapes (a context fed shapes new to it specializes again on the GPU)
    first, made = engine.trt_engine.contexts
    assert [c for c in made.calls if c[0] == "shape"] == [("shape", "x", (1, 4))]
    assert {r[1] for r in ran[4:] if r[0] is first} == {(2, 4), (4, 4), (8, 4)}  # after round 1


def test_shape_contexts_keep_their_shapes_when_new_shapes_come(torch: FakeTorch, ran: list[Any]) -> None:
    """A shape never run, while a context made for other shapes is in use, goes to the
    lane's first context: the one in use keeps its shapes."""
    engine = _engine(limit=3)
    xs = {b: torch.cuda_tensor((b, 4)) for b in (1, 8, 2, 4)}
    for b in (1, 8, 1):
        engine(xs[b])
    first, made = engine.trt_engine.contexts
    assert engine._lanes[0].context.trt_context is made  # the one made for (1, 4) is in use
    for b in (2, 4, 1, 2):
        engine(xs[b])
    assert [c for c in made.calls if c[0] == "shape"] == [("shape", "x", (1, 4))]
    assert [r[1] for r in ran[-4:] if r[0] is first] == [(2, 4), (4, 4)]
    assert ran[-1][0] is engine.trt_engine.contexts[2]  # (2, 4) came back: a context of its own
    for (_, shape, x_ptr, _), b in zip(ran[-4:], (2, 4, 1, 2), strict=True):
        assert shape == (b, 4) and x_ptr == xs[b].data_ptr()


def test_shape_contexts_after_a_refused_switch(torch: FakeTorch, ran: list[Any]) -> None:
    """Shapes no context holds go to the lane's first context, so a switch TensorRT refuses
    leaves only that one in unknown shapes: the next calls set its shapes again (even shapes
    a context of their own holds), no context is dropped, and every call runs in its shapes."""
    from trt_runtime import InputError

    engine = _engine(limit=3)
    xs = {b: torch.cuda_tensor((b, 4)) for b in (1, 8, 2)}
    for b in (1, 8, 2, 1, 8):  # contexts for (1, 4) and (8, 4); the first one roams
        engine(xs[b])
    held = list(engine.trt_engine.contexts)
    first = held[0]
    refuse = first.set_input_shape
    first.set_input_shape = lambda name, shape: False  # type: ignore[method-assign]
    with pytest.raises(InputError, match=r"TensorRT rejected shape \(5, 4\) for input 'x'"):
        engine(torch.cuda_tensor((5, 4)))
    first.set_input_shape = refuse  # type: ignore[method-assign]
    for b in (1, 2, 8, 1, 2, 8):
        engine(xs[b])
    assert engine.shape_context_stats["contexts"] == 3 and engine.trt_engine.contexts == held
    for (_, shape, x_ptr, _), b in zip(ran[-6:], (1, 2, 8, 1, 2, 8), strict=True):
        assert shape == (b, 4) and x_ptr == xs[b].data_ptr()


def test_shape_contexts_one_turns_them_off_and_bad_limits_are_refused(torch: FakeTorch) -> None:
    engine = _engine()
    assert engine.shape_contexts == shapes.SHAPE_CONTEXTS == 4
    xs = [torch.cuda_tensor((b, 4)) for b in (1, 8)]
    for x in xs * 3:
        engine(x)
    assert engine.shape_context_stats["contexts"] == 2
    engine.shape_contexts = 1  # drops the contexts: the next call makes one
    assert engine.shape_context_stats["contexts"] == 0
    for x in xs * 3:
        engine(x)
    assert engine.shape_context_stats["contexts"] == 1
    for bad in (0, -1, 2.0, True, "4", None):
        with pytest.raises(ValueError, match=rf"shape_contexts must be an int >= 1; got {bad!r}"):
            engine.shape_contexts = bad
    assert engine.shape_contexts == 1


def test_shape_contexts_only_for_one_shared_user_managed_buffer(torch: FakeTorch,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from _python_doubles import _fake_engine
    from trt_runtime_backends.python import lane as lane_module

    plain = _fake_engine()  # TensorRT without USER_MANAGED contexts: each context owns its memory
    monkeypatch.setattr(lane_module, "MEMORY_PER_SHAPE", True)
    per_shape = _engine()  # memory sized per shape: contexts could not share one buffer
    for engine in (plain, per_shape):
        for b in (1, 8) * 3:
            engine(torch.cuda_tensor((b, 4)))
        assert len(engine.trt_engine.contexts) == 1


def test_shape_contexts_of_several_lanes_and_their_release(torch: FakeTorch) -> None:
    engine = _engine(limit=3)
    with pytest.warns(ContextOverlapWarning):  # (TensorRT-RTX 1.6.1's, for contexts of lanes)
        engine.contexts = 2
    lanes = engine._lanes
    assert [lane.ops._shape_contexts.limit for lane in lanes] == [3, 3]
    xs = [torch.cuda_tensor((b, 4)) for b in (1, 8)]
    for lane in lanes:  # each lane leased in turn (a thread keeps its lane)
        for x in xs * 2:
            lane.call((x,), None, None, None)
    assert engine.shape_context_stats == {"contexts": 4, "made": 2, "swaps": 2}
    parked = [lane.ops._res.context.parked for lane in lanes]
    assert all(len(p) == 1 for p in parked)
    engine.close()
    assert all(not p for p in parked)  # released with the lane's context


def test_shape_contexts_a_context_that_cannot_be_made_warns_and_calls_go_on(torch: FakeTorch,
                                                                            ran: list[Any]) -> None:
    engine = _engine()
    xs = [torch.cuda_tensor((b, 4)) for b in (1, 8)]
    for x in xs:
        engine(x)
    engine.trt_engine.create_execution_context = lambda config=None: None
    said = (r"engine 'fake': no context per shape from now on \(TensorRT could not create an execution "
            r"context for input shapes \(1, 4\)\)")
    with pytest.warns(RuntimeWarning, match=said):
        engine(xs[0])
    for x in xs * 2:
        engine(x)
    assert engine.shape_contexts == 4 and not engine._lanes[0].ops._shape_contexts.making
    assert len(engine.trt_engine.contexts) == 1
    for (_, shape, x_ptr, _), x in zip(ran, [*xs, xs[0], *xs, *xs], strict=True):
        assert shape == tuple(x.shape) and x_ptr == x.data_ptr()


def test_shape_contexts_under_the_outer_graph(torch: FakeTorch, ran: list[Any]) -> None:
    engine = _engine()
    xs = {b: torch.cuda_tensor((b, 4)) for b in (1, 8, 2)}
    for b in (1, 8, 1):
        engine(xs[b])
    assert engine.shape_context_stats["made"] == 1
    ran.clear()
    engine.outer_graph = True
    for b in (2, 8, 1, 2, 8, 1):
        engine(xs[b])
    assert engine.graph_captures == 3
    # a capture swaps in a context already in its shapes, else uses the one in use: its
    # replays need no context in them, so none is made for it (making one takes ~75 ms)
    assert engine.shape_context_stats["made"] == 1 and engine.shape_context_stats["swaps"] >= 1
    # the warm-ups and captures ran on a context in each graph's shapes, with that graph's
    # static buffers bound (one address per shape)
    by_shape: dict[Any, set[Any]] = {}
    for _, shape, x_ptr, _ in ran:
        by_shape.setdefault(shape, set()).add(x_ptr)
    assert set(by_shape) == {(1, 4), (2, 4), (8, 4)} and all(len(p) == 1 for p in by_shape.values())
    assert len(set.union(*by_shape.values())) == 3


def test_shape_contexts_refuse_what_tensorrt_refuses(torch: FakeTorch) -> None:
    engine = _engine()
    xs = [torch.cuda_tensor((b, 4)) for b in (1, 8)]
    for x in xs:
        engine(x)

    def refusing(config: Any = None) -> Any:
        context = _FakeContext(engine.trt_engine)
        context.set_optimization_profile_async = lambda index, stream: False  # type: ignore[method-assign]
        return context

    engine.trt_engine.create_execution_context = refusing
    with pytest.warns(RuntimeWarning, match=r"could not select optimization profile 0 in a new context"):
        assert engine(xs[0]).shape == (1, 4)
    assert not engine._lanes[0].ops._shape_contexts.making and engine.shape_context_stats["contexts"] == 1
