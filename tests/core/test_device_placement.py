"""Device placement for any number of GPUs, proven on CPU with fake GPUs of mixed models.

The rules (docs/concurrency.md, "Device placement"): the blob's ``device_id`` places an
engine, ``device=`` overrides it verbatim; a device that does not exist is an
EngineError naming what exists; loading and creating streams happen on the engine's
device whatever the caller's current device is, and the caller keeps its own; each GPU
model gets its own runtime-cache file, so kernels of an sm89 GPU never reach an sm90 one.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from _device_doubles import FakeGpus
from _python_doubles import _FakeLogger, _FakeTrt, _FakeTrtEngine
from _torchbind_doubles import make_backend, source
from trt_runtime_backends.python import cuda
from trt_runtime_backends.python.backend import PythonBackend
from trt_runtime_backends.python.engine import PythonEngine

from trt_runtime import CacheKey, EngineError, EngineSource, runtime_cache
from trt_runtime.cache import RuntimeCache
from trt_runtime.errors import CacheError
from trt_runtime.protocols import Availability
from trt_runtime.testing import MemoryBackend

#: 1, 2 and 4 GPUs; the mixed machines alternate Hopper (sm90) and Ada (sm89).
MACHINES = {1: ["9.0"], 2: ["9.0", "8.9"], 4: ["9.0", "8.9", "9.0", "8.9"]}


class _Loaded:
    """What ``PythonEngine._create`` was given, and where the engine's stream landed."""

    def __init__(self, state: cuda.DeviceState, gpus: FakeGpus) -> None:
        self.device = state.index
        self.state = state
        self.current_at_create = gpus.current()
        self.stream = state.create_stream()


class _Runtime:
    def __init__(self, gpus: FakeGpus, seen: list[int | None]) -> None:
        self._gpus, self._seen = gpus, seen

    def deserialize_cuda_engine(self, data: bytes) -> Any:
        self._seen.append(self._gpus.current())
        return _FakeTrtEngine()


@pytest.fixture(params=sorted(MACHINES), ids=lambda n: f"{n}gpu")
def gpus(request: Any, monkeypatch: pytest.MonkeyPatch) -> FakeGpus:
    return FakeGpus(MACHINES[request.param]).install(monkeypatch)


@pytest.fixture
def python(gpus: FakeGpus, monkeypatch: pytest.MonkeyPatch) -> tuple[PythonBackend, list[int | None]]:
    backend = PythonBackend()
    backend._trt, backend._flavour, backend._logger = _FakeTrt, "tensorrt_rtx", _FakeLogger()
    seen: list[int | None] = []
    monkeypatch.setattr(backend, "is_available", lambda: Availability(True))
    monkeypatch.setattr(backend, "runtime", lambda index: _Runtime(gpus, seen))
    monkeypatch.setattr(
        PythonEngine, "_create", classmethod(lambda cls, b, t, state, s, st: _Loaded(state, gpus))
    )
    return backend, seen


def _blob(device_id: int | None) -> EngineSource:
    return EngineSource(b"PLAN", name="mlp", device_id=device_id)


# -- placement ---------------------------------------------------------------------------------
def test_device_placement_blob_device_places_each_engine(gpus: FakeGpus, python: Any) -> None:
    backend, seen = python
    gpus.make_current(0)
    for index in range(len(gpus.sms)):
        engine = backend.load_engine(_blob(index))
        assert engine.device == index and engine.current_at_create == index
        assert engine.stream.device == index  # the engine's stream is on its own device
        assert gpus.current() == 0  # the caller keeps its device
    assert seen == list(range(len(gpus.sms)))  # deserialized on the engine's device


def test_device_placement_device_argument_overrides_blob_verbatim(gpus: FakeGpus, python: Any) -> None:
    backend, _ = python
    last = len(gpus.sms) - 1
    assert backend.load_engine(_blob(0), device=last).device == last
    assert backend.load_engine(_blob(last), device=0).device == 0
    gpus.make_current(last)
    assert backend.load_engine(_blob(None)).device == last  # a raw plan: the current device


def test_device_placement_missing_device_names_what_exists(gpus: FakeGpus, python: Any) -> None:
    backend, _ = python
    n = len(gpus.sms)
    with pytest.raises(
        EngineError,
        match=rf"engine 'mlp': the engine's container names device_id {n}, "
        rf"but this machine has {n} CUDA device\(s\) \(0..{n - 1}\); pass device=N",
    ):
        backend.load_engine(_blob(n))
    with pytest.raises(EngineError, match=rf"engine 'mlp': device={n + 3} does not exist"):
        backend.load_engine(_blob(0), device=n + 3)
    with pytest.raises(EngineError, match=r"device must be an int CUDA device id; got 'cuda:0'"):
        backend.load_engine(_blob(0), device="cuda:0")  # type: ignore[arg-type]


def test_device_placement_caller_without_context_keeps_none(gpus: FakeGpus, python: Any) -> None:
    backend, _ = python
    assert gpus.current() is None
    engine = backend.load_engine(_blob(len(gpus.sms) - 1))
    assert engine.stream.device == len(gpus.sms) - 1
    assert gpus.current() is None  # no context was left behind on any GPU


def test_device_placement_streams_land_on_engine_device_in_every_thread(gpus: FakeGpus, python: Any) -> None:
    backend, _ = python
    engines = [backend.load_engine(_blob(i)) for i in range(len(gpus.sms))]
    results: dict[int, tuple[int, int | None, int | None]] = {}

    def caller(k: int) -> None:
        gpus.make_current(k % len(gpus.sms))  # each thread starts on some other device
        engine = engines[(k + 1) % len(engines)]
        before = gpus.current()
        stream = engine.state.create_stream()
        results[k] = (stream.device - engine.device, before, gpus.current())
        engine.state.activate()  # what an engine does once per thread before its first call
        assert gpus.current() == engine.device

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8
    assert all(delta == 0 and before == after for delta, before, after in results.values())


def test_device_placement_device_state_changes_no_current_device(gpus: FakeGpus) -> None:
    gpus.make_current(0)
    states = [cuda.get_device(i) for i in range(len(gpus.sms))]
    assert [s.compute_capability for s in states] == gpus.sms
    assert gpus.current() == 0
    assert cuda.get_device(len(gpus.sms) - 1) is states[-1]  # one state per device
    assert gpus.contexts_made == set()  # asking a device's model creates no context on it


# -- one runtime-cache file per GPU model --------------------------------------------------------
def test_device_placement_cache_key_per_gpu_model(gpus: FakeGpus, python: Any) -> None:
    backend, _ = python
    gpus.make_current(0)
    keys = [backend.cache_key(i) for i in range(len(gpus.sms))]
    assert [k.compute_capability for k in keys] == gpus.sms
    names = {RuntimeCache.in_directory("/tmp/x", backend, i).path.name for i in range(len(gpus.sms))}
    assert names == {
        f"runtime-cache-tensorrt_rtx-1.6.1.120-sm{sm.replace('.', '')}-drv13000.bin" for sm in set(gpus.sms)
    }
    assert backend.cache_key(None) == keys[0]  # None: the current device
    assert gpus.current() == 0
    assert gpus.contexts_made == set()  # cache keys create no context on any GPU


class _PerDeviceMemory(MemoryBackend):
    """The memory backend with a cache key per fake GPU model."""

    def __init__(self, sms: list[str]) -> None:
        super().__init__()
        self.sms = sms

    def cache_key(self, device: int | None = None) -> CacheKey:
        return CacheKey("memory", "1", self.sms[0 if device is None else device], "0")


def _memory_engines(sms: list[str]) -> tuple[_PerDeviceMemory, list[Any]]:
    import numpy as np

    from trt_runtime import TensorSpec
    from trt_runtime.testing.memory import AffineOutput

    backend = _PerDeviceMemory(sms)
    data = backend.build_engine([TensorSpec("x", "float32", (2, 4), True)], [AffineOutput("y", "x")])
    engines = [backend.load_engine(EngineSource(data), device=i) for i in range(len(sms))]
    for engine in engines:
        engine(np.ones((2, 4), np.float32))
    return backend, engines


@pytest.mark.parametrize("n", sorted(MACHINES))
def test_device_placement_runtime_cache_directory_gets_a_file_per_model(n: int, tmp_path: Any) -> None:
    import numpy as np

    sms = MACHINES[n]
    _, engines = _memory_engines(sms)
    with runtime_cache(engines, tmp_path) as first:
        for engine in engines:
            engine(np.ones((2, 4), np.float32))
    files = sorted(p.name for p in tmp_path.glob("runtime-cache-*.bin"))
    assert files == sorted(f"runtime-cache-memory-1-sm{sm.replace('.', '')}-drv0.bin" for sm in set(sms))
    assert first.key is not None and first.key.compute_capability == sms[0]
    for path in tmp_path.glob("runtime-cache-*.bin"):
        key, _ = __import__("trt_runtime.cache", fromlist=["decode"]).decode(path.read_bytes())
        assert f"sm{key.compute_capability.replace('.', '')}" in path.name  # no file holds another model


def test_device_placement_runtime_cache_default_per_model(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRT_RUNTIME_CACHE_DIR", str(tmp_path))
    _, engines = _memory_engines(MACHINES[4])
    with runtime_cache(engines):
        pass
    assert {p.name for p in tmp_path.glob("*.bin")} == {
        "runtime-cache-memory-1-sm90-drv0.bin",
        "runtime-cache-memory-1-sm89-drv0.bin",
    }


def test_device_placement_one_cache_file_refuses_two_models(tmp_path: Any) -> None:
    _, engines = _memory_engines(MACHINES[2])
    with pytest.raises(CacheError, match=r"2 GPU models \(sm89, sm90\); one runtime cache cannot serve"):
        with runtime_cache(engines, tmp_path / "one.bin"):
            pass
    assert not (tmp_path / "one.bin").exists()
    with runtime_cache(engines[:1], tmp_path / "one.bin"):  # one model: one file is fine
        pass
    assert (tmp_path / "one.bin").exists()


def test_device_placement_default_cache_refuses_another_model(tmp_path: Any) -> None:
    backend, _ = _memory_engines(MACHINES[2])
    cache = RuntimeCache.in_directory(tmp_path, backend, 0)
    message = r"is the file of memory-1-sm90-drv0; an engine of memory-1-sm89-drv0"
    with pytest.raises(CacheError, match=message):
        cache.ensure_materialized(object(), backend=backend, key=backend.cache_key(1))


# -- torchbind follows the same rule --------------------------------------------------------------
@pytest.mark.parametrize("n", sorted(MACHINES))
def test_device_placement_torchbind_blob_and_override(n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from trt_runtime_backends.torchbind import backend as torchbind_backend

    monkeypatch.setattr(torchbind_backend, "_driver_version", lambda: "13000")
    monkeypatch.setattr(torchbind_backend, "_tensorrt_version", lambda flavour: "1.6.1.120")
    backend, bridge = make_backend("2.14.0", devices=n)
    bridge.device_properties = lambda i: (*map(int, MACHINES[n][i].split(".")), f"GPU {i}")  # type: ignore[method-assign]
    assert backend.load_engine(source(device_id=n - 1)).device == n - 1
    assert backend.load_engine(source(device_id=n - 1), device=0).device == 0
    assert [backend.cache_key(i).compute_capability for i in range(n)] == MACHINES[n]
    with pytest.raises(EngineError, match=rf"engine 'mlp': the engine's container names device_id {n}"):
        backend.load_engine(source(device_id=n))


def test_device_placement_settings_cache_path_never_mixes_models(tmp_path: Any) -> None:
    import numpy as np

    from trt_runtime import TensorSpec
    from trt_runtime.cache import decode
    from trt_runtime.testing.memory import AffineOutput

    backend = _PerDeviceMemory(MACHINES[2])
    data = backend.build_engine([TensorSpec("x", "float32", (2, 4), True)], [AffineOutput("y", "x")])
    path = tmp_path / "shared.bin"
    hopper, ada = (
        backend.load_engine(EngineSource(data), device=i, settings={"runtime_cache": path}) for i in (0, 1)
    )
    hopper(np.ones((2, 4), np.float32))
    with pytest.raises(
        CacheError, match=r"holds kernels for memory-1-sm90-drv0; it cannot serve memory-1-sm89"
    ):
        ada(np.ones((2, 4), np.float32))
    RuntimeCache.shared(path).save()
    key, _ = decode(path.read_bytes())
    assert key is not None and key.compute_capability == "9.0"


def test_device_placement_contexts_are_made_on_the_engine_device(gpus: FakeGpus) -> None:
    """``engine.contexts = N`` (what ``load(..., contexts=N)`` does) makes each lane's stream
    on the engine's device and gives the caller its own device back."""
    from _python_doubles import _fake_backend, _FakeRuntime

    last = len(gpus.sms) - 1
    backend = _fake_backend()
    made: list[int] = []  # (a dynamic engine: each further context deserializes its own)
    backend.deserialize = lambda source, state: made.append(state.index) or _FakeTrtEngine()  # type: ignore[method-assign]
    engine = PythonEngine.__new__(PythonEngine)
    engine._init(backend, _FakeTrtEngine(), cuda.DeviceState(last), _blob(last), None,
                 runtime=_FakeRuntime())
    gpus.make_current(0)
    engine.contexts = 3
    assert engine.contexts == 3 and gpus.current() == 0  # the caller keeps its device
    assert [lane.ops._stream.device for lane in engine._pool.lanes] == [last] * 3
    assert made == [last, last]
