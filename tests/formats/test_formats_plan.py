"""Raw serialized plans: detection, header hints, size checks, atomic writes."""

from __future__ import annotations

import io
import mmap
import struct

import pytest

from trt_runtime import FormatError
from trt_runtime.formats import (
    MIN_PLAN_SIZE,
    describe,
    detect_format,
    read_engine_source,
    write_plan,
)


@pytest.fixture(scope="module")
def rtx_plan() -> bytes:
    """A real TensorRT-RTX plan: one matmul, built on the CPU in ~0.2 s."""
    trt = pytest.importorskip("tensorrt_rtx", reason="tensorrt_rtx not installed: cannot build a real plan")
    np = pytest.importorskip("numpy")
    builder = trt.Builder(trt.Logger(trt.Logger.ERROR))
    network = builder.create_network(0)
    x = network.add_input("x", trt.float32, (2, 4))
    w = network.add_constant((4, 3), trt.Weights(np.ones((4, 3), np.float32)))
    mm = network.add_matrix_multiply(x, trt.MatrixOperation.NONE, w.get_output(0), trt.MatrixOperation.NONE)
    mm.get_output(0).name = "y"
    network.mark_output(mm.get_output(0))
    plan = builder.build_serialized_network(network, builder.create_builder_config())
    assert plan is not None, "the TensorRT-RTX builder returned no plan"
    return bytes(memoryview(plan))


def _rtx_version() -> str:
    import tensorrt_rtx as trt

    return ".".join(trt.__version__.split(".")[:4])


def test_formats_plan_real_rtx_plan_is_detected(rtx_plan: bytes) -> None:
    assert rtx_plan[:4] == b"vtrt"
    source = read_engine_source(rtx_plan)
    assert source.format == "plan"
    assert source.device_id is None
    assert source.bindings == ()
    assert bytes(source.data) == rtx_plan
    assert source.metadata["plan"]["flavour"] == "tensorrt_rtx"
    assert source.metadata["plan"]["declared_size"] == len(rtx_plan)
    assert source.metadata["plan"]["version"] == _rtx_version()


def test_formats_plan_from_path_and_file_objects_without_copies(rtx_plan: bytes, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "mlp.plan"
    path.write_bytes(rtx_plan)
    from_path = read_engine_source(path)
    assert isinstance(from_path.data, memoryview) and isinstance(from_path.data.obj, mmap.mmap)
    assert from_path.name == "mlp.plan"
    assert bytes(from_path.data) == rtx_plan
    with open(path, "rb") as f:
        from_file = read_engine_source(f)
        assert isinstance(from_file.data.obj, mmap.mmap)  # type: ignore[union-attr]
    assert bytes(read_engine_source(io.BytesIO(rtx_plan)).data) == rtx_plan
    assert bytes(read_engine_source(str(path)).data) == rtx_plan


def test_formats_plan_truncated_rtx_plan_names_sizes(rtx_plan: bytes) -> None:
    cut = rtx_plan[: len(rtx_plan) - 1000]
    with pytest.raises(
        FormatError,
        match=rf"TensorRT-RTX plan 'engine' is truncated.*expected {len(rtx_plan)} bytes, got {len(cut)}",
    ):
        read_engine_source(cut)


def test_formats_plan_empty_and_tiny_inputs_are_rejected(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(FormatError, match=r"plan 'engine' is empty \(0 bytes\)"):
        read_engine_source(b"")
    empty = tmp_path / "empty.plan"
    empty.write_bytes(b"")
    with pytest.raises(FormatError, match=r"file '.*empty.plan' is empty \(0 bytes\)"):
        read_engine_source(empty)
    with pytest.raises(
        FormatError,
        match=rf"too small to be a serialized engine: 10 bytes \(expected at least {MIN_PLAN_SIZE}",
    ):
        read_engine_source(b"vtrt" + b"\x00" * 6)


def test_formats_plan_unknown_magic_is_a_plan_only_as_fallback() -> None:
    blob = b"ZZZZ" + bytes(200)
    source = read_engine_source(blob)
    assert source.format == "plan"
    assert source.metadata["plan"]["flavour"] == "unknown"
    assert detect_format(memoryview(b"ptrt" + bytes(100))) == "plan"
    assert detect_format(memoryview(b"TR01" + bytes(100))) == "TR01"
    assert detect_format(memoryview(b"\x00\x00\x00\x00ET12" + bytes(100))) == "pte"
    assert read_engine_source(b"ptrt" + bytes(100)).metadata["plan"]["flavour"] == "tensorrt"
    # Full TensorRT's own plans start with 'ftrt'.
    assert detect_format(memoryview(b"ftrt" + bytes(100))) == "plan"
    assert read_engine_source(b"ftrt" + bytes(100)).metadata["plan"]["flavour"] == "tensorrt"


def test_formats_plan_unknown_blob_version_is_not_a_plan() -> None:
    with pytest.raises(FormatError, match=r"unknown magic b'TR07'; expected b'TR01' or b'TR02'"):
        read_engine_source(b"TR07" + bytes(200))


def test_formats_plan_write_is_atomic(rtx_plan: bytes, tmp_path) -> None:  # type: ignore[no-untyped-def]
    target = tmp_path / "out.plan"
    target.write_bytes(b"previous")
    write_plan(target, memoryview(rtx_plan))
    assert target.read_bytes() == rtx_plan
    with pytest.raises(FormatError, match="is too small"):
        write_plan(target, b"tiny")
    with pytest.raises(FormatError, match="truncated"):
        write_plan(target, rtx_plan[:-1])
    assert target.read_bytes() == rtx_plan
    assert [p.name for p in tmp_path.iterdir()] == ["out.plan"]
    copy = tmp_path / "copy.plan"
    write_plan(copy, target)  # from a path: streamed through mmap
    assert copy.read_bytes() == rtx_plan


def test_formats_plan_write_from_builder_host_memory(tmp_path) -> None:  # type: ignore[no-untyped-def]
    trt = pytest.importorskip("tensorrt_rtx", reason="tensorrt_rtx not installed: no IHostMemory to write")
    builder = trt.Builder(trt.Logger(trt.Logger.ERROR))
    network = builder.create_network(0)
    x = network.add_input("x", trt.float32, (4,))
    network.mark_output(network.add_identity(x).get_output(0))
    host_memory = builder.build_serialized_network(network, builder.create_builder_config())
    target = tmp_path / "identity.plan"
    write_plan(target, memoryview(host_memory))
    assert target.read_bytes() == bytes(memoryview(host_memory))


def test_formats_plan_describe(rtx_plan: bytes) -> None:
    info = describe(rtx_plan)
    assert info["format"] == "plan"
    assert info["size"] == len(rtx_plan)
    assert info["flavour"] == "tensorrt_rtx"
    assert info["version"] == _rtx_version()
    assert info["device_id"] is None
    assert info["data_dependent_outputs"] is None


def test_formats_plan_rejects_non_bytes_sources() -> None:
    with pytest.raises(FormatError, match=r"engine source must be bytes, .*; got int"):
        read_engine_source(42)  # type: ignore[arg-type]
    with pytest.raises(FormatError, match="is in text mode"):
        read_engine_source(io.StringIO("vtrt"))  # type: ignore[arg-type]


def test_formats_plan_header_declared_size_smaller_is_accepted() -> None:
    # Only a declared size larger than the input means truncation; trailing data is the
    # plan reader's business.
    plan = bytearray(b"vtrt" + bytes(124))
    struct.pack_into("<Q", plan, 16, 100)
    struct.pack_into("<4B", plan, 24, 1, 6, 1, 120)
    assert read_engine_source(bytes(plan)).metadata["plan"]["version"] == "1.6.1.120"
