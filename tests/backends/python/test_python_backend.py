"""The python backend without a GPU: real engine builds, availability, capabilities, and the
execution path driven with test doubles for TensorRT and the CUDA runtime."""

from __future__ import annotations

import ctypes
import gc
import logging
import re
import sys
from typing import Any

import numpy as np
import pytest
from _device_doubles import FakeDriver
from _python_doubles import (
    _CAI,
    FakeTorch,
    _CudaGraphStrategy,
    _DynamicShapes,
    _fake_backend,
    _fake_engine,
    _FakeBuffer,
    _FakeConfig,
    _FakeLogger,
    _FakeRuntime,
    _FakeState,
    _FakeTrt,
    _Mode,
    _trt_calls,
    _user_managed_engine,
)
from trt_runtime_backends.python import CUDA_HINT, RTX_HINT, PythonBackend, plans
from trt_runtime_backends.python import backend as backend_module
from trt_runtime_backends.python.arrays import DeviceArray, describe_device_array
from trt_runtime_backends.python.cache import IRuntimeCacheHandle
from trt_runtime_backends.python.engine import PythonEngine

from trt_runtime import (
    BackendUnavailableError,
    CacheError,
    CapabilityError,
    EngineError,
    EngineSource,
    InputError,
    RuntimeCache,
    RuntimeSettings,
    TensorSpec,
    backend_status,
    get_backend,
    installed_backends,
)

builders = pytest.importorskip("trt_runtime.builders")


def _has_tensorrt() -> bool:
    try:
        builders.import_tensorrt()
    except ImportError:
        return False
    return True


needs_trt = pytest.mark.skipif(not _has_tensorrt(), reason="tensorrt_rtx is not installed")


# -- builders make real engines (the TensorRT-RTX builder needs no GPU) ---------------------------


@needs_trt
def test_python_backend_builders_make_real_mlp_engines() -> None:
    built = builders.build_mlp(64, 3, batch=8, dtype="float16")
    assert len(built.plan) > 10_000
    assert built.inputs == (TensorSpec("x", "float16", (8, 64), True),)
    assert built.outputs == (TensorSpec("y", "float16", (8, 64), False),)
    assert len(built.weights) == 3
    x = built.random_inputs(seed=1)[0]
    assert x.dtype == np.float16 and np.abs(x).max() > 0
    expected = x.astype(np.float64)
    for i in range(3):
        expected = np.maximum(expected @ built.weights[f"w{i}"].astype(np.float64), 0)
    np.testing.assert_allclose(built.reference(x)[0], expected)

    dynamic = builders.build_mlp(32, 2, batch=None, dtype="float32", max_batch=16)
    assert dynamic.inputs[0].shape == (-1, 32)
    assert dynamic.inputs[0].profiles == (((1, 32), (8, 32), (16, 32)),)
    assert dynamic.plan != built.plan


@needs_trt
def test_python_backend_builders_make_dynamic_and_conv_engines() -> None:
    progress: list[tuple[str, int, int]] = []
    dyn = builders.build_dynamic(8, "float32", profiles=((1, 2, 4), (5, 6, 7)),
                                 progress=lambda *a: progress.append(a))
    assert dyn.inputs[0].profiles == (((1, 8), (2, 8), (4, 8)), ((5, 8), (6, 8), (7, 8)))
    x = dyn.random_inputs(batch=6)[0]
    assert x.shape == (6, 8)
    np.testing.assert_allclose(dyn.reference(x)[0],
                               np.maximum(x.astype(np.float64) @ dyn.weights["w"], 0) + 1)
    assert progress, "the IProgressMonitor callback was never called"

    conv = builders.build_convnet(2, "float32", image_size=32, base_channels=8, num_classes=5)
    assert conv.inputs[0].shape == (2, 3, 32, 32)
    assert conv.outputs[0] == TensorSpec("logits", "float32", (2, 5), False)
    assert sum(k.endswith(".w") for k in conv.weights) == 1 + 8 * 2 + 3 + 1  # stem, blocks, proj, fc
    out = conv.reference(conv.random_inputs()[0])[0]
    assert out.shape == (2, 5) and np.isfinite(out).all()


def test_python_backend_conv_reference_matches_direct_convolution() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 5, 5))
    w = rng.standard_normal((3, 2, 3, 3))
    b = rng.standard_normal(3)
    got = builders._conv_ref(x, w, b, stride=2, pad=1)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((1, 3, 3, 3))
    for k in range(3):
        for i in range(3):
            for j in range(3):
                want[0, k, i, j] = (xp[0, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3] * w[k]).sum() + b[k]
    np.testing.assert_allclose(got, want)


@needs_trt
def test_python_backend_data_dependent_builder_reports_why_it_cannot_build() -> None:
    try:
        built = builders.build_data_dependent()
    except NotImplementedError as exc:
        assert str(exc) == builders.DATA_DEPENDENT_UNSUPPORTED
    else:
        assert built.outputs[0].data_dependent


def test_python_backend_builders_reject_bad_batch() -> None:
    with pytest.raises(ValueError, match="batch must be a positive int, None or 'dynamic'; got 0"):
        builders._batch_dim(0)
    assert builders._batch_dim("dynamic") == -1 and builders._batch_dim(None) == -1


# -- availability and capabilities -------------------------------------------------------------------


def test_python_backend_found_through_entry_point() -> None:
    assert "python" in installed_backends()
    status = backend_status()["python"]
    assert isinstance(status.ok, bool)
    if not status:
        assert status.reason.startswith("the 'python' backend needs")


def test_python_backend_availability_without_tensorrt(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt_rtx", None)
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    availability = PythonBackend().is_available()
    assert not availability
    assert availability.reason == RTX_HINT
    assert "pip install -c constraints.txt -e '.[rtx]'" in RTX_HINT
    with pytest.raises(BackendUnavailableError, match=re.escape(RTX_HINT)):
        PythonBackend().load_engine(EngineSource(b"plan"))


def test_python_backend_availability_without_cuda_python(monkeypatch) -> None:
    monkeypatch.setattr(backend_module, "_import_trt", lambda: (object(), "tensorrt_rtx"))
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    availability = PythonBackend().is_available()
    assert not availability and availability.reason == CUDA_HINT
    assert "pip install -c constraints.txt -e '.[cuda]'" in CUDA_HINT


def _fake_cuda_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """Importable stand-ins for cuda-python, so the checks after the import checks run
    whether or not cuda-python is installed here."""
    import types

    cuda_pkg = types.ModuleType("cuda")
    bindings = types.ModuleType("cuda.bindings")
    bindings.runtime = types.ModuleType("cuda.bindings.runtime")  # type: ignore[attr-defined]
    core = types.ModuleType("cuda.core")
    core.Device = object  # type: ignore[attr-defined]
    for name, module in (("cuda", cuda_pkg), ("cuda.bindings", bindings),
                         ("cuda.bindings.runtime", bindings.runtime), ("cuda.core", core)):  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, name, module)


def test_python_backend_availability_without_gpu_never_raises(monkeypatch) -> None:
    from trt_runtime_backends.python import cuda

    monkeypatch.setattr(backend_module, "_import_trt", lambda: (object(), "tensorrt_rtx"))
    _fake_cuda_python(monkeypatch)
    monkeypatch.setattr(cuda, "device_count", lambda: 0)
    availability = PythonBackend().is_available()
    assert not availability and "no CUDA device is visible" in availability.reason

    def broken() -> int:
        raise RuntimeError("driver exploded")

    monkeypatch.setattr(cuda, "device_count", broken)
    availability = PythonBackend().is_available()
    assert not availability and "driver exploded" in availability.reason
    monkeypatch.setattr(cuda, "device_count", lambda: 1)
    assert PythonBackend().is_available()


def test_python_backend_unavailable_here_says_why() -> None:
    availability = backend_status()["python"]
    if availability:
        pytest.skip("a GPU is visible: the backend is available here")
    with pytest.raises(BackendUnavailableError, match=re.escape(availability.reason)):
        get_backend("python")


def test_python_backend_capabilities_per_flavour(monkeypatch) -> None:
    monkeypatch.setattr(backend_module, "_import_trt", lambda: (object(), "tensorrt_rtx"))
    rtx = PythonBackend().capabilities
    assert rtx.supports_runtime_cache and rtx.supports_cuda_graph_strategy
    assert rtx.supports_dynamic_shapes_kernel_specialization_strategy and rtx.supports_output_allocator
    assert rtx.supports_host_io and not rtx.cache_deserialize_merges

    monkeypatch.setattr(backend_module, "_import_trt", lambda: (object(), "tensorrt"))
    full = PythonBackend()
    caps = full.capabilities
    assert not caps.supports_runtime_cache and not caps.supports_cuda_graph_strategy
    assert not caps.supports_dynamic_shapes_kernel_specialization_strategy and caps.supports_host_io
    with pytest.raises(CapabilityError, match="runtime_cache: needs TensorRT-RTX"):
        caps.require("supports_runtime_cache", "python")
    full._trt, full._flavour, full._logger = _FakeTrt, "tensorrt", _FakeLogger()
    with pytest.raises(CapabilityError, match="cuda_graph_strategy"):
        _fake_engine(backend=full, settings=RuntimeSettings(cuda_graph_strategy="whole_graph_capture"))
    engine = _fake_engine(backend=full)
    with pytest.raises(CapabilityError, match="runtime_cache"):
        engine.runtime_settings = RuntimeSettings(runtime_cache=RuntimeCache())


@pytest.mark.parametrize("flavour", ["tensorrt_rtx", "tensorrt"])
def test_python_backend_capabilities_declare_outputs_profiles_and_outer_graphs(monkeypatch, flavour) -> None:
    monkeypatch.setattr(backend_module, "_import_trt", lambda: (object(), flavour))
    caps = PythonBackend().capabilities
    assert caps.supports_preallocated_outputs and caps.supports_profile_selection
    assert caps.supports_outer_cuda_graph and caps.supports_multiple_contexts
    caps.require("supports_multiple_contexts", "python")  # N contexts of one ICudaEngine


# -- stream handles and device arrays ------------------------------------------------------------------


def test_python_backend_describes_cuda_array_interface() -> None:
    assert describe_device_array(_CAI((2, 3), "<f2")) == (4096, (2, 3), "float16", None, True)
    assert describe_device_array(_CAI((2, 3), "<f4", strides=(12, 4)))[4] is True
    assert describe_device_array(_CAI((2, 3), "<f4", strides=(4, 8)))[4] is False
    assert describe_device_array(_CAI((2,), "<i8"))[2] == "int64"



def test_python_backend_device_array_exports_cai_and_dlpack() -> None:
    from trt_runtime_backends.python import arrays

    array = DeviceArray(_FakeBuffer(24), (2, 3), "float32", 0)
    cai = array.__cuda_array_interface__
    assert cai["shape"] == (2, 3) and cai["typestr"] == "<f4" and cai["data"][0] == array.ptr
    assert array.__dlpack_device__() == (2, 0)
    assert array.nbytes == 24 and len(array) == 2
    before = len(arrays._live)
    capsule = array.__dlpack__()
    get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))
    assert get_name(capsule) == b"dltensor"
    assert len(arrays._live) == before + 1
    del capsule  # never consumed: the destructor must free the exported tensor
    gc.collect()
    assert len(arrays._live) == before


def test_python_backend_device_array_dlpack_layout_is_consumable() -> None:
    """numpy consumes the capsule when it describes host memory: struct layout, shape,
    dtype and the deleter all work (a CUDA consumer reads the same struct)."""
    from trt_runtime_backends.python import arrays

    class HostArray(DeviceArray):
        __slots__ = ()
        _dl_device_type = 1  # kDLCPU

    source = np.arange(12, dtype=np.float32).reshape(3, 4)

    class Borrowed:
        size = source.nbytes
        handle = source.ctypes.data

    before = len(arrays._live)
    view = np.from_dlpack(HostArray(Borrowed(), (3, 4), "float32", 0))
    np.testing.assert_array_equal(view, source)
    assert len(arrays._live) == before + 1  # alive while numpy holds it
    del view
    gc.collect()
    assert len(arrays._live) == before  # numpy called the deleter


# -- the runtime cache handle ---------------------------------------------------------------------



def test_python_backend_cache_handle_materializes_once() -> None:
    handle = IRuntimeCacheHandle()
    assert not handle.has_cache()
    with pytest.raises(CacheError, match="not materialized yet; nothing to serialize"):
        handle.serialize()
    with pytest.raises(CacheError, match="not materialized yet; cannot load"):
        handle.deserialize(b"x")
    config = _FakeConfig()
    native = handle.ensure_materialized(config)
    assert handle.ensure_materialized(_FakeConfig()) is native
    assert config.created == 1 and handle.has_cache()
    handle.deserialize(b"abc")
    assert handle.serialize() == b"nativeabc" and handle.deserialize_count == 1
    native.accept = False
    with pytest.raises(CacheError, match="TensorRT-RTX rejected 4 bytes of runtime cache"):
        handle.deserialize(b"junk")
    assert handle.deserialize_count == 1
    with pytest.raises(CacheError, match="cannot create a runtime cache"):
        IRuntimeCacheHandle().ensure_materialized(object())


def test_python_backend_cache_handle_serializes_in_the_context_it_was_made_in() -> None:
    """TensorRT-RTX serializes a runtime cache only with a CUDA context current; a save from a
    thread with none (an engine process's main thread after the engine gave its context back)
    makes the cache's own context current for the call and gives the thread its own back."""
    driver = FakeDriver(0xA)
    handle = IRuntimeCacheHandle(driver=driver)
    native = handle.ensure_materialized(_FakeConfig())
    seen: list[int] = []
    serialize = native.serialize

    def serialize_in_context() -> Any:
        seen.append(driver.current)
        return serialize()

    native.serialize = serialize_in_context
    driver.current = 0  # the saving thread has no context
    handle.deserialize(b"abc")
    assert handle.serialize() == b"nativeabc"
    assert seen == [0xA] and driver.current == 0
    assert driver.sets == [0xA, 0, 0xA, 0]  # made current for the load and the save, given back
    driver.sets.clear()
    driver.current = 0xA  # already current: no switch at all
    handle.serialize()
    assert driver.sets == []


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
    ev_in, ev_out = engine._order.event_in, engine._order.event_out
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
    context, rt = engine._context, engine._rt
    events = engine._order.events()
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
    ev = engine._order.event_tail
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
    assert engine._fast_paths.prebound == {}
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


# -- the natural call path (engine(x) with torch tensors) and the device contract ------------------


@pytest.fixture
def torch(monkeypatch: pytest.MonkeyPatch) -> FakeTorch:
    fake = FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", fake)
    return fake


def test_python_backend_natural_call_remembers_shapes_not_tensors(torch: FakeTorch) -> None:
    engine = _fake_engine()
    first = engine(torch.cuda_tensor((2, 4)))
    assert isinstance(first, torch.Tensor) and first.get_device() == 0 and first.shape == (2, 4)
    assert list(engine._fast_paths.natural) == [((2, 4),)]
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
    assert ("get_shape", "y") in calls and len(engine._fast_paths.natural) == 2
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
    ev = engine._order.event_tail  # the repeat call runs on 55, after the lane's work on ours
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
    order = engine._order
    ours = engine._stream_handle

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
    assert engine._order.ours == spare.handle and engine._res.stream_handle == spare.handle
    assert engine._binding.stream is spare
    engine._rt.calls.clear()
    engine(x)  # the legacy caller is now ordered with events, the work on the spare stream
    assert [c[0] for c in engine._rt.calls if c[0] in ("record", "wait")] == ["record", "wait"] * 2
    assert [c[1] for c in _trt_calls(engine) if c[0] == "execute"][-1] == spare.handle
    engine.runtime_settings = {"cuda_graph_strategy": "disabled"}
    engine._rt.calls.clear()
    engine(x)
    engine(x)
    assert engine.stream is blocking and engine._order.skip == (0, 1)
    assert not [c for c in engine._rt.calls if c[0] in ("record", "wait")]
    engine.close()
    assert engine._spare_stream is None


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
    assert calls[4] == ("device_memory", engine._context.device_memory.handle, 2 * 256)
    first = engine._context.device_memory
    engine.execute(np.ones((1, 4), np.float32))  # smaller: the same buffer
    assert engine._context.device_memory is first
    engine.outer_graph = True
    engine.execute(np.ones((2, 4), np.float32))
    assert engine.graph_captures == 1 and engine._res.graph_execs
    engine.execute(np.ones((8, 4), np.float32))  # larger: a new buffer, the old graphs dropped
    assert engine._context.device_memory is not first
    assert engine.graph_captures == 2 and len(engine._res.graph_execs) == 1


def test_python_backend_user_managed_memory_sized_once_for_every_shape() -> None:
    engine = _user_managed_engine()
    engine.trt_engine.device_memory_size_v2 = 4096  # the most any profile and shape needs
    engine.execute(np.ones((2, 4), np.float32))
    memory = engine._context.device_memory
    assert memory.size == 4096 and not engine._context.per_shape
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
    assert engine._context.device_memory is memory


def test_python_backend_user_managed_memory_per_shape_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    from trt_runtime_backends.python import engine as engine_module

    monkeypatch.setattr(engine_module, "MEMORY_PER_SHAPE", True)
    engine = _user_managed_engine()
    engine.trt_engine.device_memory_size_v2 = 64
    engine.execute(np.ones((2, 4), np.float32))
    engine.execute(np.ones((8, 4), np.float32))
    calls = _trt_calls(engine)
    assert engine._context.per_shape and ("memory_size",) in calls
    assert engine._context.device_memory.size == 8 * 256  # grown to what the shapes need


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
