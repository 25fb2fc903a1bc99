"""The torchbind backend's lanes (``contexts = N``), each a ``torch.classes.tensorrt.Engine``
of its own: settings made before a lane exists reach its native engine when its context is
made, every lane's native engine is released by ``close()``, and what the engine counts and
logs once is the engine's, not each lane's."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from _reach import path_to
from _torchbind_doubles import inputs, make_backend, source

from trt_runtime import RuntimeSettings

pytestmark = pytest.mark.filterwarnings("ignore::trt_runtime.ContextOverlapWarning")

EAGER = RuntimeSettings(dynamic_shapes_kernel_specialization_strategy="eager")


def test_torchbind_lanes_made_later_update_their_native_engine_with_the_settings() -> None:
    backend, _ = make_backend("2.14.0")
    engine = backend.load_engine(source())
    a, b = inputs()
    want = engine(a, b).array
    engine.runtime_settings = EAGER
    engine.contexts = 3
    natives = [lane.ops.native for lane in engine._lanes]  # type: ignore[attr-defined]
    assert len({id(n) for n in natives}) == 3
    for lane in engine._lanes:
        lane.ensure_context()
        (out,) = lane.call((a, b), None, None, None)
        np.testing.assert_array_equal(out.array, want)
    codes = EAGER.to_codes()
    assert [tuple(n.updates[-1][:2]) for n in natives] == [codes] * 3
    assert engine.native_updates == 1 + 3  # the first call, then each lane with EAGER
    engine.close()
    assert all(lane.ops.native is None for lane in engine._lanes)  # type: ignore[attr-defined]


def test_torchbind_lanes_log_the_strategy_note_once_per_engine(caplog: pytest.LogCaptureFixture) -> None:
    backend, _ = make_backend("2.14.0")
    engine = backend.load_engine(source())
    engine.contexts = 2
    engine.runtime_settings = RuntimeSettings(cuda_graph_strategy="whole_graph_capture")
    engine.outer_graph = "copy"
    a, b = inputs()
    with caplog.at_level(logging.WARNING, logger="trt_runtime.torchbind"):
        for lane in engine._lanes:
            for _ in range(2):
                lane.call((a, b), None, None, None)
    notes = [r for r in caplog.records if "cuda_graph_strategy" in r.getMessage()]
    assert len(notes) == 1 and engine.graph_captures == 0  # eager with TensorRT-RTX's own capture


def test_torchbind_lanes_closed_engine_reaches_no_native_engine() -> None:
    """close() lets go of every lane's torch.classes.tensorrt.Engine at once: the closed
    engine's objects, which wait for the garbage collector, reach none of them (the test
    double's op keeps a log of its calls: not followed)."""
    backend, bridge = make_backend("2.14.0")
    engine = backend.load_engine(source())
    engine(*inputs())
    engine.contexts = 2
    natives = [lane.ops.native for lane in engine._lanes]  # type: ignore[attr-defined]
    op_log = engine._first_lane()._op.__self__  # type: ignore[attr-defined]
    engine.close()
    for native in natives:
        assert path_to(engine, native, skip=(backend, bridge, op_log)) is None


def test_torchbind_lanes_closed_engine_gives_its_streams_back_at_once() -> None:
    """close() hands every lane's stream to the pool then and there (the next engine takes
    it), not when the garbage collector frees the closed engine's objects."""
    backend, bridge = make_backend("2.14.0")
    engine = backend.load_engine(source())
    engine.contexts = 2
    a, b = inputs()
    engine(a, b)
    engine.outer_graph = True
    engine(a, b)  # a capture, on a side stream of the first lane's graphs
    lanes = [lane.ops for lane in engine._lanes]  # type: ignore[attr-defined]
    streams = [ops._lane_stream.stream for ops in lanes if ops._lane_stream is not None]
    streams += [ops.graphs.side for ops in lanes if ops.graphs.side is not None]
    assert len(streams) >= 2 and bridge.given_back == []
    engine.close()
    assert sorted(id(s) for s in bridge.given_back) == sorted(id(s) for s in streams)
