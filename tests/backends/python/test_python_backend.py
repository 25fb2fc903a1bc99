"""The python backend without a GPU: real engine builds, availability, capabilities, stream handles,
device arrays and the runtime cache handle. The execution path with test doubles for TensorRT and
the CUDA runtime is in test_python_execution.py and test_python_natural_call.py (this folder)."""

from __future__ import annotations

import ctypes
import gc
import re
import sys
from typing import Any

import numpy as np
import pytest
from _device_doubles import FakeDriver
from _python_doubles import (
    _CAI,
    _fake_engine,
    _FakeBuffer,
    _FakeConfig,
    _FakeLogger,
    _FakeTrt,
)
from trt_runtime_backends.python import CUDA_HINT, RTX_HINT, PythonBackend
from trt_runtime_backends.python import backend as backend_module
from trt_runtime_backends.python.arrays import DeviceArray, describe_device_array
from trt_runtime_backends.python.cache import IRuntimeCacheHandle

from trt_runtime import (
    BackendUnavailableError,
    CacheError,
    CapabilityError,
    EngineSource,
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
