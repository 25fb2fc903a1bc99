"""CPU tests of the benchmarks package's results: ratios, targets, cold vs warm pairs, the written
Markdown, JSON and plot, the environment and wheels, and the whole command without a GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from _bench_all_support import ROOT, row_result

from benchmarks import cold_warm, environment, report, rows, runner, targets
from benchmarks.workloads import WORKLOADS
from trt_runtime.bench import summarize

# -- ratios and targets -----------------------------------------------------------------------


def _table() -> list[runner.RowResult]:
    out = []
    for w in ("tiny", "mlp"):
        out += [
            row_result(w, "raw-prebound", 10.0, latency=20.0),
            row_result(w, "raw-bind-alloc", 20.0),
            row_result(w, "python-natural", 21.0 if w == "tiny" else 23.0),
            row_result(w, "python-prebound", 10.5),
            row_result(w, "python-outer-replay", 5.0),
            row_result(w, "torchbind", 33.0),
            row_result(w, "execute-engine-op", 30.0),
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
    def run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, *entry, *args], capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=ROOT)

    proc = run("--quick", "--out", str(out), timeout=120)
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
    rendered = run("--render", str(out / "bench_all.json"), "--out", str(tmp_path / "again"), "--no-plot",
                   timeout=60)
    assert rendered.returncode == 0, rendered.stderr[-2000:]
    assert (tmp_path / "again" / "bench_all.md").read_text().startswith("Environment: ")


def test_bench_all_issue17_targets_take_the_slack_and_the_graph_floor() -> None:
    results = [
        row_result("tiny", "raw-bind-alloc", 5.0),
        row_result("tiny", "python-natural", 6.8),  # 1.36x but +1.8 us: met by the slack
        row_result("tiny", "raw-graph-replay", 2.0),
        row_result("tiny", "python-outer-replay", 4.0),  # 2.0x and +2.0 us: missed
        row_result("tiny", "torchbind-outer-replay", 5.0),  # 1.25x of the python replay
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


def test_bench_all_targets_pair_a_row_with_its_reference_round_by_round() -> None:
    """The verdict is the medians'; ``paired`` and the detail add the per-round differences
    and ratios (a round measures both rows close in time), and a row without rounds has none."""
    raw, ours = row_result("tiny", "raw-prebound", 6.0), row_result("tiny", "python-prebound", 7.6)
    raw.round_medians["enqueue"] = [6.0, 9.0, 6.0, 6.5]
    ours.round_medians["enqueue"] = [7.2, 10.6, 7.5, 7.7]
    verdicts = {(t["key"], t["workload"]): t for t in targets.evaluate([raw, ours], None)}
    prebound = verdicts[("prebound", "tiny")]
    assert prebound["verdict"] == "FAIL"  # 7.6 / 6.0: +1.6 us, whatever the rounds say
    paired = prebound["paired"]
    assert paired["rounds"] == 4
    assert paired["diff_median_us"] == pytest.approx(1.35) and paired["diff_min_us"] == pytest.approx(1.2)
    assert paired["diff_max_us"] == pytest.approx(1.6) and paired["ratio_max"] == pytest.approx(7.5 / 6.0)
    assert prebound["detail"].endswith("; per round (4): +1.35 us (+1.20 to +1.60)")
    raw.round_medians.clear()
    again = {(t["key"], t["workload"]): t for t in targets.evaluate([raw, ours], None)}
    assert "paired" not in again[("prebound", "tiny")]
    assert again[("prebound", "tiny")]["detail"] == "7.60 / 6.00 us = 1.27x"
