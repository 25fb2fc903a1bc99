"""How the torchbind backend orders a lane's stream with the caller's: ``TorchBridge.execute_on``
over the doubles' torch (raw stream handles, stream ids, blocking flags, events and
``record_stream`` logged). The stream pool's kinds: test_torchbind_bridge.py."""

from __future__ import annotations

from typing import Any

import pytest
from _torchbind_doubles import FakeBridge, inputs, make_backend, source
from _torchbind_fakes import FakeStream

from trt_runtime.errors import EngineError
from trt_runtime.settings import RuntimeSettings

CAPTURE = RuntimeSettings(cuda_graph_strategy="whole_graph_capture")


def _engine(**options: Any) -> tuple[Any, FakeBridge]:
    backend, bridge = make_backend("2.14.0", ordering=True, **options)
    engine = backend.load_engine(source())
    return engine, bridge


def _events(caller: str, lane: str, outputs: int = 1) -> list[tuple[str, ...]]:
    """What ordering ``lane`` with ``caller`` by events logs: ready, wait, done, wait, and
    ``record_stream`` of each output on the caller's stream."""
    return [
        ("record", caller), ("wait_event", lane), ("record", lane), ("wait_event", caller),
        *[("record_stream", caller)] * outputs,
    ]


def test_torchbind_stream_order_default_stream_caller_on_a_blocking_lane_needs_no_event() -> None:
    engine, bridge = _engine()
    for _ in range(3):  # the general path (first call), then the hot path
        out = engine(*inputs())
    assert bridge.lanes == 1
    lane = bridge.lane_calls[0][0]
    assert bridge.ordering_log == []  # no event record, no wait, no record_stream
    assert bridge.ops.streams == [lane] * 3  # the op ran with the lane's stream current
    assert bridge.stream_sets == [lane, "current:0"] * 3  # and torch's default stream came back
    assert bridge.active_stream(0).name == "current:0" and bridge.active_stream(0).handle == 0
    assert out.array[0, 0] == 6.0  # ((x + y) * 2, as the doubles compute)


def test_torchbind_stream_order_default_stream_restored_after_the_op_raises() -> None:
    engine, bridge = _engine()
    engine(*inputs())
    bridge.ops.fail_with = RuntimeError("enqueueV3 failed")
    with pytest.raises(EngineError, match="enqueueV3 failed"):
        engine(*inputs())  # the hot path
    assert bridge.stream_sets[-2:] == ["lane:0:1", "current:0"]
    assert bridge.active_stream(0).name == "current:0"
    assert bridge.ordering_log == []


def test_torchbind_stream_order_side_stream_caller_gets_events_and_record_stream() -> None:
    engine, bridge = _engine()
    engine(*inputs())
    mine = FakeStream("mine")
    with bridge.stream_scope(mine):
        engine(*inputs())  # the hot path, on the caller's own stream
        assert bridge.active_stream(0) is mine  # (its stream current again)
    assert bridge.ordering_log == _events("mine", "lane:0:1")
    assert bridge.ops.streams[-1] == "lane:0:1"
    bridge.ordering_log.clear()
    engine.execute(*inputs(), stream=mine)  # the general path with a stream given
    assert bridge.ordering_log == _events("mine", "lane:0:1")


def test_torchbind_stream_order_without_cuda_python_orders_every_caller_with_events() -> None:
    engine, bridge = _engine(cuda_python=False)
    engine(*inputs())
    engine(*inputs())
    assert bridge.ordering_log == _events("current:0", "lane:0:1") * 2  # default stream too


def test_torchbind_stream_order_cuda_graph_strategy_runs_on_a_non_blocking_stream() -> None:
    engine, bridge = _engine()
    engine(*inputs())
    assert bridge.ordering_log == [] and bridge.lanes == 1
    engine.runtime_settings = CAPTURE
    synced = len(bridge.synced)
    engine(*inputs())
    # a second stream, non-blocking: a capture on a blocking stream would make every call
    # on the legacy default stream fail meanwhile; the blocking one was idle before the switch
    assert bridge.lanes == 2 and "lane:0:1" in [s.name for s in bridge.synced[synced:]]
    assert bridge.ops.streams[-1] == "lane:0:2"
    assert bridge.ordering_log == _events("current:0", "lane:0:2")
    bridge.ordering_log.clear()
    engine.runtime_settings = RuntimeSettings()  # off again: back to the blocking stream
    engine(*inputs())
    assert bridge.lanes == 2 and bridge.ops.streams[-1] == "lane:0:1"
    assert bridge.ordering_log == []


def test_torchbind_stream_order_lane_made_under_cuda_graph_strategy_is_non_blocking() -> None:
    backend, bridge = make_backend("2.14.0", ordering=True)
    engine = backend.load_engine(source(), settings=CAPTURE)
    engine(*inputs())
    engine(*inputs())
    assert bridge.lanes == 1
    assert bridge.ordering_log == _events("current:0", "lane:0:1") * 2
