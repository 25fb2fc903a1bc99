"""Hostile ``.npy`` / ``.npz`` files for ``run --load-inputs``, ``run --compare``,
``bench --load-inputs`` and the shared reader (``trt_runtime.arrays_io``).

Targets: a ~1 MB archive that inflates to 640 MB is refused or skipped without being
inflated (peak RSS of a fresh process at most 300 MB + 4x the archive, against 45 MB for
a clean run), at most 2 s of CPU; a member that is not an ``.npy`` is one line naming the
file and the member.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trt_runtime import ArraySizeError, FormatError, TensorSpec
from trt_runtime.arrays_io import read_npy, read_npz
from trt_runtime.testing.memory import AffineOutput, MemoryBackend

MB = 2**20
WORKER = Path(__file__).with_name("_hostile_cli.py")
BOMB_BYTES = 640 * 10**6


def _npy_header(dtype: str, shape: tuple[int, ...]) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def _bomb(path: Path, name: str, *, method: int = zipfile.ZIP_DEFLATED, size: int = BOMB_BYTES) -> Path:
    """An ``.npz`` whose member ``name`` is ``size`` bytes of float32 zeros, written in pieces."""
    count = size // 4
    with zipfile.ZipFile(path, "w", compression=method, compresslevel=9) as archive:
        with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
            member.write(_npy_header("<f4", (count,)))
            piece = bytes(16 * MB)
            left = count * 4
            while left:
                member.write(piece[: min(left, len(piece))])
                left -= min(left, len(piece))
    return path


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _bomb(tmp_path_factory.mktemp("bomb") / "bomb.npz", "w")


@pytest.fixture
def engine(tmp_path: Path) -> Path:
    x = TensorSpec("x", "float32", (-1, 4), True, profiles=(((1, 4), (2, 4), (8, 4)),))
    data = MemoryBackend.build_engine([x], [AffineOutput("y", "x", scale=2.0, bias=1.0)], name="affine")
    path = tmp_path / "affine.mem"
    path.write_bytes(data)
    return path


def _cli(*argv: Any) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(WORKER), *map(os.fspath, argv)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return result


def _bounded(result: dict[str, Any], size: int) -> None:
    assert result["seconds"] < 2.0, result
    assert result["peak_rss"] <= 300 * MB + 4 * size, result


def _one_error(result: dict[str, Any]) -> str:
    lines = [ln for ln in result["stderr"].splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("trt-runtime: error: "), result["stderr"]
    return lines[0]


def test_hostile_arrays_bomb_is_small_on_disk(bomb: Path) -> None:
    assert bomb.stat().st_size < 1.5 * MB
    (info,) = zipfile.ZipFile(bomb).infolist()
    assert info.file_size > BOMB_BYTES


@pytest.mark.parametrize("command", ["run", "bench"])
def test_hostile_arrays_load_inputs_never_inflates_a_member_that_is_not_an_input(
    bomb: Path, engine: Path, tmp_path: Path, command: str
) -> None:
    extra = ["--iterations", "2"] if command == "bench" else ["--output-dir", tmp_path / "out"]
    result = _cli(command, engine, "--backend", "memory", "--force", "--load-inputs", bomb, *extra)
    assert result["exit"] == 2 and "--load-inputs names ['w'], which are not inputs" in _one_error(result)
    _bounded(result, bomb.stat().st_size)


def test_hostile_arrays_input_member_is_checked_before_it_is_inflated(engine: Path, tmp_path: Path) -> None:
    bomb = _bomb(tmp_path / "x.npz", "x")
    result = _cli("run", engine, "--backend", "memory", "--force", "--load-inputs", bomb,
                  "--output-dir", tmp_path / "out")
    line = _one_error(result)
    # a shape that contradicts the engine is a usage error (2), whichever flag gave it
    assert result["exit"] == 2 and "the array given for input 'x': shape 160000000 " in line, line
    _bounded(result, bomb.stat().st_size)


def test_hostile_arrays_compare_never_inflates_a_member_that_is_not_an_output(
    bomb: Path, engine: Path, tmp_path: Path
) -> None:
    result = _cli("--json", "run", engine, "--backend", "memory", "--force", "--compare", bomb,
                  "--output-dir", tmp_path / "out")
    assert result["exit"] == 1  # the reference has no 'y': the comparison fails, nothing is inflated
    _bounded(result, bomb.stat().st_size)


def test_hostile_arrays_compare_member_over_the_budget_is_refused(engine: Path, tmp_path: Path) -> None:
    bomb = _bomb(tmp_path / "y.npz", "y", size=64 * MB)
    result = _cli("run", engine, "--backend", "memory", "--force", "--compare", bomb,
                  "--output-dir", tmp_path / "out")
    line = _one_error(result)
    assert result["exit"] == 1 and f"--compare {bomb} unpacks to" in line and "over the limit" in line
    _bounded(result, bomb.stat().st_size)


def test_hostile_arrays_member_that_is_not_npy_names_file_and_member(engine: Path, tmp_path: Path) -> None:
    path = tmp_path / "odd.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.txt", b"hello")
    result = _cli("run", engine, "--backend", "memory", "--force", "--load-inputs", path,
                  "--output-dir", tmp_path / "out")
    line = _one_error(result)
    assert result["exit"] == 1 and f"{path}: member 'x.txt' is not an .npy array" in line, line


# -- the reader ---------------------------------------------------------------------------


def _zip(**members: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("data", "error", "match"),
    [
        (_zip(**{"x.npy": _npy_header("<f4", (10**6,)) + b"\0" * 16}), FormatError,
         r"member 'x.npy': .npy header says shape \[1000000\] of float32 \(4000000 bytes\); "
         r"the member holds 16"),
        (_zip(**{"x.npy": _npy_header("|O", (2,)) + b"\0" * 16}), FormatError, r"arrays of Python objects"),
        (_zip(**{"x.npy": b"\x93NUMPY\x01\x00\xff\xff" + b"{" * 70000}), FormatError,
         r"not a valid .npy array"),
        (_zip(**{"x.npy": _npy_header("<f4", (2**62, 2**62)) + b"\0" * 16}), FormatError, r"header says"),
        (_zip(**{"dir/x": b""}), FormatError, r"member 'dir/x' is not an .npy array"),
        (_zip(**{"x.npy": b"\x93NUMPY"})[:-8], FormatError,
         r"the archive is not a valid .npz archive"),
    ],
    # named: the archives hold the time they were made, which differs between xdist workers
    ids=["short-member", "object-arrays", "header-past-limit", "huge-shape", "not-npy", "truncated"],
)
def test_hostile_arrays_reader_refuses_malformed_members(data: bytes, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        read_npz(data, "the archive")


def test_hostile_arrays_reader_refuses_a_compression_ratio_no_deflate_reaches(tmp_path: Path) -> None:
    bomb = _bomb(tmp_path / "bz.npz", "x", method=zipfile.ZIP_BZIP2, size=32 * MB)
    info = zipfile.ZipFile(bomb).getinfo("x.npy")
    assert info.file_size / info.compress_size > 1100
    match = r"member 'x.npy' claims \d+ bytes from \d+ compressed, a ratio over"
    with pytest.raises(ArraySizeError, match=match):
        read_npz(bomb, "bz")


def test_hostile_arrays_reader_reads_only_wanted_members_in_bounded_memory(tmp_path: Path) -> None:
    bomb = _bomb(tmp_path / "two.npz", "big", size=64 * MB)
    with zipfile.ZipFile(bomb, "a") as archive:
        buffer = io.BytesIO()
        np.save(buffer, np.arange(6, dtype=np.float32).reshape(2, 3), allow_pickle=False)
        archive.writestr("x.npy", buffer.getvalue())
    tracemalloc.start()
    try:
        got = read_npz(bomb, "two", names=["x"], max_bytes=MB)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert list(got) == ["x"] and got["x"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert peak < 4 * MB
    with pytest.raises(ArraySizeError, match=r"two unpacks to \d+ bytes, over the limit of 1048576"):
        read_npz(bomb, "two", max_bytes=MB)


def test_hostile_arrays_reader_round_trips_orders_and_byte_orders(tmp_path: Path) -> None:
    arrays = {"c": np.arange(12, dtype=">i4").reshape(3, 4), "f": np.asfortranarray(np.ones((2, 5), "<f8")),
              "e": np.zeros((0, 3), np.float16)}
    np.savez_compressed(tmp_path / "a.npz", **arrays)
    got = read_npz(tmp_path / "a.npz", "a")
    for name, array in arrays.items():
        np.testing.assert_array_equal(got[name], array)
        assert got[name].dtype.isnative
    buffer = io.BytesIO()
    np.save(buffer, arrays["f"])
    np.testing.assert_array_equal(read_npy(buffer.getvalue(), "f"), arrays["f"])
