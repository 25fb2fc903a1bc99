"""The core's :class:`~trt_runtime.lane.Lane`: a context that cannot be created (out of
memory, say) leaves its lane without one and usable, other lanes keep serving, and
``contexts = N`` failing part-way keeps the lanes it had; settings reach each lane
through its own methods."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from trt_runtime import EngineError, EngineSource, RuntimeSettings, TensorSpec
from trt_runtime.errors import CacheError
from trt_runtime.lane import Lane
from trt_runtime.testing.memory import AffineOutput, MemoryBackend, MemoryEngine, MemoryLane

pytestmark = pytest.mark.filterwarnings("ignore::trt_runtime.ContextOverlapWarning")

X = np.ones((2, 4), np.float32)


class _Failing(MemoryLane):
    """A lane whose ``create_context`` raises what its engine's ``fail`` holds (once per
    entry: each failure is popped)."""

    def create_context(self, settings: Any, cache: Any) -> Any:
        engine: Any = self.engine
        if engine.fail:
            raise engine.fail.pop(0)
        return super().create_context(settings, cache)


class _Engine(MemoryEngine):
    lane_type = _Failing
    fail: list[BaseException]


def _engine() -> _Engine:
    backend = MemoryBackend()
    backend.engine_class = _Engine
    spec = TensorSpec("x", "float32", (2, 4), is_input=True)
    data = MemoryBackend.build_engine([spec], [AffineOutput("y", "x", scale=2.0, bias=1.0)], name="lanes")
    engine = backend.load_engine(EngineSource(data, name="lanes"))
    assert isinstance(engine, _Engine)
    engine.fail = []
    return engine


def test_lane_out_of_memory_at_context_creation_names_the_engine_and_the_next_call_tries_again() -> None:
    engine = _engine()
    engine.fail.append(MemoryError("cudaMalloc: out of memory"))
    said = (r"engine 'lanes': creating an execution context failed "
            r"\(MemoryError: cudaMalloc: out of memory\); the next call tries again")
    with pytest.raises(EngineError, match=said):
        engine(X)
    (lane,) = engine._lanes
    assert lane.context is None and lane.creations == 0 and not engine.has_context()
    np.testing.assert_array_equal(engine(X), np.full((2, 4), 3.0))  # the lane is usable
    assert lane.context is not None and engine.context_creations == 1


def test_lane_backend_errors_from_context_creation_pass_unchanged() -> None:
    engine = _engine()
    refused = CacheError("engine 'lanes': the runtime cache gave object, not the memory backend's cache")
    engine.fail.append(refused)
    with pytest.raises(CacheError) as raised:
        engine(X)
    assert raised.value is refused and not engine.has_context()


def test_lane_other_lanes_keep_serving_while_one_cannot_create_its_context() -> None:
    engine = _engine()
    engine.contexts = 2
    first, second = engine._lanes
    first.ensure_context()
    engine.fail.append(MemoryError("out of memory"))
    with pytest.raises(EngineError, match="out of memory"):
        second.ensure_context()
    assert first.context is not None and second.context is None
    results: list[Any] = []

    def call() -> None:
        results.append(engine(X))

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(results) == 4 and all((r == 3.0).all() for r in results)
    assert engine.contexts == 2


def test_lane_contexts_failing_part_way_keeps_the_lanes_it_had(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine()
    engine(X)
    made: list[Lane] = []
    original = _Engine._new_ops

    def new_ops(self: Any, lane: Lane) -> Any:
        if len(made) == 2:
            raise MemoryError("no memory for a third lane")
        made.append(lane)
        return original(self, lane)

    monkeypatch.setattr(_Engine, "_new_ops", new_ops)
    with pytest.raises(MemoryError, match="third lane"):
        engine.contexts = 4
    assert engine.contexts == 1 and all(lane.closed for lane in made)
    np.testing.assert_array_equal(engine(X), np.full((2, 4), 3.0))


def test_lane_settings_reach_each_lane_once_through_its_methods() -> None:
    engine = _engine()
    engine.contexts = 3
    for lane in engine._lanes:
        lane.ensure_context()
    settings = RuntimeSettings(cuda_graph_strategy="whole_graph_capture")
    engine.runtime_settings = settings
    assert all(lane.settings == settings and lane.context is None for lane in engine._lanes)
    engine.outer_graph = "view"
    assert all(lane.outer_graph is engine.outer_graph for lane in engine._lanes)
    assert engine.context_creations == 3  # dropped, not yet made again
    engine.close()
    assert all(lane.closed for lane in engine._lanes)
    assert "closed" in repr(engine._lanes[0])


def test_lane_closed_lane_refuses_calls() -> None:
    engine = _engine()
    (lane,) = engine._lanes
    engine.close()
    with pytest.raises(EngineError, match="engine 'lanes' is closed"):
        lane.call((X,), None, None, None)
