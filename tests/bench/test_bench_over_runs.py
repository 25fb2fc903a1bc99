"""CPU tests of ``python -m benchmarks --over-runs``: the per-call targets over several runs'
results, with each run judged by the rule a single run's report uses."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from _bench_all_support import row_result

from benchmarks import cli, over_runs, report, targets

PREBOUND = next(t for t in targets.TARGETS if t.key == "prebound")
TORCHBIND = next(t for t in targets.TARGETS if t.key == "torchbind")


def _document(prebound: tuple[float, float] | None, op: tuple[float, float] = (30.0, 31.0)) -> dict[str, Any]:
    """A results document as bench_all writes it (rows through ``RowResult.to_dict``, targets
    through ``targets.evaluate``) of the tiny workload: ``prebound`` is (python-prebound,
    raw-prebound) enqueue µs, ``None`` when the python row was skipped; ``op`` is (torchbind,
    execute-engine-op)."""
    results = [row_result("tiny", "raw-prebound", prebound[1] if prebound else 6.0),
               row_result("tiny", "torchbind", op[0]), row_result("tiny", "execute-engine-op", op[1])]
    if prebound is None:
        skipped = row_result("tiny", "python-prebound", 1.0)
        skipped.skip("the python engine exposes no .stream")
        results.append(skipped)
    else:
        results.append(row_result("tiny", "python-prebound", prebound[0]))
    targets.compute_ratios(results)
    return {"schema": 2, "rows": [r.to_dict() for r in results], "targets": targets.evaluate(results, None)}


def _entry(entries: list[over_runs.TargetOverRuns], target: targets.Target, workload: str
           ) -> over_runs.TargetOverRuns:
    return next(e for e in entries if e.target is target and e.workload == workload)


def _run_verdict(document: dict[str, Any], key: str, workload: str) -> str:
    return next(e["verdict"] for e in document["targets"] if e["key"] == key and e["workload"] == workload)


def test_over_runs_counts_each_run_as_its_own_report_judged_it() -> None:
    docs = [_document((8.0, 6.0)), _document((7.4, 6.2)), _document((10.0, 8.7)), _document(None)]
    entry = _entry(over_runs.over_runs(docs), PREBOUND, "tiny")
    per_run = [_run_verdict(doc, "prebound", "tiny") for doc in docs]
    assert per_run == ["FAIL", "PASS", "PASS", "n/a"]
    assert entry.met == 2 and len(entry.pairs()) == 3  # the skipped run is not a run that measured it
    table = over_runs.render_over_runs([entry], ["a", "b", "c", "d"])
    assert "| 2 of 3 |" in table
    assert "+2.00 µs FAIL | +1.20 µs PASS | +1.30 µs PASS | n/a |" in table


def test_over_runs_pairs_each_row_with_its_own_runs_reference() -> None:
    # the differences are +2.0, +1.2, +1.3: their median (+1.3) meets +1.5, while the
    # difference of the medians (8.0 - 6.2 = +1.8) would not: a slow run's row must be
    # compared with that slow run's reference
    docs = [_document((8.0, 6.0)), _document((7.4, 6.2)), _document((10.0, 8.7))]
    entry = _entry(over_runs.over_runs(docs), PREBOUND, "tiny")
    ratio, difference = entry.medians()  # type: ignore[misc]
    assert difference == pytest.approx(1.3)
    assert ratio == pytest.approx(statistics.median([8.0 / 6.0, 7.4 / 6.2, 10.0 / 8.7]))
    assert entry.met_at_median() is True
    assert "+1.30 µs: **PASS**" in over_runs.render_over_runs([entry], ["a", "b", "c"])
    slow = [_document((9.0, 6.0)), _document((9.0, 6.0))]
    worse = _entry(over_runs.over_runs([*docs, *slow]), PREBOUND, "tiny")
    assert worse.met_at_median() is False  # +2.0, +1.2, +1.3, +3.0, +3.0: the median +2.0


def test_over_runs_judges_a_ratio_target_by_its_ratio() -> None:
    docs = [_document((7.0, 6.0), op=(33.0, 30.0)), _document((7.0, 6.0), op=(34.0, 30.0))]
    entry = _entry(over_runs.over_runs(docs), TORCHBIND, "tiny")
    assert [_run_verdict(d, "torchbind", "tiny") for d in docs] == ["PASS", "FAIL"]
    assert entry.met == 1
    table = over_runs.render_over_runs([entry], ["a", "b"])
    assert "1.10x PASS | 1.13x FAIL |" in table
    assert "1.12x: **FAIL**" in table  # the median of 1.10x and 1.13x, over the limit; no µs slack shown
    assert "µs" not in table.split("\n")[-2]


def test_over_runs_names_the_targets_no_run_measured_below_the_table() -> None:
    entries = over_runs.over_runs([_document(None), _document(None)])
    entry = _entry(entries, PREBOUND, "tiny")
    assert entry.medians() is None and entry.met_at_median() is None
    table = over_runs.render_over_runs(entries, ["a", "b"])
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [row.split(" | ")[1] for row in rows if row.startswith(f"| {TORCHBIND.title} |")] == ["tiny"]
    assert not any(row.startswith(f"| {PREBOUND.title} |") for row in rows)
    last = table.splitlines()[-1]
    assert last.startswith("Measured in no run: ")
    assert f"{PREBOUND.title} (tiny, mlp, convnet, dynamic); " in last
    assert f"{TORCHBIND.title} (mlp, convnet, dynamic); " in last  # its tiny row was measured


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", r"not JSON \(Expecting property name"),
        ("[1, 2]", "expected a bench_all.json object; got a JSON list"),
        ('{"schema": 1, "rows": []}', "expected a bench_all.json of schema 2; got schema 1"),
        ('{"schema": 2, "rows": {}}', "needs a list 'rows'; got {}"),
    ],
)
def test_over_runs_refuses_a_file_that_is_not_a_results_document(tmp_path: Path, content: str, message: str
                                                                 ) -> None:
    path = tmp_path / "bench_all.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as info:
        report.read_document(path)
    assert str(path) in str(info.value)
    with pytest.raises(ValueError, match="cannot read it"):
        report.read_document(tmp_path / "missing.json")


def test_over_runs_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = []
    for i, pair in enumerate([(8.0, 6.0), (7.4, 6.2), (10.0, 8.7)]):
        paths.append(tmp_path / f"run{i}.json")
        paths[-1].write_text(json.dumps(_document(pair)))
    assert cli.main(["--over-runs", *map(str, paths)]) == 0
    out = capsys.readouterr().out
    assert f"1. {paths[0]}, 2. {paths[1]}, 3. {paths[2]}" in out
    assert "| tiny | 2 of 3 | 1.19x, +1.30 µs: **PASS** |" in out
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    assert cli.main(["--over-runs", str(paths[0]), str(bad)]) == 2
    assert f"bench_all.py: {bad}: expected a bench_all.json object" in capsys.readouterr().err
    assert cli.main(["--render", str(bad), "--out", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()  # refused before anything is written
