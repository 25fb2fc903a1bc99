"""Ratios between rows of one workload, and the per-call overhead targets as PASS / FAIL / n/a.

Every ratio is a median over a median, both from the same run and workload. Targets
compare per-call CPU cost with no synchronize (``enqueue``), the figure the issue's
numbers are; latency and GPU ratios are reported beside them. Beside each target's
verdict (which the medians decide) its ``paired`` figures say how steady the comparison
was: the row against its reference round by round (each round measures both, close in
time), as the median, lowest and highest of the per-round differences and ratios.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .runner import METRICS, RowResult

__all__ = ["CACHE_TARGET", "REFERENCES", "TARGETS", "Target", "compute_ratios", "evaluate"]

#: Reference row -> suffix of the ratio keys against it (``enqueue_vs_bind_alloc``...).
REFERENCES = {
    "raw-bind-alloc": "bind_alloc", "raw-prebound": "prebound", "execute-engine-op": "op",
    "raw-graph-replay": "graph", "python-outer-replay": "python_replay",
}


@dataclasses.dataclass(frozen=True)
class Target:
    """``row / reference`` of ``metric`` medians must be ``<= limit`` on each workload."""

    key: str
    title: str
    row: str
    reference: str
    metric: str
    limit: float
    workloads: tuple[str, ...]
    #: Also met when ``row - reference`` is at most this many µs (raw calls of a few µs).
    slack_us: float | None = None

    def met_by(self, ratio: float, difference_us: float) -> bool:
        """The rule: ``ratio`` (row / reference) within the limit, or ``difference_us``
        (row - reference) within the slack."""
        return ratio <= self.limit or (self.slack_us is not None and difference_us <= self.slack_us)


_ALL = ("tiny", "mlp", "convnet", "dynamic")
TARGETS = (
    Target("natural", "python engine(x) <= 1.10x raw bind+alloc loop, or <= +2.0 us",
           "python-natural", "raw-bind-alloc", "enqueue", 1.10, _ALL, 2.0),
    Target("prebound", "python execute(x, outputs=[y], stream=engine.stream) <= 1.10x raw pre-bound loop, "
           "or <= +1.5 us", "python-prebound", "raw-prebound", "enqueue", 1.10, _ALL, 1.5),
    Target("outer-replay", "outer-graph replay <= 0.60x raw pre-bound loop",
           "python-outer-replay", "raw-prebound", "enqueue", 0.60, ("tiny", "mlp")),
    Target("torchbind", "torchbind engine(x) <= 1.10x bare execute_engine op",
           "torchbind", "execute-engine-op", "enqueue", 1.10, _ALL),
    Target("outer-replay-floor", "python outer replay <= 1.10x a bare CUDA-graph replay, or <= +1.5 us",
           "python-outer-replay", "raw-graph-replay", "enqueue", 1.10, _ALL, 1.5),
    Target("torchbind-outer", "torchbind outer replay <= 1.3x the python outer replay",
           "torchbind-outer-replay", "python-outer-replay", "enqueue", 1.30, _ALL),
)
#: Warm runtime cache first inference must be at least this many times faster than cold
#: (median of the fresh-process pairs' ratios).
CACHE_TARGET = 20.0


def compute_ratios(results: Iterable[RowResult]) -> None:
    """Fill each measured row's ``ratios``: ``<metric>_vs_<suffix>`` against every
    measured reference row of :data:`REFERENCES` in the same workload."""
    results = list(results)
    anchors = {(r.workload, r.row): r for r in results if r.ok and r.row in REFERENCES}
    for result in results:
        result.ratios.clear()
        if not result.ok:
            continue
        for reference, suffix in REFERENCES.items():
            anchor = anchors.get((result.workload, reference))
            if anchor is None:
                continue
            for metric in METRICS:
                mine, theirs = result.median(metric), anchor.median(metric)
                if mine is not None and theirs:
                    result.ratios[f"{metric}_vs_{suffix}"] = mine / theirs


def _find(results: Sequence[RowResult], workload: str, row: str) -> RowResult | None:
    return next((r for r in results if r.workload == workload and r.row == row), None)


def _why_missing(result: RowResult | None, workload: str, row: str) -> str:
    if result is None:
        return f"{row} was not run on {workload}"
    return f"{row} {result.note}" if not result.ok else f"{row} has no {workload} figure"


def _verdict(passed: bool | None) -> str:
    return "n/a" if passed is None else ("PASS" if passed else "FAIL")


def evaluate(results: Sequence[RowResult], cold_warm: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """One entry per (target, workload) and one for the cache, each with ``value``,
    ``verdict`` (PASS / FAIL / n/a) and a ``detail`` naming the figures or what is missing."""
    out: list[dict[str, Any]] = []
    for target in TARGETS:
        for workload in target.workloads:
            row = _find(results, workload, target.row)
            ref = _find(results, workload, target.reference)
            entry: dict[str, Any] = {
                "key": target.key, "title": target.title, "workload": workload, "row": target.row,
                "reference": target.reference, "metric": target.metric, "comparison": "<=",
                "limit": target.limit, "value": None,
            }
            mine = None if row is None or not row.ok else row.median(target.metric)
            theirs = None if ref is None or not ref.ok else ref.median(target.metric)
            if mine is None:
                entry["detail"] = "not measured: " + _why_missing(row, workload, target.row)
            elif not theirs:
                entry["detail"] = "not measured: " + _why_missing(ref, workload, target.reference)
            else:
                value = mine / theirs
                entry["value"] = value
                entry["detail"] = f"{mine:.2f} / {theirs:.2f} us = {value:.2f}x"
                if target.slack_us is not None and value > target.limit and mine - theirs <= target.slack_us:
                    entry["detail"] += f"; +{mine - theirs:.2f} us <= {target.slack_us} us"
                paired = None if row is None or ref is None else _paired(row, ref, target.metric)
                if paired is not None:
                    entry["paired"] = paired
                    entry["detail"] += (
                        f"; per round ({paired['rounds']}): {paired['diff_median_us']:+.2f} us "
                        f"({paired['diff_min_us']:+.2f} to {paired['diff_max_us']:+.2f})"
                    )
            passed = None if mine is None or not theirs else target.met_by(mine / theirs, mine - theirs)
            entry["verdict"] = _verdict(passed)
            out.append(entry)
    out.append(_cache_entry(cold_warm))
    return out


def _paired(row: RowResult, ref: RowResult, metric: str) -> dict[str, Any] | None:
    """``row`` against ``ref`` round by round (their ``round_medians``, paired by round):
    the number of rounds and the median, lowest and highest difference (µs) and ratio;
    ``None`` when either has none."""
    mine, theirs = row.round_medians.get(metric, []), ref.round_medians.get(metric, [])
    pairs = [(a, b) for a, b in zip(mine, theirs, strict=False) if b > 0]
    if not pairs:
        return None
    diffs = [a - b for a, b in pairs]
    ratios = [a / b for a, b in pairs]
    return {
        "rounds": len(pairs),
        "diff_median_us": statistics.median(diffs), "diff_min_us": min(diffs), "diff_max_us": max(diffs),
        "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
    }


def _cache_entry(cold_warm: Mapping[str, Any] | None) -> dict[str, Any]:
    record = dict(cold_warm or {})
    entry: dict[str, Any] = {
        "key": "warm-cache", "title": "warm runtime cache first inference >= 20x faster than cold",
        "workload": record.get("workload", "convnet"), "row": "python (fresh processes)",
        "reference": "cold", "metric": "first inference", "comparison": ">=", "limit": CACHE_TARGET,
        "value": None,
    }
    ratio = record.get("median_ratio")
    if ratio is None:
        entry["detail"] = "not measured: " + str(record.get("skipped", "not run"))
    else:
        entry["value"] = float(ratio)
        entry["detail"] = (
            f"median of {len(record.get('pairs', []))} pair ratios {float(ratio):.1f}x "
            f"(median cold {record['median_cold_ms']:.1f} ms, warm {record['median_warm_ms']:.1f} ms)"
        )
    passed = None if entry["value"] is None else entry["value"] >= CACHE_TARGET
    entry["verdict"] = _verdict(passed)
    return entry
