"""Optimization profiles recorded by the TR01 / .pte writers, and the engine writer by format."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from trt_runtime import FormatError, TensorSpec
from trt_runtime.executorch import read_program, to_pte
from trt_runtime.formats import describe, encode_metadata, pack_tr01, parse_tr01, read_engine_source
from trt_runtime.formats.write import format_for_path, write_engine

ENGINE = bytes(range(256)) * 2
PROFILE = (((1, 4), (2, 4), (8, 4)),)
X = TensorSpec("x", "float32", (-1, 4), True, profiles=PROFILE)
Y = TensorSpec("y", "float32", (-1, 4), False)


def _blob_with(profiles: object) -> bytes:
    doc = {"io_bindings": [{"name": "x", "dtype": "float32", "shape": [-1, 4], "is_input": True,
                            "profiles": profiles},
                           {"name": "y", "dtype": "float32", "shape": [-1, 4], "is_input": False}],
           "device_id": 0}
    metadata = json.dumps(doc).encode()
    offset = (32 + len(metadata) + 15) // 16 * 16
    header = struct.pack("<4sIIIQ8s", b"TR01", 32, len(metadata), offset, len(ENGINE), bytes(8))
    return header + metadata + bytes(offset - 32 - len(metadata)) + ENGINE


def test_profiles_round_trip_through_tr01_and_pte(tmp_path: Path) -> None:
    blob = parse_tr01(pack_tr01(ENGINE, (X, Y)))
    assert blob.bindings == (X, Y)
    to_pte(ENGINE, (X, Y), tmp_path / "m.pte")
    (delegate,) = read_program((tmp_path / "m.pte").read_bytes()).delegates
    assert delegate.blob.bindings[0].profiles == PROFILE
    assert read_engine_source(tmp_path / "m.pte").bindings[0].profiles == PROFILE
    assert describe(pack_tr01(ENGINE, (X, Y)))["bindings"][0]["profiles"] == [[[1, 4], [2, 4], [8, 4]]]


def test_profiles_left_out_on_request_as_torch_tensorrt_writes() -> None:
    metadata = json.loads(encode_metadata((X, Y), record_profiles=False))
    assert "profiles" not in metadata["io_bindings"][0]
    assert json.loads(encode_metadata((X, Y)))["io_bindings"][0]["profiles"] == [[[1, 4], [2, 4], [8, 4]]]
    # An output never records profiles, and a binding without them adds no key.
    assert "profiles" not in json.loads(encode_metadata((X, Y)))["io_bindings"][1]


@pytest.mark.parametrize(
    "profiles",
    [
        "1x4",
        [[[1, 4], [2, 4]]],
        [[[1, 4], [2, 4], [8]]],
        [[[4, 4], [2, 4], [8, 4]]],
        [[[1, 4], [2, 4], [8, True]]],
    ],
)
def test_profiles_malformed_in_a_blob_are_refused(profiles: object) -> None:
    with pytest.raises(FormatError, match=r"io_bindings\[0\] \('x'\) profiles"):
        parse_tr01(_blob_with(profiles))


def test_profiles_the_writer_refuses_what_the_reader_would() -> None:
    bad = TensorSpec("x", "float32", (-1, 4), True, profiles=(((3, 4), (2, 4), (8, 4)),))
    with pytest.raises(FormatError, match=r"binding 'x' profiles\[0\] must be \[min, opt, max\]"):
        pack_tr01(ENGINE, (bad, Y))


def test_write_engine_picks_the_format(tmp_path: Path) -> None:
    assert format_for_path("a.PTE") == "pte" and format_for_path("a.engine") == "plan"
    assert format_for_path("a.bin", "tr01") == "tr01"
    with pytest.raises(ValueError, match=r"format must be one of plan, tr01, pte; got 'onnx'"):
        format_for_path("a.plan", "onnx")
    with pytest.raises(ValueError, match=r"cannot tell the format of 'a' from its extension '\(none\)'"):
        format_for_path("a")
    assert write_engine(tmp_path / "m.tr01", ENGINE, (X, Y)) == "tr01"
    assert parse_tr01((tmp_path / "m.tr01").read_bytes()).bindings[0].profiles == PROFILE
