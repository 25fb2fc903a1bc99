"""Time and memory bounds of the engine-file readers under hostile input (issue 21's targets).

Every reader returns within 2 s on any input up to 1 MB and within 10 s up to the
documented caps (64 MiB of TR01 metadata), with peak memory <= 300 MB + 4x the input;
every failure is a FormatError. Hypothesis drives the shapes (aliasing counts, JSON
shapes, offsets overwritten with pointers into the file); peak RSS of the cap cases is
measured in a fresh process by ``_bounded_read.py``.
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from _hostile_pte import aliased_program, blob
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trt_runtime import FormatError, TensorSpec
from trt_runtime.formats import Tr01Blob, describe, parse_tr01
from trt_runtime.formats.pte_writer import write_program
from trt_runtime.formats.tr01 import HEADER_FORMAT, MAX_METADATA_ITEMS, MAX_METADATA_SIZE, RESERVED

MB = 2**20
# CPU seconds (time.process_time), so that other jobs on a loaded machine do not fail them;
# a reader that blocks instead of computing is caught by the wall-clock FIFO tests.
SMALL_SECONDS = 2.0  # inputs up to 1 MB
CAP_SECONDS = 10.0  # inputs up to the documented caps
BOUNDS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
WORKER = Path(__file__).with_name("_bounded_read.py")


def _memory_limit(size: int) -> int:
    return 300 * MB + 4 * size


def _blob_with_metadata(meta: bytes, engine: bytes = b"\x00" * 16) -> bytes:
    offset = (32 + len(meta) + 15) // 16 * 16
    header = struct.pack(HEADER_FORMAT, b"TR01", 32, len(meta), offset, len(engine), RESERVED)
    return header + meta + b"\x00" * (offset - 32 - len(meta)) + engine


def _check_bounded(data: bytes, reader: Any = describe) -> Any:
    """Read ``data``: a result or a FormatError, in time and within the memory bound."""
    start = time.process_time()
    try:
        result = reader(data)
    except FormatError as exc:
        result = exc
    seconds = time.process_time() - start
    assert seconds < SMALL_SECONDS, (len(data), seconds)
    tracemalloc.start()
    try:
        try:
            reader(data)
        except FormatError:
            pass
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= _memory_limit(len(data)), (len(data), peak)
    return result


@BOUNDS
@given(
    bindings=st.integers(0, 4000),
    delegates=st.integers(1, 4000),
    instructions=st.integers(1, 4000),
    args=st.integers(0, 60_000),
)
def test_hostile_bounds_aliased_pte(bindings: int, delegates: int, instructions: int, args: int) -> None:
    data = aliased_program(bindings=bindings, delegates=delegates, instructions=instructions, args=args)
    assert len(data) <= MB
    _check_bounded(data)


JSON_ATOMS = st.sampled_from([b"[]", b"{}", b"0", b'""', b"null", b"1e308", b'{"a":[]}', b"[[[]]]", b"-1"])


@settings(BOUNDS, max_examples=10)
@given(
    atom=JSON_ATOMS, depth=st.integers(0, 3000), key=st.sampled_from([b"io_bindings", b"x", b"aliased_io"])
)
def test_hostile_bounds_tr01_metadata_shapes(atom: bytes, depth: int, key: bytes) -> None:
    """Metadata of ~1 MB made of one small JSON value repeated, optionally nested deep."""
    count = (MB - 64 - 2 * depth) // (len(atom) + 1)
    body = b"[" * depth + b",".join([atom] * count) + b"]" * depth
    meta = b'{"' + key + b'":[' + body + b'],"io_bindings":[],"device_id":0}'
    result = _check_bounded(_blob_with_metadata(meta), parse_tr01)
    assert isinstance(result, (FormatError, Tr01Blob))


def _valid_pte(location: str) -> bytes:
    specs = (TensorSpec("x", "float32", (2,), True), TensorSpec("y", "float32", (2,), False))
    out = io.BytesIO()
    write_program(out, [blob(2)], specs, location=location)
    return out.getvalue()


VALID = {location: _valid_pte(location) for location in ("inline", "segment", "named_data")}


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    location=st.sampled_from(sorted(VALID)),
    writes=st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 2000)), min_size=1, max_size=8),
)
def test_hostile_bounds_offsets_rewired_into_the_file(location: str, writes: list[tuple[int, int]]) -> None:
    """Overwrite 4-byte words with offsets that point elsewhere in the file (cycles, aliases)."""
    data = bytearray(VALID[location])
    for at, target in writes:
        at -= at % 4
        if at + 4 <= len(data):
            struct.pack_into("<I", data, at, target % len(data))
    _check_bounded(bytes(data))


# -- the documented caps, in a fresh process for peak RSS -------------------------------------


def _read_in_process(path: Path, reader: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, os.fspath(WORKER), reader, os.fspath(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


def _metadata_at_cap(kind: str) -> bytes:
    room = MAX_METADATA_SIZE - 64
    if kind == "lists":  # the case: 1.69 GB of RSS before the FormatError
        return b'{"io_bindings":[' + b"[]," * (room // 3 - 1) + b'[]],"device_id":0}'
    if kind == "string":  # valid: a 64 MiB serialized_metadata string
        return b'{"io_bindings":[],"serialized_metadata":"' + b"A" * (room - 40) + b'","device_id":0}'
    # the costliest values under the value budget: two-letter strings (~60 bytes decoded each)
    return b'{"io_bindings":[' + b'"ab",' * (MAX_METADATA_ITEMS - 8) + b'"ab"],"device_id":0}'


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "outcome"),
    [("lists", "FormatError"), ("string", "ok"), ("budget", "FormatError")],
)
def test_hostile_bounds_tr01_metadata_at_the_cap(tmp_path: Path, kind: str, outcome: str) -> None:
    path = tmp_path / f"{kind}.tr01"
    path.write_bytes(_blob_with_metadata(_metadata_at_cap(kind)))
    size = path.stat().st_size
    report = _read_in_process(path, "describe")
    assert report["outcome"] == outcome, report
    assert report["seconds"] < CAP_SECONDS, report
    assert report["peak_rss"] <= _memory_limit(size), (size, report)


@pytest.mark.parametrize("reader", ["describe", "load", "inspect", "inspect-json"])
def test_hostile_bounds_1mb_inputs_in_a_fresh_process(tmp_path: Path, reader: str) -> None:
    """The issue's worst 1 MB shapes through every reader: time and peak RSS of the process."""
    cases = {
        "aliased.pte": aliased_program(bindings=4000, delegates=2000, instructions=2000),
        "args.pte": aliased_program(bindings=2, delegates=2, instructions=2, args=250_000),
        "delegates.pte": aliased_program(bindings=1, delegates=250_000, instructions=1),
        "lists.tr01": _blob_with_metadata(b'{"io_bindings":[' + b"[]," * 340_000 + b'[]],"device_id":0}'),
    }
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        report = _read_in_process(path, reader)
        # Refused (FormatError, exit 1) or, where aliasing costs nothing once memoised, read.
        assert report["outcome"] in ("FormatError", "exit 1", "ok", "exit 0"), (name, report)
        assert report["seconds"] < SMALL_SECONDS, (name, report)
        assert report["peak_rss"] <= _memory_limit(len(data)), (name, report)
