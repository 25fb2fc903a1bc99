"""Calls into the python backend on a real GPU: numerics against float64 references, device arrays,
streams, staging, profiles, bad inputs, data-dependent outputs, engine and device errors, the
torch module wrapper and the repeat-call fast path."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

from trt_runtime import (
    EngineError,
    EngineSource,
    InputError,
    RuntimeSettings,
    enable_cudagraphs,
    runtime_config,
)
from trt_runtime.settings import CudaGraphStrategy

pytestmark = pytest.mark.gpu


def _close(actual: Any, expected: Any, tol: tuple[float, float]) -> None:
    actual = np.asarray(actual, dtype=np.float64)
    np.testing.assert_allclose(actual, expected, rtol=tol[0], atol=tol[1])


def _torch() -> Any:
    torch = pytest.importorskip("torch", reason="torch is not installed on this GPU host")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA support here")
    return torch


# -- numerics ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mlp_fp32", "mlp_fp16", "convnet_fp32", "convnet_fp16"])
def test_python_backend_outputs_match_float64_reference(load, engines, name) -> None:
    built = engines(name)
    engine = load(name)
    for seed in range(3):
        inputs = built.random_inputs(seed=seed)
        assert np.abs(inputs[0]).max() > 0
        expected = built.reference(*inputs)
        outputs = engine.execute(*inputs)
        assert isinstance(outputs[0], np.ndarray)
        assert outputs[0].dtype == inputs[0].dtype
        _close(outputs[0], expected[0], built.tolerance)


def test_python_backend_torch_outputs_match_reference(load, engines) -> None:
    torch = _torch()
    built = engines("mlp_fp16")
    engine = load("mlp_fp16")
    x = built.random_inputs(seed=4)[0]
    y = engine(torch.from_numpy(x).cuda())
    assert isinstance(y, torch.Tensor) and y.is_cuda and y.dtype == torch.float16
    _close(y.cpu().numpy(), built.reference(x)[0], built.tolerance)


def test_python_backend_device_array_in_device_array_out(load, engines) -> None:
    from trt_runtime_backends.python.arrays import DeviceArray

    built = engines("dynamic")
    engine = load("dynamic")
    x = built.random_inputs(batch=5, seed=5)[0]
    host_out = engine.execute(x)[0]
    assert isinstance(host_out, np.ndarray)
    staged = engine.execute(host_out)[0]
    dev_out = engine.execute(_as_device_array(engine, host_out))[0]
    assert isinstance(dev_out, DeviceArray)
    assert dev_out.shape == (5, 16) and dev_out.dtype == "float32"
    assert "data" in dev_out.__cuda_array_interface__
    np.testing.assert_allclose(dev_out.numpy(), staged, rtol=1e-6, atol=1e-6)
    # The device output feeds the next call zero-copy and stays a device array.
    chained = engine.execute(dev_out)[0]
    assert isinstance(chained, DeviceArray)
    np.testing.assert_allclose(chained.numpy(), engine.execute(staged)[0], rtol=1e-6, atol=1e-6)


def _as_device_array(engine: Any, array: np.ndarray) -> Any:
    """Copy ``array`` to the engine's device as a DeviceArray (through cuda-python)."""
    from cuda.bindings import runtime
    from trt_runtime_backends.python.arrays import DeviceArray

    state = engine._state
    buf = state.allocate(array.nbytes, engine.stream)
    engine.synchronize()
    (err,) = runtime.cudaMemcpy(int(buf.handle), array.ctypes.data, array.nbytes,
                                runtime.cudaMemcpyKind.cudaMemcpyHostToDevice)
    assert int(err) == 0
    return DeviceArray(buf, array.shape, str(array.dtype), engine.device)


def test_python_backend_device_array_exports_dlpack_to_torch(load, engines) -> None:
    torch = _torch()
    built = engines("dynamic")
    engine = load("dynamic")
    x = built.random_inputs(batch=3, seed=6)[0]
    out = engine.execute(_as_device_array(engine, x))[0]
    tensor = torch.from_dlpack(out)
    assert tensor.is_cuda and tuple(tensor.shape) == (3, 16)
    _close(tensor.cpu().numpy(), built.reference(x)[0], built.tolerance)
    again = torch.as_tensor(out, device="cuda")  # through __cuda_array_interface__
    assert torch.equal(again, tensor)


def test_python_backend_preallocated_outputs_are_written(load, engines) -> None:
    torch = _torch()
    built = engines("mlp_fp16")
    engine = load("mlp_fp16")
    x = built.random_inputs(seed=7)[0]
    out = torch.empty((8, 256), dtype=torch.float16, device="cuda")
    result = engine.execute(torch.from_numpy(x).cuda(), outputs=[out])
    assert result[0] is out
    _close(out.cpu().numpy(), built.reference(x)[0], built.tolerance)
    with pytest.raises(InputError, match=r"output 'y' must have shape \(8, 256\)"):
        engine.execute(torch.from_numpy(x).cuda(), outputs=[out[:4]])


# -- host staging, graphs and streams ------------------------------------------------------------


def test_python_backend_host_inputs_stage_and_log_once(load, engines, caplog) -> None:
    built = engines("mlp_fp32")
    engine = load("mlp_fp32")
    caplog.set_level(logging.INFO, logger="trt_runtime.python")
    for seed in range(3):
        x = built.random_inputs(seed=seed)[0]
        _close(engine.execute(x)[0], built.reference(x)[0], built.tolerance)
    staged = [r for r in caplog.records if r.name == "trt_runtime.python" and "staging" in r.getMessage()]
    assert len(staged) == 1, [r.getMessage() for r in staged]
    assert "'x'" in staged[0].getMessage() and "zero-copy" in staged[0].getMessage()


def test_python_backend_whole_graph_capture_repeats_correctly_without_stream(load, engines) -> None:
    built = engines("mlp_fp16")
    engine = load("mlp_fp16")
    with enable_cudagraphs(engine):
        for seed in range(8):  # host in/out: no caller stream at all
            x = built.random_inputs(seed=seed)[0]
            _close(engine.execute(x)[0], built.reference(x)[0], built.tolerance)
        config = engine.runtime_config
        assert int(config.cuda_graph_strategy) == CudaGraphStrategy.WHOLE_GRAPH_CAPTURE.code
    try:
        torch = _torch()
    except pytest.skip.Exception:
        return
    with enable_cudagraphs(engine):
        xs = torch.empty((8, 256), dtype=torch.float16, device="cuda")
        for seed in range(8):  # same input buffer, new values: the graph must read them
            x = built.random_inputs(seed=100 + seed)[0]
            xs.copy_(torch.from_numpy(x))
            y = engine(xs)
            _close(y.cpu().numpy(), built.reference(x)[0], built.tolerance)


def test_python_backend_orders_work_after_and_before_the_callers_torch_stream(load, engines) -> None:
    torch = _torch()
    built = engines("mlp_fp16")
    engine = load("mlp_fp16")
    side = torch.cuda.Stream()
    for explicit in (True, False):
        x = built.random_inputs(seed=11 + explicit)[0]
        source = torch.from_numpy(x).cuda()
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            dest = torch.zeros_like(source)
            torch.cuda._sleep(50_000_000)  # keep `side` busy so a missing wait reads zeros
            dest.copy_(source)
            y = engine(dest, stream=side) if explicit else engine(dest)  # current stream = side
            snapshot = y.clone()  # queued on side: must wait for the engine
        side.synchronize()
        _close(snapshot.cpu().numpy(), built.reference(x)[0], built.tolerance)


def test_python_backend_accepts_cuda_core_and_int_streams(load, engines) -> None:
    built = engines("mlp_fp32")
    engine = load("mlp_fp32")
    x = built.random_inputs(seed=13)[0]
    expected = built.reference(x)[0]
    other = engine._state.create_stream()
    for stream in (other, int(other.handle), engine.stream):
        _close(engine.execute(x, stream=stream)[0], expected, built.tolerance)
    other.close()


# -- dynamic shapes and profiles -----------------------------------------------------------------


def test_python_backend_chooses_profiles_and_refuses_out_of_range(load, engines) -> None:
    built = engines("dynamic")
    engine = load("dynamic")
    assert engine.num_profiles == 2
    for batch in (1, 3, 8, 9, 20, 32, 5):
        x = built.random_inputs(batch=batch, seed=batch)[0]
        _close(engine.execute(x)[0], built.reference(x)[0], built.tolerance)
    x3 = built.random_inputs(batch=3)[0]
    with pytest.raises(InputError, match=re.escape("input 'x' has shape (3, 16), outside optimization "
                                                   "profile 1 (min (9, 16), max (32, 16))")):
        engine.execute(x3, profile=1)
    with pytest.raises(InputError, match=r"input 'x' has shape \(40, 16\), outside every optimization"):
        engine.execute(built.random_inputs(batch=40)[0])
    x20 = built.random_inputs(batch=20)[0]
    _close(engine.execute(x20, profile=1)[0], built.reference(x20)[0], built.tolerance)
    engine.profile = 0
    with pytest.raises(InputError, match="profile 0"):
        engine.execute(x20)
    with pytest.raises(InputError, match=r"profile must be an int in 0\.\.1; got 2"):
        engine.profile = 2


# -- bad inputs --------------------------------------------------------------------------------


def test_python_backend_rejects_bad_torch_inputs_before_tensorrt(load) -> None:
    torch = _torch()
    engine = load("mlp_fp16")
    good = torch.zeros((8, 256), dtype=torch.float16, device="cuda")
    with pytest.raises(InputError, match=re.escape("input 'x' must have dtype float16; got torch.float32")):
        engine.execute(good.float())
    with pytest.raises(InputError, match="input 'x' is not contiguous"):
        engine.execute(torch.zeros((256, 8), dtype=torch.float16, device="cuda").t())
    with pytest.raises(InputError, match=r"input 'x' must have shape \(8, 256\); got \(8, 255\)"):
        engine.execute(good[:, :255].contiguous())
    with pytest.raises(InputError, match=r"takes 1 input\(s\) \(x\); got 2"):
        engine.execute(good, good)
    y = engine(good)  # the engine still works after refusing bad inputs
    assert float(y.abs().max()) == 0.0


def test_python_backend_rejects_non_contiguous_host_input(load) -> None:
    engine = load("mlp_fp32")
    x = np.zeros((256, 8), dtype=np.float32).T
    with pytest.raises(InputError, match="input 'x' is not C-contiguous"):
        engine.execute(x)


# -- data-dependent outputs ------------------------------------------------------------------------


def test_python_backend_runs_data_dependent_engine(python_backend) -> None:
    from trt_runtime import builders

    try:
        built = builders.build_data_dependent(logger=python_backend.logger)
    except NotImplementedError as exc:
        pytest.skip(str(exc))
    engine = python_backend.load_engine(EngineSource(built.plan, name="dd"))
    try:
        assert engine.has_data_dependent_outputs
        x = np.array([0, 1, 0, 2] * 4, dtype=np.float32)
        out = engine.execute(x)[0]
        np.testing.assert_array_equal(out, built.reference(x)[0])
    finally:
        engine.close()


# -- engine and device errors ----------------------------------------------------------------------


_CORRUPT = textwrap.dedent(
    """
    import json, sys
    from trt_runtime import EngineError, EngineSource, get_backend

    data = open(sys.argv[1], "rb").read()
    try:
        get_backend("python").load_engine(EngineSource(data, name="corrupt"))
    except EngineError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
    else:
        print(json.dumps({"error": None, "message": ""}))
    """
)


def test_python_backend_corrupt_plan_raises_engine_error_with_tensorrt_message(
    python_backend, engines, tmp_path
) -> None:
    with pytest.raises(EngineError, match="could not be deserialized") as info:
        python_backend.load_engine(EngineSource(b"\x00" * 256, name="zeros"))
    assert "TensorRT logged no error" not in str(info.value), str(info.value)
    assert "'zeros'" in str(info.value)
    # Damaged real plans go through a subprocess: a TensorRT crash must not end the session.
    plan = bytearray(engines("mlp_fp16").plan)
    damaged = bytearray(plan)
    damaged[16:48] = b"\xff" * 32
    for label, data in (("damaged", bytes(damaged)), ("truncated", bytes(plan[: len(plan) // 3]))):
        path = tmp_path / f"{label}.plan"
        path.write_bytes(data)
        proc = subprocess.run([sys.executable, "-c", _CORRUPT, str(path)], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, f"{label}: exit {proc.returncode}: {proc.stderr[-2000:]}"
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        assert result["error"] == "EngineError", f"{label}: {result}"
        assert "could not be deserialized" in result["message"], result
        assert "TensorRT logged no error" not in result["message"], result


def test_python_backend_device_out_of_range_is_named(python_backend, engines) -> None:
    from cuda.bindings import runtime

    _, count = runtime.cudaGetDeviceCount()
    plan = engines("mlp_fp16").plan
    expected = rf"device={count} does not exist: this machine has {count} CUDA device\(s\)"
    with pytest.raises(EngineError, match=expected):
        python_backend.load_engine(EngineSource(plan), device=count)
    from_blob = rf"names device_id {count}, but this machine has {count} CUDA device\(s\)"
    with pytest.raises(EngineError, match=from_blob):
        python_backend.load_engine(EngineSource(plan, device_id=count))
    engine = python_backend.load_engine(EngineSource(plan, device_id=count), device=0)
    try:
        assert engine.device == 0
    finally:
        engine.close()


def test_python_backend_cache_key_names_this_stack(python_backend) -> None:
    from cuda.bindings import runtime

    key = python_backend.cache_key(0)
    _, driver = runtime.cudaDriverGetVersion()
    assert key.flavour == python_backend.flavour == "tensorrt_rtx"
    assert key.version == python_backend.tensorrt.__version__
    assert key.driver == str(driver)
    assert re.fullmatch(r"\d+\.\d+", key.compute_capability)


def test_python_backend_closed_engine_refuses_work(load) -> None:
    engine = load("mlp_fp32")
    engine.close()
    engine.close()
    with pytest.raises(EngineError, match="closed"):
        engine.execute(np.zeros((8, 256), np.float32))


def test_python_backend_runtime_config_helper_changes_live_config(load) -> None:
    engine = load("mlp_dynamic")
    x = np.ones((4, 64), np.float32)
    with runtime_config(engine, dynamic_shapes_kernel_specialization_strategy="eager"):
        engine.execute(x)
        assert int(engine.runtime_config.dynamic_shapes_kernel_specialization_strategy) == 1
    engine.execute(x)
    assert int(engine.runtime_config.dynamic_shapes_kernel_specialization_strategy) == 0


# -- the torch module wrapper ------------------------------------------------------------------------


def test_python_backend_trt_module_runs_on_torchs_current_stream(load, engines) -> None:
    torch = _torch()
    from trt_runtime.contexts import engines_of
    from trt_runtime.torch_module import TRTModule

    built = engines("mlp_fp16")
    engine = load("mlp_fp16")
    module = TRTModule(engine)
    assert engines_of(module) == [engine]
    side = torch.cuda.Stream()
    x = built.random_inputs(seed=21)[0]
    source = torch.from_numpy(x).cuda()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        dest = torch.zeros_like(source)
        torch.cuda._sleep(50_000_000)
        dest.copy_(source)
        y = module(dest).clone()
    side.synchronize()
    _close(y.cpu().numpy(), built.reference(x)[0], built.tolerance)
    with enable_cudagraphs(module):
        for seed in range(3):
            x = built.random_inputs(seed=30 + seed)[0]
            _close(module(torch.from_numpy(x).cuda()).cpu().numpy(), built.reference(x)[0], built.tolerance)
    with pytest.raises(TypeError, match="TRTModule needs a trt-runtime engine; got int"):
        TRTModule(3)


# -- the repeat-call fast path -------------------------------------------------------------------------


@pytest.mark.parametrize("graphs", ["disabled", "whole_graph_capture"])
def test_python_backend_repeat_calls_with_the_same_arrays_stay_correct(load, engines, graphs) -> None:
    """The fast path (same array objects as the last call) must still see new values written
    in place, and fall back when an input object or its storage changes."""
    torch = _torch()
    built = engines("mlp_fp16")
    engine = load("mlp_fp16", settings=RuntimeSettings(cuda_graph_strategy=graphs))
    x = torch.empty((8, 256), dtype=torch.float16, device="cuda")
    y = torch.empty((8, 256), dtype=torch.float16, device="cuda")
    for seed in range(4):
        data = built.random_inputs(seed=40 + seed)[0]
        x.copy_(torch.from_numpy(data))
        assert engine.execute(x, outputs=[y], stream=engine.stream)[0] is y
        engine.synchronize()
        _close(y.cpu().numpy(), built.reference(data)[0], built.tolerance)
        if seed:
            assert engine._lanes[0].ops._fast_paths.prebound, "a repeat call must take the fast path"
    data = built.random_inputs(seed=50)[0]
    x.set_(torch.from_numpy(data).cuda())  # same object, new storage: must be re-bound
    engine.execute(x, outputs=[y])  # torch's current stream this time
    torch.cuda.synchronize()
    _close(y.cpu().numpy(), built.reference(data)[0], built.tolerance)
    other = torch.from_numpy(built.random_inputs(seed=51)[0]).cuda()
    engine.execute(other, outputs=[y])
    torch.cuda.synchronize()
    _close(y.cpu().numpy(), built.reference(other.cpu().numpy())[0], built.tolerance)


def test_python_backend_output_allocator_path_on_the_gpu(load, engines) -> None:
    """TensorRT-RTX has no layer with data-dependent shapes, so the IOutputAllocator path is
    proven by forcing every output of the dynamic engine through it."""
    built = engines("dynamic")
    engine = load("dynamic")
    engine.output_allocator = "always"
    for batch in (4, 2, 20):  # reuse for 2, grow for 20 (and a profile switch)
        x = built.random_inputs(batch=batch, seed=batch)[0]
        out = engine.execute(x)[0]
        assert out.shape == (batch, 16)
        _close(out, built.reference(x)[0], built.tolerance)
    allocator = engine.output_allocators["y"]
    assert allocator.reallocate_calls >= 3, allocator.reallocate_calls
    # The buffer of batch 4 is reused for batch 2 and grown for 20 (TensorRT may ask for
    # more than it needs at first, then fewer allocations happen).
    assert 1 <= allocator.allocations <= 2, allocator.allocations
    assert allocator.buffers["y"].size >= 20 * 16 * 4
    assert [s for _, s in allocator.notified][-3:] == [(4, 16), (2, 16), (20, 16)], allocator.notified
    try:
        torch = _torch()
    except pytest.skip.Exception:
        return
    x = built.random_inputs(batch=7, seed=7)[0]
    y = engine(torch.from_numpy(x).cuda())
    assert isinstance(y, torch.Tensor) and tuple(y.shape) == (7, 16)
    _close(y.cpu().numpy(), built.reference(x)[0], built.tolerance)
