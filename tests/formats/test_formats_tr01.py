"""TR01/TR02 blobs: byte layout, strict validation, dtype names, device policy."""

from __future__ import annotations

import io
import json
import os
import struct

import pytest

from trt_runtime import EngineError, FormatError, TensorSpec
from trt_runtime.formats import (
    describe,
    encode_metadata,
    pack_tr01,
    parse_tr01,
    read_engine_source,
    resolve_device,
    write_tr01,
)

# A stand-in engine: an unknown plan flavour, but big enough to pass the plan checks.
ENGINE = bytes(range(256)) * 2
BINDINGS = (
    TensorSpec("x", "float32", (2, 4), True),
    TensorSpec("y", "float16", (2, 3), False),
)


def _blob(**overrides: object) -> bytearray:
    return bytearray(pack_tr01(ENGINE, BINDINGS, target_platform="linux_x86_64", **overrides))  # type: ignore[arg-type]


def _set_header(blob: bytearray, **fields: int) -> bytearray:
    layout = {
        "metadata_offset": (4, "<I"),
        "metadata_size": (8, "<I"),
        "engine_offset": (12, "<I"),
        "engine_size": (16, "<Q"),
    }
    for name, value in fields.items():
        offset, fmt = layout[name]
        struct.pack_into(fmt, blob, offset, value)
    return blob


def _with_metadata(doc: object, raw: bytes | None = None) -> bytes:
    metadata = raw if raw is not None else json.dumps(doc).encode()
    engine_offset = (32 + len(metadata) + 15) // 16 * 16
    header = struct.pack("<4sIIIQ8s", b"TR01", 32, len(metadata), engine_offset, len(ENGINE), bytes(8))
    return header + metadata + bytes(engine_offset - 32 - len(metadata)) + ENGINE


def _doc(**changes: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "io_bindings": [
            {"name": "x", "dtype": "float32", "shape": [2, 4], "is_input": True},
            {"name": "y", "dtype": "float16", "shape": [2, 3], "is_input": False},
        ],
        "aliased_io": [],
        "hardware_compatible": False,
        "device_id": 0,
        "serialized_metadata": "",
        "target_platform": "",
    }
    doc.update(changes)
    return doc


def test_formats_tr01_bytes_match_torch_tensorrt_layout() -> None:
    # What torch-tensorrt 2.14's serialize_engine writes for these values (compact JSON
    # in its key order, header "<4sIIIQ8s" with reserved b"\x01"+7 zeros, 16-byte aligned
    # engine), restated by hand.
    bindings = (TensorSpec("x", "", (), True), TensorSpec("y", "", (), False))
    blob = pack_tr01(b"engine-bytes", bindings, device_id=1, hardware_compatible=True, target_platform="")
    metadata = (
        b'{"io_bindings":[{"name":"x","dtype":"","shape":[],"is_input":true},'
        b'{"name":"y","dtype":"","shape":[],"is_input":false}],"aliased_io":[],'
        b'"hardware_compatible":true,"device_id":1,"serialized_metadata":"","target_platform":""}'
    )
    engine_offset = 32 + len(metadata) + (-(32 + len(metadata)) % 16)
    expected = (
        b"TR01"
        + (32).to_bytes(4, "little")
        + len(metadata).to_bytes(4, "little")
        + engine_offset.to_bytes(4, "little")
        + (12).to_bytes(8, "little")
        + b"\x01\x00\x00\x00\x00\x00\x00\x00"
        + metadata
        + b"\x00" * (engine_offset - 32 - len(metadata))
        + b"engine-bytes"
    )
    assert blob == expected


def test_formats_tr01_aliased_io_writes_tr02_with_ordered_entries() -> None:
    bindings = (
        TensorSpec("in_k", "float16", (1, 8), True),
        TensorSpec("out_k", "float16", (1, 8), False),
        TensorSpec("in_u", "float32", (4,), True),
        TensorSpec("out_u", "float32", (4,), False),
    )
    blob = pack_tr01(ENGINE, bindings, aliased_io={"out_k": "in_k", "out_u": ("in_u", "user")})
    assert blob[:4] == b"TR02"
    metadata = blob[32 : 32 + struct.unpack_from("<I", blob, 8)[0]]
    assert (
        b'"aliased_io":[{"output":"out_k","input":"in_k","kind":"kv_cache_update"},'
        b'{"output":"out_u","input":"in_u","kind":"user"}],"hardware_compatible"' in metadata
    )
    parsed = parse_tr01(blob)
    assert parsed.magic == "TR02"
    assert parsed.aliased_io == (("out_k", "in_k", "kv_cache_update"), ("out_u", "in_u", "user"))
    assert pack_tr01(ENGINE, BINDINGS)[:4] == b"TR01"


def test_formats_tr01_binding_named_output_keeps_tr01() -> None:
    bindings = (TensorSpec("output", "float32", (1,), False), TensorSpec("input", "float32", (1,), True))
    assert pack_tr01(ENGINE, bindings)[:4] == b"TR01"


def test_formats_tr01_round_trip_through_read_engine_source() -> None:
    blob = _blob(device_id=3, hardware_compatible=True, serialized_metadata="meta")
    source = read_engine_source(bytes(blob))
    assert source.format == "TR01"
    assert source.device_id == 3
    assert source.bindings == BINDINGS
    assert bytes(source.data) == ENGINE
    assert isinstance(source.data, memoryview)
    assert source.metadata["hardware_compatible"] is True
    assert source.metadata["serialized_metadata"] == "meta"
    assert source.metadata["target_platform"] == "linux_x86_64"


def test_formats_tr01_reads_torch_tensorrt_blob_without_dtypes() -> None:
    # torch-tensorrt's backend records names and directions only.
    doc = _doc(
        io_bindings=[
            {"name": "x", "dtype": "", "shape": [], "is_input": True},
            {"name": "y", "dtype": "", "shape": [], "is_input": False},
        ]
    )
    parsed = parse_tr01(_with_metadata(doc))
    assert [(b.name, b.dtype, b.is_input) for b in parsed.bindings] == [("x", "", True), ("y", "", False)]
    assert parsed.dtypes_recorded is False


def test_formats_tr01_reads_older_blob_without_aliased_io() -> None:
    doc = _doc()
    del doc["aliased_io"], doc["target_platform"]
    parsed = parse_tr01(_with_metadata(doc))
    assert parsed.aliased_io == ()
    assert parsed.target_platform == ""


@pytest.mark.parametrize(
    ("written", "canonical"),
    [
        ("float32", "float32"),
        ("torch.float16", "float16"),
        ("DataType.HALF", "float16"),
        ("DataType.FLOAT", "float32"),
        ("bf16", "bfloat16"),
        ("DataType.INT64", "int64"),
        ("bool", "bool"),
        ("fp8", "float8_e4m3fn"),
    ],
)
def test_formats_tr01_dtype_names_map_to_canonical(written: str, canonical: str) -> None:
    doc = _doc()
    doc["io_bindings"][0]["dtype"] = written  # type: ignore[index]
    assert parse_tr01(_with_metadata(doc)).bindings[0].dtype == canonical


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b[:31], r"too small: 31 bytes; expected at least 32"),
        (lambda b: b"TR03" + b[4:], r"unknown magic b'TR03'; expected b'TR01' or b'TR02'"),
        (lambda b: _set_header(b, metadata_offset=8), r"metadata_offset 8 is inside the 32-byte header"),
        (lambda b: _set_header(b, metadata_size=0), r"metadata_size is 0"),
        (lambda b: _set_header(b, metadata_size=2**32 - 1), r"metadata_size 4294967295 is absurd"),
        (lambda b: _set_header(b, engine_offset=16), r"engine_offset 16 is inside the 32-byte header"),
        (
            lambda b: _set_header(b, engine_offset=(struct.unpack_from("<I", b, 12)[0] + 4)),
            r"engine_offset \d+ is not 16-byte aligned \(remainder 4\)",
        ),
        (lambda b: _set_header(b, engine_size=0), r"engine_size is 0"),
        (
            lambda b: _set_header(b, engine_size=2**64 - 1),
            r"TR01 engine_size 18446744073709551615 runs past the end of the blob \(offset \d+ \+ size "
            r"18446744073709551615 = \d+ > \d+ bytes\)",
        ),
        (lambda b: b[:-100], r"truncated or corrupt: expected \d+ bytes, got \d+"),
        (
            lambda b: _set_header(b, metadata_size=struct.unpack_from("<I", b, 12)[0]),
            r"metadata \(offset 32 \+ size \d+ = \d+\) overlaps the engine at engine_offset \d+",
        ),
        (lambda b: b + b"\x00" * 16, r"16 trailing bytes after the engine"),
    ],
)
def test_formats_tr01_rejects_bad_header(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    bad = bytes(mutate(_blob()))
    with pytest.raises(FormatError, match=message):
        parse_tr01(bad)
    with pytest.raises(FormatError, match=message):
        read_engine_source(bad)


@pytest.mark.parametrize(
    ("doc", "raw", "message"),
    [
        (None, b'{"io_bindings":[\xff]}', r"metadata is not valid UTF-8: byte 16 is 0xff"),
        (None, b'{"io_bindings": [', r"metadata is not valid JSON"),
        (None, b"[" * 100000 + b"]" * 100000, r"metadata is not valid JSON"),
        ([1, 2], None, r"metadata must be a JSON object; got list"),
        ({"device_id": 0}, None, r"lacks required key\(s\) \['io_bindings'\]"),
        ({"io_bindings": []}, None, r"lacks required key\(s\) \['device_id'\]"),
        (_doc(io_bindings={"x": 1}), None, r"io_bindings must be a list; got dict"),
        (
            _doc(io_bindings=[{"dtype": "float32", "is_input": True}]),
            None,
            r"io_bindings\[0\] needs a non-empty string 'name'; got None",
        ),
        (
            _doc(io_bindings=[{"name": "x", "dtype": "float32"}]),
            None,
            r"io_bindings\[0\] \('x'\) needs a boolean 'is_input'; got None",
        ),
        (
            _doc(io_bindings=[{"name": "x", "dtype": "complex64", "is_input": True}]),
            None,
            r"io_bindings\[0\] \('x'\) has unknown dtype 'complex64'; expected one of float32",
        ),
        (
            _doc(io_bindings=[{"name": "x", "dtype": "float32", "shape": [2, -3], "is_input": True}]),
            None,
            r"shape must be a list of integers >= -1; got \[2, -3\]",
        ),
        (
            _doc(io_bindings=[{"name": "x", "is_input": True}, {"name": "x", "is_input": False}]),
            None,
            r"io_bindings\[1\] repeats binding name 'x'",
        ),
        (_doc(device_id=-1), None, r"device_id must be an integer in \[0, 2\*\*31\); got -1"),
        (_doc(device_id="0"), None, r"device_id must be an integer in \[0, 2\*\*31\); got '0'"),
        (_doc(hardware_compatible="yes"), None, r"hardware_compatible must be a boolean; got 'yes'"),
        (_doc(target_platform=7), None, r"target_platform must be a string; got int"),
        (
            _doc(aliased_io=[{"output": "y", "input": "x"}]),
            None,
            r"TR01 blob carries aliased_io \['y'\]; a blob with aliased IO must use magic TR02",
        ),
        (
            _doc(aliased_io=[{"output": "nope", "input": "x"}]),
            None,
            r"aliased_io\[0\] output 'nope' is not an output binding; outputs: \['y'\]",
        ),
        (
            _doc(aliased_io=[{"output": "y", "input": "x", "kind": "magic"}]),
            None,
            r"aliased_io\[0\] kind 'magic' is unknown; expected one of kv_cache_update, user",
        ),
    ],
)
def test_formats_tr01_rejects_bad_metadata(doc: object, raw: bytes | None, message: str) -> None:
    with pytest.raises(FormatError, match=message):
        parse_tr01(_with_metadata(doc, raw))


def test_formats_tr01_write_is_atomic_and_streams_from_a_path(tmp_path) -> None:  # type: ignore[no-untyped-def]
    plan = tmp_path / "engine.plan"
    plan.write_bytes(ENGINE)
    target = tmp_path / "model.tr01"
    target.write_bytes(b"old contents")
    size = write_tr01(target, plan, BINDINGS, device_id=1)
    assert size == target.stat().st_size
    assert target.read_bytes() == pack_tr01(ENGINE, BINDINGS, device_id=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine.plan", "model.tr01"]


def test_formats_tr01_failed_write_leaves_target_untouched(tmp_path) -> None:  # type: ignore[no-untyped-def]
    target = tmp_path / "model.tr01"
    target.write_bytes(b"old contents")
    with pytest.raises(FormatError, match="engine is empty"):
        write_tr01(target, b"", BINDINGS)
    with pytest.raises(ValueError, match="aliased_io\\[0\\] input 'zz' is not an input binding"):
        write_tr01(target, ENGINE, BINDINGS, aliased_io={"y": "zz"})
    assert target.read_bytes() == b"old contents"
    assert [p.name for p in tmp_path.iterdir()] == ["model.tr01"]


def test_formats_tr01_write_to_file_object() -> None:
    out = io.BytesIO()
    write_tr01(out, ENGINE, BINDINGS)
    assert out.getvalue() == pack_tr01(ENGINE, BINDINGS)


def test_formats_tr01_read_from_path_is_mmapped(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import mmap

    path = tmp_path / "model.tr01"
    path.write_bytes(_blob(device_id=2))
    source = read_engine_source(path)
    assert isinstance(source.data, memoryview)
    assert isinstance(source.data.obj, mmap.mmap)
    assert source.name == "model.tr01"
    assert bytes(source.data) == ENGINE
    with open(path, "rb") as f:
        assert read_engine_source(f).device_id == 2
    assert read_engine_source(io.BytesIO(bytes(_blob(device_id=5)))).device_id == 5


def test_formats_tr01_data_dependent_outputs_round_trip() -> None:
    bindings = (
        TensorSpec("x", "float32", (4,), True),
        TensorSpec("idx", "int64", (-1, 1), False, data_dependent=True),
    )
    blob = pack_tr01(ENGINE, bindings)
    assert b'{"name":"idx","dtype":"int64","shape":[-1,1],"is_input":false,"data_dependent":true}' in blob
    assert parse_tr01(blob).bindings == bindings
    info = describe(blob)
    assert info["data_dependent_outputs"] == ["idx"]
    assert info["format"] == "TR01"


def test_formats_tr01_describe_reports_fields() -> None:
    info = describe(bytes(_blob(device_id=4)))
    assert info["device_id"] == 4
    assert info["engine_size"] == len(ENGINE)
    assert info["flavour"] == "unknown"
    assert [b["name"] for b in info["bindings"]] == ["x", "y"]
    json.dumps(info)


def test_formats_tr01_metadata_key_order_is_stable() -> None:
    doc = json.loads(encode_metadata(BINDINGS, target_platform="p"))
    assert list(doc) == [
        "io_bindings",
        "aliased_io",
        "hardware_compatible",
        "device_id",
        "serialized_metadata",
        "target_platform",
    ]
    assert list(doc["io_bindings"][0]) == ["name", "dtype", "shape", "is_input"]


def test_formats_tr01_writer_rejects_bad_bindings() -> None:
    with pytest.raises(ValueError, match=r"binding names must be unique; repeated: \['x'\]"):
        pack_tr01(ENGINE, (BINDINGS[0], BINDINGS[0]))
    with pytest.raises(ValueError, match="unknown dtype 'complex64'"):
        pack_tr01(ENGINE, (TensorSpec("x", "complex64", (1,), True),))
    with pytest.raises(ValueError, match=r"device_id must be an integer in \[0, 2\*\*31\); got -2"):
        pack_tr01(ENGINE, BINDINGS, device_id=-2)


def test_formats_tr01_resolve_device_policy() -> None:
    assert resolve_device(1, None, 2) == 1
    assert resolve_device(1, 0, 2) == 0  # explicit wins verbatim
    assert resolve_device(None, None, 4, current=2) == 2
    with pytest.raises(
        EngineError, match=r"names device_id 3, but this machine has 2 CUDA device\(s\) \(0..1\)"
    ):
        resolve_device(3, None, 2)
    with pytest.raises(EngineError, match=r"device=5 does not exist: this machine has 2 CUDA device\(s\)"):
        resolve_device(0, 5, 2)
    with pytest.raises(EngineError, match="no CUDA device is visible"):
        resolve_device(0, None, 0)


def test_formats_tr01_tiny_engine_is_rejected_before_tensorrt() -> None:
    blob = pack_tr01(b"engine-bytes", BINDINGS)
    assert bytes(parse_tr01(blob).engine) == b"engine-bytes"
    with pytest.raises(FormatError, match=r"engine in blob 'engine' is too small .*: 12 bytes"):
        read_engine_source(blob)


def test_formats_tr01_delegate_index_is_refused_for_blobs() -> None:
    with pytest.raises(FormatError, match=r"delegate_index/method apply to \.pte programs"):
        read_engine_source(bytes(_blob()), delegate_index=0)
    with pytest.raises(TypeError, match=r"unknown format option\(s\) \['bogus'\]"):
        read_engine_source(bytes(_blob()), bogus=1)


def test_formats_tr01_missing_file_is_a_format_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(FormatError, match=r"cannot read engine file .*missing\.tr01"):
        read_engine_source(os.path.join(tmp_path, "missing.tr01"))


def test_formats_tr01_file_object_is_read_from_its_position(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "bundle.bin"
    path.write_bytes(b"JUNK" * 4 + bytes(_blob(device_id=6)))
    with open(path, "rb") as f:
        f.seek(16)
        source = read_engine_source(f)
    assert source.device_id == 6
    assert bytes(source.data) == ENGINE
