"""The python backend's natural call path (``engine(x)`` with torch tensors, faked) and its device
contract: shapes remembered, the caller's stream followed, output kinds, user-managed context
memory and the device made current once per thread."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _python_doubles import (
    _CAI,
    FakeTorch,
    _fake_engine,
    _trt_calls,
    _user_managed_engine,
)
from trt_runtime_backends.python import plans
from trt_runtime_backends.python.arrays import DeviceArray

from trt_runtime import InputError

# -- the natural call path (engine(x) with torch tensors) and the device contract ------------------


def test_python_backend_natural_call_remembers_shapes_not_tensors(torch: FakeTorch) -> None:
    engine = _fake_engine()
    first = engine(torch.cuda_tensor((2, 4)))
    assert isinstance(first, torch.Tensor) and first.get_device() == 0 and first.shape == (2, 4)
    assert list(engine._lanes[0].ops._fast_paths.natural) == [((2, 4),)]
    calls = _trt_calls(engine)
    calls.clear()
    torch.empty_calls.clear()
    x = torch.cuda_tensor((2, 4))  # another tensor of a remembered shape
    out = engine(x)
    # no shape inference, no output-shape query: bind the new addresses and run
    assert [c[0] for c in calls] == ["address", "address", "execute"]
    # the output comes from a slab: one torch.empty for the next SLAB_CALLS calls' outputs
    assert torch.empty_calls == [((plans.SLAB_CALLS, 2, 4), torch.float32, ("cuda", 0))]
    assert out.data_ptr() != first.data_ptr() and out.shape == (2, 4)
    assert [c[0] for c in engine._rt.calls if c[0] in ("record", "wait")] == []  # legacy stream
    calls.clear()
    engine(torch.cuda_tensor((3, 4)))  # a new shape: the full path once
    assert ("get_shape", "y") in calls and len(engine._lanes[0].ops._fast_paths.natural) == 2
    calls.clear()
    engine(x)  # back to (2, 4): only the shape is set again
    assert [c for c in calls if c[0] == "shape"] == [("shape", "x", (2, 4))]
    assert not [c for c in calls if c[0] == "get_shape"]


def test_python_backend_natural_call_orders_other_streams_and_checks_inputs(torch: FakeTorch) -> None:
    engine = _fake_engine()
    x = torch.cuda_tensor((2, 4))
    engine(x)
    torch.current_stream = 55  # inside torch.cuda.stream(side)
    engine._rt.calls.clear()
    engine(x)
    ev = engine._lanes[0].ops._order.event_tail  # the repeat call runs on 55, after the lane's work on ours
    ordering = [c for c in engine._rt.calls if c[0] in ("record", "wait")]
    assert ordering == [("record", ev, 4242), ("wait", 55, ev)]
    engine._rt.calls.clear()
    engine(x, stream=engine.stream)  # back on our own stream, after the work on 55
    ordering = [c for c in engine._rt.calls if c[0] in ("record", "wait")]
    assert ordering == [("record", ev, 55), ("wait", 4242, ev)]
    engine._rt.calls.clear()
    engine(x, stream=engine.stream)
    assert not [c for c in engine._rt.calls if c[0] in ("record", "wait")]
    with pytest.raises(InputError, match=r"input 'x' must have dtype float32; got torch\.float16"):
        engine(torch.cuda_tensor((2, 4), torch.float16))
    with pytest.raises(InputError, match=r"input 'x' is not contiguous \(strides"):
        engine(torch.cuda_tensor((2, 4), contiguous=False))
    with pytest.raises(InputError, match=r"input 'x' is on cuda:1; the engine runs on cuda:0"):
        engine(torch.Tensor((2, 4), torch.float32, 1))
    with pytest.raises(InputError, match=r"takes 1 input\(s\) \(x\); got 2"):
        engine(x, x)


def test_python_backend_fast_calls_follow_the_callers_stream(torch: FakeTorch) -> None:
    """A repeat call runs on the caller's stream: no event while the lane's previous work
    went there too; one record + wait when it went elsewhere; the general path joins its
    own stream first, and _sync waits for both."""
    engine = _fake_engine()
    rt = engine._rt.calls
    order = engine._lanes[0].ops._order
    ours = engine._lanes[0].ops._stream_handle

    def ordering() -> list[tuple[Any, ...]]:
        found = [c for c in rt if c[0] in ("record", "wait")]
        rt.clear()
        return found

    def executes() -> list[Any]:
        found = [c[1] for c in _trt_calls(engine) if c[0] == "execute"]
        _trt_calls(engine).clear()
        return found

    x = torch.cuda_tensor((2, 4))
    torch.current_stream = 77
    engine(x)  # the general path: our stream, ordered with 77 by events
    assert executes() == [ours] and len(ordering()) == 4 and order.tail == ours
    engine(x)  # fast path: onto 77, after the lane's previous work on ours
    assert executes() == [77]
    assert ordering() == [("record", order.event_tail, ours), ("wait", 77, order.event_tail)]
    for _ in range(3):
        engine(x)  # 77 again: nothing to order
    assert executes() == [77] * 3 and ordering() == [] and order.tail == 77
    torch.current_stream = 88  # another caller stream
    engine(x)
    assert executes() == [88]
    assert ordering() == [("record", order.event_tail, 77), ("wait", 88, order.event_tail)]
    torch.current_stream = 0  # the legacy stream: back on ours (blocking: no caller events)
    engine(x)
    assert executes() == [ours]
    assert ordering() == [("record", order.event_tail, 88), ("wait", ours, order.event_tail)]
    torch.current_stream = 99
    engine(x)
    assert executes() == [99] and len(ordering()) == 2
    engine(torch.cuda_tensor((3, 4)))  # new shapes: the general path joins ours first
    assert ordering()[:2] == [("record", order.event_tail, 99), ("wait", ours, order.event_tail)]
    engine(x)
    assert order.tail == 99
    rt.clear()
    engine.synchronize()
    assert [c for c in rt if c[0] in ("record", "wait", "sync")][:2] == [
        ("record", order.event_tail, 99), ("wait", ours, order.event_tail)]
    assert order.tail == ours


def test_python_backend_runs_on_a_non_blocking_stream_while_trt_captures(torch: FakeTorch) -> None:
    """With cuda_graph_strategy on, TensorRT-RTX captures on the stream execute_async_v3 is
    given; a capture on a blocking stream breaks every legacy-stream call in the process, so
    the lane moves to a non-blocking stream (events for legacy callers), and back."""
    engine = _fake_engine()
    blocking = engine.stream
    assert blocking.blocking
    x = torch.cuda_tensor((2, 4))  # torch.current_stream is 0: the legacy stream
    engine(x)
    engine.runtime_settings = {"cuda_graph_strategy": "whole_graph_capture"}
    engine(x)
    spare = engine.stream
    assert spare is not blocking and not spare.blocking
    ops = engine._lanes[0].ops
    assert ops._order.ours == spare.handle and ops._res.stream_handle == spare.handle
    assert engine._lanes[0].ops._binding.stream is spare
    engine._rt.calls.clear()
    engine(x)  # the legacy caller is now ordered with events, the work on the spare stream
    assert [c[0] for c in engine._rt.calls if c[0] in ("record", "wait")] == ["record", "wait"] * 2
    assert [c[1] for c in _trt_calls(engine) if c[0] == "execute"][-1] == spare.handle
    engine.runtime_settings = {"cuda_graph_strategy": "disabled"}
    engine._rt.calls.clear()
    engine(x)
    engine(x)
    assert engine.stream is blocking and engine._lanes[0].ops._order.skip == (0, 1)
    assert not [c for c in engine._rt.calls if c[0] in ("record", "wait")]
    engine.close()
    assert engine._lanes[0].ops._spare_stream is None


def test_python_backend_events_mode_orders_the_legacy_stream_too(torch: FakeTorch) -> None:
    engine = _fake_engine(ordering="events")
    assert not engine._state.streams[0].blocking
    x = torch.cuda_tensor((2, 4))
    engine(x)
    engine._rt.calls.clear()
    engine(x)
    assert [c[0] for c in engine._rt.calls if c[0] in ("record", "wait")] == ["record", "wait"] * 2
    implicit = _fake_engine()
    assert implicit._state.streams[0].blocking  # what lets the legacy stream skip events
    with pytest.raises(ValueError, match="stream ordering mode must be one of 'implicit', 'events'; got 'x'"):
        _fake_engine(ordering="x")


def test_python_backend_output_kind_follows_input_kind(torch: FakeTorch) -> None:
    engine = _fake_engine()
    assert isinstance(engine(np.ones((2, 4), np.float32)), np.ndarray)
    cpu = engine(torch.Tensor((2, 4), torch.float32, -1))
    assert isinstance(cpu, torch.Tensor) and cpu.get_device() == -1  # CPU torch in, CPU torch out
    cuda_out = engine(torch.cuda_tensor((2, 4)))
    assert isinstance(cuda_out, torch.Tensor) and cuda_out.get_device() == 0
    assert isinstance(engine(_CAI((2, 4), "<f4", ptr=8192)), DeviceArray)
    with pytest.raises(InputError, match=r"input 'x' is not contiguous \(strides"):
        engine(torch.Tensor((2, 4), torch.float32, -1, contiguous=False))
    with pytest.raises(InputError, match=r"input 'x' must have dtype float32; got torch\.float64"):
        engine(torch.Tensor((2, 4), torch.float64, -1))


def test_python_backend_cpu_torch_tensors_of_any_dtype_are_staged(torch: FakeTorch) -> None:
    engine = _fake_engine(dtype="BF16")
    host = torch.Tensor((2, 4), torch.bfloat16, -1)
    out = engine(host)  # no numpy round trip: bfloat16 works
    assert isinstance(out, torch.Tensor) and out.dtype is torch.bfloat16 and out.get_device() == -1
    copies = engine._rt.copies
    assert [(k, n) for k, _, _, n, _ in copies] == [(1, 16), (2, 16)]
    assert copies[0][2] == host.data_ptr() and copies[1][1] == out.data_ptr()


def test_python_backend_user_managed_context_memory_fits_each_shape() -> None:
    engine = _user_managed_engine()
    engine.trt_engine.device_memory_size_v2 = 0
    engine.execute(np.ones((2, 4), np.float32))
    config = engine.runtime_config
    assert config.allocation_strategy == "user_managed"
    calls = _trt_calls(engine)
    # the profile is selected explicitly, then the memory sized for the shapes
    assert [c[0] for c in calls[:4]] == ["device_memory", "profile", "shape", "memory_size"]
    assert calls[4] == ("device_memory", engine._lanes[0].context.device_memory.handle, 2 * 256)
    first = engine._lanes[0].context.device_memory
    engine.execute(np.ones((1, 4), np.float32))  # smaller: the same buffer
    assert engine._lanes[0].context.device_memory is first
    engine.outer_graph = True
    engine.execute(np.ones((2, 4), np.float32))
    assert engine.graph_captures == 1 and engine._lanes[0].ops._res.graph_execs
    engine.execute(np.ones((8, 4), np.float32))  # larger: a new buffer, the old graphs dropped
    assert engine._lanes[0].context.device_memory is not first
    assert engine.graph_captures == 2 and len(engine._lanes[0].ops._res.graph_execs) == 1


def test_python_backend_user_managed_memory_sized_once_for_every_shape() -> None:
    engine = _user_managed_engine()
    engine.trt_engine.device_memory_size_v2 = 4096  # the most any profile and shape needs
    engine.execute(np.ones((2, 4), np.float32))
    memory = engine._lanes[0].context.device_memory
    assert memory.size == 4096 and not engine._lanes[0].context.per_shape
    calls = _trt_calls(engine)
    handed = ("device_memory", memory.handle, 4096)
    # at creation, then again after the first (explicit) profile selection
    assert [c for c in calls if c[0] in ("device_memory", "profile", "memory_size")][:3] == [
        handed, ("profile", 0), handed,
    ]
    del calls[:]
    for batch in (1, 8, 2, 1, 8):  # alternating shapes of one profile: only the shapes change
        engine.execute(np.ones((batch, 4), np.float32))
    assert not [c for c in calls if c[0] in ("device_memory", "memory_size")]
    assert ("shape", "x", (8, 4)) in calls
    engine.execute(np.ones((16, 4), np.float32))  # another profile: the same buffer handed again
    assert [c for c in calls if c[0] in ("device_memory", "memory_size")] == [handed]
    assert engine._lanes[0].context.device_memory is memory


def test_python_backend_user_managed_memory_per_shape_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    from trt_runtime_backends.python import lane as lane_module

    monkeypatch.setattr(lane_module, "MEMORY_PER_SHAPE", True)
    engine = _user_managed_engine()
    engine.trt_engine.device_memory_size_v2 = 64
    engine.execute(np.ones((2, 4), np.float32))
    engine.execute(np.ones((8, 4), np.float32))
    calls = _trt_calls(engine)
    assert engine._lanes[0].context.per_shape and ("memory_size",) in calls
    assert engine._lanes[0].context.device_memory.size == 8 * 256  # grown to what the shapes need


def test_python_backend_makes_its_device_current_once_per_thread() -> None:
    import threading

    engine = _fake_engine()
    engine.execute(np.ones((2, 4), np.float32))
    state = engine._state
    before = state.activations
    engine.execute(np.ones((2, 4), np.float32))
    assert state.activations == before  # the same thread: nothing to do
    threads = [threading.Thread(target=engine.execute, args=(np.ones((2, 4), np.float32),)) for _ in range(3)]
    for thread in threads:
        thread.start()
        thread.join()
    assert state.activations == before + 3  # a thread has no current context until made so
