"""The torchbind backend on the CPU, against doubles of torch and torch-tensorrt's runtime
(tests/_torchbind_doubles.py): discovery, the serialized-info layout, capabilities by
version, settings and contexts, runtime caches and IO metadata. The device contract is in
test_torchbind_contract.py, the outer CUDA graph in test_torchbind_outer_graph.py and
test_torchbind_replay_plans.py (this folder).
"""

from __future__ import annotations

import json
import logging
import sys
import textwrap
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from _torchbind_doubles import (
    DYNAMIC_X,
    DYNAMIC_Y,
    LIB,
    RELEASES,
    TWO_PROFILES,
    FakeBridge,
    FakeOps,
    FakeTensor,
    X,
    Y,
    cuda,
    inputs,
    make_backend,
    source,
)
from trt_runtime_backends.torchbind import (
    SerializedLayout,
    TorchbindBackend,
    TorchbindCacheHandle,
    TorchbindEngine,
    library,
    runtime,
)
from trt_runtime_backends.torchbind.bindings import _read_io, io_from_source
from trt_runtime_backends.torchbind.library import RuntimeLibrary

from trt_runtime.errors import (
    BackendUnavailableError,
    CacheError,
    CapabilityError,
    EngineError,
    InputError,
)
from trt_runtime.protocols import EngineSource, RuntimeCacheHandle, TensorSpec
from trt_runtime.settings import RuntimeSettings


# -- discovery and availability -------------------------------------------------------------
def test_torchbind_backend_unavailable_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(library, "installed_distribution", lambda: None)
    availability = TorchbindBackend().is_available()
    assert not availability
    assert availability.reason == (
        "the 'torchbind' backend needs torch-tensorrt-rtx: pip install -c constraints.txt -e '.[torchbind]'"
    )


def test_torchbind_backend_is_found_through_the_entry_point() -> None:
    import trt_runtime

    assert "torchbind" in trt_runtime.installed_backends()
    status = trt_runtime.backend_status()["torchbind"]
    assert isinstance(status.ok, bool)  # reported, never raised
    assert "torch" not in sys.modules or "torch_tensorrt" not in sys.modules


def _fake_distribution(root: Path, name: str, version: str, *, with_lib: bool = True) -> Path:
    pkg = root / "torch_tensorrt"
    (pkg / "lib").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('the compiler package must not be imported')\n")
    if with_lib:
        (pkg / "lib" / "libtorchtrt_runtime.so").write_bytes(b"\x7fELF")
    dist = root / f"{name.replace('-', '_')}-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    record = "torch_tensorrt/__init__.py,,\n" + (
        "torch_tensorrt/lib/libtorchtrt_runtime.so,,\n" if with_lib else ""
    )
    (dist / "RECORD").write_text(record)
    return pkg / "lib" / "libtorchtrt_runtime.so"


def test_torchbind_library_located_from_distribution_record_without_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = _fake_distribution(tmp_path, "torch-tensorrt-rtx", "2.14.0")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = library.find_runtime_library()
    assert isinstance(found, RuntimeLibrary), found
    assert found.path.resolve() == expected.resolve()
    assert (found.distribution, found.version, found.flavour) == (
        "torch-tensorrt-rtx",
        "2.14.0",
        "tensorrt_rtx",
    )
    assert found.version_tuple == (2, 14, 0)
    assert "torch_tensorrt" not in sys.modules


def test_torchbind_library_missing_file_says_to_reinstall(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_distribution(tmp_path, "torch-tensorrt-rtx", "2.11.0", with_lib=False)
    (tmp_path / "torch_tensorrt" / "lib").rmdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    found = library.find_runtime_library()
    assert isinstance(found, str)
    assert "torch-tensorrt-rtx 2.11.0 is installed" in found and "libtorchtrt_runtime.so" in found


def test_torchbind_runtime_loads_library_once_and_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    backend, bridge = make_backend("2.14.0")
    assert bridge.loaded == [str(LIB.path)]
    assert backend.runtime.loaded_here
    assert backend.runtime.layout.abi_version == "10"
    assert backend.is_available()


def test_torchbind_runtime_load_failure_names_library_and_error(monkeypatch: pytest.MonkeyPatch) -> None:
    bridge = FakeBridge("2.14.0")
    attempts: list[str] = []

    def fail(path: str) -> None:
        attempts.append(path)
        raise OSError(
            "libtorch_nvshmem_missing.so: cannot open shared object file: No such file or directory"
        )

    bridge.load_library = fail  # type: ignore[method-assign]
    monkeypatch.setattr(runtime, "find_runtime_library", lambda: LIB)
    with pytest.raises(
        BackendUnavailableError, match=r"could not load .*libtorchtrt_runtime\.so.*nvshmem_missing"
    ):
        runtime.load_runtime(bridge)  # type: ignore[arg-type]
    assert attempts == [str(LIB.path)]  # nothing to preload: not retried


def test_torchbind_runtime_skips_loading_when_already_registered() -> None:
    backend, bridge = make_backend("2.14.0", registered=True)
    assert bridge.loaded == []
    assert not backend.runtime.loaded_here


def test_torchbind_backend_unavailable_without_gpu() -> None:
    backend, _ = make_backend("2.14.0", devices=0)
    availability = backend.is_available()
    assert not availability and "needs a CUDA GPU" in availability.reason


# -- serialized-info layout ------------------------------------------------------------------
@pytest.mark.parametrize("version", sorted(RELEASES))
def test_torchbind_layout_read_from_ops_at_run_time(version: str) -> None:
    release = RELEASES[version]
    layout = SerializedLayout.read(FakeOps(release))
    assert layout.field_names() == release["fields"]
    info = layout.pack(
        name="m", device="0%9%0%0%H200", engine=b"PLAN\xff\x00", inputs=["a", "b"], outputs=["c"],
        platform="linux_x86_64", requires_output_allocator=True,
    )  # fmt: skip
    slot = {f: i for i, f in enumerate(release["fields"])}
    assert len(info) == len(release["fields"])
    assert info[slot["ABI_TARGET"]] == release["abi"]
    assert info[slot["ENGINE"]] == b"PLAN\xff\x00" and isinstance(info[slot["ENGINE"]], bytes)
    assert info[slot["INPUT_BINDING_NAMES"]] == "a%b"
    assert info[slot["REQUIRES_OUTPUT_ALLOCATOR"]] == "1"
    assert all(isinstance(v, str) for i, v in enumerate(info) if i != slot["ENGINE"])


def test_torchbind_layout_known_abi_with_wrong_length_is_refused() -> None:
    release = dict(RELEASES["2.14.0"], fields=RELEASES["2.13.0"]["fields"])  # ABI 10 with 12 fields
    with pytest.raises(
        BackendUnavailableError, match=r"ABI '10'.*expected SERIALIZATION_LEN\(\) == 13.*found 12"
    ):
        SerializedLayout.read(FakeOps(release))


def test_torchbind_layout_unknown_field_slot_is_refused() -> None:
    ops = FakeOps(dict(RELEASES["2.14.0"], abi="11"))
    ops.SERIALIZATION_LEN = lambda: 14  # type: ignore[method-assign]
    with pytest.raises(BackendUnavailableError, match=r"slot\(s\) \[13\] of 14 belong to fields"):
        SerializedLayout.read(ops)


def test_torchbind_layout_missing_required_index_is_refused() -> None:
    ops = FakeOps(RELEASES["2.11.0"])
    del ops.TARGET_PLATFORM_IDX
    with pytest.raises(BackendUnavailableError, match="TARGET_PLATFORM_IDX"):
        SerializedLayout.read(ops)


def test_torchbind_layout_check_names_expected_and_found_abi() -> None:
    layout = SerializedLayout.read(FakeOps(RELEASES["2.14.0"]))
    info = layout.pack(name="m", device="d", engine=b"PLAN", inputs=["a"], outputs=["b"], platform="p")
    info[0] = "9"
    with pytest.raises(
        EngineError, match=r"targets torch-tensorrt ABI '9'; the loaded runtime expects ABI '10'"
    ):
        layout.check(info)
    with pytest.raises(EngineError, match="has 12 field"):
        layout.check(info[:-1])


def test_torchbind_layout_refuses_binding_names_with_the_delimiter() -> None:
    layout = SerializedLayout.read(FakeOps(RELEASES["2.14.0"]))
    with pytest.raises(EngineError, match=r"input binding name\(s\) \['a%b'\]"):
        layout.pack(name="m", device="d", engine=b"PLAN", inputs=["a%b"], outputs=["y"], platform="p")


# -- capabilities by version ------------------------------------------------------------------
def test_torchbind_capabilities_full_on_2_14() -> None:
    backend, _ = make_backend("2.14.0")
    caps = backend.capabilities
    assert caps.supports_runtime_cache and caps.supports_cuda_graph_strategy
    assert caps.supports_dynamic_shapes_kernel_specialization_strategy and caps.supports_host_io
    assert caps.supports_preallocated_outputs and caps.supports_outer_cuda_graph
    assert not caps.cache_deserialize_merges
    # what 2.14 cannot do is said, and only that
    missing = sorted(k for k in caps.notes if k.startswith("supports_"))
    assert missing == ["supports_profile_selection"]
    assert caps.supports_multiple_contexts and not caps.supports_profile_selection
    assert "_auto_select_profiles" in caps.notes["supports_profile_selection"]
    assert "replaces" in caps.notes["cache_deserialize_merges"]


def test_torchbind_capabilities_on_2_11_say_which_version_adds_them() -> None:
    backend, _ = make_backend("2.11.0")
    caps = backend.capabilities
    assert not caps.supports_runtime_cache
    assert not caps.supports_cuda_graph_strategy
    assert not caps.supports_dynamic_shapes_kernel_specialization_strategy
    with pytest.raises(
        CapabilityError, match=r"cuda_graph_strategy: .*>= 2\.13; torch-tensorrt-rtx 2\.11\.0"
    ):
        backend.load_engine(source(), settings=RuntimeSettings(cuda_graph_strategy="whole_graph_capture"))
    with pytest.raises(CapabilityError, match=r"runtime_cache: RuntimeCacheHandle .*>= 2\.13"):
        backend.create_cache_handle()
    engine = backend.load_engine(source())
    with pytest.raises(CapabilityError, match=r"dynamic_shapes_kernel_specialization_strategy: .*2\.13"):
        engine.runtime_settings = RuntimeSettings(dynamic_shapes_kernel_specialization_strategy="eager")
    out = engine.execute(*inputs())
    np.testing.assert_array_equal(out[0].array, np.full((2, 4), 6.0, np.float16))


# -- engines, settings and contexts -------------------------------------------------------------
def test_torchbind_engine_constructed_from_serialized_info() -> None:
    backend, _bridge = make_backend("2.14.0", devices=2)
    engine = backend.load_engine(source(device_id=1))
    native = engine.native
    assert isinstance(engine, TorchbindEngine) and engine.device == 1
    assert native.inputs == ["x", "y"] and native.outputs == ["out"]
    assert native.device == "1%9%0%0%NVIDIA H200 #1"
    assert [s.name for s in engine.inputs] == ["x", "y"]
    assert engine.backend is backend and not engine.has_context()


def test_torchbind_engine_device_argument_overrides_and_is_checked() -> None:
    backend, _ = make_backend("2.14.0", devices=2)
    assert backend.load_engine(source(device_id=1), device=0).device == 0
    with pytest.raises(
        EngineError, match=r"engine 'mlp': the engine's container names device_id 5, but this machine has 2"
    ):
        backend.load_engine(source(device_id=5))
    with pytest.raises(EngineError, match=r"device=2 does not exist: this machine has 2 CUDA device"):
        backend.load_engine(source(), device=2)


def test_torchbind_engine_constructor_failure_is_an_engine_error() -> None:
    backend, _ = make_backend("2.14.0")
    with pytest.raises(
        EngineError, match=r"constructing torch\.classes\.tensorrt\.Engine failed.*Unable to deserialize"
    ):
        backend.load_engine(source(data=b"garbage"))


def test_torchbind_engine_bytes_reach_cpp_as_bytes_from_memoryview() -> None:
    backend, _ = make_backend("2.14.0")
    plan = bytearray(b"PLAN" + b"\x80\xff" * 64)  # not UTF-8
    engine = backend.load_engine(source(data=memoryview(plan)))
    layout = backend.runtime.layout
    assert engine.native.info[layout.indices["ENGINE"]] == bytes(plan)


def test_torchbind_settings_applied_lazily_at_next_execute() -> None:
    backend, _bridge = make_backend("2.14.0")
    engine = backend.load_engine(source())
    native = engine.native
    engine.execute(*inputs())
    assert engine.context_creations == 1 and native.updates == [(0, 0, None)]
    engine.runtime_settings = RuntimeSettings(cuda_graph_strategy="whole_graph_capture")
    assert native.updates == [(0, 0, None)]  # nothing reaches torch-tensorrt until the next call
    assert not engine.has_context()
    engine.execute(*inputs())
    engine.execute(*inputs())
    assert native.updates == [(0, 0, None), (0, 1, None)]
    assert engine.context_creations == 2
    assert engine.native_context_creations == 2


def test_torchbind_settings_codes_follow_to_codes_order() -> None:
    backend, _ = make_backend("2.14.0")
    settings = RuntimeSettings(
        cuda_graph_strategy="whole_graph_capture", dynamic_shapes_kernel_specialization_strategy="none"
    )
    engine = backend.load_engine(source(), settings=settings)
    engine.execute(*inputs())
    ds, cg = settings.to_codes()
    assert engine.native.updates == [(ds, cg, None)] == [(2, 1, None)]


def test_torchbind_invalidate_context_drops_the_native_context_too() -> None:
    backend, _ = make_backend("2.14.0")
    engine = backend.load_engine(source())
    engine.execute(*inputs())
    engine.invalidate_context()
    engine.execute(*inputs())
    assert engine.context_creations == 2 == engine.native_context_creations


def test_torchbind_engine_close_is_idempotent_and_final() -> None:
    backend, _bridge = make_backend("2.14.0")
    with backend.load_engine(source()) as engine:
        engine.execute(*inputs())
    assert engine.closed and engine.native is None
    engine.close()
    with pytest.raises(EngineError, match="is closed"):
        engine.execute(*inputs())


# -- the runtime cache handle ----------------------------------------------------------------------
def test_torchbind_cache_handle_is_a_runtime_cache_handle() -> None:
    backend, _ = make_backend("2.14.0")
    handle = backend.create_cache_handle()
    assert isinstance(handle, RuntimeCacheHandle) and isinstance(handle, TorchbindCacheHandle)
    assert not handle.has_cache()


@pytest.mark.parametrize("version", ["2.13.0", "2.14.0"])
def test_torchbind_cache_pending_bytes_drained_exactly_once(version: str) -> None:
    """The facade's drain goes into the C++ stash; C++ drains the stash once, at the first execute."""
    backend, _ = make_backend(version)
    warm = b"KC" + json.dumps({"old-kernel": "k"}).encode()
    handle = backend.create_cache_handle()

    class Facade:  # what trt_runtime.RuntimeCache does with a handle: attach, then drain pending
        def __init__(self) -> None:
            self.pending: bytes | None = warm
            self.drains = 0

        def ensure_materialized(self, config: Any, *, backend: Any = None, key: Any = None) -> Any:
            native = handle.ensure_materialized(config)
            if self.pending is not None and handle.has_cache():
                handle.deserialize(self.pending)
                self.pending, self.drains = None, self.drains + 1
            return native

    facade = Facade()
    engine = backend.load_engine(source(), settings=RuntimeSettings())
    engine._create_context = _with_cache(engine, facade)  # type: ignore[method-assign]
    assert handle.serialize() == b""  # nothing loaded yet
    engine.execute(*inputs())
    native = handle.native
    assert facade.drains == 1 and native.drained == 1 and native.loads == [warm]
    assert handle.native_has_cache()
    saved = json.loads(handle.serialize()[2:])
    assert "old-kernel" in saved and any(k.startswith("mlp|2x4,2x4") for k in saved)
    engine.execute(*inputs())
    assert native.drained == 1 and facade.drains == 1


def _with_cache(engine: TorchbindEngine, facade: Any) -> Any:
    original = engine._create_context

    def create(settings: RuntimeSettings, cache: Any) -> Any:
        return original(settings, facade)

    return create


@pytest.mark.parametrize("version", ["2.13.0", "2.14.0"])
def test_torchbind_cache_serialize_before_materialization_returns_loaded_bytes(version: str) -> None:
    backend, _ = make_backend(version)
    handle = backend.create_cache_handle()
    handle.ensure_materialized(None)
    blob = b"KC" + json.dumps({"a": "b"}).encode()
    handle.deserialize(blob)
    assert not handle.native_has_cache()
    assert handle.serialize() == blob  # 2.13's C++ would give b""; the wrapper keeps the copy


def test_torchbind_cache_from_another_backend_is_refused() -> None:
    backend, _ = make_backend("2.14.0")
    engine = backend.load_engine(source())

    class Foreign:
        def ensure_materialized(self, config: Any, *, backend: Any = None, key: Any = None) -> Any:
            return object()

    with pytest.raises(CacheError, match="not torch-tensorrt's RuntimeCacheHandle"):
        engine._create_context(RuntimeSettings(), Foreign())  # type: ignore[arg-type]


def test_torchbind_cache_with_core_facade_drains_once() -> None:
    from trt_runtime.cache import RuntimeCache

    backend, _ = make_backend("2.14.0")
    warm = b"KC" + json.dumps({"old-kernel": "k"}).encode()
    cache = RuntimeCache()
    try:
        cache.load_bytes(warm)
    except NotImplementedError:
        pytest.skip("trt_runtime.RuntimeCache is still the skeleton (cache issue not landed)")
    engine = backend.load_engine(source(), settings=RuntimeSettings(runtime_cache=cache))
    assert cache.serialize() == warm  # pending, before any engine ran
    engine.execute(*inputs())
    engine.execute(*inputs())
    native = engine.native.settings[2]
    assert native.drained == 1 and native.loads == [warm]
    assert b"old-kernel" in cache.serialize() and b"mlp|2x4,2x4" in cache.serialize()


# -- IO metadata --------------------------------------------------------------------------------------
def test_torchbind_io_from_source_splits_bindings() -> None:
    ins, outs = io_from_source(source())  # type: ignore[misc]
    assert [s.name for s in ins] == ["x", "y"] and [s.name for s in outs] == ["out"]
    assert io_from_source(EngineSource(data=b"PLAN")) is None


def test_torchbind_io_read_from_a_tensorrt_engine() -> None:
    class Mode:
        INPUT, OUTPUT = "in", "out"

    class FakeDtype:
        def __init__(self, name: str) -> None:
            self.name = name

    class Engine:
        num_io_tensors = 3
        num_optimization_profiles = 1
        table: ClassVar[dict[str, tuple[str, str, tuple[int, ...]]]] = {
            "x": ("in", "HALF", (-1, 256)),
            "idx": ("in", "INT32", (4,)),
            "y": ("out", "HALF", (-1, 256)),
        }

        def get_tensor_name(self, i: int) -> str:
            return list(self.table)[i]

        def get_tensor_mode(self, n: str) -> str:
            return self.table[n][0]

        def get_tensor_dtype(self, n: str) -> FakeDtype:
            return FakeDtype(self.table[n][1])

        def get_tensor_shape(self, n: str) -> tuple[int, ...]:
            return self.table[n][2]

        def get_tensor_profile_shape(self, n: str, p: int) -> tuple[Any, ...]:
            return ((1, 256), (8, 256), (64, 256))

    trt = type("trt", (), {"TensorIOMode": Mode})
    ins, outs = _read_io(trt, Engine())
    assert ins[0] == TensorSpec("x", "float16", (-1, 256), True, (((1, 256), (8, 256), (64, 256)),))
    assert ins[1] == TensorSpec("idx", "int32", (4,), True)
    assert outs == [TensorSpec("y", "float16", (-1, 256), False)]


def test_torchbind_package_import_is_light() -> None:
    import subprocess

    code = textwrap.dedent(
        """
        import sys, trt_runtime_backends.torchbind as tb
        tb.TorchbindBackend().capabilities
        print(sorted(m for m in ("torch", "torch_tensorrt", "tensorrt_rtx") if m in sys.modules))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "torch_tensorrt" not in out.stdout


# -- the core conformance suite, against the doubles ---------------------------------------------
from trt_runtime.testing.conformance import BackendConformance  # noqa: E402


class _FakeTorchbindConformance(BackendConformance):
    version = "2.14.0"

    @pytest.fixture
    def backend(self) -> TorchbindBackend:
        return make_backend(self.version)[0]

    @pytest.fixture
    def engine_source(self) -> EngineSource:
        return EngineSource(b"PLAN-affine", name="affine", bindings=(DYNAMIC_X, DYNAMIC_Y))

    @pytest.fixture
    def make_inputs(self) -> Any:
        def make(rng: np.random.Generator) -> list[FakeTensor]:
            rows = int(rng.integers(1, 9))
            return [FakeTensor(rng.standard_normal((rows, 4)).astype(np.float32))]

        return make

    @pytest.fixture
    def reference(self) -> Any:
        # the double computes 2 * sum; inputs may be FakeTensors or host arrays
        return lambda inputs: [2.0 * np.asarray(_array(inputs[0]), dtype=np.float64)]

    @pytest.fixture
    def input_kinds(self) -> Any:
        # The doubles emulate torch with FakeTensor: real torch tensors (where torch is
        # installed) would reach the fake runtime, so only host numpy input is offered.
        from trt_runtime.testing import array_kinds

        return {"numpy": array_kinds.converter("numpy")}

    def as_backend_input(self, array: Any, like: Any) -> Any:
        return FakeTensor(np.ascontiguousarray(array), like.device)

    def output_to_numpy(self, value: Any) -> Any:
        return np.asarray(_array(value))

    def input_to_numpy(self, value: Any) -> Any:
        return np.asarray(_array(value))


def _array(value: Any) -> Any:
    """The numpy array of a FakeTensor (a CPU or CUDA torch tensor of the doubles), else the value."""
    return value.array if isinstance(value, FakeTensor) else value


class TestFakeTorchbind214Conformance(_FakeTorchbindConformance):
    version = "2.14.0"


class TestFakeTorchbind211Conformance(_FakeTorchbindConformance):
    version = "2.11.0"




def test_torchbind_profiles_selected_automatically_on_2_14() -> None:
    backend, bridge = make_backend("2.14.0")
    engine = backend.load_engine(source(bindings=(TWO_PROFILES, DYNAMIC_Y)))
    assert engine.native._auto_select_profiles is True
    assert engine.inputs[0].profiles == TWO_PROFILES.profiles
    engine.execute(FakeTensor(np.ones((20, 4), np.float32)))
    assert len(bridge.ops.calls) == 1


def test_torchbind_only_first_profile_before_profile_selection(caplog: pytest.LogCaptureFixture) -> None:
    backend, bridge = make_backend("2.11.0")
    with caplog.at_level(logging.INFO, logger="trt_runtime.torchbind"):
        engine = backend.load_engine(source(bindings=(TWO_PROFILES, DYNAMIC_Y)))
    assert "cannot switch optimization profiles; only profile 0 is used" in caplog.text
    assert engine.inputs[0].profiles == TWO_PROFILES.profiles[:1]
    assert not hasattr(engine.native, "_auto_select_profiles")
    with pytest.raises(
        InputError,
        match=r"input 'x' has shape \(20, 4\), outside every optimization profile .*: "
        r"profile 0: min \(1, 4\), max \(8, 4\)$",
    ):
        engine.execute(FakeTensor(np.ones((20, 4), np.float32)))
    assert bridge.ops.calls == []


def test_torchbind_incomplete_container_bindings_read_from_the_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch-tensorrt's TR01 writer records no dtypes: IO then comes from the engine itself."""
    from trt_runtime_backends.torchbind import backend as backend_module

    no_dtype = (
        TensorSpec("x", "", (2, 4), True),
        TensorSpec("y", "", (2, 4), True),
        TensorSpec("out", "", (-1,), False, data_dependent=True),
    )
    src = source(bindings=no_dtype, metadata={"dtypes_recorded": False})
    assert io_from_source(src) is None
    assert (
        io_from_source(source(bindings=(DYNAMIC_X.__class__("x", "float32", (-1, 4), True), DYNAMIC_Y)))
        is None
    )
    read: list[bytes] = []

    def from_engine(data: bytes, **kw: Any) -> tuple[list[TensorSpec], list[TensorSpec]]:
        read.append(data)
        return [X, Y], [TensorSpec("out", "float16", (-1,), False)]

    monkeypatch.setattr(backend_module, "io_from_tensorrt", from_engine)
    backend, _ = make_backend("2.14.0")
    engine = backend.load_engine(src)
    assert read == [src.data]
    assert [s.dtype for s in engine.inputs] == ["float16", "float16"]
    assert engine.outputs[0].data_dependent and engine.has_data_dependent_outputs
    layout = backend.runtime.layout
    assert engine.native.info[layout.indices["REQUIRES_OUTPUT_ALLOCATOR"]] == "1"


@pytest.mark.parametrize("drop", ["invalidate", "settings"])
def test_torchbind_profile_resynced_after_context_is_recreated(drop: str) -> None:
    """torch-tensorrt keeps its active profile index when its context is rebuilt (the new
    context starts on profile 0); the backend resets it so selection stays right."""
    backend, bridge = make_backend("2.14.0")
    bridge.ops.profile_ranges = [(1, 8), (9, 32)]
    engine = backend.load_engine(source(bindings=(TWO_PROFILES, DYNAMIC_Y)))
    big = FakeTensor(np.ones((20, 4), np.float32))
    engine.execute(big)
    assert engine.native._active_profile_index == 1
    if drop == "invalidate":
        engine.invalidate_context()
    else:
        engine.runtime_settings = RuntimeSettings(cuda_graph_strategy="whole_graph_capture")
    engine.execute(big)  # same shape: torch-tensorrt would not re-select by itself
    engine.execute(FakeTensor(np.ones((3, 4), np.float32)))
    engine.execute(big)
    assert engine.context_creations == 2 == engine.native_context_creations


def test_torchbind_engine_binds_a_cuda_context_once_in_each_calling_thread() -> None:
    # A new thread has no current CUDA context, and TensorRT-RTX's profile switch inside
    # execute_engine fails without one (seen on an H100): the first call of each thread
    # makes the engine's device context current, later calls of that thread do not.
    import threading

    backend, bridge = make_backend("2.14.0", devices=2)
    engine = backend.load_engine(source(device_id=1))
    try:
        on_1 = [cuda(np.ones((2, 4)), "cuda:1"), cuda(np.full((2, 4), 2.0), "cuda:1")]

        def calls() -> None:
            for _ in range(3):
                engine(*on_1)

        workers = [threading.Thread(target=calls) for _ in range(3)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        bound = bridge.bound_threads
        assert sorted(t for t, _ in bound) == sorted(w.ident for w in workers)
        assert {device for _, device in bound} == {1}
    finally:
        engine.close()


def test_torchbind_engine_runs_every_call_of_a_lane_on_its_own_stream() -> None:
    # torch-tensorrt's op gave wrong outputs when called from threads on different streams
    # under GPU load (H100); every call of one lane goes through one private stream, from
    # any thread, ordered with the caller's stream.
    import threading

    backend, bridge = make_backend("2.14.0")
    engine = backend.load_engine(source())
    try:
        engine(*inputs())
        worker = threading.Thread(target=lambda: engine(*inputs()))
        worker.start()
        worker.join()
        assert bridge.lanes == 1
        assert [lane for lane, _, _ in bridge.lane_calls] == ["lane:0:1"] * len(bridge.lane_calls)
        assert len({thread for _, _, thread in bridge.lane_calls}) == 2
        assert len(bridge.lane_calls) >= 2
    finally:
        engine.close()
