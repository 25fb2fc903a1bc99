"""``trt-runtime demo`` and the command line as a program: the console script, ``python -m`` and the
package's exports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _cli_runner import run_cli as _run
from _cli_shared import gpu_reason, one_error_line

from trt_runtime import TensorSpec, cli
from trt_runtime.testing.memory import AffineOutput, MemoryBackend

# -- demo -----------------------------------------------------------------------------


def test_cli_demo_without_gpu_builds_writes_inspects_and_explains(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("tensorrt_rtx", reason="the demo builds with tensorrt-rtx")
    reason = gpu_reason()
    if not reason:
        pytest.skip("a backend can run here; the GPU path is test_cli_demo_gpu_runs_cold_and_warm")
    code, out, err = _run(capsys, "demo", "--out", tmp_path)
    assert code == 0, err
    plans = list(tmp_path.glob("*.plan"))
    blobs = list(tmp_path.glob("*.tr01"))
    assert len(plans) == 1 and len(blobs) == 1
    assert plans[0].read_bytes()[:4] == b"vtrt"  # a real TensorRT-RTX plan
    assert blobs[0].read_bytes()[:4] == b"TR01"
    assert "bindings" in out
    assert "logits" in out  # the TR01 blob lists its bindings on the CPU
    assert "GPU part skipped" in out
    assert " ".join(reason.split()) in " ".join(out.split())  # the backend's own reason
    assert "--no-load" not in out  # the plan was not loaded for want of a GPU, not for a flag


def test_cli_demo_json_reports_files_and_gpu_status(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("tensorrt_rtx", reason="the demo builds with tensorrt-rtx")
    if not gpu_reason():
        pytest.skip("a backend can run here; the GPU path is test_cli_demo_gpu_runs_cold_and_warm")
    code, out, err = _run(capsys, "--json", "demo", "--out", tmp_path)
    assert code == 0, err
    doc = json.loads(out)
    assert Path(doc["files"]["plan"]).is_file()
    assert Path(doc["files"]["tr01"]).is_file()
    assert doc["gpu"]["ran"] is False and doc["gpu"]["reason"]
    tr01 = doc["inspect"][Path(doc["files"]["tr01"]).name]
    assert tr01["format"] == "TR01"
    assert [b["name"] for b in tr01["bindings"]] == ["image", "logits"]
    # The engine's optimization profile is recorded in the blob (issue 20: was []).
    assert tr01["bindings"][0]["profiles"] == [[[1, 3, 16, 16], [2, 3, 16, 16], [8, 3, 16, 16]]]
    if doc["source"]["onnx"] is not None:  # made with the onnx package, built by the ONNX parser
        assert Path(doc["source"]["onnx"]).is_file()
    plan = doc["inspect"][Path(doc["files"]["plan"]).name]
    assert plan["bindings"] == [] and "GPU" in plan["bindings_note"]


def test_cli_demo_run_part_with_the_memory_backend(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cold/warm part of the demo, end to end on the CPU: the 'built' engine is a memory engine."""
    from trt_runtime import builders
    from trt_runtime.cli import demo

    spec = TensorSpec("x", "float32", (-1, 4), True, profiles=(((1, 4), (2, 4), (8, 4)),))
    out_spec = TensorSpec("logits", "float32", (-1, 4), False)
    data = MemoryBackend.build_engine([spec], [AffineOutput("logits", "x", scale=3.0)], name="affine")
    fake = builders.BuiltEngine(
        data, (spec,), (out_spec,), {}, lambda x: [3.0 * np.asarray(x, np.float64)], name="affine"
    )
    monkeypatch.setattr(demo, "_build_engine", lambda outdir, progress: (fake, {"onnx": None, "why": "test"}))
    code, out, err = _run(capsys, "--json", "demo", "--out", tmp_path, "--backend", "memory")
    assert code == 0, err
    doc = json.loads(out)
    runs = doc["gpu"]["runs"]
    assert doc["gpu"]["ran"] is True and doc["gpu"]["backend"] == "memory"
    assert runs["cold"]["runtime_cache"]["existed_before"] is False
    assert runs["warm"]["runtime_cache"]["existed_before"] is True
    assert runs["cold"]["check"]["ok"] and runs["warm"]["check"]["ok"]
    assert runs["warm"]["check"]["outputs"][0]["max_abs_error"] < 1e-5
    # A wrong reference is caught: exit 1 with one line.
    wrong = builders.BuiltEngine(data, (spec,), (out_spec,), {}, lambda x: [np.asarray(x) * 0], name="affine")
    monkeypatch.setattr(demo, "_build_engine",
                        lambda outdir, progress: (wrong, {"onnx": None, "why": "test"}))
    code, _, err = _run(capsys, "demo", "--out", tmp_path / "again", "--backend", "memory")
    assert code == 1
    assert "do not match the numpy reference" in one_error_line(err)


@pytest.mark.gpu
def test_cli_demo_gpu_runs_cold_and_warm(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    reason = gpu_reason()
    if reason:
        pytest.skip(f"no CUDA GPU: {reason}")
    code, out, err = _run(capsys, "--json", "demo", "--out", tmp_path)
    assert code == 0, err
    doc = json.loads(out)
    runs = doc["gpu"]["runs"]
    assert runs["cold"]["runtime_cache"]["existed_before"] is False
    assert runs["warm"]["runtime_cache"]["existed_before"] is True
    assert runs["warm"]["runtime_cache"]["bytes_after"] > 0
    assert runs["cold"]["check"]["ok"] and runs["warm"]["check"]["ok"]


# -- the installed console script -------------------------------------------------------


def _script() -> str:
    found = Path(sys.executable).with_name("trt-runtime")
    if found.is_file():
        return os.fspath(found)
    which = shutil.which("trt-runtime")
    if which is None:
        pytest.skip("the trt-runtime console script is not installed (pip install -e .)")
    return which


def _script_run(*argv: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_script(), *map(os.fspath, argv)], capture_output=True, text=True, timeout=300,
                          check=False)


def test_cli_entry_point_demo_and_errors(tmp_path: Path) -> None:
    pytest.importorskip("tensorrt_rtx", reason="the demo builds with tensorrt-rtx")
    done = _script_run("--json", "demo", "--out", tmp_path)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert Path(doc["files"]["plan"]).is_file() and Path(doc["files"]["tr01"]).is_file()
    assert doc["gpu"]["ran"] is (not gpu_reason())
    done = _script_run("inspect", tmp_path / "missing.plan")
    assert done.returncode == 1 and done.stdout == ""
    assert one_error_line(done.stderr).endswith(str(tmp_path / "missing.plan"))
    done = _script_run("--quiet", "nope")
    assert done.returncode == 2
    one_error_line(done.stderr)


def test_cli_runs_as_python_dash_m() -> None:
    done = subprocess.run([sys.executable, "-m", "trt_runtime.cli", "--version"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.startswith("trt-runtime "), done.stderr


def test_cli_package_exports_its_public_names() -> None:
    from trt_runtime.cli import (  # noqa: F401
        CliError,
        UsageError,
        backend_report,
        build_parser,
        inspect_file,
        main,
        make_inputs,
    )

    assert callable(main) and issubclass(UsageError, CliError)
    assert sorted(cli.__all__) == sorted(
        ["CliError", "UsageError", "backend_report", "build_parser", "inspect_file", "main", "make_inputs"]
    )
