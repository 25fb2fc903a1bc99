"""The python backend's contexts by TensorRT's rule: for an engine with dynamic input shapes,
contexts in concurrent use never share an optimization profile, so each further context
gets an ICudaEngine of its own (deserialized from the same plan); a static engine's share
one. memory_usage() counts the weights of every engine. The backend's own settings
(profile, output_allocator, shape_contexts) reach every lane, and the lanes made later."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from _python_doubles import FakeTorch, _fake_engine, _FakeContext, _FakeTrtEngine
from _reach import path_to

from trt_runtime import CapabilityError, EngineError, EngineSource

pytestmark = pytest.mark.filterwarnings("ignore::trt_runtime.ContextOverlapWarning")


def _deserializing(engine: Any, monkeypatch: pytest.MonkeyPatch) -> list[_FakeTrtEngine]:
    """Make the engine's backend deserialize fake engines like the first, from a plan of
    1,000 bytes; return them."""
    plan = EngineSource(b"P" * 1000, name="fake")
    engine._shared.source = plan
    made: list[_FakeTrtEngine] = []
    first = engine.trt_engine

    def deserialize(source: EngineSource, state: Any) -> _FakeTrtEngine:
        made.append(_FakeTrtEngine(-1 if first.num_optimization_profiles > 1 else 8))
        return made[-1]

    monkeypatch.setattr(engine.backend, "deserialize", deserialize)
    return made


def test_python_lanes_dynamic_engine_gives_each_context_its_own_engine(monkeypatch: pytest.MonkeyPatch
                                                                       ) -> None:
    engine = _fake_engine()  # dynamic batch, two profiles
    made = _deserializing(engine, monkeypatch)
    engine.contexts = 3
    lanes = engine._lanes
    assert len(made) == 2 and [lane.ops.trt_engine for lane in lanes[1:]] == made
    assert len({id(lane.ops.trt_engine) for lane in lanes}) == 3
    usage = engine.memory_usage()
    assert usage["weights"] == 3 * 1000 and usage["contexts"] == 3
    # every lane's calls create contexts on its own engine only
    x = np.ones((2, 4), np.float32)
    barrier = threading.Barrier(3)

    def call() -> None:
        barrier.wait()
        for _ in range(5):
            engine.execute(x)

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for lane in lanes:
        if lane.context is not None:
            assert lane.context.trt_context in lane.ops.trt_engine.contexts
    assert sum(len(e.contexts) for e in made) + len(engine.trt_engine.contexts) >= 1
    assert all(len(e.contexts) <= 1 for e in made)  # one context per engine
    engine.contexts = 1  # the other engines go with their lanes
    assert engine.memory_usage()["weights"] == 1000
    engine.close()


def test_python_lanes_static_engine_shares_its_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _fake_engine(batch=8)  # static shapes, one profile
    made = _deserializing(engine, monkeypatch)
    engine.contexts = 3
    assert made == [] and {id(lane.ops.trt_engine) for lane in engine._lanes} == {id(engine.trt_engine)}
    assert engine.memory_usage()["weights"] == 1000
    engine.close()


def test_python_lanes_failed_deserialize_keeps_the_contexts_it_has(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _fake_engine()
    made = _deserializing(engine, monkeypatch)
    working = engine.backend.deserialize
    clones: list[Any] = []  # the lanes whose ops were made
    original_new_ops = type(engine)._new_ops

    def new_ops(self: Any, lane: Any) -> Any:
        ops = original_new_ops(self, lane)
        clones.append(lane)
        return ops

    monkeypatch.setattr(type(engine), "_new_ops", new_ops)

    def failing_second(source: EngineSource, state: Any) -> Any:
        if made:
            raise EngineError("engine 'fake': TensorRT failed to deserialize it: out of memory")
        return working(source, state)

    monkeypatch.setattr(engine.backend, "deserialize", failing_second)
    with pytest.raises(EngineError, match="out of memory"):
        engine.contexts = 3
    assert engine.contexts == 1 and len(clones) == 1 and clones[0].closed  # nothing left half-made
    np.testing.assert_array_equal(engine.execute(np.ones((2, 4), np.float32))[0].shape, (2, 4))
    engine.close()


def test_python_lanes_backend_settings_reach_every_lane_and_the_lanes_made_later(torch: FakeTorch) -> None:
    """``profile``, ``output_allocator`` and ``shape_contexts`` are the engine's: a change
    reaches every lane (remembered calls forgotten, contexts dropped), and a lane that
    ``contexts = N`` makes later starts with them."""
    engine = _fake_engine()
    engine.contexts = 2
    x = torch.cuda_tensor((2, 4))

    def call_each_lane() -> None:
        for lane in engine._lanes:
            for _ in range(2):  # the second call runs the plan the first one made
                (y,) = lane.guarded_call(False, (x,), None, None, None)
                assert tuple(y.shape) == (2, 4)

    call_each_lane()
    assert all(lane.fast_entry != lane.ops.call_fast for lane in engine._lanes)
    engine.profile = 0
    assert all(lane.fast_entry == lane.ops.call_fast for lane in engine._lanes)
    assert not any(lane.ops._fast_paths.natural for lane in engine._lanes)  # type: ignore[attr-defined]
    assert engine.has_context()
    engine.output_allocator = "always"
    assert not engine.has_context()
    call_each_lane()
    engine.shape_contexts = 1
    assert not engine.has_context()
    engine.contexts = 3
    call_each_lane()
    for lane in engine._lanes:
        ops: Any = lane.ops
        assert set(lane.context.allocators) == {"y"} and ops._shape_contexts.limit == 1
        assert ops.shared.profile == 0
    assert engine.context_creations == 2 + 2 + 3


def test_python_lanes_an_output_one_lane_finds_data_dependent_is_so_for_the_engine(
        torch: FakeTorch, monkeypatch: pytest.MonkeyPatch) -> None:
    """An output whose shape TensorRT leaves unknown on a lane's first run is data-dependent
    for every lane and for the engine: ``outputs`` says so, the outer graph is refused, and
    the other lanes' next contexts give it an output allocator."""
    engine = _fake_engine()
    engine.contexts = 2
    first, second = engine._lanes
    x = torch.cuda_tensor((2, 4))
    first.guarded_call(False, (x,), None, None, None)
    original = _FakeContext.get_tensor_shape
    unknown = [True]

    def shape(self: _FakeContext, name: str) -> tuple[int, ...]:
        if name == "y" and unknown:  # once: TensorRT's shape inference on the second lane
            unknown.clear()
            return (-1, 4)
        return original(self, name)

    monkeypatch.setattr(_FakeContext, "get_tensor_shape", shape)
    (y,) = second.guarded_call(False, (x,), None, None, None)
    assert tuple(y.shape) == (2, 4) and set(second.context.allocators) == {"y"}
    assert engine.data_dependent_outputs == ["y"] and engine.outputs[0].data_dependent
    with pytest.raises(CapabilityError, match=r"outputs \['y'\] have data-dependent shapes"):
        engine.outer_graph = "copy"
    engine.invalidate_context()
    first.guarded_call(False, (x,), None, None, None)
    assert set(first.context.allocators) == {"y"}


def test_python_lanes_closed_engine_holds_no_tensorrt_object(torch: FakeTorch) -> None:
    """close() lets go of the TensorRT engine (its weights), the contexts and their memory at
    once: the closed engine's objects, which wait for the garbage collector, reach none of them."""
    engine = _fake_engine(batch=-1)
    engine.contexts = 2
    engine(torch.cuda_tensor((2, 4)))
    native = [engine.trt_engine, *(ops.trt_engine for ops in engine._lane_ops()),
              *(lane.context.trt_context for lane in engine._pool.lanes if lane.context is not None)]
    memory = [lane.context.device_memory for lane in engine._pool.lanes if lane.context is not None]
    assert native and all(n is not None for n in native)
    engine.close()
    for held in [*native, *(m for m in memory if m is not None)]:
        assert path_to(engine, held, skip=(engine.backend,)) is None, (type(held).__name__,
                                                                      path_to(engine, held))
