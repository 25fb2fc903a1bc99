"""One behaviour in every command (issue 20): exit codes, JSON errors, broken pipes, checks
before work, nothing left behind, the CPU path with the memory backend, and the API's
``load`` refusing what the CLI refuses, with the same message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trt_runtime as trt
from trt_runtime import FormatError, TensorSpec, cli
from trt_runtime.testing.memory import AffineOutput, MemoryBackend


def _run(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    code = cli.main([os.fspath(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _error_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("usage:")]


@pytest.fixture
def mem_file(tmp_path: Path) -> Path:
    """``affine.mem``: the memory backend's engine ``y = 2 x + 1`` on a (2, 3) float32 input."""
    spec = TensorSpec("x", "float32", (2, 3), is_input=True)
    data = MemoryBackend.build_engine([spec], [AffineOutput("y", "x", scale=2.0, bias=1.0)], name="affine")
    path = tmp_path / "affine.mem"
    path.write_bytes(data)
    return path


# -- the CPU path -----------------------------------------------------------------------------


def test_cli_behaviour_load_picks_the_backend_that_reads_the_format(mem_file: Path) -> None:
    with trt.load(mem_file) as engine:
        assert engine.backend.name == "memory" and engine.device == 0
        y = engine(np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(y, np.full((2, 3), 3.0, np.float32))


@pytest.mark.parametrize("command", [["run"], ["bench", "--iterations", "3", "--warmup", "1"], ["inspect"]])
def test_cli_behaviour_mem_engine_runs_without_force_or_warning(
    capsys: pytest.CaptureFixture[str], mem_file: Path, command: list[str]
) -> None:
    code, out, err = _run(capsys, "--json", command[0], mem_file, *command[1:])
    assert code == 0, err
    assert err == ""  # no --force warning
    doc = json.loads(out)
    if command[0] == "inspect":
        assert doc["format"] == "memory test engine (.mem)" and len(doc["bindings"]) == 2
    elif command[0] == "run":
        assert doc["backend"] == "memory" and doc["output_dir"] is None
    else:
        assert [r["label"] for r in doc["results"]] == ["memory"]


# -- the API refuses what the CLI refuses --------------------------------------------------


@pytest.mark.parametrize("content", [b"hello\n", bytes(range(256)) * 8])
def test_cli_behaviour_load_and_cli_share_the_bad_magic_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "not-an-engine.bin"
    path.write_bytes(content)
    with pytest.raises(FormatError, match=r"is not an engine file \(unknown magic") as caught:
        trt.load(path)
    code, _, err = _run(capsys, "inspect", path)
    assert code == 1
    (line,) = _error_lines(err)
    api_reason = str(caught.value).split(" is not an engine file ", 1)[1]
    assert api_reason in line and "too small" not in line and "allow_pickle" not in line


# -- exit codes: usage 2, failure 1, one line ----------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "{mem}", "--backend", "nope"],
        ["inspect", "{mem}", "--backend", "nope"],
        ["bench", "{mem}", "--backend", "nope"],
        ["demo", "--backend", "nope"],
    ],
)
def test_cli_behaviour_unknown_backend_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], mem_file: Path, argv: list[str]
) -> None:
    code, out, err = _run(capsys, *[a.replace("{mem}", str(mem_file)) for a in argv])
    assert code == 2 and out == ""
    (line,) = _error_lines(err)
    assert "--backend 'nope' is not an installed backend" in line and "'memory'" in line


def test_cli_behaviour_json_errors_are_json_on_stdout(
    capsys: pytest.CaptureFixture[str], mem_file: Path
) -> None:
    code, out, err = _run(capsys, "--json", "run", mem_file, "--backend", "nope")
    assert code == 2
    doc = json.loads(out)
    assert doc["error"]["exit_code"] == 2 and doc["error"]["kind"] == "usage"
    assert "nope" in doc["error"]["message"] and len(_error_lines(err)) == 1
    code, out, _ = _run(capsys, "run", mem_file, "--json", "--input", "x=missing.npy")
    assert code == 1 and json.loads(out)["error"]["kind"] == "failure"


def test_cli_behaviour_input_that_is_not_npy_is_one_clear_line(
    capsys: pytest.CaptureFixture[str], mem_file: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "x.txt"
    bad.write_text("not numpy")
    code, _, err = _run(capsys, "run", mem_file, "--input", f"x={bad}")
    assert code == 1
    (line,) = _error_lines(err)
    assert f"--input x={bad} is not a .npy file: it starts with b'not nu'" in line
    assert "allow_pickle" not in line and "pickle" not in line


def test_cli_behaviour_demo_out_existing_file_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    existing = tmp_path / "taken"
    existing.write_text("mine")
    code, _, err = _run(capsys, "demo", "--out", existing)
    assert code == 2
    (line,) = _error_lines(err)
    assert f"--out {existing} is a file" in line and "Errno" not in line
    assert existing.read_text() == "mine"


# -- checks before work; nothing left behind ------------------------------------------------


def test_cli_behaviour_bench_plot_checks_matplotlib_before_measuring(
    capsys: pytest.CaptureFixture[str], mem_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trt_runtime import bench

    calls: list[object] = []
    monkeypatch.setattr(bench, "bench_engine", lambda *a, **k: calls.append(a))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    code, out, err = _run(capsys, "bench", mem_file, "--plot", tmp_path / "p.png")
    assert code == 1 and calls == [] and out == ""
    (line,) = _error_lines(err)
    assert "plotting needs matplotlib" in line and "-e '.[plot]'" in line


def test_cli_behaviour_run_and_demo_leave_nothing_in_the_temp_dir(
    capsys: pytest.CaptureFixture[str], mem_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    from trt_runtime import builders

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", os.fspath(temp))
    assert _run(capsys, "run", mem_file)[0] == 0
    assert _run(capsys, "run", mem_file, "--input", "x=missing.npy")[0] == 1  # a failed run
    spec = TensorSpec("x", "float32", (-1, 4), True, profiles=(((1, 4), (2, 4), (8, 4)),))
    data = MemoryBackend.build_engine([spec], [AffineOutput("logits", "x", scale=3.0)], name="affine")
    fake = builders.BuiltEngine(data, (spec,), (TensorSpec("logits", "float32", (-1, 4), False),), {},
                                lambda x: [3.0 * np.asarray(x, np.float64)], name="affine")
    from trt_runtime.cli import demo

    monkeypatch.setattr(demo, "_build_engine", lambda outdir, progress: (fake, {"onnx": None, "why": "test"}))
    code, out, err = _run(capsys, "demo", "--backend", "memory")
    assert code == 0, err
    assert "removed at the end" in out
    assert list(temp.iterdir()) == []
    outdir = tmp_path / "kept"
    assert _run(capsys, "run", mem_file, "--output-dir", outdir)[0] == 0
    assert sorted(p.name for p in outdir.rglob("*.npy")) == ["x.npy", "y.npy"]


def test_cli_behaviour_read_only_commands_create_nothing(
    capsys: pytest.CaptureFixture[str], mem_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("TRT_RUNTIME_CACHE_DIR", os.fspath(home / "cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", os.fspath(home / "xdg"))
    before = sorted(tmp_path.rglob("*"))
    code, out, _ = _run(capsys, "cache", "info")
    assert code == 0 and "does not exist yet" in out
    assert _run(capsys, "cache", "path")[0] == 0
    assert _run(capsys, "inspect", mem_file)[0] == 0
    assert sorted(tmp_path.rglob("*")) == before


def test_cli_behaviour_cache_clear_removes_only_what_info_recognises(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from trt_runtime import CacheKey
    from trt_runtime.cache import encode

    directory = tmp_path / "c"
    directory.mkdir()
    ours = directory / "a.bin"
    ours.write_bytes(encode(b"k" * 10, CacheKey("tensorrt_rtx", "1.6.1.120", "9.0", "13000")))
    lock = directory / "a.bin.lock"
    lock.write_bytes(b"")
    foreign = directory / "photo.bin"
    foreign.write_bytes(b"\x89PNG not a cache")
    other_lock = directory / "x.lock"
    other_lock.write_bytes(b"")
    code, out, _ = _run(capsys, "--json", "cache", "info", "--dir", directory)
    entries = {e["name"]: e for e in json.loads(out)["entries"]}
    assert entries["photo.bin"]["recognised"] is False and "not a trt-runtime cache file" in entries[
        "photo.bin"]["note"]
    assert entries["a.bin"]["recognised"] and entries["a.bin.lock"]["recognised"]
    code, out, err = _run(capsys, "--json", "cache", "clear", "--yes", "--dir", directory)
    assert code == 0, err
    assert sorted(json.loads(out)["removed"]) == sorted([str(ours), str(lock)])
    assert foreign.exists() and other_lock.exists() and not ours.exists()


# -- broken pipes ----------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["backends"], ["--json", "inspect", "{mem}"], ["--help"]])
def test_cli_behaviour_closed_stdout_is_quiet(mem_file: Path, argv: list[str]) -> None:
    """``trt-runtime ... | head -0``: the reader is gone before anything is written."""
    command = [sys.executable, "-m", "trt_runtime.cli", *[a.replace("{mem}", str(mem_file)) for a in argv]]
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has already gone
    done = subprocess.run(command, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120,
                          check=False)
    os.close(write_end)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_cli_behaviour_deprecated_flag_still_works_and_warns(
    capsys: pytest.CaptureFixture[str], mem_file: Path
) -> None:
    code, out, err = _run(capsys, "--json", "run", mem_file, "--dynamic-shapes-kernel-strategy", "eager")
    assert code == 0, err
    assert "--dynamic-shapes-kernel-strategy is deprecated; use " \
           "--dynamic-shapes-kernel-specialization-strategy" in err
    assert json.loads(out)["settings"]["dynamic_shapes_kernel_specialization_strategy"] == "eager"
    code, out, err = _run(capsys, "--json", "run", mem_file,
                          "--dynamic-shapes-kernel-specialization-strategy", "none")
    assert code == 0 and err == ""
    assert json.loads(out)["settings"]["dynamic_shapes_kernel_specialization_strategy"] == "none"
