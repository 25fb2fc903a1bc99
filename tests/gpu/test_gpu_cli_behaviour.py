"""Issue 20 on the GPU host, where the ``python`` backend can run: backend choice by format,
the API's format errors, and what the CLI leaves behind.

On a CPU the same behaviour is proven with the memory backend alone
(tests/cli/test_cli_behaviour.py); here the default order has a backend that runs, so these
check that a ``.mem`` file still goes to ``memory``, a plan to ``python``, and that a
bad file is refused before any backend sees it.
"""

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
from trt_runtime import FormatError, TensorSpec
from trt_runtime.testing.memory import AffineOutput, MemoryBackend


def test_gpu_load_picks_by_format_with_python_available(engines: Any, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRT_RUNTIME_BACKEND", raising=False)  # the pick by format, not a named backend
    plan = engines.path("mlp_fp32")
    with trt.load(plan) as engine:
        assert engine.backend.name == "python"
        x = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)
        assert np.asarray(engine(x)).shape[0] == 8
    spec = TensorSpec("x", "float32", (2, 3), is_input=True)
    mem = tmp_path / "affine.mem"
    mem.write_bytes(MemoryBackend.build_engine([spec], [AffineOutput("y", "x", 2.0, 1.0)], name="affine"))
    with trt.load(mem) as engine:
        assert engine.backend.name == "memory"
    bad = tmp_path / "random.bin"
    bad.write_bytes(np.random.default_rng(1).bytes(4096))
    with pytest.raises(FormatError, match=r"is not an engine file \(unknown magic"):
        trt.load(bad)


def test_gpu_cli_run_and_demo_leave_nothing_in_tmp(engines: Any, tmp_path: Path) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": os.fspath(temp)}
    cli = [sys.executable, "-m", "trt_runtime.cli"]
    plan = engines.path("mlp_fp32")
    done = subprocess.run([*cli, "--json", "run", os.fspath(plan)], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["backend"] == "python"
    done = subprocess.run([*cli, "--json", "demo"], env=env, capture_output=True, text=True, timeout=900,
                          check=False)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["gpu"]["ran"] is True and all(r["check"]["ok"] for r in doc["gpu"]["runs"].values())
    assert list(temp.iterdir()) == []
