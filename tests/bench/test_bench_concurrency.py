"""CPU tests of benchmarks/bench_concurrency.py: the grid, the threaded measurement (on the
memory backend), skipped rows, wrong-output counting, targets and the written files."""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from benchmarks import bench_concurrency
from benchmarks.concurrency_grid import Row, estimate_seconds, evaluate_targets, grid
from trt_runtime.testing.memory import MemoryEngine

ROOT = Path(__file__).resolve().parents[2]

FIELDS = {
    "backend",
    "workload",
    "mode",
    "callers",
    "contexts",
    "calls_per_s",
    "items_per_s",
    "p50_us",
    "p99_us",
    "wrong",
}
SMOKE = [
    "--backend",
    "memory",
    "--duration",
    "0.05",
    "--warmup",
    "0.01",
    "--callers",
    "1,4",
    "--contexts",
    "1,2",
]


def _run(tmp_path: Path, *extra: str, **kw: object) -> dict:
    assert bench_concurrency.main([*SMOKE, "--out", str(tmp_path), *extra], **kw) == 0  # type: ignore[arg-type]
    return json.loads((tmp_path / "bench_concurrency.json").read_text())


def test_bench_concurrency_full_grid_fits_the_budget() -> None:
    rows = grid(("raw", "python", "torchbind"), ("tiny", "mlp", "convnet"), (1, 2, 4, 8, 16), (1, 2, 4, 8))
    # per workload: raw 2 modes x 5 callers, its floors (an output per call) 2 modes x 2 callers,
    # + 2 backends x 2 modes x 4 contexts x 5 callers
    assert len(rows) == 3 * (10 + 4 + 80) == 282
    assert all(r.contexts == r.callers for r in rows if r.backend == "raw")
    floors = [(r.workload, r.mode, r.callers) for r in rows if r.alloc]
    assert all(r.backend == "raw" for r in rows if r.alloc) and len(set(floors)) == len(floors) == 12
    assert {c for _, _, c in floors} == {1, 8} and rows[0].label == "raw" and not rows[0].alloc
    assert estimate_seconds(len(rows), 1.0, 0.2) < 6.5 * 60  # the default run: about 6 minutes


def test_bench_concurrency_memory_smoke_rows(tmp_path: Path) -> None:
    doc = _run(tmp_path)
    assert doc["status"] == "complete"
    assert doc["environment"]["date"].endswith("+00:00")  # when it ran, in UTC
    rows = doc["rows"]
    assert len(rows) == 2 * 2 * 2  # modes x contexts x callers
    assert all(FIELDS <= set(r) for r in rows)
    measured = rows  # the memory backend has supports_multiple_contexts: contexts 2 runs too
    assert all(r["skipped"] is None and r["calls_per_s"] > 0 and r["wrong"] == 0 for r in measured)
    assert all(
        r["p50_us"] <= r["p99_us"] and r["items_per_s"] == pytest.approx(8 * r["calls_per_s"], rel=0.01)
        for r in measured
    )
    assert all(r["checked"] >= r["callers"] for r in measured)  # every caller's first output is checked
    assert all(r["cpu_us_per_call"] > 0 for r in measured)
    if sys.platform == "linux":  # getrusage(RUSAGE_THREAD): the callers' context switches per call
        assert all(r["switches_per_call"] is not None and r["switches_per_call"] >= 0 for r in measured)
    assert {r["mode"] for r in rows} == {"eager", "outer"} and {r["contexts"] for r in rows} == {1, 2}
    markdown = (tmp_path / "bench_concurrency.md").read_text()
    assert "| memory | outer | 4 | 1 |" in markdown and "## Targets" in markdown
    zero = next(t for t in doc["targets"] if t["target"].startswith("0 wrong"))
    assert zero["status"] == "met"


class _CrossTalk(MemoryEngine):
    """Answers a call with the result of whatever call finished last."""

    def execute(self, *inputs, stream=None, outputs=None):
        self.last = self.compute(list(inputs))
        time.sleep(0.0002)
        return [r.copy() for r in self.last]

    def __call__(self, *inputs, stream=None, outputs=None):
        return self.execute(*inputs)[0]  # around the core's lease, as a broken backend could


class _BrokenMemory(bench_concurrency._Memory):
    def __init__(self) -> None:
        super().__init__()
        self.engine.__class__ = _CrossTalk


class _Raising(MemoryEngine):
    """Fails every call: a caller error, not a wrong output."""

    def __call__(self, *inputs, stream=None, outputs=None):
        raise RuntimeError("boom in the engine")


class _RaisingMemory(bench_concurrency._Memory):
    def __init__(self) -> None:
        super().__init__()
        self.engine.__class__ = _Raising


def test_bench_concurrency_counts_caller_errors_apart_from_wrong_outputs(tmp_path: Path) -> None:
    doc = _run(tmp_path, memory_factory=_RaisingMemory)
    rows = doc["rows"]
    assert rows and all(r["wrong"] == 0 and r["errors"] == r["callers"] for r in rows)
    assert all("boom in the engine" in (r["skipped"] or r["note"] or "") for r in rows)
    zero = next(t for t in doc["targets"] if t["target"].startswith("0 wrong"))
    assert zero["status"] == "missed" and "caller error" in zero["detail"]


class _OneContextMemory(bench_concurrency._Memory):
    """The smoke workload on a memory backend without ``supports_multiple_contexts``."""

    def __init__(self) -> None:
        from trt_runtime import EngineSource, TensorSpec
        from trt_runtime.testing.memory import AffineOutput, MemoryBackend

        self.backend = MemoryBackend(without=("supports_multiple_contexts",))
        data = MemoryBackend.build_engine(
            [TensorSpec("x", "float32", (8, 16), True)], [AffineOutput("y", "x", scale=2.0, bias=1.0)]
        )
        self.engine = self.backend.load_engine(EngineSource(data, name="tiny"))


def test_bench_concurrency_skips_contexts_a_backend_lacks(tmp_path: Path) -> None:
    doc = _run(tmp_path, memory_factory=_OneContextMemory)
    skipped = [r for r in doc["rows"] if r["contexts"] == 2]
    assert skipped and all("lacks supports_multiple_contexts" in r["skipped"] for r in skipped)
    assert all(r["skipped"] is None for r in doc["rows"] if r["contexts"] == 1)


def test_bench_concurrency_counts_wrong_outputs(tmp_path: Path) -> None:
    doc = _run(tmp_path, "--check-every", "1", memory_factory=_BrokenMemory)
    four = [r for r in doc["rows"] if r["callers"] == 4 and r["contexts"] == 1]
    assert four and all(r["wrong"] > 0 for r in four)
    # how far off: a cross-talk output is another thread's, far beyond rounding
    assert all(r["wrong_diff"] > 1e-2 for r in four)
    assert all(r["wrong_diff"] is None for r in doc["rows"] if not r["wrong"])
    zero = next(t for t in doc["targets"] if t["target"].startswith("0 wrong"))
    assert zero["status"] == "missed" and "memory/tiny" in zero["detail"] and "of the peak" in zero["detail"]


def test_bench_concurrency_unavailable_backend_is_skipped_not_fatal(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(bench_concurrency, "_backend_reason", lambda name: f"no {name} here")
    code = bench_concurrency.main(
        [
            "--backend",
            "python,torchbind",
            "--workloads",
            "tiny",
            "--callers",
            "1",
            "--contexts",
            "1",
            "--out",
            str(tmp_path),
            "--no-plot",
        ]
    )
    assert code == 0
    rows = json.loads((tmp_path / "bench_concurrency.json").read_text())["rows"]
    assert {r["skipped"] for r in rows} == {"no python here", "no torchbind here"}


def test_bench_concurrency_plot_needs_matplotlib(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(bench_concurrency, "_plot_reason", lambda: "matplotlib is not installed")
    doc = _run(tmp_path)
    assert doc["plot"] == "matplotlib is not installed"
    assert not (tmp_path / "bench_concurrency.png").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--callers", "0"], "--callers must be comma-separated integers >= 1; got '0'"),
        (["--backend", "fast"], "--backend must be some of raw, python, torchbind, or memory; got 'fast'"),
        (["--backend", "memory,raw"], "--backend memory (the CPU smoke mode) runs alone"),
        (["--workloads", "huge", "--backend", "raw"], "--workloads must be some of tiny, mlp, convnet"),
        (["--duration", "0"], "--duration must be > 0; got 0.0"),
    ],
)
def test_bench_concurrency_bad_arguments(argv: list[str], message: str, capsys, tmp_path: Path) -> None:
    assert bench_concurrency.main([*argv, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def _row(backend: str, mode: str, callers: int, contexts: int, calls: float, workload: str = "tiny",
         alloc: bool = False) -> Row:
    return Row(
        backend,
        workload,
        mode,
        callers,
        contexts,
        calls_per_s=calls,
        items_per_s=calls * 8,
        p50_us=1.0,
        p99_us=2.0,
        wrong=0,
        checked=1,
        alloc=alloc,
    )


def test_bench_concurrency_targets_met_missed_and_na() -> None:
    rows = [
        _row("raw", "eager", 1, 1, 10_000),
        _row("raw", "eager", 8, 8, 10_000),
        _row("raw", "outer", 1, 1, 20_000),
        _row("python", "eager", 1, 1, 9_000),
        _row("python", "eager", 8, 1, 5_000),
        _row("python", "eager", 8, 4, 8_500),  # the best contexts at 8 callers counts
        _row("python", "outer", 1, 1, 9_000),
        _row("python", "outer", 8, 1, 7_000),
    ]
    status = {t["target"]: t["status"] for t in evaluate_targets(rows)}
    assert status["no collapse: python tiny eager, best contexts at 8 callers >= 0.9x 1 caller"] == "met"
    assert status["no collapse: python tiny outer, best contexts at 8 callers >= 0.9x 1 caller"] == "missed"
    assert status["near raw: python tiny eager 8 callers >= 0.8x raw 8 threads"] == "met"
    assert status["near raw: python tiny eager 1 caller >= 0.8x raw 1 thread"] == "met"
    assert status["near raw: python tiny outer 1 caller >= 0.5x bare replay + sync"] == "missed"  # 0.45x
    assert status["0 wrong outputs in every row"] == "met"
    rows[4].wrong = 3
    assert evaluate_targets(rows)[0]["status"] == "missed"
    alone = evaluate_targets([_row("python", "eager", 1, 1, 9_000)])
    assert {t["status"] for t in alone[1:]} == {"n/a"}
    assert all("floor_ratio" not in t for t in evaluate_targets(rows))  # no floor rows measured


def test_bench_concurrency_floors_stand_beside_targets_and_never_replace_raw() -> None:
    """The raw loops that make an output per call (``alloc``) are shown beside the targets,
    never taken as the raw reference the targets name."""
    floor = functools.partial(_row, alloc=True)
    rows = [
        _row("raw", "eager", 1, 1, 10_000),
        _row("raw", "eager", 8, 8, 10_000),
        floor("raw", "eager", 1, 1, 50_000),  # faster than the bound loop: must not become the reference
        floor("raw", "eager", 8, 8, 30_000),
        _row("raw", "outer", 1, 1, 20_000),
        floor("raw", "outer", 1, 1, 16_000),
        floor("raw", "outer", 8, 8, 8_000),
        _row("python", "eager", 1, 1, 9_000),
        _row("python", "eager", 8, 2, 6_000),
        _row("python", "outer", 1, 1, 12_000),
        _row("python", "outer", 8, 8, 6_000),
    ]
    got = {t["target"]: t for t in evaluate_targets(rows)}
    eager = got["no collapse: python tiny eager, best contexts at 8 callers >= 0.9x 1 caller"]
    assert eager["status"] == "missed" and eager["ratio"] == pytest.approx(6 / 9, abs=1e-3)
    assert eager["floor_ratio"] == pytest.approx(0.6) and "makes its output per call" in eager["detail"]
    outer = got["no collapse: python tiny outer, best contexts at 8 callers >= 0.9x 1 caller"]
    assert outer["floor_ratio"] == pytest.approx(0.5)
    near = got["near raw: python tiny eager 8 callers >= 0.8x raw 8 threads"]
    assert near["ratio"] == pytest.approx(0.6)  # over the bound raw loop (10,000), not the floor
    assert near["floor_ratio"] == pytest.approx(0.2)  # python 6,000 over the floor's 30,000
    one = got["near raw: python tiny eager 1 caller >= 0.8x raw 1 thread"]
    assert one["ratio"] == pytest.approx(0.9) and "floor_ratio" not in one
    replay = got["near raw: python tiny outer 1 caller >= 0.5x bare replay + sync"]
    assert replay["ratio"] == pytest.approx(0.6)  # over the bare replay (20,000)
    markdown = bench_concurrency.render_markdown({"rows": [r.to_dict() for r in rows], "targets": []})
    assert "| raw+alloc | eager | 8 | 8 | 30,000 |" in markdown
    assert "| raw | eager | 8 | 8 | 10,000 |" in markdown


def test_bench_concurrency_module_runs_from_the_repo_root(tmp_path: Path) -> None:
    import subprocess

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench_concurrency",
            *SMOKE,
            "--callers",
            "2",
            "--contexts",
            "1",
            "--out",
            str(tmp_path),
            "--no-plot",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "met  0 wrong outputs in every row" in result.stdout
    assert (tmp_path / "bench_concurrency.json").exists()
    assert np.isfinite(
        json.loads((tmp_path / "bench_concurrency.json").read_text())["rows"][0]["calls_per_s"]
    )


def test_bench_concurrency_thread_inputs_distinct_and_computed_once() -> None:
    from types import SimpleNamespace

    from benchmarks.concurrency_callers import thread_inputs

    calls: list[int] = []

    def reference(x):
        calls.append(1)
        return [2.0 * x]

    built = SimpleNamespace(reference=reference)
    first, want = thread_inputs(built, (2, 3), 0)
    again, _ = thread_inputs(built, (2, 3), 0)
    other, _ = thread_inputs(built, (2, 3), 1)
    assert again is first and not np.array_equal(first, other)  # one input per thread
    assert first.dtype == np.float32 and want.dtype == np.float64
    np.testing.assert_allclose(want, 2.0 * first.astype(np.float64))
    assert len(calls) == 2


def test_bench_concurrency_repeat_measures_each_row_in_interleaved_passes(tmp_path: Path, capsys) -> None:
    doc = _run(tmp_path, "--repeat", "3")
    assert doc["config"]["repeat"] == 3
    rows = doc["rows"]
    assert len(rows) == 8 and all(r["skipped"] is None for r in rows)
    for r in rows:
        runs = r["runs"]
        assert len(runs) == 3 and all(v > 0 for v in runs)
        assert r["calls_per_s"] == sorted(runs)[1]  # the median pass's figures
        assert r["checked"] >= 3 * r["callers"]  # every pass checks each caller's first output
    log = capsys.readouterr().err
    # passes interleave: every row's first pass comes before any row's second
    first_of_second = log.index("pass 2/3")
    assert log.count("pass 1/3") == 8 and log.rindex("pass 1/3") < first_of_second
    assert "3 interleaved passes" in (tmp_path / "bench_concurrency.md").read_text()


def test_bench_concurrency_repeat_sums_wrong_outputs_of_every_pass(tmp_path: Path) -> None:
    doc = _run(tmp_path, "--repeat", "2", "--check-every", "1", memory_factory=_BrokenMemory)
    four = [r for r in doc["rows"] if r["callers"] == 4 and r["contexts"] == 1]
    assert four and all(r["wrong"] > 0 and len(r["runs"]) == 2 for r in four)


def test_bench_concurrency_merge_runs_takes_the_median_pass_and_sums_checks() -> None:
    from benchmarks.concurrency_grid import merge_runs

    passes = [_row("python", "eager", 8, 8, v) for v in (300.0, 100.0, 200.0, 400.0)]
    passes[0].p50_us, passes[2].p50_us = 7.0, 9.0
    passes[3].wrong, passes[3].wrong_diff, passes[1].errors = 2, 0.25, 1
    skipped = Row("python", "tiny", "eager", 8, 8, skipped="budget of 5 s spent")
    row = merge_runs(Row("python", "tiny", "eager", 8, 8), [*passes, skipped])
    assert row.calls_per_s == 200.0 and row.p50_us == 9.0  # lower middle of 100, 200, 300, 400
    assert row.runs == [300.0, 100.0, 200.0, 400.0] and row.skipped is None
    assert (row.checked, row.wrong, row.wrong_diff, row.errors) == (4, 2, 0.25, 1)
    none = merge_runs(Row("python", "tiny", "eager", 8, 8), [skipped])
    assert none.skipped == "budget of 5 s spent" and not none.ok


def test_bench_concurrency_refuses_repeat_below_one(capsys, tmp_path: Path) -> None:
    assert bench_concurrency.main([*SMOKE, "--repeat", "0", "--out", str(tmp_path)]) == 2
    assert "--repeat >= 1" in capsys.readouterr().err
