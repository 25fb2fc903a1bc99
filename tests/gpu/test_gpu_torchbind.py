"""The torchbind backend on a GPU: capability detection, conformance, agreement with the
python backend and runtime caches moving between the two backends. The device contract is in
test_gpu_torchbind_contract.py, the outer CUDA graph and the call overhead in
test_gpu_torchbind_outer_graph.py.

Runs on either staged stack: ``PROFILE=torchbind`` (torch 2.14 + torch-tensorrt-rtx 2.14,
full capability) or ``PROFILE=torchbind211`` (torch 2.11 + torch-tensorrt-rtx 2.11, Engine
only); the capability test asserts what the installed version must offer.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _gpu_conformance import GpuConformance
from _gpu_torchbind import torchbind_version

from trt_runtime import EngineSource, RuntimeCache, RuntimeSettings
from trt_runtime.errors import CapabilityError, InputError

pytestmark = pytest.mark.gpu


def _cuda(torch: Any, arrays: Sequence[Any]) -> list[Any]:
    return [torch.from_numpy(np.ascontiguousarray(a)).cuda() for a in arrays]


def _host(values: Sequence[Any]) -> list[Any]:
    out = []
    for v in values:
        out.append(v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v))
    return out


def _full_capability() -> bool:
    return torchbind_version() >= (2, 13)


# -- capability detection --------------------------------------------------------------------
def test_gpu_torchbind_capabilities_match_installed_version(
    torchbind_backend: Any, load_torchbind: Any
) -> None:
    runtime = torchbind_backend.runtime
    caps = torchbind_backend.capabilities
    version = torchbind_version()
    info = runtime.describe()
    print("torchbind runtime:", info)
    assert info["serialization_len"] == len(info["fields"])
    assert "torch_tensorrt" not in sys.modules, "only the runtime library may be loaded, not the package"
    assert caps.supports_preallocated_outputs and caps.supports_host_io
    assert caps.supports_outer_cuda_graph  # torch has torch.cuda.CUDAGraph
    if version >= (2, 13):
        assert runtime.has_cache_handle and runtime.has_runtime_settings
        assert caps.supports_runtime_cache and caps.supports_cuda_graph_strategy
        assert caps.supports_dynamic_shapes_kernel_specialization_strategy
        missing = sorted(k for k in caps.notes if k.startswith("supports_"))
        assert missing == ["supports_profile_selection"]
        engine = load_torchbind("mlp_fp16")
        assert engine.native_context_creations == 0  # lazy in 2.13+
    else:
        assert not runtime.has_cache_handle and not runtime.has_runtime_settings
        assert not caps.supports_runtime_cache
        assert not caps.supports_cuda_graph_strategy
        assert not caps.supports_dynamic_shapes_kernel_specialization_strategy
        assert "2.13" in caps.notes["supports_cuda_graph_strategy"]
        engine = load_torchbind("mlp_fp16")
        with pytest.raises(CapabilityError, match=r"cuda_graph_strategy: .*2\.13"):
            engine.runtime_settings = RuntimeSettings(cuda_graph_strategy="whole_graph_capture")
        with pytest.raises(CapabilityError, match=r"runtime_cache: .*2\.13"):
            torchbind_backend.create_cache_handle()
    known = {(2, 11): ("8", 11), (2, 12): ("9", 12), (2, 13): ("9", 12), (2, 14): ("10", 13)}
    if version[:2] in known:
        assert (runtime.layout.abi_version, runtime.layout.length) == known[version[:2]]


@pytest.fixture
def load_torchbind(torchbind_backend: Any, engines: Any) -> Any:
    opened: list[Any] = []

    def _load(name: str, **kwargs: Any) -> Any:
        engine = torchbind_backend.load_engine(EngineSource(engines(name).plan, name=name), **kwargs)
        opened.append(engine)
        return engine

    yield _load
    for engine in opened:
        engine.close()


# -- running, IO metadata, input checks ----------------------------------------------------------
def test_gpu_torchbind_mlp_matches_float64_reference(load_torchbind: Any, engines: Any, torch: Any) -> None:
    built = engines("mlp_fp16")
    engine = load_torchbind("mlp_fp16")
    assert [(s.name, s.dtype, s.shape) for s in engine.inputs] == [("x", "float16", (8, 256))]
    assert [(s.name, s.dtype, s.shape) for s in engine.outputs] == [("y", "float16", (8, 256))]
    host = built.random_inputs(seed=3)
    (out,) = engine.execute(*_cuda(torch, host))
    assert out.is_cuda and out.dtype == torch.float16 and tuple(out.shape) == (8, 256)
    rtol, atol = built.tolerance
    np.testing.assert_allclose(
        _host([out])[0].astype(np.float64), built.reference(*host)[0], rtol=rtol, atol=atol
    )
    # numpy (host) inputs are staged to the device and give the same result, on the host
    (staged,) = engine.execute(*host)
    assert isinstance(staged, np.ndarray)
    np.testing.assert_array_equal(staged, _host([out])[0])


def test_gpu_torchbind_bad_input_refused_before_the_op(load_torchbind: Any, torch: Any) -> None:
    engine = load_torchbind("mlp_fp16")
    x = torch.randn(8, 256, device="cuda", dtype=torch.float16)
    with pytest.raises(InputError, match="input 'x' must have dtype float16; got float32"):
        engine.execute(x.float())
    with pytest.raises(InputError, match=r"input 'x' must have shape \(8, 256\); got \(4, 256\)"):
        engine.execute(x[:4])
    with pytest.raises(InputError, match=r"input 'x' is not contiguous \(strides \(1, 8\)\)"):
        engine.execute(x.t().contiguous().t())
    with pytest.raises(InputError, match=r"takes 1 input\(s\) \(x\); got 2"):
        engine.execute(x, x)
    with pytest.raises(InputError, match="input 'x' must have dtype float16; got float32"):
        engine.execute(x.float().cpu().numpy())
    with pytest.raises(InputError, match=r"outputs= must hold CUDA arrays; output 'y' is a cpu tensor"):
        engine.execute(x, outputs=[torch.empty(8, 256, dtype=torch.float16)])
    with pytest.raises(InputError, match=r"output 'y' must have shape \(8, 256\); got \(8, 255\)"):
        engine.execute(x, outputs=[torch.empty(8, 255, dtype=torch.float16, device="cuda")])
    assert engine.context_creations == 0  # nothing reached torch-tensorrt


def test_gpu_torchbind_dynamic_profiles(load_torchbind: Any, engines: Any, torch: Any) -> None:
    built = engines("dynamic")
    engine = load_torchbind("dynamic")
    profiles = engine.inputs[0].profiles
    selectable = torchbind_can_switch_profiles(engine)
    # 2.14+ switches profiles per call; before, only profile 0 is ever active (and advertised).
    assert len(profiles) == (len(built.inputs[0].profiles) if selectable else 1)
    for lo, _opt, hi in profiles:
        for batch in (lo[0], hi[0]):
            host = built.random_inputs(batch=batch, seed=batch)
            outs = engine.execute(*_cuda(torch, host))
            rtol, atol = built.tolerance
            for got, want in zip(_host(outs), built.reference(*host), strict=True):
                np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=atol)
    too_big = max(p[2][0] for p in profiles) + 1
    with pytest.raises(InputError, match="outside every optimization profile"):
        engine.execute(torch.zeros(too_big, engine.inputs[0].shape[1], device="cuda"))


def torchbind_can_switch_profiles(engine: Any) -> bool:
    return bool(engine.backend.runtime.bridge.has_method(engine.native, "set_active_profile"))


@pytest.fixture(scope="session")
def dynamic_max_batch(torchbind_backend: Any, engines: Any) -> int:
    """The largest batch the torchbind engine of ``dynamic`` accepts (its advertised profiles)."""
    engine = torchbind_backend.load_engine(EngineSource(engines("dynamic").plan, name="dynamic"))
    try:
        return max(p[2][0] for p in engine.inputs[0].profiles)
    finally:
        engine.close()


# -- settings and contexts ---------------------------------------------------------------------------
def test_gpu_torchbind_settings_applied_lazily_one_native_context(load_torchbind: Any, torch: Any) -> None:
    if not _full_capability():
        pytest.skip(
            f"torch-tensorrt-rtx {torchbind_version()} has no update_runtime_settings (2.13 adds it)"
        )
    engine = load_torchbind("mlp_fp16")
    x = torch.randn(8, 256, device="cuda", dtype=torch.float16)
    (eager,) = engine.execute(x)
    assert engine.context_creations == 1 == engine.native_context_creations
    engine.runtime_settings = RuntimeSettings(cuda_graph_strategy="whole_graph_capture")
    assert engine.native_context_creations == 1, "a settings change must not build a context by itself"
    outs = [engine.execute(x)[0] for _ in range(5)]
    assert engine.context_creations == 2 == engine.native_context_creations
    for out in outs:
        assert torch.equal(out, eager), "whole_graph_capture must not change results"
    engine.invalidate_context()
    engine.execute(x)
    assert engine.context_creations == 3 == engine.native_context_creations


class TestTorchbindConformance(GpuConformance):
    """The core conformance suite and state machine, torch CUDA tensors in and out."""

    @pytest.fixture
    def backend(self, torchbind_backend: Any) -> Any:
        return torchbind_backend

    @pytest.fixture
    def make_inputs(self, torch: Any, dynamic_max_batch: int) -> Callable[[Any], Sequence[Any]]:
        def make(rng: np.random.Generator) -> list[Any]:
            # both profiles (1..8, 9..32) where torch-tensorrt can switch them, else profile 0
            batch = int(rng.integers(1, dynamic_max_batch + 1))
            return _cuda(torch, [rng.standard_normal((batch, 16)).astype(np.float32)])

        return make

    def as_backend_input(self, array: Any, like: Any) -> Any:
        import torch

        return torch.from_numpy(np.ascontiguousarray(array)).to(like.device)

    @pytest.fixture
    def reference(self, engines: Any) -> Callable[[Sequence[Any]], Sequence[Any]]:
        built = engines("dynamic")
        return lambda inputs: built.reference(*_host(inputs))


# -- interchangeability with the python backend --------------------------------------------------------
def _python_backend() -> Any:
    from trt_runtime import backend_status, get_backend

    status = backend_status().get("python")
    if not status:
        pytest.skip(f"the python backend cannot run here: {status.reason if status else 'not installed'}")
    return get_backend("python")


def _user_code(plan: Path, backend: str, x: Any, cache: Path, strategy: str) -> Any:
    """What a user writes; only ``backend`` changes between the two runs."""
    import trt_runtime

    engine = trt_runtime.load(plan, backend=backend)
    try:
        with trt_runtime.runtime_config(engine, cuda_graph_strategy=strategy):
            if trt_runtime.get_backend(backend).capabilities.supports_runtime_cache:
                with trt_runtime.runtime_cache(engine, cache):
                    (y,) = engine.execute(x)
            else:
                (y,) = engine.execute(x)
            engine.synchronize()
        return y.detach().cpu().numpy() if hasattr(y, "detach") else np.asarray(y)
    finally:
        engine.close()


@pytest.mark.parametrize("strategy", ["disabled", "whole_graph_capture"])
def test_gpu_torchbind_agrees_with_python_backend(
    torchbind_backend: Any, engines: Any, torch: Any, tmp_path: Path, strategy: str
) -> None:
    """Same engine, same inputs, same user code: outputs are bitwise equal (TensorRT-RTX runs
    the same kernels on the same GPU); the stated fallback tolerance is never needed here."""
    _python_backend()
    if strategy != "disabled" and not torchbind_backend.capabilities.supports_cuda_graph_strategy:
        pytest.skip("this torch-tensorrt-rtx has no cuda_graph_strategy (2.13 adds it)")
    built = engines("mlp_fp16")
    plan = tmp_path / "mlp.plan"
    plan.write_bytes(built.plan)
    x = _cuda(torch, built.random_inputs(seed=11))[0]
    ours = {
        name: _user_code(plan, name, x, tmp_path / f"{name}.cache", strategy)
        for name in ("python", "torchbind")
    }
    assert ours["python"].dtype == ours["torchbind"].dtype == np.float16
    np.testing.assert_array_equal(ours["torchbind"], ours["python"])


# -- runtime caches across backends -------------------------------------------------------------------------
def test_gpu_torchbind_cache_keys_equal_python_backend(torchbind_backend: Any) -> None:
    python = _python_backend()
    assert torchbind_backend.cache_key(0) == python.cache_key(0)


@pytest.mark.parametrize("direction", ["python_to_torchbind", "torchbind_to_python"])
def test_gpu_torchbind_cache_bytes_move_between_backends(
    torchbind_backend: Any, engines: Any, torch: Any, tmp_path: Path, direction: str
) -> None:
    if not torchbind_backend.capabilities.supports_runtime_cache:
        pytest.skip("this torch-tensorrt-rtx has no RuntimeCacheHandle (2.13 adds it)")
    python = _python_backend()
    source_backend, target_backend = (
        (python, torchbind_backend) if direction == "python_to_torchbind" else (torchbind_backend, python)
    )
    built = engines("convnet_fp16")
    x = _cuda(torch, built.random_inputs(seed=5))
    path = tmp_path / "shared.cache"

    writer = RuntimeCache(path)
    first = source_backend.load_engine(
        EngineSource(built.plan, name="conv"), settings=RuntimeSettings(runtime_cache=writer)
    )
    first.execute(*x)
    first.synchronize()
    writer.save()
    saved = path.read_bytes()
    first.close()
    writer.close()
    assert len(saved) > 0

    reader = RuntimeCache(path)
    assert reader.load(), "the file written by the other backend must load (same cache key)"
    payload = bytes(reader.serialize())
    assert payload and reader.has_pending
    second = target_backend.load_engine(
        EngineSource(built.plan, name="conv"), settings=RuntimeSettings(runtime_cache=reader)
    )
    outs = second.execute(*x)
    second.synchronize()
    assert reader.drain_count == 1 and not reader.has_pending
    after = bytes(reader.serialize())
    # TensorRT-RTX replaces on deserialize: every kernel the first backend compiled is
    # still in the cache the second backend now holds, so it did not grow from scratch.
    assert len(after) >= len(payload) * 0.9, (len(after), len(payload))
    rtol, atol = built.tolerance
    np.testing.assert_allclose(
        _host(outs)[0].astype(np.float64), built.reference(*_host(x))[0], rtol=rtol, atol=atol
    )
    second.close()
    reader.close()


_FIRST_INFERENCE = textwrap.dedent(
    """
    import json, sys, time
    import torch, numpy as np
    import trt_runtime
    plan, backend, cache = sys.argv[1], sys.argv[2], sys.argv[3]
    engine = trt_runtime.load(plan, backend=backend)
    x = [torch.from_numpy(np.random.default_rng(0).standard_normal(tuple(s.shape)).astype(s.dtype)).cuda()
         for s in engine.inputs]
    torch.cuda.synchronize()
    ctx = trt_runtime.runtime_cache(engine, cache) if cache != "-" else None
    if ctx is not None:
        ctx.__enter__()
    t0 = time.perf_counter()
    engine.execute(*x)
    engine.synchronize()
    first = time.perf_counter() - t0
    if ctx is not None:
        ctx.__exit__(None, None, None)
    print(json.dumps({"first_s": first}))
    """
)


def _first_inference(plan: Path, backend: str, cache: Path | None) -> float:
    import json

    env = dict(os.environ)
    done = subprocess.run(
        [sys.executable, "-c", _FIRST_INFERENCE, str(plan), backend, str(cache) if cache else "-"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return float(json.loads(done.stdout.strip().splitlines()[-1])["first_s"])


@pytest.mark.slow
def test_gpu_torchbind_warm_cache_from_python_backend_speeds_first_inference(
    torchbind_backend: Any, engines: Any, tmp_path: Path
) -> None:
    """A cache file saved by the python backend, in another process, makes the torchbind
    backend's first inference (JIT) faster than a cold start, in a fresh process."""
    if not torchbind_backend.capabilities.supports_runtime_cache:
        pytest.skip("this torch-tensorrt-rtx has no RuntimeCacheHandle (2.13 adds it)")
    _python_backend()
    plan = tmp_path / "resnet.plan"
    plan.write_bytes(engines("resnet18_fp16").plan)
    cache = tmp_path / "from_python.cache"
    _first_inference(plan, "python", cache)  # cold, fills the cache file
    assert cache.stat().st_size > 0
    cold = _first_inference(plan, "torchbind", None)
    warm = _first_inference(plan, "torchbind", cache)
    print(f"torchbind first inference: cold {cold * 1e3:.1f} ms, warm (python's cache) {warm * 1e3:.1f} ms")
    assert warm * 3 < cold, f"warm {warm:.3f}s is not clearly faster than cold {cold:.3f}s"


def test_gpu_torchbind_distribution_version_is_what_was_probed(torchbind_backend: Any) -> None:
    runtime = torchbind_backend.runtime
    name = runtime.library.distribution
    assert importlib.metadata.version(name) == runtime.library.version
    assert runtime.library.path.is_file()
