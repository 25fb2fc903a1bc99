"""Hostile engine files: special files never block, aliasing never multiplies work, one error class.

Each test is one cause of issue 21 ("hostile files and hostile hosts"); the time and
memory bounds under fuzzing are in test_hostile_bounds.py.
"""

from __future__ import annotations

import io
import json
import os
import struct
import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _hostile_pte import aliased_program, blob

import trt_runtime
from trt_runtime import FormatError, TensorSpec
from trt_runtime.cli import main as cli_main
from trt_runtime.executorch import read_program
from trt_runtime.formats import describe, parse_pte, parse_tr01, read_engine_source
from trt_runtime.formats.pte_writer import write_program
from trt_runtime.formats.tr01 import HEADER_FORMAT, MAX_METADATA_ITEMS, RESERVED

FIXTURES = Path(__file__).parent.parent / "fixtures" / "executorch"
SPECS = (TensorSpec("x", "float32", (2,), True), TensorSpec("y", "float32", (2,), False))


def _blob_with_metadata(meta: bytes, engine: bytes = b"\x00" * 16) -> bytes:
    offset = (32 + len(meta) + 15) // 16 * 16
    header = struct.pack(HEADER_FORMAT, b"TR01", 32, len(meta), offset, len(engine), RESERVED)
    return header + meta + b"\x00" * (offset - 32 - len(meta)) + engine


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as exc:
        return exc


def _measured(call: Callable[[], Any]) -> tuple[Any, float, int]:
    """(result or exception, CPU seconds, peak bytes allocated) of ``call()``.

    CPU time, not wall time, so that a loaded machine does not fail the bound. Timed
    without tracemalloc (which slows allocation-heavy code ten-fold), then run
    again under it for the peak.
    """
    start = time.process_time()
    result = _outcome(call)
    seconds = time.process_time() - start
    tracemalloc.start()
    try:
        _outcome(call)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return result, seconds, peak


# -- cause 1: a FIFO (or any special file) never blocks --------------------------------------


def _returns_within(call: Callable[[], Any], fifo: Path, seconds: float = 10.0) -> Any:
    """``call()``'s result or exception; fails if it blocks (and then unblocks it by writing)."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(call())
        except BaseException as exc:
            box.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        with open(fifo, "wb"):  # releases the blocked open so the thread can end
            pass
        thread.join(5)
        pytest.fail(f"reading the FIFO {fifo} blocked for more than {seconds} s")
    return box[0]


@pytest.mark.parametrize(
    "reader",
    [
        lambda p: trt_runtime.load(p, backend="memory"),
        describe,
        read_engine_source,
        read_program,
        lambda p: cli_main(["inspect", os.fspath(p)]),
        lambda p: cli_main(["run", os.fspath(p), "--backend", "memory"]),
        lambda p: cli_main(["inspect", os.fspath(p), "--force", "--no-load"]),
    ],
    ids=["load", "describe", "read_engine_source", "read_program", "cli-inspect", "cli-run", "cli-force"],
)
def test_hostile_fifo_is_refused_without_blocking(tmp_path: Path, reader: Callable[[Path], Any]) -> None:
    fifo = tmp_path / "model.engine"
    os.mkfifo(fifo)
    result = _returns_within(lambda: reader(fifo), fifo)
    if isinstance(result, int):  # the CLI: exit 1, one line naming the file
        assert result == 1
    else:
        assert isinstance(result, FormatError), result
        assert "FIFO" in str(result) and "not a regular file" in str(result)


@pytest.mark.parametrize("device", ["/dev/null", "/dev/zero"])
def test_hostile_character_device_is_refused(device: str) -> None:
    if not os.path.exists(device):
        pytest.skip(f"{device} does not exist here")
    with pytest.raises(FormatError, match="character device, not a regular file"):
        read_engine_source(device)


def test_hostile_nul_in_engine_path_is_a_format_error() -> None:
    with pytest.raises(FormatError, match="embedded null byte"):
        describe("model\x00.engine")


# -- cause 2: aliasing never multiplies work -------------------------------------------------


@pytest.mark.parametrize(
    ("bindings", "delegates", "instructions", "args"),
    [(10, 2000, 2000, 0), (4000, 2000, 10, 0), (2, 2, 2, 200_000), (1, 250_000, 1, 0)],
    ids=[
        "2000-delegates-x-2000-instructions",
        "4000-bindings-x-2000-delegates",
        "200k-aliased-args",
        "250k-delegates-1mb",
    ],
)
def test_hostile_pte_aliasing_is_refused_in_linear_time(
    bindings: int, delegates: int, instructions: int, args: int
) -> None:
    data = aliased_program(bindings=bindings, delegates=delegates, instructions=instructions, args=args)
    result, seconds, peak = _measured(lambda: describe(data))
    assert isinstance(result, (FormatError, dict)), result
    if isinstance(result, FormatError):
        assert "aliasing that multiplies work" in str(result)
    # Before: 46 s and 2.2 GB for the first two. The bound is the target for <= 1 MB.
    assert seconds < 2.0, (len(data), seconds)
    assert peak < 300 * 2**20 + 4 * len(data), (len(data), peak)


def test_hostile_pte_delegates_sharing_one_blob_parse_it_once() -> None:
    program = parse_pte(memoryview(aliased_program(bindings=3, delegates=5, instructions=5)))
    assert len(program.delegates) == 5
    assert all(d.blob is program.delegates[0].blob for d in program.delegates)


# -- cause 5: numbers past Python's limits ---------------------------------------------------


def test_hostile_pte_target_device_of_5000_digits_names_no_device() -> None:
    data = aliased_program(bindings=2, delegates=1, instructions=1, target_device=b"cuda:" + b"7" * 5000)
    (delegate,) = parse_pte(memoryview(data)).delegates
    assert any("names no CUDA device" in w for w in delegate.warnings)


@pytest.mark.parametrize(
    ("meta", "match"),
    [
        (b'{"io_bindings":[],"device_id":' + b"1" * 5000 + b"}", "not valid JSON.*digits"),
        (
            b'{"io_bindings":' + b"[" * 100_000 + b"]" * 100_000 + b',"device_id":0}',
            "JSON values|not valid JSON",
        ),
        (b'{"io_bindings":[' + b"[]," * (MAX_METADATA_ITEMS + 1) + b'[]],"device_id":0}', "JSON values"),
        (b'{"io_bindings":[],"device_id":1e999}', "device_id"),
    ],
    ids=["device-id-5000-digits", "nesting-100000", "items-over-the-budget", "device-id-inf"],
)
def test_hostile_tr01_metadata_limits_are_format_errors(meta: bytes, match: str) -> None:
    with pytest.raises(FormatError, match=match):
        parse_tr01(_blob_with_metadata(meta))


def test_hostile_tr01_deep_nesting_under_the_budget_is_a_format_error() -> None:
    meta = b'{"io_bindings":' + b"[" * 50_000 + b"]" * 50_000 + b',"device_id":0}'
    with pytest.raises(FormatError, match=r"TR01 metadata is not valid JSON|recursion"):
        parse_tr01(_blob_with_metadata(meta))


def test_hostile_tr01_messages_never_repr_huge_values() -> None:
    shape = b"[" + b"-2," * 200_000 + b"1]"
    meta = b'{"io_bindings":[{"name":"x","is_input":true,"shape":' + shape + b'}],"device_id":0}'
    with pytest.raises(FormatError, match="shape must be a list") as info:
        parse_tr01(_blob_with_metadata(meta))
    assert len(str(info.value)) < 400


# -- cause 8: truncation is detected wherever it cuts data ------------------------------------


def _programs() -> dict[str, bytes]:
    tr01 = blob(2)
    programs = {}
    for location in ("inline", "segment", "named_data"):
        out = io.BytesIO()
        write_program(out, [tr01], SPECS, location=location)
        programs[location] = out.getvalue()
    for name in ("tensorrt_static_inline_cuda0.pte", "tensorrt_dynamic_cuda1.pte"):
        programs[name] = (FIXTURES / name).read_bytes()
    return programs


@pytest.mark.parametrize("name", list(_programs()))
def test_hostile_pte_truncated_anywhere_is_refused(name: str) -> None:
    data = _programs()[name]
    accepted = []
    for cut in range(1, len(data) - 7):
        try:
            parse_pte(memoryview(data[:-cut]))
        except FormatError:
            continue
        accepted.append(cut)
    # Only the zero padding after the last object may go unnoticed: it holds nothing.
    assert all(cut < 16 and not any(data[-cut:]) for cut in accepted), (name, accepted)


# -- one error class: bytes mutated anywhere in valid containers ------------------------------


@pytest.mark.parametrize("name", list(_programs()))
def test_hostile_pte_any_single_byte_flip_is_format_error_or_valid(name: str) -> None:
    data = bytearray(_programs()[name])
    step = max(1, len(data) // 1500)
    for i in range(0, len(data), step):
        for value in (0x00, 0xFF, data[i] ^ 0x80):
            mutated = bytearray(data)
            mutated[i] = value
            try:
                describe(bytes(mutated))
            except FormatError:
                pass


def test_hostile_cli_inspect_of_16k_bindings_is_fast_and_truncated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trt_runtime.formats import write_tr01

    specs = [TensorSpec(f"binding_{i:05d}", "float32", (1, 3, 224, 224), i % 2 == 0) for i in range(16_384)]
    path = tmp_path / "wide.tr01"
    write_tr01(path, b"\x00" * 64, specs)
    assert path.stat().st_size < 1_400_000
    start = time.process_time()
    assert cli_main(["inspect", os.fspath(path), "--no-load"]) == 0
    seconds = time.process_time() - start
    out = capsys.readouterr().out
    assert "… 16334 more bindings (--all lists them" in out
    assert "binding_00049" in out and "binding_00050" not in out
    assert seconds < 1.0, seconds  # CPU seconds; before: ~8 s
    assert cli_main(["inspect", os.fspath(path), "--no-load", "--all"]) == 0
    assert "binding_16383" in capsys.readouterr().out
    assert cli_main(["--json", "inspect", os.fspath(path), "--no-load"]) == 0
    assert len(json.loads(capsys.readouterr().out)["bindings"]) == 16_384
