"""The python backend's execution path without a GPU, driven with test doubles for TensorRT and the
CUDA runtime: metadata, input checks, staging, profiles, streams, settings, the fast path,
output allocators and closing."""

from __future__ import annotations

import gc
import logging
import re
from typing import Any

import numpy as np
import pytest
from _python_doubles import (
    _CAI,
    _CudaGraphStrategy,
    _DynamicShapes,
    _fake_backend,
    _fake_engine,
    _FakeBuffer,
    _FakeRuntime,
    _FakeState,
    _Mode,
    _trt_calls,
)
from trt_runtime_backends.python.arrays import DeviceArray
from trt_runtime_backends.python.engine import PythonEngine

from trt_runtime import (
    EngineError,
    EngineSource,
    InputError,
    RuntimeCache,
    RuntimeSettings,
    TensorSpec,
)

# -- the execution path with doubles for TensorRT and the CUDA runtime -----------------------------


def test_python_backend_engine_metadata_from_tensorrt() -> None:
    engine = _fake_engine()
    assert engine.inputs == (
        TensorSpec("x", "float32", (-1, 4), True,
                   profiles=(((1, 4), (2, 4), (8, 4)), ((9, 4), (16, 4), (32, 4)))),
    )
    assert engine.outputs == (TensorSpec("y", "float32", (-1, 4), False),)
    assert not engine.has_data_dependent_outputs
    assert engine.num_profiles == 2 and engine.profile is None
    assert engine.runtime_config is None


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ((), r"takes 1 input\(s\) \(x\); got 0"),
        ((np.zeros((2, 4), np.float32),) * 2, r"takes 1 input\(s\) \(x\); got 2"),
        ((np.zeros((2, 4), np.float64),), "input 'x' must have dtype float32; got float64"),
        ((np.zeros((4, 2), np.float32).T,), "input 'x' is not C-contiguous"),
        ((np.zeros((2, 4, 1), np.float32),), r"input 'x' must have 2 dimension\(s\)"),
        ((np.zeros((2, 5), np.float32),), r"input 'x' must have shape \(-1, 4\); got \(2, 5\)"),
        ((np.zeros((40, 4), np.float32),), r"input 'x' has shape \(40, 4\), outside every optimization"),
        ((_CAI((2, 4), "<f2"),), "input 'x' must have dtype float32; got float16"),
        ((_CAI((2, 4), "<f4", strides=(4, 8)),), "input 'x' is not C-contiguous"),
        (("text",), "input 'x' must have dtype float32"),
    ],
)
def test_python_backend_bad_inputs_never_reach_tensorrt(inputs: tuple[Any, ...], message: str) -> None:
    engine = _fake_engine()
    with pytest.raises(InputError, match=message):
        engine.execute(*inputs)
    assert not any(c[0] in ("execute", "address") for c in _trt_calls(engine))
    assert not any(c[0] == "memcpy" for c in engine._rt.calls)


def test_python_backend_host_inputs_staged_once_and_bindings_cached(caplog) -> None:
    engine = _fake_engine()
    caplog.set_level(logging.INFO, logger="trt_runtime.python")
    out = engine.execute(np.ones((2, 4), np.float32))[0]
    assert isinstance(out, np.ndarray) and out.shape == (2, 4) and out.dtype == np.float32
    engine.execute(np.ones((2, 4), np.float32))
    calls = _trt_calls(engine)
    assert [c for c in calls if c[0] == "shape"] == [("shape", "x", (2, 4))]
    assert len([c for c in calls if c[0] == "address"]) == 2  # x and y bound once each
    assert len([c for c in calls if c[0] == "execute"]) == 2
    staged = [r for r in caplog.records if "staging" in r.getMessage()]
    assert len(staged) == 1 and "'x'" in staged[0].getMessage()
    kinds = [c[1] for c in engine._rt.calls if c[0] == "memcpy"]
    assert kinds == [1, 2, 1, 2]  # H2D in, D2H out, per call
    assert ("sync", 4242) in engine._rt.calls
    engine.execute(np.ones((3, 4), np.float32))
    assert [c for c in calls if c[0] == "shape"][-1] == ("shape", "x", (3, 4))


def test_python_backend_picks_the_profile_or_honours_the_explicit_one() -> None:
    engine = _fake_engine()
    engine.execute(np.ones((20, 4), np.float32))
    calls = _trt_calls(engine)
    assert ("profile", 1) in calls
    with pytest.raises(InputError, match=re.escape(
        "input 'x' has shape (20, 4), outside optimization profile 0 (min (1, 4), max (8, 4))"
    )):
        engine.execute(np.ones((20, 4), np.float32), profile=0)
    engine.execute(np.ones((3, 4), np.float32))
    assert calls[-6:].count(("profile", 0)) == 1
    with pytest.raises(InputError, match=r"profile must be an int in 0\.\.1; got 5"):
        engine.execute(np.ones((3, 4), np.float32), profile=5)


def test_python_backend_orders_the_callers_stream_with_events() -> None:
    engine = _fake_engine()
    engine.execute(np.ones((2, 4), np.float32), stream=77)
    rt = engine._rt.calls
    ev_in, ev_out = engine._lanes[0].ops._order.event_in, engine._lanes[0].ops._order.event_out
    ordering = [c for c in rt if c[0] in ("record", "wait")]
    assert ordering == [("record", ev_in, 77), ("wait", 4242, ev_in),
                        ("record", ev_out, 4242), ("wait", 77, ev_out)]
    execute_at = _trt_calls(engine).index(("execute", 4242))
    assert execute_at >= 0
    rt.clear()
    engine.execute(np.ones((2, 4), np.float32), stream=engine.stream)  # our own stream: no events
    assert not [c for c in rt if c[0] in ("record", "wait")]


def test_python_backend_device_arrays_in_give_device_arrays_out() -> None:
    engine = _fake_engine()
    x = _CAI((2, 4), "<f4", ptr=8192)
    out = engine.execute(x)[0]
    assert isinstance(out, DeviceArray) and out.shape == (2, 4) and out.dtype == "float32"
    assert out.stream == 4242  # no caller stream: consumers sync on ours through CAI / DLPack
    assert ("address", "x", 8192) in _trt_calls(engine)
    assert not [c for c in engine._rt.calls if c[0] == "memcpy"]
    given = DeviceArray(_FakeBuffer(32), (2, 4), "float32", 0)
    assert engine.execute(x, outputs=[given])[0] is given
    assert ("address", "y", given.ptr) in _trt_calls(engine)
    with pytest.raises(InputError, match=r"output 'y' must have shape \(2, 4\); got \(1, 4\)"):
        engine.execute(x, outputs=[DeviceArray(_FakeBuffer(16), (1, 4), "float32", 0)])
    with pytest.raises(InputError, match=r"has 1 output\(s\); outputs= has 2"):
        engine.execute(x, outputs=[given, given])


def test_python_backend_execute_failure_carries_tensorrt_log() -> None:
    engine = _fake_engine()
    engine.ensure_context().trt_context.ok = False
    with pytest.raises(EngineError, match=r"execute_async_v3 failed: \[TRT\] fake error"):
        engine.execute(np.ones((2, 4), np.float32))


def test_python_backend_settings_reach_the_runtime_config_and_cache_drains_once() -> None:
    engine = _fake_engine(settings=RuntimeSettings("whole_graph_capture", "eager"))
    engine.execute(np.ones((2, 4), np.float32))
    config = engine.runtime_config
    assert config.cuda_graph_strategy is _CudaGraphStrategy.WHOLE_GRAPH_CAPTURE
    assert config.dynamic_shapes_kernel_specialization_strategy is _DynamicShapes.EAGER
    assert config.get_runtime_cache() is None
    cache = RuntimeCache()
    cache.load_bytes(b"kernels")
    engine.runtime_settings = engine.runtime_settings.merge(runtime_cache=cache)
    assert engine.runtime_config is None  # the settings change dropped the context
    engine.execute(np.ones((2, 4), np.float32))
    native = engine.runtime_config.get_runtime_cache()
    assert native is engine.native_runtime_cache and native.loaded == [b"kernels"]
    engine.invalidate_context()
    engine.execute(np.ones((2, 4), np.float32))
    assert engine.native_runtime_cache is native and native.loaded == [b"kernels"]
    assert cache.drain_count == 1 and engine.context_creations == 3


def test_python_backend_static_outputs_with_unknown_dims_are_data_dependent() -> None:
    engine = _fake_engine(batch=2)
    engine.trt_engine.tensors["y"] = ("INT64", (-1, 2), _Mode.OUTPUT)
    engine2 = PythonEngine.__new__(PythonEngine)
    engine2._init(_fake_backend(), engine.trt_engine, _FakeState(), EngineSource(b"", name="dd"), None,
                  runtime=_FakeRuntime())
    assert engine2.has_data_dependent_outputs and engine2.data_dependent_outputs == ["y"]
    assert engine2.outputs[0].dtype == "int64"


def test_python_backend_close_is_idempotent_and_final() -> None:
    engine = _fake_engine()
    engine.execute(np.ones((2, 4), np.float32))
    engine.close()
    engine.close()
    with pytest.raises(EngineError, match="engine 'fake' is closed"):
        engine.execute(np.ones((2, 4), np.float32))


def test_python_backend_unclosed_engine_releases_its_context_when_collected() -> None:
    engine = _fake_engine()
    engine.execute(np.ones((2, 4), np.float32))
    context, rt = engine._lanes[0].context, engine._rt
    events = engine._lanes[0].ops._order.events()
    del engine
    gc.collect()
    assert context.trt_context is None and context.config is None
    assert [c for c in rt.calls if c[0] == "destroy"] == [("destroy", e) for e in events]
    first_destroy = rt.calls.index(("destroy", events[0]))
    assert ("sync", 4242) in rt.calls[first_destroy - 2:first_destroy]


def test_python_backend_host_inputs_with_preallocated_device_outputs() -> None:
    engine = _fake_engine()
    given = DeviceArray(_FakeBuffer(32), (2, 4), "float32", 0)
    assert engine.execute(np.ones((2, 4), np.float32), outputs=[given])[0] is given
    calls = engine._rt.calls
    assert [c[1] for c in calls if c[0] == "memcpy"] == [1]  # staged in, nothing copied out
    assert calls[-1] == ("sync", 4242)
    assert ("address", "y", given.ptr) in _trt_calls(engine)


def test_python_backend_bad_input_creates_no_context() -> None:
    engine = _fake_engine()
    with pytest.raises(InputError, match="input 'x' must have dtype float32"):
        engine.execute(np.zeros((2, 4), np.float64))
    with pytest.raises(InputError, match="outside every optimization profile"):
        engine.execute(np.zeros((99, 4), np.float32))
    assert not engine.has_context() and engine.context_creations == 0
    assert engine.trt_engine.contexts == [] and engine.trt_engine.configs == []


def test_python_backend_repeat_call_takes_the_fast_path() -> None:
    engine = _fake_engine()
    x = DeviceArray(_FakeBuffer(32), (2, 4), "float32", 0)
    y = DeviceArray(_FakeBuffer(32), (2, 4), "float32", 0)
    engine.execute(x, outputs=[y], stream=engine.stream)
    calls = _trt_calls(engine)
    calls.clear()
    for _ in range(3):
        assert engine.execute(x, outputs=[y], stream=engine.stream) == [y]
    assert calls == [("execute", 4242)] * 3  # nothing re-bound, nothing re-checked
    engine._rt.calls.clear()
    engine.execute(x, outputs=[y], stream=77)  # runs on the caller's stream, after ours
    ev = engine._lanes[0].ops._order.event_tail
    assert engine._rt.calls == [("record", ev, 4242), ("wait", 77, ev)]
    assert calls[-1] == ("execute", 77)
    calls.clear()
    x.ptr += 4096  # the same object now points elsewhere: re-validated and re-bound
    engine.execute(x, outputs=[y], stream=engine.stream)
    assert ("address", "x", x.ptr) in calls
    calls.clear()
    x.shape = (3, 4)
    with pytest.raises(InputError, match=r"output 'y' must have shape \(3, 4\); got \(2, 4\)"):
        engine.execute(x, outputs=[y], stream=engine.stream)
    assert ("shape", "x", (3, 4)) in calls
    x2 = DeviceArray(_FakeBuffer(32), (2, 4), "float32", 0)
    engine.execute(x2, outputs=[y], stream=engine.stream)  # another object: slow path again
    assert ("address", "x", x2.ptr) in calls
    engine.invalidate_context()
    assert engine._lanes[0].ops._fast_paths.prebound == {}
    engine.execute(x2, outputs=[y], stream=engine.stream)
    assert engine.context_creations == 2


def test_python_backend_output_allocator_always_routes_outputs_through_it() -> None:
    engine = _fake_engine()
    engine.execute(np.ones((2, 4), np.float32))
    assert engine.output_allocators == {}
    with pytest.raises(ValueError, match="output_allocator must be one of 'auto', 'always'; got 'yes'"):
        engine.output_allocator = "yes"
    engine.output_allocator = "always"
    assert not engine.has_context()
    for batch in (4, 2, 20):
        out = engine.execute(np.ones((batch, 4), np.float32))[0]
        assert out.shape == (batch, 4)
    allocator = engine.output_allocators["y"]
    assert allocator.reallocate_calls == 3
    assert allocator.allocations == 2  # 4 rows, reused for 2, grown for 20
    assert allocator.notified == [("y", (4, 4)), ("y", (2, 4)), ("y", (20, 4))]
    assert not [c for c in _trt_calls(engine) if c[:2] == ("address", "y")]
    given = DeviceArray(_FakeBuffer(32), (2, 4), "float32", 0)
    with pytest.raises(InputError, match="output 'y' is produced through an output allocator"):
        engine.execute(DeviceArray(_FakeBuffer(32), (2, 4), "float32", 0), outputs=[given])


def test_python_backend_cycled_views_skip_checks_and_shape_inference() -> None:
    engine = _fake_engine()
    base_x, base_y = _FakeBuffer(4 * 4 * 8), _FakeBuffer(4 * 4 * 8)
    xs = [DeviceArray(base_x, (b, 4), "float32", 0) for b in (1, 5, 8)]  # one pointer, 3 shapes
    ys = [DeviceArray(base_y, (b, 4), "float32", 0) for b in (1, 5, 8)]
    for x, y in zip(xs, ys, strict=True):
        engine.execute(x, outputs=[y], stream=engine.stream)
    calls = _trt_calls(engine)
    calls.clear()
    for _ in range(2):
        for x, y in zip(xs, ys, strict=True):
            assert engine.execute(x, outputs=[y], stream=engine.stream) == [y]
    # Only the new input shape is set per call: no address, no output-shape query.
    assert calls == [c for b in (1, 5, 8) * 2 for c in (("shape", "x", (b, 4)), ("execute", 4242))]
    # A shape in another profile goes through the full path and comes back fast after.
    x20, y20 = DeviceArray(_FakeBuffer(320), (20, 4), "float32", 0), DeviceArray(_FakeBuffer(320), (20, 4),
                                                                                    "float32", 0)
    engine.execute(x20, outputs=[y20], stream=engine.stream)
    assert ("profile", 1) in calls
    calls.clear()
    engine.execute(xs[0], outputs=[ys[0]], stream=engine.stream)
    assert ("profile", 0) in calls and ("address", "x", xs[0].ptr) in calls
    calls.clear()
    engine.execute(xs[1], outputs=[ys[1]], stream=engine.stream)
    assert calls == [("shape", "x", (5, 4)), ("execute", 4242)]
