"""Property tests: malformed containers raise only FormatError; valid packs round-trip."""

from __future__ import annotations

import io
import json
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import trt_runtime
from trt_runtime import Availability, BackendCapabilities, FormatError, TensorSpec
from trt_runtime.dtypes import DTYPE_NAMES
from trt_runtime.executorch import to_pte
from trt_runtime.formats import describe, pack_tr01, parse_tr01, read_engine_source

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ENGINE = bytes(range(256)) * 2
BINDINGS = (TensorSpec("x", "float32", (2, 4), True), TensorSpec("y", "float32", (2, 3), False))
VALID_BLOB = pack_tr01(ENGINE, BINDINGS, device_id=1)


def _valid_pte() -> bytes:
    out = io.BytesIO()
    to_pte(ENGINE, BINDINGS, out)
    return out.getvalue()


VALID_PTE = _valid_pte()
PREFIXES = st.sampled_from(
    [b"", b"TR01", b"TR02", b"TR09", b"\x00\x00\x00\x00ET12", b"\x10\x00\x00\x00ET12eh00", b"vtrt", b"ptrt"]
)


def _only_format_errors(data: bytes, **options: Any) -> None:
    """Reading either works or raises FormatError; a success is self-consistent."""
    try:
        source = read_engine_source(data, **options)
    except FormatError:
        pass
    else:
        assert 0 < len(source.data) <= len(data)
        assert source.format in ("plan", "TR01", "TR02", "pte")
    try:
        describe(data)
    except FormatError:
        pass


@FUZZ
@given(prefix=PREFIXES, tail=st.binary(max_size=600))
def test_formats_fuzz_random_bytes_raise_only_format_errors(prefix: bytes, tail: bytes) -> None:
    _only_format_errors(prefix + tail)


@FUZZ
@given(
    magic=st.sampled_from([b"TR01", b"TR02", b"TR00", b"XXXX"]),
    metadata_offset=st.one_of(st.integers(0, 2**32 - 1), st.integers(0, 96)),
    metadata_size=st.one_of(st.integers(0, 2**32 - 1), st.integers(0, 400)),
    engine_offset=st.one_of(st.integers(0, 2**32 - 1), st.integers(0, 512)),
    engine_size=st.one_of(st.integers(0, 2**64 - 1), st.integers(0, 1024)),
    reserved=st.binary(min_size=8, max_size=8),
)
def test_formats_fuzz_random_header_fields_raise_only_format_errors(
    magic: bytes,
    metadata_offset: int,
    metadata_size: int,
    engine_offset: int,
    engine_size: int,
    reserved: bytes,
) -> None:
    header = struct.pack(
        "<4sIIIQ8s", magic, metadata_offset, metadata_size, engine_offset, engine_size, reserved
    )
    data = header + VALID_BLOB[32:]
    try:
        blob = parse_tr01(data)
    except FormatError:
        pass
    else:
        assert blob.engine_offset % 16 == 0
        assert blob.metadata_offset + blob.metadata_size <= blob.engine_offset
        assert bytes(blob.engine) == data[engine_offset : engine_offset + engine_size]
    _only_format_errors(data)


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


def _base_doc() -> dict[str, Any]:
    return {
        "io_bindings": [
            {"name": "x", "dtype": "float32", "shape": [2, 4], "is_input": True},
            {"name": "k", "dtype": "float16", "shape": [-1, 8], "is_input": True},
            {"name": "y", "dtype": "int64", "shape": [2, 3], "is_input": False, "data_dependent": True},
            {"name": "k_out", "dtype": "", "shape": [], "is_input": False},
        ],
        "aliased_io": [{"output": "k_out", "input": "k", "kind": "kv_cache_update"}],
        "hardware_compatible": False,
        "device_id": 0,
        "serialized_metadata": "",
        "target_platform": "linux_x86_64",
    }


def _blob_with(doc: Any, magic: bytes) -> bytes:
    metadata = json.dumps(doc).encode()
    engine_offset = (32 + len(metadata) + 15) // 16 * 16
    header = struct.pack("<4sIIIQ8s", magic, 32, len(metadata), engine_offset, len(ENGINE), bytes(8))
    return header + metadata + bytes(engine_offset - 32 - len(metadata)) + ENGINE


@FUZZ
@given(doc=JSON, magic=st.sampled_from([b"TR01", b"TR02"]))
def test_formats_fuzz_random_json_metadata_raises_only_format_errors(doc: Any, magic: bytes) -> None:
    _only_format_errors(_blob_with(doc, magic))


@FUZZ
@given(data=st.data(), magic=st.sampled_from([b"TR01", b"TR02"]))
def test_formats_fuzz_corrupted_metadata_fields_raise_only_format_errors(
    data: st.DataObject, magic: bytes
) -> None:
    # Start from valid metadata and corrupt one to three fields, so that each check is
    # reached with the fields before it intact.
    doc = _base_doc()
    for _ in range(data.draw(st.integers(1, 3))):
        where = data.draw(st.sampled_from(["top", "binding", "alias"]))
        if where == "top":
            container: dict[str, Any] = doc
        elif where == "binding" and isinstance(doc.get("io_bindings"), list) and doc["io_bindings"]:
            container = data.draw(st.sampled_from(doc["io_bindings"]))
        elif where == "alias" and isinstance(doc.get("aliased_io"), list) and doc["aliased_io"]:
            container = doc["aliased_io"][0]
        else:
            continue
        if not isinstance(container, dict):
            continue
        key = data.draw(st.sampled_from([*sorted(container), "extra"]))
        if data.draw(st.booleans()) and key in container:
            del container[key]
        else:
            container[key] = data.draw(JSON | st.sampled_from(["x", "y", "k", "half", "user", -1, 2**31]))
    _only_format_errors(_blob_with(doc, magic))


@FUZZ
@given(data=st.data())
def test_formats_fuzz_mutated_programs_raise_only_format_errors(data: st.DataObject) -> None:
    program = bytearray(VALID_PTE)
    limit = min(len(program), 1200)  # the flatbuffer, the header and the blob's start
    for _ in range(data.draw(st.integers(1, 6))):
        position = data.draw(st.integers(0, limit - 1))
        program[position] = data.draw(st.integers(0, 255))
    cut = data.draw(st.one_of(st.just(len(program)), st.integers(0, len(program))))
    _only_format_errors(bytes(program[:cut]))
    _only_format_errors(bytes(program[:cut]), delegate_index=0)


NAMES = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
SPEC = st.builds(
    lambda name, dtype, shape, is_input, dd: TensorSpec(
        name, dtype, tuple(shape), is_input, data_dependent=dd and not is_input
    ),
    NAMES,
    st.sampled_from([*DTYPE_NAMES, ""]),
    st.lists(st.integers(-1, 64), max_size=4),
    st.booleans(),
    st.booleans(),
)


@FUZZ
@given(
    engine=st.binary(min_size=64, max_size=400),
    bindings=st.lists(SPEC, max_size=6, unique_by=lambda s: s.name),
    device_id=st.integers(0, 2**31 - 1),
    hardware_compatible=st.booleans(),
    serialized_metadata=st.text(max_size=40),
    target_platform=st.sampled_from(["linux_x86_64", "win_x86_64", ""]),
    alias=st.booleans(),
)
def test_formats_fuzz_valid_packs_round_trip(
    engine: bytes,
    bindings: list[TensorSpec],
    device_id: int,
    hardware_compatible: bool,
    serialized_metadata: str,
    target_platform: str,
    alias: bool,
) -> None:
    assume(not engine.startswith((b"vtrt",)))
    inputs = [b.name for b in bindings if b.is_input]
    outputs = [b.name for b in bindings if not b.is_input]
    aliased = {outputs[0]: (inputs[0], "user")} if alias and inputs and outputs else {}
    blob = pack_tr01(
        engine,
        bindings,
        aliased_io=aliased,
        device_id=device_id,
        hardware_compatible=hardware_compatible,
        serialized_metadata=serialized_metadata,
        target_platform=target_platform,
    )
    assert blob[:4] == (b"TR02" if aliased else b"TR01")
    source = read_engine_source(blob)
    assert bytes(source.data) == engine
    assert source.bindings == tuple(bindings)
    assert source.device_id == device_id
    assert source.metadata["hardware_compatible"] is hardware_compatible
    assert source.metadata["serialized_metadata"] == serialized_metadata
    assert source.metadata["target_platform"] == target_platform
    assert [tuple(a) for a in source.metadata["aliased_io"]] == [(o, i, k) for o, (i, k) in aliased.items()]


@settings(max_examples=40, deadline=None)
@given(
    engine=st.binary(min_size=64, max_size=300),
    bindings=st.lists(
        SPEC.filter(lambda s: s.dtype != ""), min_size=2, max_size=5, unique_by=lambda s: s.name
    ),
    device_id=st.integers(0, 7),
    location=st.sampled_from(["segment", "inline", "named_data"]),
)
def test_formats_fuzz_valid_programs_round_trip(
    engine: bytes, bindings: list[TensorSpec], device_id: int, location: str
) -> None:
    assume(not engine.startswith(b"vtrt"))
    assume(any(b.is_input for b in bindings) and any(not b.is_input for b in bindings))
    out = io.BytesIO()
    to_pte(engine, bindings, out, device_id=device_id, location=location, allow_data_dependent=True)
    source = read_engine_source(out.getvalue())
    assert bytes(source.data) == engine
    ordered = [b for b in bindings if b.is_input] + [b for b in bindings if not b.is_input]
    assert source.bindings == tuple(ordered)
    assert source.device_id == device_id


class SpyBackend:
    """Records every load_engine call; a bad container must never get here."""

    name = "spy"
    capabilities = BackendCapabilities()

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def is_available(self) -> Availability:
        return Availability(True)

    def load_engine(self, source: Any, *, device: Any = None, settings: Any = None) -> Any:
        self.calls.append(source)
        return source


def _corrupt_blob() -> bytes:
    blob = bytearray(VALID_BLOB)
    struct.pack_into("<Q", blob, 16, 2**64 - 1)
    return bytes(blob)


@pytest.mark.parametrize(
    "bad",
    [
        b"",
        b"tiny",
        _corrupt_blob(),
        VALID_BLOB[:-1],
        VALID_BLOB[:40],
        b"TR01" + bytes(60),
        VALID_PTE[: len(VALID_PTE) // 2],
        b"\x00\x00\x00\x00ET12" + bytes(100),
    ],
    ids=[
        "empty",
        "tiny",
        "absurd-engine-size",
        "truncated-blob",
        "header-only",
        "zero-header",
        "truncated-pte",
        "empty-pte",
    ],
)
def test_formats_fuzz_bad_input_never_reaches_the_backend(bad: bytes) -> None:
    spy = SpyBackend()
    with pytest.raises(FormatError):
        trt_runtime.load(bad, backend=spy)  # type: ignore[arg-type]
    assert spy.calls == []


def test_formats_fuzz_spy_backend_sees_valid_input() -> None:
    spy = SpyBackend()
    trt_runtime.load(VALID_PTE, backend=spy, device=0)  # type: ignore[arg-type]
    (source,) = spy.calls
    assert bytes(source.data) == ENGINE
    assert source.device_id == 0
