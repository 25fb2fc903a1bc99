"""How the torchbind backend orders a lane's stream with the caller's, on a GPU: a caller on
torch's default stream (the legacy default stream) and a blocking lane stream need no event
and no ``record_stream``, and its results and freed outputs stay right; other caller streams,
and lanes under TensorRT-RTX's ``cuda_graph_strategy``, are ordered with events."""

from __future__ import annotations

import importlib.util
import threading
from typing import Any

import pytest
from _gpu_torchbind import tiny_input

from trt_runtime import RuntimeSettings

pytestmark = pytest.mark.gpu

_SLEEP = 50_000_000  # torch.cuda._sleep cycles: ~25 ms, the work behind it is late


class _Counted:
    """A lane event whose records are counted (and still made)."""

    def __init__(self, event: Any) -> None:
        self.event, self.records = event, 0

    def record(self, stream: Any) -> None:
        self.records += 1
        self.event.record(stream)

    def __getattr__(self, name: str) -> Any:  # what Stream.wait_event reads of an event
        return getattr(self.event, name)


def _spied_lane(engine: Any, torch: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[Any], list[Any]]:
    """The engine's first lane stream with counted events, and the streams each output was
    recorded on (``Tensor.record_stream``)."""
    lane = engine._lanes[0].ops._lane_stream
    assert lane is not None, "the lane's stream is made by the first call"
    events = [_Counted(lane.ready), _Counted(lane.done)]
    monkeypatch.setattr(lane, "ready", events[0])  # (the events restored after the test)
    monkeypatch.setattr(lane, "done", events[1])
    recorded: list[Any] = []
    original = torch.Tensor.record_stream
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda t, s: recorded.append(s) or original(t, s))
    return lane, events, recorded


def _mlp(open_torchbind: Any, torch: Any, seed: int) -> tuple[Any, Any, Any]:
    """The mlp engine, an input and its output (a copy)."""
    engine, built = open_torchbind("mlp_fp16")
    x = tiny_input(torch, built, seed=seed)
    return engine, x, engine(x).clone()


def _cuda_python() -> bool:
    return importlib.util.find_spec("cuda.bindings") is not None


def test_gpu_torchbind_default_stream_caller_needs_no_event(
    open_torchbind: Any, torch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not _cuda_python():
        pytest.skip("cuda-python is not installed: lane streams are non-blocking")
    engine, built = open_torchbind("mlp_fp16")
    torch.cuda.set_stream(torch.cuda.default_stream())
    xs = [tiny_input(torch, built, seed=s) for s in range(4)]
    wants = [engine(x).clone() for x in xs]
    torch.cuda.synchronize()
    lane, events, recorded = _spied_lane(engine, torch, monkeypatch)
    assert lane.blocking
    for _ in range(5):
        torch.cuda._sleep(_SLEEP)  # the inputs below are late: the op must wait for them
        late = [x * 1 for x in xs]
        got = [engine(x) * 1 for x in late]  # read on the default stream right after
        torch.cuda.synchronize()
        assert all(torch.equal(g, w) for g, w in zip(got, wants, strict=True))
    assert [e.records for e in events] == [0, 0] and recorded == []
    assert torch._C._cuda_getCurrentRawStream(engine.device) == 0  # the default stream is current again


def test_gpu_torchbind_default_stream_output_freed_while_still_read(
    open_torchbind: Any, torch: Any
) -> None:
    """An output read by late work on the default stream and freed at once: its memory goes
    to the next call's output (no ``record_stream``), whose write must wait for that read."""
    engine, built = open_torchbind("mlp_fp16")
    torch.cuda.set_stream(torch.cuda.default_stream())
    a, b = tiny_input(torch, built, seed=1), tiny_input(torch, built, seed=2)
    want_a, want_b = engine(a).clone(), engine(b).clone()
    assert not torch.equal(want_a, want_b)
    torch.cuda.synchronize()
    for _ in range(5):
        y = engine(a)
        torch.cuda._sleep(_SLEEP)
        read = y * 1  # queued behind the sleep
        address = y.data_ptr()
        del y
        z = engine(b)  # may reuse y's memory
        torch.cuda.synchronize()
        assert torch.equal(read, want_a) and torch.equal(z, want_b)
        print("reused the freed output's memory:", z.data_ptr() == address)


def test_gpu_torchbind_side_stream_caller_ordered_with_events(
    open_torchbind: Any, torch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, x, want = _mlp(open_torchbind, torch, seed=3)
    _, events, recorded = _spied_lane(engine, torch, monkeypatch)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(_SLEEP)
        got = engine(x * 1) * 1
    side.synchronize()
    assert torch.equal(got, want)
    assert [e.records for e in events] == [1, 1] and recorded == [side]


def test_gpu_torchbind_cuda_graph_strategy_runs_on_a_non_blocking_stream(
    open_torchbind: Any, torch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TensorRT-RTX's own capture on a blocking stream would make the other thread's work on
    the legacy default stream fail; the lane runs on a non-blocking stream, with events."""
    torch.cuda.set_stream(torch.cuda.default_stream())
    engine, x, want = _mlp(open_torchbind, torch, seed=4)
    if not engine.backend.capabilities.supports_cuda_graph_strategy:
        pytest.skip("this torch-tensorrt-rtx has no cuda_graph_strategy")
    engine.runtime_settings = RuntimeSettings(cuda_graph_strategy="whole_graph_capture")
    assert torch.equal(engine(x), want)
    torch.cuda.synchronize()
    lane, events, recorded = _spied_lane(engine, torch, monkeypatch)
    assert not lane.blocking
    errors: list[BaseException] = []
    stop = threading.Event()

    def legacy_work() -> None:  # another thread on the legacy default stream meanwhile
        try:
            t = torch.ones(256, device=f"cuda:{engine.device}")
            while not stop.is_set():
                t = t * 1
            torch.cuda.synchronize()
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=legacy_work)
    worker.start()
    try:
        for _ in range(20):
            got = engine(x)
        torch.cuda.synchronize()
    finally:
        stop.set()
        worker.join()
    assert errors == [] and torch.equal(got, want)
    assert events[0].records == 20 and len(recorded) == 20
    engine.runtime_settings = RuntimeSettings()  # off again: the blocking stream, no events
    assert torch.equal(engine(x), want)
    assert engine._lanes[0].ops._lane_stream.blocking == _cuda_python()
