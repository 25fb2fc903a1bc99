"""The torchbind backend on the CPU, against doubles of torch and torch-tensorrt's runtime
(tests/_torchbind_doubles.py): discovery, the serialized-info layout, capabilities by
version, settings and contexts, and IO metadata. In this folder: the runtime cache handle in
test_torchbind_cache_handle.py, the conformance suite and calls in test_torchbind_calls.py, the
device contract in test_torchbind_contract.py, the outer CUDA graph in
test_torchbind_outer_graph.py and test_torchbind_replay_plans.py.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from _torchbind_doubles import LIB, FakeBridge, inputs, make_backend, source
from _torchbind_fakes import RELEASES, FakeOps
from trt_runtime_backends.torchbind import (
    SerializedLayout,
    TorchbindBackend,
    TorchbindEngine,
    library,
    runtime,
)
from trt_runtime_backends.torchbind.bindings import _read_io, io_from_source
from trt_runtime_backends.torchbind.library import RuntimeLibrary

from trt_runtime.errors import BackendUnavailableError, CapabilityError, EngineError
from trt_runtime.protocols import EngineSource, TensorSpec
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
