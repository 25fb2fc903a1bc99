"""Engines over 2 GiB: sparse files parse through mmap, writers stream, nothing is copied."""

from __future__ import annotations

import mmap
import os
import resource
import sys
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

from trt_runtime import FormatError, TensorSpec
from trt_runtime.executorch import to_pte
from trt_runtime.formats import describe, pack_tr01, read_engine_source, write_tr01

GiB = 1024**3
BINDINGS = (TensorSpec("x", "float16", (1, 4096), True), TensorSpec("y", "float16", (1, 4096), False))
#: Far below any GiB-sized copy, far above what parsing needs.
ALLOWANCE = 32 * 1024 * 1024

pytestmark = pytest.mark.skipif(
    sys.platform == "win32", reason="sparse files via truncate are POSIX-only here"
)


def _sparse_tr01(path: os.PathLike[str] | str, engine_size: int, file_size: int | None = None) -> int:
    """A TR01 file for an engine of ``engine_size`` zero bytes, written sparse.

    Only the header and metadata hit the disk; ``truncate`` extends the file with a
    hole. Returns the blob size the header declares.
    """
    prefix = pack_tr01(b"\x00", BINDINGS, device_id=1)[:-1]
    total = len(prefix) + engine_size
    with open(path, "wb") as f:
        f.write(prefix[:16] + engine_size.to_bytes(8, "little") + prefix[24:])
        f.truncate(total if file_size is None else file_size)
    return total


def _measure(call: Callable[[], Any]) -> tuple[Any, int, int]:
    """(result, tracemalloc peak, growth of max RSS) of ``call``; both in bytes."""
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tracemalloc.start()
    try:
        result = call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    rss_growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    return result, peak, rss_growth


def test_formats_large_sparse_tr01_parses_without_reading_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "big.tr01"
    engine_size = 4 * GiB + GiB // 2
    total = _sparse_tr01(path, engine_size)
    assert os.path.getsize(path) == total
    source, peak, rss_growth = _measure(lambda: read_engine_source(path))
    assert peak < ALLOWANCE, f"parsing a {total}-byte blob allocated {peak} bytes"
    assert rss_growth < ALLOWANCE, f"parsing a {total}-byte blob grew the RSS by {rss_growth} bytes"
    assert isinstance(source.data, memoryview)
    assert isinstance(source.data.obj, mmap.mmap)
    assert len(source.data) == engine_size
    assert source.device_id == 1
    assert source.bindings == BINDINGS
    info = describe(path)
    assert info["engine_size"] == engine_size


def test_formats_large_truncated_copy_names_expected_size(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "cut.tr01"
    engine_size = 4 * GiB + GiB // 2
    total = _sparse_tr01(path, engine_size, file_size=3 * GiB)
    with pytest.raises(FormatError, match=rf"expected {total} bytes, got {3 * GiB}"):
        read_engine_source(path)


class _Sink:
    """A binary file that keeps the first bytes written and counts the rest.

    It never touches the bytes of a large slice, so streaming a sparse mapped engine
    through it costs no memory: any copy would show up in tracemalloc.
    """

    def __init__(self, keep: int) -> None:
        self.head = bytearray()
        self.keep = keep
        self.size = 0
        self.largest_write = 0

    def write(self, data: Any) -> int:
        n = len(memoryview(data).cast("B"))
        if len(self.head) < self.keep:
            self.head += bytes(memoryview(data).cast("B")[: self.keep - len(self.head)])
        self.size += n
        self.largest_write = max(self.largest_write, n)
        return n


def _sparse_engine(path: os.PathLike[str] | str, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)


def test_formats_large_write_tr01_streams(tmp_path) -> None:  # type: ignore[no-untyped-def]
    engine = tmp_path / "engine.plan"
    engine_size = 2 * GiB + GiB // 2
    _sparse_engine(engine, engine_size)
    sink = _Sink(keep=4096)
    written, peak, _ = _measure(lambda: write_tr01(sink, engine, BINDINGS))  # type: ignore[arg-type]
    assert peak < ALLOWANCE, f"writing a {engine_size}-byte engine allocated {peak} bytes"
    assert written == sink.size == len(pack_tr01(b"\x00", BINDINGS)) - 1 + engine_size
    assert sink.largest_write <= 16 * 1024 * 1024
    assert bytes(sink.head[:4]) == b"TR01"
    assert int.from_bytes(sink.head[16:24], "little") == engine_size


def test_formats_large_pte_over_2gib_streams_and_loads(tmp_path) -> None:  # type: ignore[no-untyped-def]
    engine = tmp_path / "engine.plan"
    engine_size = 2 * GiB + 4096
    _sparse_engine(engine, engine_size)
    sink = _Sink(keep=64 * 1024)
    written, peak, _ = _measure(lambda: to_pte(engine, BINDINGS, sink, device_id=1))  # type: ignore[arg-type]
    assert peak < ALLOWANCE, f"writing a .pte around a {engine_size}-byte engine allocated {peak} bytes"
    assert written == sink.size > engine_size
    # Rebuild the file sparse: what the writer put before the engine, then a hole.
    program = tmp_path / "big.pte"
    with open(program, "wb") as f:
        f.write(sink.head)
        f.truncate(sink.size)
    source, peak, rss_growth = _measure(lambda: read_engine_source(program))
    assert peak < ALLOWANCE and rss_growth < ALLOWANCE
    assert isinstance(source.data, memoryview) and isinstance(source.data.obj, mmap.mmap)
    assert len(source.data) == engine_size
    assert source.device_id == 1
    assert source.metadata["location"] == "segment"
    with open(program, "r+b") as f:
        f.truncate(sink.size - 1)
    with pytest.raises(FormatError, match=rf"expected {sink.size} bytes, got {sink.size - 1}"):
        read_engine_source(program)
