"""The exit matrix on the GPU host: each scenario of trt_runtime.testing.exit_scenarios in a
process of its own exits 0, finishes its checked work and writes no error line to stderr
(the same table ``tools/gpu_exit_matrix.py`` runs). docs/reliability.md, "Ending cleanly, and
the caller's device"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trt_runtime.testing.exit_scenarios import SCENARIOS, Scenario, prepare, run_scenario, skip_reason

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="session")
def exit_work(tmp_path_factory: pytest.TempPathFactory, python_backend: Any) -> Path:
    """The scenarios' engines, built once per session on this GPU host."""
    return prepare(tmp_path_factory.mktemp("exit-matrix"), logger=python_backend.logger)


@pytest.fixture(scope="session")
def host_gpus_and_backends(python_backend: Any) -> tuple[int, list[str]]:
    from cuda.bindings import runtime

    import trt_runtime

    err, count = runtime.cudaGetDeviceCount()
    status = trt_runtime.backend_status()
    return (int(count) if int(err) == 0 else 0), [b for b in ("python", "torchbind") if status.get(b)]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_gpu_exit_scenario_ends_cleanly(
    scenario: Scenario, exit_work: Path, host_gpus_and_backends: tuple[int, list[str]]
) -> None:
    reason = skip_reason(scenario, *host_gpus_and_backends)
    if reason:
        pytest.skip(reason)
    result = run_scenario(scenario, exit_work)
    detail = "\n".join(["stderr:", *result["stderr_tail"], "stdout:", *result["stdout_tail"]])
    assert result["exit_code"] == 0, f"{scenario.name} exited {result['exit_code']}\n{detail}"
    assert result["done"], f"{scenario.name} did not finish its work\n{detail}"
    assert not result["error_lines"], f"{scenario.name} wrote errors\n{detail}"
