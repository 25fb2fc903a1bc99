"""CPU tests of the benchmarks package: arguments, interleaved runner, skips, ratios, targets, output."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the benchmarks package lives next to tests/, not in site-packages
    sys.path.insert(0, str(ROOT))

from benchmarks import cli, cold_warm, environment, report, rows, runner, targets  # noqa: E402
from benchmarks.row_base import Bench, RowSkip, Workbench  # noqa: E402
from benchmarks.workloads import WORKLOADS, Workload, parse_workloads  # noqa: E402
from trt_runtime.bench import summarize  # noqa: E402

# -- doubles ----------------------------------------------------------------------------------


class _Timer:
    def __init__(self, handle: int, log: list[int]) -> None:
        log.append(handle)

    def gate(self, us: float) -> bool:
        return True

    def record(self, index: int) -> None:
        pass

    def elapsed_us(self, first: int, second: int) -> float:
        return 4.0

    def synchronize(self) -> None:
        pass


class _Device:
    """The device hooks the runner uses: synchronize, and a timer per slice (logged by stream)."""

    def __init__(self) -> None:
        self.syncs = 0
        self.slices: list[int] = []

    def synchronize(self) -> None:
        self.syncs += 1

    def timer(self, handle: int) -> _Timer:
        return _Timer(handle, self.slices)


WORKLOAD = Workload("tiny", "test workload", ((8, 16),), 4, "build_tiny", ())


def _workbench(device: _Device, closed: list[str]) -> Workbench:
    built = SimpleNamespace(reference=lambda x: [x * 2.0], tolerance=(1e-6, 1e-6))
    wb = Workbench(WORKLOAD, built, SimpleNamespace(host_input=np.ones(4)), device)
    wb.on_close(lambda: closed.append("workbench"))
    return wb


def _spec(
    name: str,
    stream: int,
    *,
    output: float = 2.0,
    fail_after: int | None = None,
    setup_error: BaseException | None = None,
    warmup_error: bool = False,
    closed: list[str] | None = None,
    needs: tuple[str, ...] = (),
) -> rows.RowSpec:
    """A row whose calls count themselves; it can fail at setup, in warm-up, or after N calls."""
    count = [0]

    def call() -> None:
        count[0] += 1
        if warmup_error or (fail_after is not None and count[0] > fail_after):
            raise RuntimeError(f"{name} broke at call {count[0]}")

    def setup(wb: Workbench) -> Bench:
        if setup_error is not None:
            raise setup_error
        return Bench(
            [call],
            stream,
            close=lambda: (closed if closed is not None else []).append(name),
            check=lambda: np.full(4, output),
            info={"stream": f"s{stream}"},
        )

    return rows.RowSpec(name, name, f"{name}()", needs, setup)


PLAN = runner.Plan(rounds=3, min_rounds=2, latency=7, enqueue_chunks=3, gpu_chunks=2, warmup=2)


def _run(
    specs: list[rows.RowSpec],
    env: environment.Environment | None = None,
    *,
    deadline: float = 1e12,
    clock: Any = None,
) -> tuple[list[runner.RowResult], _Device, list[str]]:
    device, closed = _Device(), list[str]()
    results = runner.run_workload(
        WORKLOAD,
        specs,
        env or environment.Environment(),
        lambda: _workbench(device, closed),
        PLAN,
        deadline,
        **({"clock": clock} if clock else {}),
    )
    return results, device, closed


def _result(
    workload: str, row: str, enqueue: float, latency: float = 50.0, gpu: float = 30.0
) -> runner.RowResult:
    r = runner.RowResult(workload, row, status="ok")
    r.stats = {
        "enqueue": summarize([enqueue] * 3),
        "latency": summarize([latency] * 3),
        "gpu": summarize([gpu] * 3),
    }
    return r


# -- arguments ----------------------------------------------------------------------------------


def test_bench_all_parse_rows_and_workloads_keep_table_order_and_name_the_allowed_set() -> None:
    assert [s.name for s in rows.parse_rows("torchbind, raw-prebound")] == ["raw-prebound", "torchbind"]
    assert parse_workloads("mlp,tiny") == ["mlp", "tiny"]
    with pytest.raises(ValueError, match=r"row must be one of raw-prebound, .*; got 'fast'"):
        rows.parse_rows("raw-prebound,fast")
    with pytest.raises(ValueError, match=r"workload must be one of tiny, mlp, convnet, dynamic; got 'bert'"):
        parse_workloads("bert")
    with pytest.raises(ValueError, match="no row given"):
        rows.parse_rows(" , ")
    assert [w.key for w in WORKLOADS] == ["tiny", "mlp", "convnet", "dynamic"]
    assert all(w.chunk % len(w.shapes) == 0 for w in WORKLOADS)  # every shape timed alike


def test_bench_all_make_config_defaults_quick_and_errors() -> None:
    full = cli.make_config(cli.parse_args(["--out", "o"]), ["--out", "o"])
    assert (full.budget_s, full.pairs, full.plan.rounds, full.plan.latency) == (330.0, 5, 10, 400)
    assert full.rows == tuple(r.name for r in rows.ROWS) and full.workloads == (
        "tiny",
        "mlp",
        "convnet",
        "dynamic",
    )
    assert full.command == "bench_all.py --out o"
    quick = cli.make_config(cli.parse_args(["--quick", "--pairs", "0", "--rows", "python-natural"]), [])
    assert (quick.budget_s, quick.pairs, quick.plan.rounds, quick.rows) == (100.0, 0, 2, ("python-natural",))
    with pytest.raises(ValueError, match=r"--pairs must be >= 0; got -1"):
        cli.make_config(cli.parse_args(["--pairs", "-1"]), [])
    with pytest.raises(ValueError, match=r"--budget-s must be > 0; got 0\.0"):
        cli.make_config(cli.parse_args(["--budget-s", "0"]), [])
    with pytest.raises(ValueError, match="rounds must be an int >= 1; got 0"):
        cli.make_config(cli.parse_args(["--rounds", "0"]), [])
    assert cli.make_config(cli.parse_args(["--rounds", "1"]), []).plan.min_rounds == 1


def test_bench_all_main_exits_2_on_a_bad_argument(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cli.main(["--rows", "nope", "--out", str(tmp_path)]) == 2
    assert "row must be one of" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_bench_all_plan_and_slice_counts() -> None:
    with pytest.raises(ValueError, match="rounds must be an int >= 1; got 0"):
        runner.Plan(rounds=0)
    with pytest.raises(ValueError, match=r"min_rounds \(3\) must be <= rounds \(2\)"):
        runner.Plan(rounds=2, min_rounds=3)
    plan = runner.Plan(rounds=4, latency=400, enqueue_chunks=20, gpu_chunks=2)
    # 1 s per row-round at 100 us per call: 5000 latency calls wanted, capped at 400; chunks of 10
    # calls: 333 wanted, capped at 20; GPU 166 wanted, capped at 2.
    assert runner.slice_counts(plan, 100e-6, 10, 1.0) == (400, 20, 2)
    # 10 ms per row-round at 1 ms per call: 5 latency calls -> floor 10; 0 chunks -> floor 2; GPU floor 1.
    assert runner.slice_counts(plan, 1e-3, 10, 0.01) == (10, 2, 1)
    # 60 ms at 1 ms: 30 latency calls, 20 ms / 10 ms per chunk = 2 chunks, 1 GPU chunk.
    assert runner.slice_counts(plan, 1e-3, 10, 0.06) == (30, 2, 1)
    assert runner.slice_counts(plan, 0.0, 10, 1.0) == (400, 20, 2)


def test_bench_all_budget_counts_down_with_its_clock() -> None:
    now = [100.0]
    budget = runner.Budget(60.0, clock=lambda: now[0])
    now[0] = 130.0
    assert (budget.elapsed(), budget.remaining(), budget.share(3)) == (30.0, 30.0, 10.0)
    now[0] = 200.0
    assert budget.remaining() == 0.0 and budget.share(5) == 0.0
    with pytest.raises(ValueError, match="budget must be > 0 seconds; got 0"):
        runner.Budget(0)


# -- the runner ------------------------------------------------------------------------------


def test_bench_all_runner_measures_interleaved_rows_and_checks_outputs() -> None:
    closed: list[str] = []
    specs = [
        _spec("a", 1, closed=closed),
        _spec("b", 2, closed=closed),
        _spec("c", 3, output=9.0, closed=closed),
    ]
    results, device, wb_closed = _run(specs)
    a, _, c = results
    assert [r.status for r in results] == ["ok", "ok", "ok"]
    assert a.rounds == 3 and a.chunk == 4 and a.call == "a()" and a.info == {"stream": "s1"}
    # per round: 7 latency calls, 3 enqueue chunks, 2 GPU chunks of 4 calls
    assert a.stats["latency"].n == 21 and a.stats["enqueue"].n == 9 and a.stats["gpu"].n == 24
    assert a.drained is not None and a.drained.n == 9
    assert a.stats["gpu"].median == 4.0 and a.gpu_gated
    # one timer per slice, rows rotated each round: a b c, b c a, c a b
    assert device.slices == [1, 2, 3, 2, 3, 1, 3, 1, 2]
    assert a.check.startswith("ok: max abs err 0") and "wrong output" not in a.flags
    assert c.check.startswith("WRONG: max abs err 7") and "wrong output" in c.flags
    assert sorted(closed) == ["a", "b", "c"]  # every bench closed, then the workbench
    assert wb_closed == ["workbench"]


def test_bench_all_runner_keeps_cycling_shapes_across_warm_up_and_slices() -> None:
    order: list[int] = []

    def step(i: int) -> Any:
        return lambda: order.append(i)

    def setup(wb: Workbench) -> Bench:
        return Bench([step(i) for i in range(5)], 1)

    results, _, _ = _run([rows.RowSpec("cycle", "cycle", "cycle()", (), setup)])
    assert results[0].ok and len(order) == 2 + 10 + 3 * (3 * 4 + 7 + 2 * 4)  # warm-up, calibration, 3 rounds
    # warm-up, calibration and every slice of every metric continue one cycle: 0 1 2 3 4 0 1 ...
    assert order == [i % 5 for i in range(len(order))]


def test_bench_all_runner_turns_every_failure_into_a_skipped_row() -> None:
    closed: list[str] = []
    env = environment.Environment(reasons={"backend:torchbind": "the 'torchbind' backend is not installed"})
    specs = [
        _spec("good", 1, closed=closed),
        _spec("unmet", 2, needs=("gpu", "backend:torchbind")),
        _spec("refused", 3, setup_error=RowSkip("no static_inputs()")),
        _spec("crashed", 4, setup_error=KeyError("boom")),
        _spec("cold", 5, warmup_error=True, closed=closed),
        _spec("late", 6, fail_after=40, closed=closed),
    ]
    results, device, _ = _run(specs, env)
    by = {r.row: r for r in results}
    assert by["good"].ok and by["good"].rounds == 3
    assert by["unmet"].note == "skipped: the 'torchbind' backend is not installed"
    assert by["refused"].note == "skipped: no static_inputs()"
    assert by["crashed"].note == "skipped: error in setup: KeyError: 'boom'"
    assert by["cold"].note == "skipped: error in warm-up: RuntimeError: cold broke at call 1"
    late = by["late"]
    assert late.note.startswith("skipped: error while measuring: RuntimeError: late broke at call 41")
    assert late.stats == {} and late.to_dict()["latency_us"] is None
    assert sorted(closed) == ["cold", "good", "late"]  # set-up benches are closed whatever happened
    assert 6 not in device.slices[device.slices.index(6) + 1 :]  # a failed row is not measured again


def test_bench_all_runner_skips_every_row_when_the_workload_cannot_be_built() -> None:
    def broken() -> Workbench:
        raise OSError("no CUDA device")

    specs = [_spec("a", 1), _spec("b", 2, needs=("gpu",))]
    env = environment.Environment(reasons={"gpu": "no CUDA GPU: test"})
    results = runner.run_workload(WORKLOAD, specs, env, broken, PLAN, 1e12)
    assert [r.note for r in results] == [
        "skipped: error building tiny: OSError: no CUDA device",
        "skipped: no CUDA GPU: test",
    ]
    # Nothing runnable: the workbench is never made.
    results = runner.run_workload(WORKLOAD, specs[1:], env, broken, PLAN, 1e12)
    assert results[0].note == "skipped: no CUDA GPU: test"


def test_bench_all_runner_stops_at_the_deadline_after_min_rounds() -> None:
    results, _, _ = _run([_spec("a", 1), _spec("b", 2)], deadline=0.0, clock=lambda: 10.0)
    assert [r.rounds for r in results] == [2, 2]  # past the deadline from the start: min_rounds
    assert results[0].stats["latency"].n == 2 * 7  # slices shrink to the floors (10, or the cap 7)
    assert results[0].stats["enqueue"].n == 2 * 2


def test_bench_all_flags_and_output_checks() -> None:
    r = _result("mlp", "python-natural", enqueue=40.0, gpu=42.0)
    r.gpu_gated = True
    assert runner.flags_for(r) == ["enqueue within 10% of GPU time: may be the GPU's pace"]
    r.stats["enqueue"] = summarize([10.0])
    assert runner.flags_for(r) == []  # CPU-bound well below the GPU time: nothing to say
    r.gpu_gated = False
    assert runner.flags_for(r) == ["GPU time ungated: includes waits for the CPU"]
    assert runner.check_output(np.ones(3), np.ones(3) + 1e-4, (1e-3, 1e-3)) == (True, "max abs err 0.0001")
    assert runner.check_output(np.ones(3), np.zeros(3), (1e-3, 1e-3))[0] is False
    assert runner.check_output(np.ones(3), np.ones(4), (1e-3, 1e-3)) == (
        False,
        "wrong shape (3,), expected (4,)",
    )


def test_bench_all_workbench_shares_objects_and_closes_newest_first() -> None:
    order: list[str] = []
    wb = Workbench(WORKLOAD, None, None, None)
    made = []

    def make(name: str) -> Any:
        def _make() -> tuple[str, Any]:
            made.append(name)
            return name, lambda: order.append(name)

        return _make

    assert wb.shared("engine", make("first")) == "first"
    assert wb.shared("engine", make("second")) == "first"  # built once per workload
    wb.shared("other", make("other"))

    def failing() -> None:
        raise RuntimeError("close failed")

    wb.on_close(failing)  # a failing close does not stop the others
    wb.close()
    assert made == ["first", "other"] and order == ["other", "first"]
    assert wb.expected() is None


# -- ratios and targets -----------------------------------------------------------------------


def _table() -> list[runner.RowResult]:
    out = []
    for w in ("tiny", "mlp"):
        out += [
            _result(w, "raw-prebound", 10.0, latency=20.0),
            _result(w, "raw-bind-alloc", 20.0),
            _result(w, "python-natural", 21.0 if w == "tiny" else 23.0),
            _result(w, "python-prebound", 10.5),
            _result(w, "python-outer-replay", 5.0),
            _result(w, "torchbind", 33.0),
            _result(w, "execute-engine-op", 30.0),
        ]
    return out


def test_bench_all_ratios_are_against_each_reference_of_the_same_workload() -> None:
    results = _table()
    results[1].stats["enqueue"] = summarize([10.0])  # tiny's raw-bind-alloc
    results[9].stats["enqueue"] = summarize([40.0])  # mlp's python-natural, against mlp's (20)
    targets.compute_ratios(results)
    natural = results[2]
    assert natural.ratios["enqueue_vs_bind_alloc"] == pytest.approx(21 / 10)
    assert natural.ratios["enqueue_vs_prebound"] == pytest.approx(2.1)
    assert natural.ratios["latency_vs_prebound"] == pytest.approx(2.5)
    assert natural.ratios["gpu_vs_op"] == pytest.approx(1.0)
    assert results[9].ratios["enqueue_vs_bind_alloc"] == pytest.approx(2.0)
    skipped = runner.RowResult("tiny", "torchbind", status="skipped", reason="x")
    targets.compute_ratios([*results[:7], skipped])
    assert skipped.ratios == {}


def test_bench_all_targets_pass_fail_and_say_what_is_missing() -> None:
    results = _table()
    cache = cold_warm.summarize_pairs(
        [
            {"cold_ms": c, "warm_ms": 50.0, "ratio": c / 50.0, "cache_bytes": 1}
            for c in (900.0, 1100.0, 1000.0)
        ],
        3,
    )
    verdicts = {(t["key"], t["workload"]): t for t in targets.evaluate(results, cache)}
    assert verdicts[("natural", "tiny")]["verdict"] == "PASS"
    assert verdicts[("natural", "tiny")]["detail"] == "21.00 / 20.00 us = 1.05x"
    assert verdicts[("natural", "mlp")]["verdict"] == "FAIL"  # 23 / 20 = 1.15x
    assert verdicts[("prebound", "mlp")]["verdict"] == "PASS"
    assert verdicts[("outer-replay", "tiny")]["value"] == pytest.approx(0.5)
    assert verdicts[("torchbind", "tiny")]["verdict"] == "PASS"  # 33 / 30 = 1.10x, on the limit
    cache_entry = verdicts[("warm-cache", "convnet")]
    assert cache_entry["verdict"] == "PASS" and cache_entry["value"] == pytest.approx(20.0)
    assert "median of 3 pair ratios 20.0x" in cache_entry["detail"]

    results[4].skip("the python engine has no static_inputs()")
    del results[13]  # mlp's execute-engine-op was not run
    later = {
        (t["key"], t["workload"]): t for t in targets.evaluate(results, {"skipped": "no CUDA GPU: test"})
    }
    assert later[("outer-replay", "tiny")]["verdict"] == "n/a"
    assert later[("outer-replay", "tiny")]["detail"] == (
        "not measured: python-outer-replay skipped: the python engine has no static_inputs()"
    )
    assert later[("torchbind", "mlp")]["detail"] == "not measured: execute-engine-op was not run on mlp"
    assert later[("warm-cache", "convnet")]["detail"] == "not measured: no CUDA GPU: test"
    low = cold_warm.summarize_pairs([{"cold_ms": 500.0, "warm_ms": 50.0, "ratio": 10.0, "cache_bytes": 1}], 5)
    assert targets.evaluate([], low)[-1]["verdict"] == "FAIL"


# -- cold vs warm --------------------------------------------------------------------------------


def test_bench_all_cold_warm_pairs_take_the_median_and_stop_cleanly(tmp_path: Path) -> None:
    firsts = iter([1000.0, 50.0, 1200.0, 40.0, 800.0, 50.0])
    seen: list[tuple[str, bool]] = []

    def launch(plan: Path, cache: Path, timeout: float) -> dict[str, Any]:
        seen.append((cache.name, cache.exists()))
        cache.write_bytes(b"c" * 10)
        return {"first_ms": next(firsts), "inputs": "numpy (host)"}

    record = cold_warm.run_pairs(b"plan", 3, tmp_path, launch, deadline=1e12)
    assert [p["ratio"] for p in record["pairs"]] == [20.0, 30.0, 16.0]
    assert record["median_ratio"] == 20.0 and record["median_cold_ms"] == 1000.0
    assert record["median_warm_ms"] == 50.0 and "error" not in record
    # each pair: cold on a missing cache file, warm on the one the cold process saved
    assert seen == [
        ("convnet-0.trtcache", False),
        ("convnet-0.trtcache", True),
        ("convnet-1.trtcache", False),
        ("convnet-1.trtcache", True),
        ("convnet-2.trtcache", False),
        ("convnet-2.trtcache", True),
    ]
    assert (tmp_path / "convnet.plan").read_bytes() == b"plan"

    firsts = iter([1000.0, 50.0])
    timed_out = cold_warm.run_pairs(b"plan", 5, tmp_path, launch, deadline=0.0, clock=lambda: 1.0)
    assert len(timed_out["pairs"]) == 1 and timed_out["error"] == "time budget: ran 1 of 5 pairs"

    def failing(plan: Path, cache: Path, timeout: float) -> dict[str, Any]:
        raise RuntimeError("exited 1: ImportError: no tensorrt_rtx")

    broken = cold_warm.run_pairs(b"plan", 5, tmp_path, failing, deadline=1e12)
    assert broken["skipped"] == "pair 1: RuntimeError: exited 1: ImportError: no tensorrt_rtx"
    assert "median_ratio" not in broken


# -- output ---------------------------------------------------------------------------------------


def _document(status: str = "complete") -> dict[str, Any]:
    results = _table()
    results.append(
        runner.RowResult(
            "tiny",
            "torch-tensorrt-python",
            status="skipped",
            reason="torch_tensorrt does not import: No module named 'dllist'",
        )
    )
    results[0].check = "ok: max abs err 0"
    env = environment.Environment(
        reasons={"torch_tensorrt": "torch_tensorrt does not import: No module named 'dllist'"},
        info={
            "device": "Test GPU",
            "compute_capability": "9.0",
            "driver": 13000,
            "python": "3.12",
            "date": "2026-11-23T06:00:00+00:00",
            "versions": {"tensorrt-rtx": "1.6.1.120", "torch": "2.14.0"},
        },
    )
    cache = cold_warm.summarize_pairs(
        [{"cold_ms": 900.0, "warm_ms": 50.0, "ratio": 18.0, "cache_bytes": 4096}],
        5,
        "time budget: ran 1 of 5 pairs",
    )
    workloads = {
        "tiny": {
            "title": "tiny",
            "engine": "build_tiny(width=16)",
            "shapes": [[8, 16]],
            "chunk": 32,
            "build_s": 0.4,
        }
    }
    return report.make_document(
        env, {"command": "bench_all.py --quick"}, workloads, results, cache, 12.0, status
    )


def test_bench_all_markdown_shows_rows_targets_and_pairs() -> None:
    text = report.render_markdown(_document())
    assert "Environment: Test GPU (sm 9.0); driver 13000; tensorrt-rtx 1.6.1.120; torch 2.14.0" in text
    assert "Run: `bench_all.py --quick`, 12 s, status complete." in text
    assert "`build_tiny(width=16)`, shapes [[8, 16]], chunk 32 calls, built in 0.4 s." in text
    assert (
        "| raw-prebound | 10.00 | 10.00 | 20.00 | 20.00 | 30.00 | 0.50x | 1.00x | 0.33x | 1.00x | ok |  |"
        in text
    )
    assert (
        "| python-natural | 21.00 | 21.00 | 50.00 | 50.00 | 30.00 | 1.05x | 2.10x | 0.70x | 2.50x |  |  |"
        in text
    )
    assert (
        "| torch-tensorrt-python |  |  |  |  |  |  |  |  |  |  | skipped: torch_tensorrt does not import"
        in text
    )
    assert (
        "| python engine(x) <= 1.10x raw bind+alloc loop, or <= +2.0 us | mlp | 23.00 / 20.00 us = 1.15x "
        "| <= 1.10x | **FAIL** |"
    ) in text
    assert "| 1 | 900.0 | 50.0 | 18.0x | 4096 |" in text
    assert (
        "Median of 1 pair ratios: **18.0x**" in text
        and "Stopped early: time budget: ran 1 of 5 pairs." in text
    )


def test_bench_all_write_outputs_replaces_files_and_notes_a_missing_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = _document("running")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    report.write_outputs(doc, tmp_path / "out")
    loaded = json.loads((tmp_path / "out" / "bench_all.json").read_text())
    assert loaded["status"] == "running" and loaded["schema"] == 2
    assert loaded["plot"].startswith("skipped: plotting needs matplotlib")
    assert loaded["unavailable"]["torch_tensorrt"].endswith("No module named 'dllist'")
    row = loaded["rows"][2]
    assert row["row"] == "python-natural" and row["enqueue_us"]["median"] == 21.0
    assert row["ratios"]["enqueue_vs_bind_alloc"] == pytest.approx(1.05) and "samples_us" not in row
    assert [t["verdict"] for t in loaded["targets"]][:2] == ["PASS", "FAIL"]
    assert (tmp_path / "out" / "bench_all.md").read_text() == report.render_markdown(loaded)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["bench_all.json", "bench_all.md"]


def test_bench_all_plot_writes_png(tmp_path: Path) -> None:
    pytest.importorskip(
        "matplotlib", reason="matplotlib is not installed: pip install -c constraints.txt -e '.[plot]'"
    )
    doc = _document()
    target = report.write_plot(doc, tmp_path / "img" / "bench.png")
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and target.stat().st_size > 5000
    doc["rows"] = [r for r in doc["rows"] if r["status"] != "ok"]
    assert report.write_plot(doc, tmp_path / "empty.png").read_bytes()[:4] == b"\x89PNG"


# -- environment and wheels ----------------------------------------------------------------------


def _wheel(folder: Path, module: str) -> Path:
    path = folder / f"{module}-1.0-py3-none-any.whl"
    info = f"{module}-1.0.dist-info"
    files = {
        f"{module}.py": "VALUE = 42\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
        zf.writestr(f"{info}/RECORD", "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n")
    return path


def test_bench_all_install_wheels_appends_a_site_the_host_still_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("pip", reason="pip is needed to install wheels")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "trt_bench_probe_mod")
    monkeypatch.setattr(sys, "path", list(sys.path))
    done = environment.install_wheels(wheels, tmp_path / "site")
    assert done["wheels"] == ["trt_bench_probe_mod-1.0-py3-none-any.whl"]
    assert sys.path[-1] == str(tmp_path / "site")  # appended: modules the host has win
    spec = importlib.util.find_spec("trt_bench_probe_mod")
    assert spec is not None and spec.origin is not None and spec.origin.startswith(str(tmp_path / "site"))
    with pytest.raises(FileNotFoundError, match=r"no \*\.whl files in"):
        environment.install_wheels(tmp_path / "empty")


def test_bench_all_environment_reasons_and_torch_tensorrt_probe() -> None:
    env = environment.Environment(reasons={"gpu": "", "backend:python": "needs tensorrt-rtx"})
    assert env.reason(("gpu", "backend:python", "outer:python")) == "needs tensorrt-rtx"
    assert env.reason(("gpu", "tensorrt")) == ""
    if importlib.util.find_spec("torch_tensorrt") is None:
        assert environment.import_torch_tensorrt_first() == ""
        assert "not installed" in environment.probe().reasons["torch_tensorrt"]
    assert environment.probe("ImportError: no dllist").reasons["torch_tensorrt"] == (
        "torch_tensorrt does not import: ImportError: no dllist"
    )
    assert environment.one_line(ValueError("a\n  b"), 3) == "a b"


# -- the whole command on a machine without a GPU ------------------------------------------------


@pytest.mark.parametrize("entry", [["benchmarks/bench_all.py"], ["-m", "benchmarks"]])
def test_bench_all_cli_without_gpu_records_every_row_as_skipped(tmp_path: Path, entry: list[str]) -> None:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # no GPU, even on a GPU machine
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, *entry, "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "bench_all.json").read_text())
    assert doc["status"] == "complete"
    assert len(doc["rows"]) == len(WORKLOADS) * len(rows.ROWS)
    assert all(r["status"] == "skipped" and len(r["note"]) > len("skipped: ") + 5 for r in doc["rows"])
    assert all(t["verdict"] == "n/a" for t in doc["targets"])
    assert doc["cold_warm"]["skipped"] and doc["environment"]["versions"]["trt-runtime"]
    text = (out / "bench_all.md").read_text()
    assert text.strip() == proc.stdout.strip()
    assert text.count("| skipped: ") == len(doc["rows"])
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "bench.png").read_bytes()[:4] == b"\x89PNG"
    else:
        assert doc["plot"].startswith("skipped: plotting needs matplotlib")
    rendered = subprocess.run(
        [
            sys.executable,
            *entry,
            "--render",
            str(out / "bench_all.json"),
            "--out",
            str(tmp_path / "again"),
            "--no-plot",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
    )
    assert rendered.returncode == 0, rendered.stderr[-2000:]
    assert (tmp_path / "again" / "bench_all.md").read_text().startswith("Environment: ")


def test_bench_all_issue17_targets_take_the_slack_and_the_graph_floor() -> None:
    results = [
        _result("tiny", "raw-bind-alloc", 5.0),
        _result("tiny", "python-natural", 6.8),  # 1.36x but +1.8 us: met by the slack
        _result("tiny", "raw-graph-replay", 2.0),
        _result("tiny", "python-outer-replay", 4.0),  # 2.0x and +2.0 us: missed
        _result("tiny", "torchbind-outer-replay", 5.0),  # 1.25x of the python replay
    ]
    targets.compute_ratios(results)
    assert results[3].ratios["enqueue_vs_graph"] == pytest.approx(2.0)
    verdicts = {(t["key"], t["workload"]): t for t in targets.evaluate(results, None)}
    natural = verdicts[("natural", "tiny")]
    assert natural["verdict"] == "PASS" and natural["detail"].endswith("; +1.80 us <= 2.0 us")
    assert verdicts[("outer-replay-floor", "tiny")]["verdict"] == "FAIL"
    assert verdicts[("torchbind-outer", "tiny")]["verdict"] == "PASS"
    assert verdicts[("natural", "dynamic")]["verdict"] == "n/a"  # every workload has the targets
    assert {"raw-graph-replay", "torchbind-outer-replay"} <= {s.name for s in rows.ROWS}
