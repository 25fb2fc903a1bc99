"""The exit matrix's runner and table on a CPU: a scenario passes only when its process exits 0,
finished its checked work and wrote no error line; the table covers what a clean exit must
survive. The scenarios themselves run on a GPU (tests/gpu/test_gpu_exit.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from trt_runtime.testing.exit_scenarios import (
    SCENARIOS,
    Scenario,
    error_lines,
    prepare_memory,
    run_scenario,
    skip_reason,
)


@pytest.fixture
def memory_work(tmp_path: Path) -> Path:
    """A work folder as ``prepare`` leaves it, with a ``memory`` engine as the MLP."""
    return prepare_memory(tmp_path)


def _scenario(body: str) -> Scenario:
    return Scenario("probe", body, ("memory",))


def test_exit_scenarios_clean_run_passes(memory_work: Path) -> None:
    body = "e = w.load('memory')\nKEEP = [e(w.host()) for _ in range(3)]\nfor y in KEEP:\n    w.check(y)\n"
    result = run_scenario(_scenario(body), memory_work, timeout=120)
    assert result["passed"], result
    assert (result["exit_code"], result["done"], result["error_lines"]) == (0, True, [])


def test_exit_scenarios_wrong_output_fails(memory_work: Path) -> None:
    np.save(memory_work / "mlp_y8.npy", np.zeros((8, 4)))
    result = run_scenario(_scenario("w.check(w.load('memory')(w.host()))\n"), memory_work, timeout=120)
    assert not result["passed"] and result["exit_code"] == 1 and not result["done"]
    assert any("AssertionError" in line for line in result["error_lines"]), result


@pytest.mark.parametrize(
    ("teardown", "code"),
    [
        # dies at teardown after the work was done, as the shutdown crash does
        ("import atexit, os\natexit.register(lambda: os._exit(134))\n", 134),
        # exit 0, but an exception reported during teardown
        ("class D:\n    def __del__(self):\n        raise RuntimeError('invalid resource handle')\n"
         "KEEP = D()\n", 0),
    ],
    ids=["abort-at-exit", "error-at-exit"],
)
def test_exit_scenarios_teardown_failure_fails(memory_work: Path, teardown: str, code: int) -> None:
    result = run_scenario(_scenario(teardown), memory_work, timeout=120)
    assert result["done"] and result["exit_code"] == code and not result["passed"], result


def test_exit_scenarios_timeout_is_a_failure(memory_work: Path) -> None:
    result = run_scenario(_scenario("import time\ntime.sleep(30)\n"), memory_work, timeout=2)
    assert result["exit_code"] is None and not result["passed"]
    assert "timed out after 2 s" in result["stderr_tail"][-1]


def test_exit_scenarios_error_lines() -> None:
    err = ("[W] a TensorRT warning\nterminate called after throwing an instance of 'c10::AcceleratorError'\n"
           "  what():  CUDA error: invalid resource handle\nFatal Python error: Aborted\n")
    assert error_lines(err) == err.splitlines()[1:]
    assert error_lines("UserWarning: ContextOverlapWarning: contexts may overlap\n") == []


def test_exit_scenarios_table_covers_the_matrix() -> None:
    names = [s.name for s in SCENARIOS]
    assert len(names) == len(set(names)) and len(names) >= 20
    for scenario in SCENARIOS:
        ast.parse(scenario.source(), scenario.name)  # every script compiles
    wanted = ["both-backends", "outer-copy", "outer-view", "static-inputs-kept", "never-closed-outputs-kept",
              "closed-twice", "contexts4-threads8", "runtime-cache", "tr01-and-pte",
              "keyboard-interrupt-in-loop", "sys-exit-in-worker", "torch-first", "torch-after", "big",
              "caller-device"]
    for part in wanted:
        assert any(part in name for name in names), part
    for backend in ("python", "torchbind"):
        assert sum(s.backends == (backend,) for s in SCENARIOS) >= 14
    first = next(s for s in SCENARIOS if s.torch_first)
    assert first.source().startswith("import torch\n")
    assert all(not s.source().startswith("import torch") for s in SCENARIOS if not s.torch_first)


def test_exit_scenarios_skip_reasons() -> None:
    two = next(s for s in SCENARIOS if s.gpus == 2)
    assert skip_reason(two, 1, ("python", "torchbind")) == "needs 2 GPUs; this host has 1"
    assert skip_reason(two, 2, ("python", "torchbind")) is None
    both = next(s for s in SCENARIOS if s.name == "big")
    assert skip_reason(both, 1, ("python",)) == "backend(s) torchbind cannot run here"
