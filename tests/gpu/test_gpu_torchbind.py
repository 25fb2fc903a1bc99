"""The torchbind backend on a GPU: capability detection, conformance, agreement with the
python backend, runtime caches moving between the two backends, the device contract (output
kind per input kind, caller-stream ordering, ``outputs=``), the outer CUDA graph (equal to
eager on the tiny engine, the MLP, the conv net and the dynamic engine across shape and
settings changes, with capture counts) and the call overhead over the bare
``execute_engine`` op.

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

from trt_runtime import EngineSource, RuntimeCache, RuntimeSettings
from trt_runtime.errors import CapabilityError, InputError

pytestmark = pytest.mark.gpu


def _torchbind_version() -> tuple[int, ...]:
    from trt_runtime_backends.torchbind.library import installed_distribution

    found = installed_distribution()
    if found is None:
        return ()
    return tuple(int(p) for p in found[1].split("+")[0].split(".")[:2] if p.isdigit())


@pytest.fixture(scope="session")
def torchbind_backend() -> Any:
    """The ``torchbind`` backend through its entry point; skips with the reason it cannot run."""
    from trt_runtime import backend_status, get_backend

    status = backend_status().get("torchbind")
    if status is None:
        pytest.skip("the torchbind backend is not installed (entry point missing)")
    if not status:
        pytest.skip(f"the torchbind backend cannot run here: {status.reason}")
    return get_backend("torchbind")


@pytest.fixture(scope="session")
def torch() -> Any:
    return pytest.importorskip("torch", reason="torch is not installed on this GPU host")


def _cuda(torch: Any, arrays: Sequence[Any]) -> list[Any]:
    return [torch.from_numpy(np.ascontiguousarray(a)).cuda() for a in arrays]


def _host(values: Sequence[Any]) -> list[Any]:
    out = []
    for v in values:
        out.append(v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v))
    return out


def _full_capability() -> bool:
    return _torchbind_version() >= (2, 13)


# -- capability detection --------------------------------------------------------------------
def test_gpu_torchbind_capabilities_match_installed_version(
    torchbind_backend: Any, load_torchbind: Any
) -> None:
    runtime = torchbind_backend.runtime
    caps = torchbind_backend.capabilities
    version = _torchbind_version()
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
            f"torch-tensorrt-rtx {_torchbind_version()} has no update_runtime_settings (2.13 adds it)"
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


# -- the device contract: output kind follows input kind -------------------------------------------------
class _CudaArrayInterface:
    """A CUDA array that is not a torch tensor (as CuPy's or Numba's): ``__cuda_array_interface__`` only."""

    def __init__(self, tensor: Any) -> None:
        self._tensor = tensor

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return self._tensor.__cuda_array_interface__  # type: ignore[no-any-return]


class _DLPackArray:
    """A CUDA array seen through DLPack only."""

    def __init__(self, tensor: Any) -> None:
        self._tensor = tensor

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._tensor.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self._tensor.__dlpack_device__()


@pytest.fixture(scope="module")
def tiny_plans(python_backend: Any) -> dict[bool, Any]:
    """The tiny engine (``y = 2x + 1``, 8x16 fp16) built with and without
    BuilderFlag.REQUIRE_USER_ALLOCATION (what makes a TensorRT-RTX context capturable)."""
    import functools

    from trt_runtime import builders

    original = builders._build
    plans = {}
    try:
        for flag in (True, False):
            builders._build = functools.partial(original, require_user_allocation=flag)  # type: ignore[assignment]
            plans[flag] = builders.build_tiny(16, 8, "float16", logger=python_backend.logger)
    finally:
        builders._build = original  # type: ignore[assignment]
    return plans


@pytest.fixture
def open_torchbind(torchbind_backend: Any, engines: Any, tiny_plans: dict[bool, Any]) -> Any:
    """``open_torchbind(name, **kwargs) -> (engine, built)`` for conftest's engines plus
    ``tiny`` and ``tiny_uncapturable``; closed after the test."""
    opened: list[Any] = []

    def _open(name: str, **kwargs: Any) -> tuple[Any, Any]:
        # torch-tensorrt creates default (STATIC) contexts, which TensorRT-RTX refuses for
        # engines built with REQUIRE_USER_ALLOCATION: both names use the default build.
        built = {"tiny": tiny_plans[False], "tiny_uncapturable": tiny_plans[False]}.get(name) or engines(name)
        engine = torchbind_backend.load_engine(EngineSource(built.plan, name=name), **kwargs)
        opened.append(engine)
        return engine, built

    yield _open
    for engine in opened:
        engine.close()


def _input(torch: Any, built: Any, batch: int | None = None, seed: int = 0) -> Any:
    return torch.from_numpy(built.random_inputs(batch=batch, seed=seed)[0]).cuda()


def _same(torch: Any, got: Any, want: Any) -> None:
    torch.cuda.synchronize()
    assert tuple(got.shape) == tuple(want.shape) and got.dtype == want.dtype
    assert torch.equal(got, want), f"max abs diff {float((got.float() - want.float()).abs().max())}"


def _close(torch: Any, got: Any, want: Any, bitwise: list[bool]) -> None:
    """Close within float32 rounding of different kernels; records whether bitwise equal."""
    torch.cuda.synchronize()
    assert tuple(got.shape) == tuple(want.shape) and got.dtype == want.dtype
    bitwise.append(bool(torch.equal(got, want)))
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)


def test_gpu_torchbind_output_kind_follows_input_kind(open_torchbind: Any, torch: Any) -> None:
    engine, built = open_torchbind("mlp_fp16")
    host = built.random_inputs(seed=21)[0]
    x = torch.from_numpy(host).cuda()
    out = engine(x)
    assert isinstance(out, torch.Tensor) and out.is_cuda and out.device.index == engine.device
    assert out.dtype == torch.float16 and tuple(out.shape) == (8, 256)
    want = out.cpu().numpy()
    got = engine(host)  # numpy in: numpy out, ready
    assert type(got) is np.ndarray and got.dtype == np.float16
    np.testing.assert_array_equal(got, want)
    got = engine(torch.from_numpy(host))  # CPU tensor in: CPU tensor out
    assert isinstance(got, torch.Tensor) and got.device.type == "cpu" and got.dtype == torch.float16
    np.testing.assert_array_equal(got.numpy(), want)
    for wrap in (_CudaArrayInterface, _DLPackArray):  # other CUDA arrays in: a device array out
        got = engine(wrap(x))
        assert hasattr(got, "__cuda_array_interface__") and hasattr(got, "__dlpack__")
        assert got.is_cuda and got.device.index == engine.device
        np.testing.assert_array_equal(got.cpu().numpy(), want)
    with pytest.raises(InputError, match=r"input 'x' is not contiguous"):
        engine(_CudaArrayInterface(x.t().contiguous().t()))  # refused, never copied


def test_gpu_torchbind_hot_path_taken_for_cuda_tensors(
    open_torchbind: Any, torch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With real torch tensors (torch.Size keys, torch dtypes) the common call skips the full check."""
    engine, built = open_torchbind("mlp_fp16")
    x = _input(torch, built, seed=1)
    want = engine(x).clone()
    slow: list[Any] = []
    original = engine._call  # the core pipeline's general path
    monkeypatch.setattr(engine, "_call", lambda *a: slow.append(a) or original(*a))
    for _ in range(5):
        _same(torch, engine(x), want)
    assert slow == []


def test_gpu_torchbind_orders_with_the_callers_stream(open_torchbind: Any, torch: Any) -> None:
    """A result read on the caller's stream right after the call, behind a long kernel queued
    there, is correct: the engine waits for the caller's work and the caller for the engine's."""
    engine, built = open_torchbind("mlp_fp16")
    x = _input(torch, built, seed=9)
    want = engine(x).clone()
    side = torch.cuda.Stream()
    for stream in (side, torch.cuda.default_stream()):
        with torch.cuda.stream(stream):
            torch.cuda._sleep(50_000_000)  # ~25 ms: the input below is late
            late = x * 1
            got = engine(late) * 1
        stream.synchronize()
        assert torch.equal(got, want)
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        late = x * 1
    (got,) = engine.execute(late, stream=side)
    with torch.cuda.stream(side):
        got = got * 1
    side.synchronize()
    assert torch.equal(got, want)
    host_x = x.cpu().numpy()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        host = engine(host_x)  # staged and run behind the sleep; ready when returned
    np.testing.assert_array_equal(host, want.cpu().numpy())


def test_gpu_torchbind_preallocated_outputs(open_torchbind: Any, torch: Any) -> None:
    engine, built = open_torchbind("mlp_fp16")
    x = _input(torch, built, seed=2)
    want = engine(x).clone()
    y = torch.empty_like(want)
    assert engine.execute(x, outputs=[y])[0] is y
    _same(torch, y, want)
    z = torch.zeros_like(want)
    through = _CudaArrayInterface(z)
    assert engine.execute(x, outputs=[through])[0] is through
    _same(torch, z, want)
    ready = torch.zeros_like(want)
    engine.execute(x.cpu().numpy(), outputs=[ready])  # host inputs: ready when returned
    assert torch.equal(ready, want)
    dynamic, _ = open_torchbind("mlp_dynamic")
    x3 = torch.randn(3, 64, device="cuda")
    wrong = torch.zeros(4, 64, device="cuda")
    with pytest.raises(InputError, match=r"output 'y' must have shape \(3, 64\); got \(4, 64\)"):
        dynamic.execute(x3, outputs=[wrong])
    assert not bool(wrong.any()), "a refused output is never written"
    right = torch.empty(3, 64, device="cuda")
    dynamic.execute(x3, outputs=[right])
    _same(torch, right, dynamic(x3))


# -- the outer CUDA graph ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tiny", "mlp_fp16", "convnet_fp16"])
@pytest.mark.parametrize("mode", ["copy", "view"])
def test_gpu_torchbind_outer_graph_equals_eager(
    open_torchbind: Any, torch: Any, name: str, mode: str
) -> None:
    from trt_runtime import enable_cudagraphs

    engine, built = open_torchbind(name)
    xs = [_input(torch, built, seed=seed) for seed in range(4)]
    eager = [engine(x).clone() for x in xs]
    with enable_cudagraphs(engine, outer=mode):
        for _ in range(2):
            for x, want in zip(xs, eager, strict=True):
                _same(torch, engine(x), want)
    assert engine.graph_captures == 1
    assert engine.context_creations == 1
    assert engine.native_context_creations in (None, 1)  # None: before 2.13


class _RuntimeSpy:
    """cuda-python's runtime module as the copy nodes see it, counting the calls of a replay."""

    def __init__(self, rt: Any) -> None:
        self._rt = rt
        self.counts: dict[str, int] = {}
        self.lock = __import__("threading").Lock()

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._rt, name)
        if not name.startswith("cudaGraph"):
            return target

        def counted(*args: Any) -> Any:
            with self.lock:
                self.counts[name] = self.counts.get(name, 0) + 1
            return target(*args)

        return counted


@pytest.mark.parametrize("mode", ["copy", "view"])
@pytest.mark.parametrize("threads", [1, 4])
def test_gpu_torchbind_outer_replays_through_copy_nodes(
    open_torchbind: Any, torch: Any, monkeypatch: pytest.MonkeyPatch, threads: int, mode: str
) -> None:
    """A replay copies through memcpy nodes around torch's kept graph (the bridge's
    ``copy_nodes``): per call one address update per input (and per output in "copy" mode)
    whose address changed since the last call, and one launch of the built graph, from any
    thread, and neither the graph launcher's copy nor its launch. Outputs equal eager ones;
    "copy" outputs are new tensors that later replays leave alone. A call given the static
    input itself launches torch's graph."""
    import threading

    from trt_runtime_backends.torchbind.bridge import TorchBridge

    from trt_runtime import enable_cudagraphs

    spies: list[_RuntimeSpy] = []
    made_nodes = TorchBridge.copy_nodes

    def spied_nodes(self: Any, graph: Any, ins: Any, outs: Any, index: int) -> Any:
        made = made_nodes(self, graph, ins, outs, index)
        assert made is not None, "this torch and cuda-python give copy nodes"
        spies.append(_RuntimeSpy(made.rt))
        made.rt = spies[-1]  # what the nodes are pointed and launched through
        return made

    plain = {"launch": 0, "copy": 0}
    made_launcher = TorchBridge.graph_launcher

    def counting(graph: Any) -> Any:
        launch, copy = made_launcher(graph)

        def counted_launch(stream: int) -> None:
            plain["launch"] += 1
            launch(stream)

        def counted_copy(dst: int, src: int, nbytes: int, stream: int) -> Any:
            plain["copy"] += 1
            return copy(dst, src, nbytes, stream)

        return counted_launch, counted_copy

    monkeypatch.setattr(TorchBridge, "copy_nodes", spied_nodes)
    monkeypatch.setattr(TorchBridge, "graph_launcher", staticmethod(counting))
    engine, built = open_torchbind("mlp_fp16")
    xs = [_input(torch, built, seed=seed) for seed in range(4)]
    eager = [engine(x).clone() for x in xs]
    results: dict[int, list[Any]] = {}
    with enable_cudagraphs(engine, outer=mode):
        engine(xs[0])  # the capture

        def body(index: int) -> None:
            results[index] = []
            for x, want in zip(xs, eager, strict=True):
                y = engine(x)
                if mode == "view" and threads == 1:  # the static output, until the next replay
                    _same(torch, y, want)
                results[index].append(y)
            torch.cuda.current_stream().synchronize()

        workers = [threading.Thread(target=body, args=(i,)) for i in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        torch.cuda.synchronize()
        (spy,) = spies
        replays = threads * len(xs)
        assert spy.counts.get("cudaGraphLaunch") == replays
        per_call = 2 if mode == "copy" else 1
        updates = spy.counts.get("cudaGraphExecMemcpyNodeSetParams1D", 0)
        if threads == 1:  # each call's input differs from the last one's (and outputs are kept)
            assert updates == replays * per_call
        else:  # two threads may call with the same input one after the other: not set again
            assert replays * (per_call - 1) < updates <= replays * per_call
        assert plain == {"launch": 0, "copy": 0}
        if mode == "copy":
            for index in range(threads):
                for got, want in zip(results[index], eager, strict=True):
                    _same(torch, got, want)
        (static,) = engine.static_inputs(tuple(xs[0].shape))
        static.copy_(xs[1])
        _same(torch, engine(static), eager[1])
        assert plain == {"launch": 1, "copy": 0} and spy.counts["cudaGraphLaunch"] == replays


def _needs_strategies(engine_or_backend: Any) -> None:
    backend = getattr(engine_or_backend, "backend", engine_or_backend)
    if not backend.capabilities.supports_dynamic_shapes_kernel_specialization_strategy:
        pytest.skip(f"torch-tensorrt-rtx {_torchbind_version()} has no dynamic-shapes strategy (2.13+)")


@pytest.mark.parametrize("strategy", ["lazy", "eager"])
def test_gpu_torchbind_outer_graph_dynamic_engine_one_capture_per_shape(
    open_torchbind: Any, torchbind_backend: Any, torch: Any, strategy: str, report_measurement: Any
) -> None:
    """Graphs of both optimization profiles (batches 1..8 and 9..32) replayed in any order."""
    from trt_runtime import enable_cudagraphs

    settings = RuntimeSettings(dynamic_shapes_kernel_specialization_strategy=strategy)
    if strategy != "lazy":
        _needs_strategies(torchbind_backend)
    engine, built = open_torchbind("dynamic", settings=settings)
    batches = (3, 8, 20, 3, 8, 20, 1, 3)
    xs = [_input(torch, built, batch=b, seed=i) for i, b in enumerate(batches)]
    eager = [engine(x).clone() for x in xs]
    bitwise: list[bool] = []
    with enable_cudagraphs(engine, outer=True):
        for x, want in zip(xs, eager, strict=True):
            _close(torch, engine(x), want, bitwise)
        assert engine.graph_captures == 4  # batches 3, 8, 20 (profile 1) and 1
        for x, want in reversed(list(zip(xs, eager, strict=True))):
            _close(torch, engine(x), want, bitwise)
        assert engine.graph_captures == 4
        engine.reset_graphs()
        _close(torch, engine(xs[0]), eager[0], bitwise)
        assert engine.graph_captures == 5
    report_measurement(f"torchbind outer graph, dynamic engine, {strategy}: bitwise equal to eager",
                       f"{sum(bitwise)}/{len(bitwise)}")


def test_gpu_torchbind_outer_graph_lru_eviction_after_the_lanes_work(
    open_torchbind: Any, torchbind_backend: Any, torch: Any
) -> None:
    """max_graphs=2 over three shapes: every call evicts (after the lane's streams are
    synchronized, then CUDAGraph.reset) and captures again; results close to eager."""
    from trt_runtime import OuterGraph

    _needs_strategies(torchbind_backend)
    engine, built = open_torchbind("dynamic", settings=RuntimeSettings(
        dynamic_shapes_kernel_specialization_strategy="eager"))
    batches = (3, 8, 20) * 3
    xs = [_input(torch, built, batch=b, seed=i) for i, b in enumerate(batches)]
    eager = [engine(x).clone() for x in xs]
    bitwise: list[bool] = []
    engine.outer_graph = OuterGraph(max_graphs=2)
    try:
        for x, want in zip(xs, eager, strict=True):
            _close(torch, engine(x), want, bitwise)
        stats = engine.graph_stats()
        assert stats["graphs"] == 2 and stats["evictions"] == len(batches) - 2
        assert engine.graph_captures == len(batches)
    finally:
        engine.outer_graph = None


def test_gpu_torchbind_outer_graph_recaptures_on_settings_change(open_torchbind: Any, torch: Any) -> None:
    from trt_runtime import enable_cudagraphs, runtime_config

    engine, built = open_torchbind("mlp_dynamic")
    _needs_strategies(engine)
    x = _input(torch, built, batch=8, seed=0)
    want = engine(x).clone()
    bitwise: list[bool] = []
    with enable_cudagraphs(engine, outer=True):
        _close(torch, engine(x), want, bitwise)
        _close(torch, engine(x), want, bitwise)
        assert engine.graph_captures == 1
        creations = engine.context_creations
        with runtime_config(engine, dynamic_shapes_kernel_specialization_strategy="eager"):
            _close(torch, engine(x), want, bitwise)
            _close(torch, engine(x), want, bitwise)
            assert engine.graph_captures == 2 and engine.context_creations == creations + 1
        _close(torch, engine(x), want, bitwise)  # settings restored: a new context, a new graph
        assert engine.graph_captures == 3 and engine.context_creations == creations + 2
    assert engine.outer_graph is None
    _close(torch, engine(x), want, bitwise)  # eager again
    assert engine.context_creations == engine.native_context_creations


def test_gpu_torchbind_outer_graph_host_inputs_static_inputs_and_outputs(
    open_torchbind: Any, torch: Any
) -> None:
    from trt_runtime import enable_cudagraphs

    engine, built = open_torchbind("mlp_fp16")
    host = built.random_inputs(seed=4)[0]
    want = engine(host)
    with enable_cudagraphs(engine, outer="view"):
        for _ in range(3):
            got = engine(host)
            assert isinstance(got, np.ndarray)
            np.testing.assert_array_equal(got, want)
        cpu = engine(torch.from_numpy(host))
        assert isinstance(cpu, torch.Tensor) and not cpu.is_cuda
        np.testing.assert_array_equal(cpu.numpy(), want)
        y = torch.empty(8, 256, dtype=torch.float16, device="cuda")
        assert engine.execute(torch.from_numpy(host).cuda(), outputs=[y])[0] is y
        torch.cuda.synchronize()
        np.testing.assert_array_equal(y.cpu().numpy(), want)
        (static,) = engine.static_inputs((8, 256))
        static.copy_(torch.from_numpy(host))
        np.testing.assert_array_equal(engine(static).cpu().numpy(), want)
    assert engine.graph_captures == 1


@pytest.mark.parametrize("mode", ["copy", "view"])
def test_gpu_torchbind_outer_graph_orders_with_the_callers_stream(
    open_torchbind: Any, torch: Any, mode: str
) -> None:
    from trt_runtime import enable_cudagraphs

    engine, built = open_torchbind("mlp_fp16")
    x = _input(torch, built, seed=5)
    want = engine(x).clone()
    side = torch.cuda.Stream()
    with enable_cudagraphs(engine, outer=mode):
        engine(x)  # captured
        for stream in (side, torch.cuda.default_stream(), side):
            with torch.cuda.stream(stream):
                torch.cuda._sleep(50_000_000)  # ~25 ms: the input below is late
                late = x * 1
                got = engine(late) * 1  # read on the caller's stream right away
            stream.synchronize()
            assert torch.equal(got, want)
    assert engine.graph_captures == 1


def test_gpu_torchbind_outer_graph_engine_without_user_allocation(
    open_torchbind: Any, python_backend: Any, tiny_plans: dict[bool, Any], torch: Any, report_measurement: Any
) -> None:
    """Never a wrong result: either TensorRT-RTX captures the context and replays match eager,
    or the call is a CapabilityError naming REQUIRE_USER_ALLOCATION."""
    from trt_runtime import CapabilityError, enable_cudagraphs

    x = _input(torch, tiny_plans[False], seed=7)
    reference = python_backend.load_engine(EngineSource(tiny_plans[False].plan, name="tiny_uncapturable"))
    try:
        reference(x)
        context = getattr(getattr(reference, "_context", None), "trt_context", None)
        stream = torch.cuda.Stream()
        capturable = "unknown" if context is None else str(context.is_stream_capturable(stream.cuda_stream))
    finally:
        reference.close()
    engine, _ = open_torchbind("tiny_uncapturable")
    want = engine(x).clone()
    with enable_cudagraphs(engine, outer=True):
        try:
            first, second = engine(x), engine(x)
        except CapabilityError as exc:
            outcome = "CapabilityError"
            assert "REQUIRE_USER_ALLOCATION" in str(exc)
            assert engine.graph_captures == 0
        else:
            outcome = "captured, replays equal eager"
            _same(torch, first, want)
            _same(torch, second, want)
    report_measurement("torchbind outer graph, tiny without REQUIRE_USER_ALLOCATION",
                       f"is_stream_capturable={capturable}; {outcome}")
    _same(torch, engine(x), want)  # eager again


@pytest.mark.parametrize("name", ["mlp_fp16", "dynamic"])
def test_gpu_torchbind_outer_graph_agrees_with_python_backend(
    open_torchbind: Any,
    torchbind_backend: Any,
    python_backend: Any,
    torch: Any,
    name: str,
    report_measurement: Any,
) -> None:
    from trt_runtime import enable_cudagraphs

    settings = RuntimeSettings(dynamic_shapes_kernel_specialization_strategy="eager")
    _needs_strategies(torchbind_backend)
    engine, built = open_torchbind(name, settings=settings)
    python = python_backend.load_engine(EngineSource(built.plan, name=name), settings=settings)
    try:
        batches = (None,) if name == "mlp_fp16" else (3, 20)
        xs = [_input(torch, built, batch=b, seed=30 + i) for i, b in enumerate(batches)]
        wants = [python(x).clone() for x in xs]
        bitwise: list[bool] = []
        with enable_cudagraphs(engine, outer=True):
            for _ in range(2):
                for x, want in zip(xs, wants, strict=True):
                    _close(torch, engine(x), want, bitwise)
    finally:
        python.close()
    report_measurement(f"torchbind outer graph vs python backend eager, {name}: bitwise equal",
                       f"{sum(bitwise)}/{len(bitwise)}")
    if name == "mlp_fp16":
        assert all(bitwise), "same engine, same kernels, same GPU: outputs must be bitwise equal"


# -- call overhead ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tiny", "mlp_fp16"])
def test_gpu_torchbind_call_overhead_over_the_bare_op(
    open_torchbind: Any, torch: Any, name: str, report_measurement: Any
) -> None:
    """``engine(x)`` against ``torch.ops.tensorrt.execute_engine([x], engine.native)`` on the same
    engine, alternating batches of calls (CPU time per call, no synchronize between calls).
    The figures are reported, never asserted: speed goals are judged by the benchmark
    (benchmarks/) as ratios within one run. What is asserted is that both calls agree."""
    import statistics
    import time

    from trt_runtime import enable_cudagraphs

    engine, built = open_torchbind(name)
    x = _input(torch, built, seed=11)
    op, native = torch.ops.tensorrt.execute_engine, engine.native
    calls = 2000

    def bare() -> None:
        for _ in range(calls):
            op([x], native)

    def ours() -> None:
        for _ in range(calls):
            engine(x)

    def timed(fn: Callable[[], None]) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
        torch.cuda.synchronize()
        return elapsed / calls

    for fn in (bare, ours):
        fn()  # warm: kernels compiled, allocator primed
    samples: dict[str, list[float]] = {"op": [], "engine": [], "graph": []}
    for rep in range(9):
        pair = [("op", bare), ("engine", ours)]
        for key, fn in pair if rep % 2 else reversed(pair):
            samples[key].append(timed(fn))
    with enable_cudagraphs(engine, outer=True):
        ours()
        samples["graph"] = [timed(ours) for _ in range(5)]
    med = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
    ratio = med["engine"] / med["op"]
    report_measurement(
        f"torchbind call overhead, {name} (median µs/call, no sync)",
        f"engine(x) {med['engine']:.1f}, execute_engine op {med['op']:.1f}: {ratio:.3f}x (target <= 1.10x); "
        f"outer graph replay engine(x) {med['graph']:.1f} ({med['graph'] / med['op']:.2f}x the op)",
    )
    expected = op([x], native)[0]
    assert torch.equal(engine(x), expected), "engine(x) and the bare op disagree on the same engine"
