"""benchmarks/probes/gpu_exit_abort_probe.py on a CPU: its ``--smoke`` run over the memory
backend (processes of their own, the exit hook's report read back), its GPU variants (one
hypothesis each, the matrix's own script where it says so) and its summary of aborted runs."""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from trt_runtime.testing.exit_scenarios import SCENARIOS

PROBE = Path(__file__).resolve().parents[2] / "benchmarks" / "probes" / "gpu_exit_abort_probe.py"


@pytest.fixture(scope="module")
def probe() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_exit_abort_probe", PROBE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclass looks its module up)
    spec.loader.exec_module(module)
    return module


def test_exit_abort_probe_smoke_reports_the_exit_hook_per_process(probe: ModuleType, tmp_path: Path) -> None:
    assert probe.main(["--smoke", "--n", "2", "--jobs", "2", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "exit_abort_probe.json").read_text())
    rows = {row["variant"]: row for row in summary["variants"]}
    loop, unhooked, blocking = rows["memory-loop"], rows["memory-no-hook"], rows["memory-blocking-hook"]
    assert (loop["runs"], loop["passed"], loop["exit_codes"]) == (2, 2, {"0": 2})
    assert (loop["hook_reports"], loop["hook_held_all"], loop["hook_gave_up"]) == (2, 2, 0)
    assert loop["hook_wait_max_s"] < 1.0
    assert (unhooked["passed"], unhooked["hook_reports"]) == (2, 0)  # the hook was unregistered
    assert (blocking["passed"], blocking["hook_reports"]) == (2, 2)  # the old hook's own report


def test_exit_abort_probe_variants_isolate_one_thing_each(probe: ModuleType) -> None:
    variants = {v.name: v for v in probe.gpu_variants()}
    table = {s.name: s for s in SCENARIOS}
    for backend in ("torchbind", "python"):
        assert variants[f"{backend}-scenario"].scenario is table[f"{backend}-daemon-thread-calling-at-exit"]
        assert variants[f"{backend}-scenario"].env == ()
    assert variants["torchbind-scenario-1gpu"].scenario is table["torchbind-daemon-thread-calling-at-exit"]
    assert dict(variants["torchbind-scenario-1gpu"].env) == {"CUDA_VISIBLE_DEVICES": "0"}
    for strategy in ("lazy", "eager", "none"):
        source = variants[f"torchbind-dynamic-{strategy}"].scenario.source()
        assert "'torchbind', 'dynamic', (2, 5, 8, 20)" in source
        assert f"STRATEGY, SYNC, HOOK = {strategy!r}, False, 'hand-over'" in source
    assert "'', True, 'hand-over'" in variants["torchbind-sync"].scenario.source()
    assert "'', False, 'none'" in variants["torchbind-no-hook"].scenario.source()
    assert "'', False, 'blocking'" in variants["torchbind-blocking-hook"].scenario.source()
    assert "'', False, 'last'" in variants["torchbind-last-hook"].scenario.source()
    assert len(variants) == 11
    for variant in variants.values():
        ast.parse(variant.scenario.source())


def test_exit_abort_probe_summary_counts_aborts_and_a_hook_that_gave_up(probe: ModuleType) -> None:
    def result(code: int, hook: list[str], errors: list[str]) -> dict[str, object]:
        return {"exit_code": code, "passed": code == 0 and not errors, "hook_lines": hook,
                "error_lines": errors, "wall_s": 7.5, "stderr_head": ["head"]}

    gave_up = "trt_runtime: at interpreter exit, lanes still in a call after 5.0 s: 'mlp' (1 of 1)"
    aborted = result(-6, [gave_up,
                          "trt_runtime exit hook: held 0 of 1 lane(s) of 1 engine(s) in 5.001 s"],
                     ["terminate called without an active exception", "Fatal Python error: Aborted"])
    clean = result(0, ["trt_runtime exit hook: held 1 of 1 lane(s) of 1 engine(s) in 0.002 s"], [])
    row = probe.summarize("v", [aborted, clean, clean])
    assert row["exit_codes"] == {"-6": 1, "0": 2}
    assert (row["passed"], row["hook_reports"], row["hook_held_all"], row["hook_gave_up"]) == (2, 3, 2, 1)
    assert row["hook_wait_max_s"] == 5.001
    assert row["first_error_lines"][0] == "terminate called without an active exception"
    assert row["stderr_head_of_a_failure"] == ["head"]
