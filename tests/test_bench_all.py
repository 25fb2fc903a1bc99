"""CPU tests of benchmarks/bench_all.py: statistics, budgeting, planning, skip reasons, output."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trt_runtime import TensorSpec
from trt_runtime.testing.memory import AffineOutput, MemoryBackend

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_all.py"


def _load() -> Any:
    spec = importlib.util.spec_from_file_location("bench_all", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_all"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


bench_all = _load()


def _row(workload: str, strategy: str, runner: str, median: float, b2b: float, gpu: float | None) -> Any:
    row = bench_all.Row(workload, strategy, runner)
    samples = [median] * 5
    row.record(bench_all.Measurement(bench_all.summarize(samples), samples, b2b, gpu, ""), 5, 1)
    return row


# -- statistics -------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=1e6, allow_nan=False), min_size=1, max_size=200))
def test_bench_all_summarize_matches_numpy(samples: list[float]) -> None:
    s = bench_all.summarize(samples)
    assert s.n == len(samples)
    for value, q in ((s.median, 50), (s.p90, 90), (s.p99, 99)):
        assert value == pytest.approx(float(np.percentile(samples, q)), rel=1e-9, abs=1e-9)
    assert s.mean == pytest.approx(float(np.mean(samples)), rel=1e-9, abs=1e-9)
    assert (s.min, s.max) == (min(samples), max(samples))
    assert s.min <= s.median <= s.p90 <= s.p99 <= s.max


def test_bench_all_summarize_rejects_empty() -> None:
    with pytest.raises(ValueError, match="empty list of samples"):
        bench_all.summarize([])


def test_bench_all_plan_iterations_fits_share_and_clamps() -> None:
    plan = bench_all.plan_iterations
    # 3 loops of n calls at 1 ms must fit 3 s -> 1000 calls
    assert plan(1e-3, 3.0, min_iterations=10, max_iterations=5000) == 1000
    assert plan(1e-3, 3.0, min_iterations=10, max_iterations=200) == 200
    assert plan(1.0, 3.0, min_iterations=10, max_iterations=200) == 10
    assert plan(0.0, 3.0, min_iterations=10, max_iterations=200) == 200
    with pytest.raises(ValueError, match="min_iterations <= max_iterations"):
        plan(1e-3, 1.0, min_iterations=50, max_iterations=10)


def test_bench_all_budget_counts_down_with_its_clock() -> None:
    now = [100.0]
    budget = bench_all.Budget(60.0, clock=lambda: now[0])
    assert budget.remaining() == 60.0
    now[0] = 130.0
    assert budget.elapsed() == 30.0
    assert budget.share(3) == pytest.approx(10.0)
    now[0] = 200.0
    assert budget.remaining() == 0.0 and budget.share(5) == 0.0
    with pytest.raises(ValueError, match="budget must be > 0 seconds; got 0"):
        bench_all.Budget(0)


# -- measuring --------------------------------------------------------------------------------


def test_bench_all_measure_cycles_calls_and_synchronizes() -> None:
    counts = [0, 0, 0]
    syncs = [0]
    gpu_batches: list[int] = []

    def make(i: int) -> Any:
        def call() -> None:
            counts[i] += 1

        return call

    def timer(run: Any, n: int) -> tuple[float, str]:
        gpu_batches.append(n)
        run()
        return 12.5, ""

    m = bench_all.measure(
        [make(0), make(1), make(2)], lambda: syncs.__setitem__(0, syncs[0] + 1), iterations=7, gpu_timer=timer
    )
    assert m.latency.n == 7 and len(m.samples_us) == 7
    # latency loop, back-to-back loop and GPU loop each make 7 calls: shapes 0,1,2,0,1,2,0
    assert counts == [9, 6, 6]
    assert syncs[0] == 7 + 2  # one per latency call, one before and one after back to back
    assert gpu_batches == [7] and m.gpu_us == 12.5
    assert m.back_to_back_us > 0


def test_bench_all_measure_latency_includes_the_synchronize() -> None:
    m = bench_all.measure([lambda: None], lambda: time.sleep(0.002), iterations=4)
    assert m.latency.median >= 2000.0
    assert m.gpu_us is None and m.gpu_note == "no GPU timer"
    with pytest.raises(ValueError, match="iterations must be >= 1"):
        bench_all.measure([lambda: None], lambda: None, iterations=0)


def test_bench_all_backend_bench_runs_a_memory_engine() -> None:
    spec = TensorSpec("x", "float32", (4,), True)
    plan = MemoryBackend.build_engine([spec], [AffineOutput("y", "x", scale=2.0, bias=1.0)])
    bench = bench_all.backend_bench("memory", plan, "affine", "whole_graph_capture", [np.ones(4, np.float32)])
    engine = bench.info["engine"]
    assert bench.stream_handle is None and bench.info["call"] == "execute(x)"
    assert engine.runtime_settings.cuda_graph_strategy.value == "whole_graph_capture"
    sync = bench_all.make_sync(bench.stream_handle, bench.sync)
    per_call = bench_all.calibrate(bench.calls, sync, warmup=3)
    assert per_call > 0
    m = bench_all.measure(bench.calls, sync, iterations=20)
    assert m.latency.n == 20
    assert engine.context_creations == 1
    np.testing.assert_allclose(bench.calls[0]()[0], np.full(4, 3.0, np.float32))
    bench.close()
    with pytest.raises(ValueError, match="needs a synchronize function"):
        bench_all.make_sync(None, None)


class _CpuDevice:
    """run_rows' device hooks on the CPU: every row runs a memory-backend engine, except
    the runners told to fail."""

    def __init__(self, failures: dict[str, BaseException]) -> None:
        spec = TensorSpec("x", "float32", (4,), True)
        self.plan = MemoryBackend.build_engine([spec], [AffineOutput("y", "x", scale=2.0)])
        self.failures = failures
        self.attempts: list[str] = []
        self.synchronized = 0

    def scope(self) -> Any:
        import contextlib

        return contextlib.nullcontext()

    def bench(self, row: Any) -> Any:
        self.attempts.append(row.runner)
        if row.runner in self.failures:
            raise self.failures[row.runner]
        x = np.ones(4, np.float32)
        return bench_all.backend_bench("memory", self.plan, row.runner, row.strategy, [x])

    def timer(self, handle: int) -> Any:  # pragma: no cover - memory benches have no stream
        raise AssertionError("no stream, no GPU timer")

    def synchronize(self) -> None:
        self.synchronized += 1


def _config(**overrides: Any) -> Any:
    values = dict(
        workloads=["mlp_b8"],
        strategies=["eager", "whole_graph_capture"],
        runners=list(bench_all.RUNNERS),
        budget_s=30.0,
        max_iterations=40,
        min_iterations=5,
        warmup=2,
        cold_warm=False,
    )
    values.update(overrides)
    return bench_all.Config(**values)


def test_bench_all_run_rows_measures_and_turns_failures_into_skipped_rows() -> None:
    config = _config()
    rows = bench_all.plan_rows(config.workloads, config.strategies, config.runners)
    env = bench_all.Environment(
        backends={"python": ("", ""), "torchbind": ("", "torch-tensorrt-rtx >= 2.13 adds it")},
    )
    device = _CpuDevice(
        {
            "torchbind-op": RuntimeError("execute_engine exploded"),
            "torch-tensorrt-python": ImportError("no module named torch_tensorrt._C"),
        }
    )
    device.failures["raw"] = bench_all._Skip("raw loop not wanted in this test")
    bench_all.run_rows(rows, env, config, bench_all.Budget(30.0), device=device)
    by = {(r.strategy, r.runner): r for r in rows}
    for strategy in ("eager", "whole_graph_capture"):
        python = by[(strategy, "python")]
        assert python.ok and python.iterations == 40 and python.latency.n == 40
        assert python.gpu_us is None and python.info["call"] == "execute(x)"
        assert by[(strategy, "raw")].note == "skipped: raw loop not wanted in this test"
    assert by[("eager", "torchbind")].ok
    assert "no cuda_graph_strategy here" in by[("whole_graph_capture", "torchbind")].note
    assert by[("eager", "torchbind-op")].note == "skipped: error: RuntimeError: execute_engine exploded"
    tt = [by[(s, "torch-tensorrt-python")] for s in ("eager", "whole_graph_capture")]
    assert all("torch_tensorrt does not import: no module named torch_tensorrt._C" in r.note for r in tt)
    assert device.attempts.count("torch-tensorrt-python") == 1  # a failed import is not retried
    assert device.synchronized == len(device.attempts)


def test_bench_all_run_rows_stops_at_the_budget() -> None:
    now = [0.0]
    budget = bench_all.Budget(10.0, clock=lambda: now[0])
    now[0] = 9.5
    config = _config(runners=["python"])
    rows = bench_all.plan_rows(config.workloads, config.strategies, config.runners)
    env = bench_all.Environment(backends={"python": ("", "")})
    bench_all.run_rows(rows, env, config, budget, device=_CpuDevice({}))
    assert [r.note for r in rows] == ["skipped: time budget of 10 s exhausted"] * 2


# -- planning and skipping ------------------------------------------------------------------


def test_bench_all_plan_rows_puts_raw_first_and_torch_tensorrt_last() -> None:
    rows = bench_all.plan_rows(
        ["mlp_b8", "dynamic_3"], ["eager", "whole_graph_capture"], list(reversed(bench_all.RUNNERS))
    )
    assert len(rows) == 2 * 2 * len(bench_all.RUNNERS)
    assert [r.runner for r in rows[:5]] == ["raw", "python", "python-call", "torchbind", "torchbind-op"]
    assert all(r.runner == "torch-tensorrt-python" for r in rows[-4:])
    assert all(r.runner != "torch-tensorrt-python" for r in rows[:-4])
    assert {(r.workload, r.strategy) for r in rows} == {
        (w, s) for w in ("mlp_b8", "dynamic_3") for s in ("eager", "whole_graph_capture")
    }
    with pytest.raises(ValueError, match=r"runner must be one of .*got 'fast'"):
        bench_all.plan_rows(["mlp_b8"], ["eager"], ["fast"])
    with pytest.raises(ValueError, match=r"strategy must be one of .*got 'graphs'"):
        bench_all.plan_rows(["mlp_b8"], ["graphs"], ["raw"])
    with pytest.raises(ValueError, match=r"workload must be one of .*got 'bert'"):
        bench_all.plan_rows(["bert"], ["eager"], ["raw"])


def test_bench_all_skip_reasons_name_what_is_missing() -> None:
    Env, Row = bench_all.Environment, bench_all.Row
    no_gpu = Env(gpu_reason="no CUDA GPU: test")
    assert all(
        bench_all.skip_reason(Row("mlp_b8", s, r), no_gpu) == "no CUDA GPU: test"
        for r in bench_all.RUNNERS
        for s in bench_all.STRATEGIES
    )
    env = Env(
        raw_cuda_graph_reason="tensorrt 10 has no CudaGraphStrategy",
        backends={"python": ("", ""), "torchbind": ("", "torch-tensorrt-rtx >= 2.13 adds it")},
        tt_python_reason="torch_tensorrt is not installed",
    )
    reason = bench_all.skip_reason
    assert reason(Row("mlp_b8", "eager", "raw"), env) == ""
    assert reason(Row("mlp_b8", "whole_graph_capture", "raw"), env) == "tensorrt 10 has no CudaGraphStrategy"
    assert reason(Row("mlp_b8", "whole_graph_capture", "python"), env) == ""
    assert reason(Row("mlp_b8", "eager", "torchbind-op"), env) == ""
    assert "2.13 adds it" in reason(Row("mlp_b8", "whole_graph_capture", "torchbind-op"), env)
    assert "no cuda_graph_strategy" in reason(Row("mlp_b8", "whole_graph_capture", "torchbind"), env)
    assert reason(Row("conv_b1", "eager", "torch-tensorrt-python"), env) == "torch_tensorrt is not installed"
    missing = Env(backends={"python": ("the 'python' backend needs tensorrt-rtx", "")})
    assert reason(Row("mlp_b8", "eager", "python"), missing) == "the 'python' backend needs tensorrt-rtx"
    assert reason(Row("mlp_b8", "eager", "torchbind"), missing) == "the 'torchbind' backend is not installed"


def test_bench_all_cold_warm_is_skipped_with_the_reason() -> None:
    budget = bench_all.Budget(10.0)
    no_gpu = bench_all.Environment(gpu_reason="no CUDA GPU: test")
    assert bench_all.run_cold_warm(no_gpu, budget) == {"skipped": "no CUDA GPU: test"}
    no_python = bench_all.Environment(backends={"python": ("needs tensorrt-rtx", "")})
    assert bench_all.run_cold_warm(no_python, budget) == {"skipped": "needs tensorrt-rtx"}
    assert "not installed" in bench_all.run_cold_warm(bench_all.Environment(), budget)["skipped"]


# -- ratios, goals, output ------------------------------------------------------------------


def _measured_rows() -> list[Any]:
    rows = [
        _row("mlp_b8", "eager", "raw", 50.0, 40.0, 30.0),
        _row("mlp_b8", "eager", "python", 54.0, 44.0, 30.0),
        _row("mlp_b8", "eager", "torchbind-op", 100.0, 80.0, 31.0),
        _row("mlp_b8", "whole_graph_capture", "raw", 20.0, 10.0, 9.0),
        _row("mlp_b8", "whole_graph_capture", "python", 30.0, 12.0, 9.0),
    ]
    skipped = bench_all.Row("mlp_b8", "whole_graph_capture", "torchbind-op")
    skipped.skip("torch-tensorrt-rtx 2.11 has no update_runtime_settings")
    return [*rows, skipped]


def test_bench_all_ratios_are_against_raw_and_the_op_of_the_same_strategy() -> None:
    rows = _measured_rows()
    bench_all.compute_ratios(rows)
    python_eager, op_eager, python_graphs = rows[1], rows[2], rows[4]
    assert python_eager.ratios["latency_vs_raw"] == pytest.approx(54 / 50)
    assert python_eager.ratios["back_to_back_vs_raw"] == pytest.approx(44 / 40)
    assert python_eager.ratios["gpu_vs_raw"] == pytest.approx(1.0)
    assert python_eager.ratios["latency_vs_torchbind_op"] == pytest.approx(0.54)
    assert op_eager.ratios["latency_vs_raw"] == pytest.approx(2.0)
    assert "latency_vs_torchbind_op" not in op_eager.ratios
    assert python_graphs.ratios["latency_vs_raw"] == pytest.approx(1.5)
    assert "latency_vs_torchbind_op" not in python_graphs.ratios  # its op row was skipped
    assert rows[5].ratios == {}


def test_bench_all_goals_pass_fail_and_name_missing_rows() -> None:
    rows = _measured_rows()
    bench_all.compute_ratios(rows)
    cache = {"cold": {"first_ms": 1300.0}, "warm": {"first_ms": 50.0}, "ratio": 26.0}
    goals = bench_all.check_goals(rows, cache)
    assert [g.verdict for g in goals] == ["PASS", "PASS", "PASS"]
    assert goals[0].value == pytest.approx(1.08) and goals[1].value == pytest.approx(0.54)
    assert "26.0x" in goals[2].detail

    slow = [
        _row("mlp_b8", "eager", "raw", 50.0, 40.0, 30.0),
        _row("mlp_b8", "eager", "python", 60.0, 44.0, 30.0),
    ]
    op = bench_all.Row("mlp_b8", "eager", "torchbind-op")
    op.skip("the 'torchbind' backend is not installed")
    bench_all.compute_ratios([*slow, op])
    goals = bench_all.check_goals([*slow, op], {"skipped": "no CUDA GPU: test"})
    assert [g.verdict for g in goals] == ["FAIL", "n/a", "n/a"]
    assert "torchbind-op row skipped: the 'torchbind' backend is not installed" in goals[1].detail
    assert goals[2].detail == "not measured: no CUDA GPU: test"
    assert "not planned" in bench_all.check_goals([], None)[0].detail


def test_bench_all_markdown_and_json_hold_every_row(tmp_path: Path) -> None:
    rows = _measured_rows()
    env = bench_all.Environment(
        info={
            "device": "Test GPU",
            "compute_capability": "9.0",
            "driver": 13000,
            "python": "3.12",
            "date": "2026-11-21T06:00:00+00:00",
            "versions": {"tensorrt-rtx": "1.6.1.120", "torch": "2.14.0"},
        }
    )
    cache = {"cold": {"first_ms": 1300.0}, "warm": {"first_ms": 100.0}, "ratio": 13.0, "cache_bytes": 4096}
    doc = bench_all.make_document(env, rows, cache, {"command": "bench_all.py --quick"}, 12.0)
    text = bench_all.render_markdown(doc)
    assert "Test GPU (sm 9.0); driver 13000; tensorrt-rtx 1.6.1.120; torch 2.14.0" in text
    assert "| mlp_b8 | eager | python | 5 | 54.0 | 54.0 | 54.0 | 44.0 | 30.0 | 1.08x | 1.10x |  |" in text
    assert "skipped: torch-tensorrt-rtx 2.11 has no update_runtime_settings" in text
    assert "| mlp_b8 | eager | python | 0.54x | 0.55x | 0.97x |" in text
    assert "cold 1300.0 ms, warm 100.0 ms: **13.0x** (cache 4096 bytes)" in text
    assert "| >= 20x | cold 1300.0 ms / warm 100.0 ms = 13.0x | FAIL |" in text
    path = bench_all.write_json(doc, tmp_path / "out" / "bench.json")
    loaded = json.loads(path.read_text())
    assert loaded["environment"]["device"] == "Test GPU"
    assert [r["runner"] for r in loaded["rows"]] == [r.runner for r in rows]
    assert loaded["rows"][1]["samples_us"] == [54.0] * 5
    assert loaded["rows"][1]["latency_us"]["p99"] == 54.0
    assert loaded["rows"][5]["status"] == "skipped" and loaded["rows"][5]["latency_us"] is None
    assert [g["verdict"] for g in loaded["goals"]] == ["PASS", "PASS", "FAIL"]


def test_bench_all_plot_writes_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is not installed: pip install 'trt-runtime[plot]'")
    rows = _measured_rows()
    doc = bench_all.make_document(bench_all.Environment(), rows, None, {}, 1.0)
    target = bench_all.write_plot(doc, tmp_path / "img" / "bench.png")
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert target.stat().st_size > 5000
    for row in rows:
        row.skip("no CUDA GPU: test")
    empty = bench_all.make_document(bench_all.Environment(), rows, None, {}, 1.0)
    assert bench_all.write_plot(empty, tmp_path / "empty.png").read_bytes()[:4] == b"\x89PNG"


# -- the whole script on a machine without a GPU --------------------------------------------


def test_bench_all_cli_without_gpu_reports_skipped_rows(tmp_path: Path) -> None:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # no GPU, even on a GPU machine
    out = tmp_path / "bench.json"
    md = tmp_path / "bench.md"
    png = tmp_path / "bench.png"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--quick",
            "--json",
            str(out),
            "--markdown",
            str(md),
            "--plot",
            str(png),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert len(doc["rows"]) == len(bench_all.WORKLOADS) * len(bench_all.STRATEGIES) * len(bench_all.RUNNERS)
    assert all(r["status"] == "skipped" for r in doc["rows"])
    assert all(
        r["note"].startswith("skipped: ") and len(r["note"]) > len("skipped: ") + 5 for r in doc["rows"]
    )
    assert all(g["verdict"] == "n/a" for g in doc["goals"])
    assert doc["cold_warm"]["skipped"]
    assert doc["environment"]["versions"]["trt-runtime"]
    text = md.read_text()
    assert text.strip() == proc.stdout.strip()
    assert text.count("| skipped: ") == len(doc["rows"])
    if importlib.util.find_spec("matplotlib") is not None:
        assert png.read_bytes()[:4] == b"\x89PNG"
    else:
        assert doc["plot"].startswith("skipped: plotting needs matplotlib")
