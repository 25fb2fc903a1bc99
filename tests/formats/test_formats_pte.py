"""ExecuTorch ``.pte`` programs: TensorRT delegates inline, in segments, in named data."""

from __future__ import annotations

import io
import mmap
import struct

import _executorch_schema
import pytest

from trt_runtime import DataDependentShapeError, FormatError, TensorSpec
from trt_runtime.executorch import delegates, read_program, to_pte
from trt_runtime.formats import describe, pack_tr01, parse_tr01, pte_writer, read_engine_source
from trt_runtime.formats import flatbuffer as fb
from trt_runtime.formats.pte import Delegate
from trt_runtime.testing.cuda_arrays import gpu_unavailable

ENGINE = bytes(range(256)) * 3
BINDINGS = (
    TensorSpec("x", "float32", (2, 4), True),
    TensorSpec("mask", "bool", (2, 4), True),
    TensorSpec("y", "float16", (2, 3), False),
)


def _pte(**kwargs: object) -> bytes:
    out = io.BytesIO()
    to_pte(ENGINE, BINDINGS, out, **kwargs)  # type: ignore[arg-type]
    return out.getvalue()


@pytest.mark.parametrize("location", ["segment", "inline", "named_data"])
def test_formats_pte_round_trip_each_location(location: str) -> None:
    data = _pte(location=location, device_id=1)
    source = read_engine_source(data)
    assert source.format == "pte"
    assert source.device_id == 1
    assert bytes(source.data) == ENGINE
    assert source.bindings == BINDINGS
    assert source.metadata["location"] == location
    assert source.metadata["fully_delegated"] is True
    assert source.metadata["method"] == "forward"
    assert source.metadata["blob_magic"] == "TR01"


def test_formats_pte_segment_layout_has_extended_header() -> None:
    data = _pte()
    assert data[4:8] == b"ET12"
    assert data[8:12] == b"eh00"
    length, program_size, base, segment_size = struct.unpack_from("<IQQQ", data, 12)
    assert length == 32
    assert base % 128 == 0 and base >= program_size
    assert base + segment_size == len(data)
    blob = parse_tr01(data[base:])
    assert bytes(blob.engine) == ENGINE
    # The segment is exactly the blob torch-tensorrt's backend would emit.
    assert data[base:] == pack_tr01(ENGINE, BINDINGS)


def test_formats_pte_write_to_path_is_atomic_and_mmapped(tmp_path) -> None:  # type: ignore[no-untyped-def]
    engine_path = tmp_path / "engine.plan"
    engine_path.write_bytes(ENGINE)
    target = tmp_path / "model.pte"
    target.write_bytes(b"old")
    size = to_pte(engine_path, BINDINGS, target, device_id=2)
    assert size == target.stat().st_size
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine.plan", "model.pte"]
    source = read_engine_source(target)
    assert isinstance(source.data, memoryview) and isinstance(source.data.obj, mmap.mmap)
    assert bytes(source.data) == ENGINE
    assert source.device_id == 2
    assert [d.device_id for d in delegates(target)] == [2]


def test_formats_pte_independent_flatbuffer_reader_agrees() -> None:
    flatbuffers = pytest.importorskip(
        "flatbuffers", reason="flatbuffers not installed: no independent reader"
    )
    from flatbuffers.table import Table

    buf = bytearray(_pte(location="inline", device_id=3))
    root = Table(buf, flatbuffers.encode.Get(flatbuffers.packer.uoffset, buf, 0))

    def tables(table: Table, field: int) -> list[Table]:
        offset = table.Offset(4 + 2 * field)
        start, count = table.Vector(offset), table.VectorLen(offset)
        return [Table(buf, table.Indirect(start + 4 * i)) for i in range(count)]

    (plan,) = tables(root, 1)
    assert plan.String(plan.Offset(4) + plan.Pos) == b"forward"
    (delegate,) = tables(plan, 7)
    assert delegate.String(delegate.Offset(4) + delegate.Pos) == b"TensorRTBackend"
    processed = Table(buf, delegate.Indirect(delegate.Offset(6) + delegate.Pos))
    assert processed.Get(flatbuffers.number_types.Uint8Flags, processed.Offset(4) + processed.Pos) == 0
    (inline,) = tables(root, 3)
    offset = inline.Offset(4)
    start, count = inline.Vector(offset), inline.VectorLen(offset)
    assert start % 16 == 0  # force_align: 16
    assert parse_tr01(bytes(buf[start : start + count])).device_id == 3
    values = tables(plan, 2)
    assert len(values) == 3
    tensor = Table(buf, values[2].Indirect(values[2].Offset(6) + values[2].Pos))
    assert tensor.Get(flatbuffers.number_types.Int8Flags, tensor.Offset(4) + tensor.Pos) == 5  # HALF


def test_formats_pte_data_dependent_outputs_are_refused_by_default() -> None:
    bindings = (
        TensorSpec("x", "float32", (8,), True),
        TensorSpec("idx", "int64", (-1, 1), False, data_dependent=True),
        TensorSpec("n", "int32", (-1,), False, data_dependent=True),
    )
    with pytest.raises(
        DataDependentShapeError, match=r"data-dependent output\(s\) \['idx', 'n'\].*allow_data_dependent=True"
    ):
        to_pte(ENGINE, bindings, io.BytesIO())
    out = io.BytesIO()
    to_pte(ENGINE, bindings, out, allow_data_dependent=True)
    assert describe(out.getvalue())["data_dependent_outputs"] == ["idx", "n"]
    assert read_engine_source(out.getvalue()).bindings == bindings


def test_formats_pte_writer_validates_bindings(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=r"bindings \['x'\] have no dtype"):
        to_pte(ENGINE, (TensorSpec("x", "", (1,), True), BINDINGS[2]), io.BytesIO())
    with pytest.raises(ValueError, match="needs at least one input and one output"):
        to_pte(ENGINE, BINDINGS[:2], io.BytesIO())
    with pytest.raises(ValueError, match="location must be one of"):
        to_pte(ENGINE, BINDINGS, io.BytesIO(), location="cloud")
    target = tmp_path / "m.pte"
    with pytest.raises(FormatError, match="engine is empty"):
        to_pte(b"", BINDINGS, target)
    assert not target.exists() and list(tmp_path.iterdir()) == []


def test_formats_pte_fills_dtypes_of_torch_tensorrt_blob_from_program() -> None:
    untyped = tuple(TensorSpec(s.name, "", (), s.is_input) for s in BINDINGS)
    blob = pack_tr01(ENGINE, untyped)
    out = io.BytesIO()
    pte_writer.write_program(out, [blob], BINDINGS)
    source = read_engine_source(out.getvalue())
    assert source.bindings == BINDINGS
    assert source.metadata["dtypes_recorded"] is True


def test_formats_pte_truncated_segment_names_sizes() -> None:
    data = _pte()
    cut = data[: len(data) - 100]
    with pytest.raises(FormatError, match=rf"truncated: .*expected {len(data)} bytes, got {len(cut)}"):
        read_engine_source(cut)


def test_formats_pte_bad_flatbuffer_offsets_are_format_errors() -> None:
    data = bytearray(_pte(location="inline"))
    struct.pack_into("<I", data, 0, len(data) + 64)
    with pytest.raises(FormatError, match=r"Program at offset \d+ lies outside the program flatbuffer"):
        read_engine_source(bytes(data))
    with pytest.raises(
        FormatError, match=r"Program at offset 65535 lies outside the program flatbuffer \(0..16\)"
    ):
        read_engine_source(b"\xff\xff\x00\x00ET12" + bytes(8))


# A program the writer does not produce: several delegates, kernels between them and a
# foreign backend, assembled from the writer's own building blocks.
def _program(methods: list[tuple[str, list[tuple[str, bytes]], bool]]) -> bytes:
    T, V, S, B = fb.Table, fb.Vector, fb.String, fb.Bytes
    inline_data, plans = [], []
    for name, members, with_kernel in methods:
        delegate_tables, instructions = [], []
        for d, (backend, blob) in enumerate(members):
            inline_data.append(T([("off", B(memoryview(blob)))]))
            delegate_tables.append(
                T(
                    [
                        ("off", S(backend)),
                        ("off", T([("<B", 0), ("<I", len(inline_data) - 1)])),
                        ("off", V("off", [])),
                    ]
                )
            )
            instructions.append(T([("<B", 2), ("off", T([("<i", d), ("off", V("<i", []))]))]))
            if with_kernel:
                instructions.append(T([("<B", 1), ("off", T([("<i", 0), ("off", V("<i", []))]))]))
        chain = T([("off", V("<i", [])), ("off", V("<i", [])), ("off", V("off", instructions)), None])
        plans.append(
            T(
                [
                    ("off", S(name)),
                    None,
                    ("off", V("off", [])),
                    None,
                    None,
                    ("off", V("off", [chain])),
                    None,
                    ("off", V("off", delegate_tables)),
                ]
            )
        )
    root = T([("<I", 0), ("off", V("off", plans)), None, ("off", V("off", inline_data))])
    writer = fb.Writer(b"\x00\x00\x00\x00ET12")
    struct.pack_into("<I", writer.buf, 0, writer.place(root))
    return bytes(writer.buf)


def _blob(device_id: int) -> bytes:
    return pack_tr01(ENGINE, BINDINGS, device_id=device_id)


def test_formats_pte_several_delegates_need_delegate_index() -> None:
    data = _program(
        [
            (
                "forward",
                [("TensorRTBackend", _blob(0)), ("XnnpackBackend", b"xnn"), ("TensorRTBackend", _blob(1))],
                True,
            ),
            ("decode", [("TensorRTBackend", _blob(2))], False),
        ]
    )
    with pytest.raises(
        FormatError,
        match=r"has 3 TensorRTBackend delegates \(0: forward/0 device 0, 1: forward/2 device 1, "
        r"2: decode/0 device 2\); pass delegate_index=N",
    ):
        read_engine_source(data)
    second = read_engine_source(data, delegate_index=1)
    assert second.device_id == 1
    assert second.metadata["fully_delegated"] is False
    decode = read_engine_source(data, method="decode")
    assert decode.device_id == 2
    assert decode.metadata["fully_delegated"] is True
    with pytest.raises(
        FormatError, match=r"no TensorRTBackend delegate with delegate_index 2; it has 0: forward/0"
    ):
        read_engine_source(data, method="forward", delegate_index=2)
    info = describe(data)
    assert [(d["method"], d["device_id"], d["fully_delegated"]) for d in info["delegates"]] == [
        ("forward", 0, False),
        ("forward", 1, False),
        ("decode", 2, True),
    ]
    assert info["other_backends"] == ["XnnpackBackend"]
    assert [d.device_id for d in read_program(data).delegates] == [0, 1, 2]


def test_formats_pte_without_tensorrt_delegate_is_rejected() -> None:
    data = _program([("forward", [("XnnpackBackend", b"xnn")], False)])
    with pytest.raises(
        FormatError,
        match=r"has no TensorRTBackend delegate \(methods \['forward'\]; "
        r"other delegates: \['XnnpackBackend'\]\)",
    ):
        read_engine_source(data)


def test_formats_pte_bad_delegate_blob_is_rejected() -> None:
    data = _program([("forward", [("TensorRTBackend", b"not a blob at all")], False)])
    with pytest.raises(FormatError, match=r"holds 17 bytes that are neither a TR01/TR02 blob"):
        read_engine_source(data)
    bad = bytearray(_blob(0))
    struct.pack_into("<Q", bad, 16, 2**64 - 1)
    data = _program([("forward", [("TensorRTBackend", bytes(bad))], False)])
    with pytest.raises(
        FormatError, match=r"delegate 0 blob.*TR01 engine_size 18446744073709551615 runs past"
    ):
        read_engine_source(data)


def test_formats_pte_executorch_deserializer_agrees(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # ExecuTorch's own deserializer (without torch, see tests/_executorch_schema.py);
    # tests/formats/test_executorch_interop.py checks every field.
    et = _executorch_schema.load_or_skip()
    path = tmp_path / "model.pte"
    to_pte(ENGINE, BINDINGS, path, device_id=1)
    program = et.deserialize_pte_binary(path.read_bytes()).program
    (delegate,) = program.execution_plan[0].delegates
    assert delegate.id == "TensorRTBackend"
    assert [(c.key, c.value) for c in delegate.compile_specs] == [("target_device", b"cuda:1")]
    inline = program.backend_delegate_data[delegate.processed.index].data
    assert parse_tr01(bytes(inline)).device_id == 1


@pytest.mark.gpu
def test_formats_pte_fully_delegated_engine_runs_in_python(tmp_path) -> None:  # type: ignore[no-untyped-def]
    reason = gpu_unavailable()
    if reason:
        pytest.skip(f"no CUDA GPU: {reason}")
    np = pytest.importorskip("numpy")
    import trt_runtime
    from trt_runtime import builders

    built = builders.build_mlp(64, 2, batch=4, dtype="float32")
    path = tmp_path / "mlp.pte"
    to_pte(built.plan, (*built.inputs, *built.outputs), path, device_id=0)
    engine = trt_runtime.load(path, backend="python")
    try:
        (x,) = built.random_inputs()
        (y,) = engine.execute(x)
        rtol, atol = built.tolerance
        np.testing.assert_allclose(np.asarray(y, np.float64), built.reference(x)[0], rtol=rtol, atol=atol)
    finally:
        engine.close()


@pytest.mark.gpu
def test_formats_pte_device_id_of_a_missing_gpu_is_an_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    reason = gpu_unavailable()
    if reason:
        pytest.skip(f"no CUDA GPU: {reason}")
    from cuda.bindings import runtime

    import trt_runtime
    from trt_runtime import EngineError, builders

    _, count = runtime.cudaGetDeviceCount()
    built = builders.build_mlp(64, 2, batch=4, dtype="float32")
    path = tmp_path / "mlp.pte"
    to_pte(built.plan, (*built.inputs, *built.outputs), path, device_id=count)
    with pytest.raises(EngineError, match=rf"\b{count}\b.*does not exist|device_id {count}"):
        trt_runtime.load(path, backend="python")
    engine = trt_runtime.load(path, backend="python", device=0)  # an explicit device wins
    engine.close()


# -- target_device, device tags, dynamic shapes --------------------------------------------

_IMAGES = ((1, 3, 64, 64), (4, 3, 64, 64), (8, 3, 64, 64))
DYNAMIC = (
    TensorSpec("x", "float16", (-1, 3, 64, 64), True, profiles=(_IMAGES,)),
    TensorSpec("logits", "float16", (-1, 10), False),
)


def _delegate(data: bytes) -> Delegate:
    (delegate,) = read_program(data).delegates
    return delegate


def test_formats_pte_target_device_follows_device_id() -> None:
    for device_id in (0, 3):
        delegate = _delegate(_pte(device_id=device_id))
        assert delegate.compile_specs == {"target_device": f"cuda:{device_id}".encode()}
        assert delegate.target_device == f"cuda:{device_id}"
        assert {t.device for t in delegate.tensors} == {f"cuda:{device_id}"}
        assert all(t.device_recorded and not t.planned for t in delegate.tensors)
        assert delegate.warnings == ()
    source = read_engine_source(_pte(device_id=3))
    assert source.metadata["compile_specs"] == {"target_device": "cuda:3"}
    assert source.metadata["warnings"] == []


def test_formats_pte_explicit_target_device_is_written_verbatim_and_warned_about() -> None:
    delegate = _delegate(_pte(device_id=0, target_device="CUDA:2"))
    assert delegate.compile_specs == {"target_device": b"CUDA:2"}
    assert {t.device for t in delegate.tensors} == {"cuda:2"}
    source = read_engine_source(_pte(device_id=0, target_device="CUDA:2"))
    assert source.device_id == 0  # the blob decides
    warnings = source.metadata["warnings"]
    assert len(warnings) == 2
    assert "target_device 'CUDA:2' disagrees with the blob; the blob's device_id 0 decides" in warnings[0]
    assert "records this delegate's tensors on cuda:2" in warnings[1]
    assert _delegate(_pte(device_id=1, target_device="cuda")).target_device == "cuda"


@pytest.mark.parametrize("bad", ["cpu", "cuda:", "cuda:x", "gpu:0", "cuda:0:1", "cuda:128", ""])
def test_formats_pte_target_device_must_name_a_cuda_device(bad: str) -> None:
    with pytest.raises(ValueError, match=r"target_device .*(must be 'cuda' or 'cuda:N'|0\.\.127)"):
        to_pte(ENGINE, BINDINGS, io.BytesIO(), target_device=bad)


def test_formats_pte_device_id_beyond_a_device_index_needs_target_device() -> None:
    with pytest.raises(ValueError, match=r"device_id 200 cannot be a target_device.*0\.\.127"):
        to_pte(ENGINE, BINDINGS, io.BytesIO(), device_id=200)
    delegate = _delegate(_pte(device_id=200, target_device="cuda:0"))
    assert delegate.device_id == 200 and delegate.target_device == "cuda:0"


def test_formats_pte_default_target_device_needs_exactly_one_engine() -> None:
    assert pte_writer.default_target_device([5]) == "cuda:5"
    assert pte_writer.default_target_device([]) == "cuda:0"
    assert pte_writer.default_target_device([1, 2]) == "cuda:0"


def test_formats_pte_reader_warns_about_a_target_device_that_is_no_gpu() -> None:
    data = bytearray(_pte(device_id=0, location="inline"))
    at = data.index(b"cuda:0")
    data[at : at + 6] = b"cpu:00"
    source = read_engine_source(bytes(data))
    assert source.metadata["compile_specs"] == {"target_device": "cpu:00"}
    assert any("target_device 'cpu:00' names no CUDA device" in w for w in source.metadata["warnings"])


def test_formats_pte_dynamic_inputs_and_outputs_record_the_same_upper_bound() -> None:
    out = io.BytesIO()
    to_pte(ENGINE, DYNAMIC, out)
    x, logits = _delegate(out.getvalue()).tensors
    assert (x.sizes, x.dynamism) == ((8, 3, 64, 64), "dynamic_bound")
    assert (logits.sizes, logits.dynamism) == ((8, 10), "dynamic_bound")
    assert x.dtype == logits.dtype == "float16"
    source = read_engine_source(out.getvalue())
    assert [b.shape for b in source.bindings] == [(-1, 3, 64, 64), (-1, 10)]
    assert source.metadata["program_tensors"][1]["sizes"] == [8, 10]
    assert source.metadata["warnings"] == []


def test_formats_pte_upper_bounds_override_and_are_validated() -> None:
    out = io.BytesIO()
    to_pte(ENGINE, DYNAMIC, out, upper_bounds={"logits": (16, 10), "x": (4, 3, 64, 64)})
    x, logits = _delegate(out.getvalue()).tensors
    assert x.sizes == (4, 3, 64, 64) and logits.sizes == (16, 10)
    with pytest.raises(ValueError, match=r"upper_bounds names \['y'\], which are not bindings"):
        to_pte(ENGINE, DYNAMIC, io.BytesIO(), upper_bounds={"y": (1,)})
    with pytest.raises(ValueError, match=r"upper bound for 'logits' must be 2 non-negative ints"):
        to_pte(ENGINE, DYNAMIC, io.BytesIO(), upper_bounds={"logits": (16,)})
    with pytest.raises(ValueError, match=r"changes its static dimension\(s\) \[1\]"):
        to_pte(ENGINE, DYNAMIC, io.BytesIO(), upper_bounds={"logits": (16, 11)})
    with pytest.raises(ValueError, match=r"exceeds its profiles' maximum \[8, 3, 64, 64\]"):
        to_pte(ENGINE, DYNAMIC, io.BytesIO(), upper_bounds={"x": (9, 3, 64, 64)})


def test_formats_pte_unknown_bounds_are_unbound_and_reported(caplog: pytest.LogCaptureFixture) -> None:
    # A second dynamic dimension defeats the dynamic-batch rule: no bound is guessed.
    bindings = (
        TensorSpec("x", "float32", (-1, -1), True, profiles=(((1, 1), (2, 2), (4, 8)),)),
        TensorSpec("y", "float32", (-1, 5), False),
    )
    out = io.BytesIO()
    with caplog.at_level("WARNING", logger="trt_runtime.formats"):
        to_pte(ENGINE, bindings, out)
    assert "writing ['y'] as DYNAMIC_UNBOUND" in caplog.text
    x, y = _delegate(out.getvalue()).tensors
    assert (x.sizes, x.dynamism) == ((4, 8), "dynamic_bound")
    assert y.dynamism == "dynamic_unbound"
    (warning,) = read_engine_source(out.getvalue()).metadata["warnings"]
    assert "tensor(s) 'y' are DYNAMIC_UNBOUND: ExecuTorch's runtime refuses" in warning


def test_formats_pte_program_layout_matches_executorch() -> None:
    # Segment 0 is ExecuTorch's empty constant segment; the blob is segment 1.
    data = _pte()
    length, program_size, base, segment_size = struct.unpack_from("<IQQQ", data, 12)
    assert length == 32 and base >= program_size
    assert segment_size == len(data) - base
    program = read_program(data)
    assert program.has_extended_header and program.version == 0
    assert _delegate(data).location == "segment"
    inline = _pte(location="inline")
    assert inline[8:12] != b"eh00"  # an empty segment needs no extended header
    assert _delegate(inline).location == "inline"
