"""The per-call targets over several runs: ``python -m benchmarks --over-runs A.json B.json ...``.

One run's verdict on a target of a few µs moves with the host: between two runs on one
machine minutes apart the raw pre-bound tiny loop has moved from 6.2 to 8.1 µs. This reads
the ``bench_all.json`` documents of several runs and says, per target and workload:

* in how many runs the target was met, by the rule a single run's report applies
  (:meth:`.targets.Target.met_by`);
* that rule applied to the medians over the runs of the ratio row / reference and of the
  difference row - reference, each run's row set against that run's reference;
* each run's figure, in the order given.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from .report import row_stat
from .targets import TARGETS, Target

__all__ = ["RunFigure", "TargetOverRuns", "over_runs", "render_over_runs"]

@dataclasses.dataclass(frozen=True)
class RunFigure:
    """One run's row and reference medians (µs) of a target's metric on a workload; ``None``
    where the run did not measure that row."""

    row_us: float | None
    reference_us: float | None


@dataclasses.dataclass(frozen=True)
class TargetOverRuns:
    """A target on a workload over the runs: each run's :class:`RunFigure`, and its rule
    applied to the medians over the runs that measured it."""

    target: Target
    workload: str
    runs: tuple[RunFigure, ...]

    def pairs(self) -> list[tuple[float, float]]:
        """``(row µs, reference µs)`` of each run that measured both rows."""
        return [(run.row_us, run.reference_us) for run in self.runs
                if run.row_us is not None and run.reference_us]

    @property
    def met(self) -> int:
        """In how many runs the target's rule held (as :func:`~.targets.evaluate` decides it)."""
        return sum(self.target.met_by(row / ref, row - ref) for row, ref in self.pairs())

    def medians(self) -> tuple[float, float] | None:
        """The median over the measured runs of the ratio row / reference and of the
        difference row - reference (µs): each run's row against that run's reference."""
        pairs = self.pairs()
        if not pairs:
            return None
        return (statistics.median(row / ref for row, ref in pairs),
                statistics.median(row - ref for row, ref in pairs))

    def met_at_median(self) -> bool | None:
        """The target's rule on :meth:`medians`: the ratio within its limit, or the
        difference within its slack (``None``: no run measured it)."""
        medians = self.medians()
        if medians is None:
            return None
        return self.target.met_by(*medians)


def _figure(document: Mapping[str, Any], target: Target, workload: str) -> RunFigure:
    measured = {row.get("row"): row_stat(row, target.metric) for row in document["rows"]
                if row.get("workload") == workload and row.get("status") == "ok"}
    return RunFigure(measured.get(target.row), measured.get(target.reference))


def over_runs(documents: Sequence[Mapping[str, Any]]) -> list[TargetOverRuns]:
    """Every per-call target on each of its workloads over ``documents`` (in that order)."""
    return [TargetOverRuns(target, workload, tuple(_figure(doc, target, workload) for doc in documents))
            for target in TARGETS for workload in target.workloads]


def _run_cell(target: Target, run: RunFigure) -> str:
    if run.row_us is None or not run.reference_us:
        return "n/a"
    ratio, difference = run.row_us / run.reference_us, run.row_us - run.reference_us
    figure = f"{difference:+.2f} µs" if target.slack_us is not None else f"{ratio:.2f}x"
    return f"{figure} {'PASS' if target.met_by(ratio, difference) else 'FAIL'}"


def _median_cell(entry: TargetOverRuns) -> str:
    medians = entry.medians()
    if medians is None:
        return "not measured"
    ratio, difference = medians
    text = f"{ratio:.2f}x" + (f", {difference:+.2f} µs" if entry.target.slack_us is not None else "")
    return f"{text}: **{'PASS' if entry.met_at_median() else 'FAIL'}**"


def render_over_runs(entries: Sequence[TargetOverRuns], names: Sequence[str]) -> str:
    """A Markdown table: target, workload, runs met, the rule on the medians over the runs,
    then each run's figure (the difference for a target with a µs slack, else the ratio);
    a last line names the targets no run measured (their rows were skipped or not asked for)."""
    lines = [f"Runs, in order: {', '.join(f'{i}. {name}' for i, name in enumerate(names, 1))}.", "",
             "| target | workload | met | medians over the runs | " + " | ".join(
                 str(i) for i in range(1, len(names) + 1)) + " |",
             "| --- | --- | ---: | --- | " + " | ".join("---" for _ in names) + " |"]
    unmeasured: dict[str, list[str]] = {}
    for entry in entries:
        if not entry.pairs():
            unmeasured.setdefault(entry.target.title, []).append(entry.workload)
            continue
        cells = [entry.target.title, entry.workload, f"{entry.met} of {len(entry.pairs())}",
                 _median_cell(entry), *(_run_cell(entry.target, run) for run in entry.runs)]
        lines.append("| " + " | ".join(cells) + " |")
    if unmeasured:
        lines += ["", "Measured in no run: " + "; ".join(
            f"{title} ({', '.join(workloads)})" for title, workloads in unmeasured.items()) + "."]
    return "\n".join(lines) + "\n"
