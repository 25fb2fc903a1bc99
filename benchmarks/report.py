"""A run's results as one JSON document, Markdown tables and a PNG plot.

:func:`write_outputs` writes ``bench_all.json``, ``bench_all.md`` and ``bench.png`` to a
folder, replacing each file atomically, so it can be called after every workload and a
run cut short still leaves its results so far. The plot needs matplotlib; without it the
document says why there is no plot (``python -m benchmarks --render bench_all.json``
draws it later on a machine that has it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .environment import Environment
from .rows import ROWS_BY_NAME
from .runner import RowResult
from .targets import compute_ratios, evaluate

__all__ = ["JSON_NAME", "MARKDOWN_NAME", "PLOT_NAME", "make_document", "read_document", "render_markdown",
           "row_stat", "write_outputs", "write_plot"]

JSON_NAME, MARKDOWN_NAME, PLOT_NAME = "bench_all.json", "bench_all.md", "bench.png"
#: The version of the results document :func:`make_document` writes.
SCHEMA = 2

METHOD = {
    "enqueue": "per-call CPU cost with no synchronize: chunks of `chunk` back-to-back calls timed, one "
               "untimed device synchronize after each chunk (so CUDA's launch queue never fills); median "
               "over chunks",
    "latency": "one call + device synchronize, per call; median",
    "gpu": "CUDA events recorded on the row's stream before and after each call of a chunk, behind a "
           "spin kernel so the whole chunk is queued before the GPU starts; median per call",
    "order": "all rows of a workload set up first, then measured in interleaved rounds",
    "paired": "a target's row against its reference round by round (the medians of each round's "
              "samples, both measured in that round): the median, lowest and highest difference and "
              "ratio, beside the verdict, which the medians over all rounds decide",
}


def make_document(
    env: Environment,
    config: Mapping[str, Any],
    workloads: Mapping[str, Any],
    results: Sequence[RowResult],
    cold_warm: Mapping[str, Any] | None,
    wall_s: float,
    status: str,
    *,
    samples: bool = False,
) -> dict[str, Any]:
    """The JSON document of a run (``status``: ``"running"`` while partial, ``"complete"``)."""
    compute_ratios(results)
    return {
        "schema": SCHEMA,
        "status": status,
        "environment": dict(env.info),
        "unavailable": dict(env.reasons),
        "config": dict(config),
        "wall_s": round(wall_s, 1),
        "method": METHOD,
        "workloads": dict(workloads),
        "rows": [r.to_dict(samples) for r in results],
        "cold_warm": dict(cold_warm or {}),
        "targets": evaluate(results, cold_warm),
    }


def _fmt(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _x(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def environment_line(info: Mapping[str, Any]) -> str:
    """Device, driver, versions, Python and date on one line."""
    versions = info.get("versions", {})
    parts = [
        f"{info.get('device', 'no GPU')}"
        + (f" (sm {info['compute_capability']})" if info.get("compute_capability") else ""),
        f"driver {info.get('driver', '?')}",
    ]
    # Module versions stand in where a stack is on sys.path without its dist-info.
    fallback = {"tensorrt-rtx": info.get("tensorrt_module"), "torch": info.get("torch_module")}
    for dist in ("tensorrt-rtx", "torch", "torch-tensorrt-rtx", "torch-tensorrt", "cuda-core", "trt-runtime"):
        if versions.get(dist):
            parts.append(f"{dist} {versions[dist]}")
        elif fallback.get(dist):
            parts.append(f"{dist} (module {fallback[dist]})")
    parts.append(f"Python {info.get('python', '?')}")
    parts.append(str(info.get("date", "")))
    return "; ".join(parts)


def row_stat(row: Mapping[str, Any], metric: str, field: str = "median") -> float | None:
    """A row's ``field`` of ``metric`` (µs) in a results document; ``None`` when not measured."""
    stats = row.get(f"{metric}_us")
    return None if not stats else stats.get(field)


def read_document(path: str | Path) -> dict[str, Any]:
    """A ``bench_all.json`` document; ``ValueError`` naming ``path`` and what it lacks when
    the file cannot be read, is not JSON, or is not a schema-2 document with its rows."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from exc
    if not isinstance(document, dict):
        raise ValueError(f"{path}: expected a bench_all.json object; got a JSON {type(document).__name__}")
    if document.get("schema") != SCHEMA:
        raise ValueError(f"{path}: expected a bench_all.json of schema {SCHEMA}; got schema "
                         f"{document.get('schema')!r}")
    if not isinstance(document.get("rows"), list):
        raise ValueError(f"{path}: a bench_all.json needs a list 'rows'; got {document.get('rows')!r:.60}")
    return document


def render_markdown(document: Mapping[str, Any]) -> str:
    """Environment, one table per workload, the targets and the cold/warm pairs."""
    config = document.get("config", {})
    lines = [
        f"Environment: {environment_line(document.get('environment', {}))}.",
        f"Run: `{config.get('command', 'bench_all.py')}`, {document.get('wall_s', 0):.0f} s, "
        f"status {document.get('status', '?')}.",
        "",
        "Enqueue: per-call CPU cost with no synchronize (chunks of back-to-back calls, one untimed "
        "synchronize per chunk). Latency: call + device synchronize. GPU: CUDA events around each call "
        "on the row's stream, the chunk queued behind a spin kernel. Medians in µs; ratios are medians "
        "over the reference row's medians in the same workload.",
    ]
    workloads = document.get("workloads", {})
    rows = document.get("rows", [])
    for key in dict.fromkeys(r["workload"] for r in rows):
        meta = workloads.get(key, {})
        lines += ["", f"### {key}" + (f": {meta['title']}" if meta.get("title") else ""), ""]
        if meta.get("engine"):
            lines += [f"`{meta['engine']}`, shapes {meta.get('shapes')}, chunk {meta.get('chunk')} calls"
                      + (f", built in {meta['build_s']:.1f} s" if meta.get("build_s") is not None else "")
                      + ".", ""]
        lines += [
            "| row | enqueue | p90 | latency | p99 | GPU | enqueue / bind+alloc | enqueue / prebound "
            "| enqueue / op | latency / prebound | output | note |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
        ]
        for r in (r for r in rows if r["workload"] == key):
            ratios = r.get("ratios", {})
            cells = [
                r["row"],
                _fmt(row_stat(r, "enqueue")),
                _fmt(row_stat(r, "enqueue", "p90")),
                _fmt(row_stat(r, "latency")),
                _fmt(row_stat(r, "latency", "p99")),
                _fmt(row_stat(r, "gpu")),
                _x(ratios.get("enqueue_vs_bind_alloc")),
                _x(ratios.get("enqueue_vs_prebound")),
                _x(ratios.get("enqueue_vs_op")),
                _x(ratios.get("latency_vs_prebound")),
                _check_cell(r),
                r.get("note", ""),
            ]
            lines.append("| " + " | ".join(_cell(str(c)) for c in cells) + " |")
    lines += ["", "### Targets: per-call overhead against the raw TensorRT loops", "",
              "| target | workload | measured | limit | result |",
              "| --- | --- | --- | ---: | --- |"]
    for t in document.get("targets", []):
        limit = f"{t['comparison']} {t['limit']:.2f}x"
        lines.append(f"| {_cell(t['title'])} | {t['workload']} | {_cell(t['detail'])} | {limit} "
                     f"| **{t['verdict']}** |")
    lines += _cold_warm_lines(document.get("cold_warm") or {})
    if document.get("plot"):
        lines += ["", f"Plot: {document['plot']}"]
    return "\n".join(lines) + "\n"


def _check_cell(row: Mapping[str, Any]) -> str:
    check = str(row.get("check", ""))
    if row.get("status") != "ok":
        return ""
    return "ok" if check.startswith("ok") else check


def _cold_warm_lines(record: Mapping[str, Any]) -> list[str]:
    lines = ["", "### Cold vs warm runtime cache (python backend, convnet, fresh processes)", ""]
    pairs = record.get("pairs") or []
    if not pairs:
        return [*lines, f"skipped: {record.get('skipped', 'not run')}"]
    lines += ["| pair | cold first inference ms | warm first inference ms | cold / warm | cache bytes |",
              "| ---: | ---: | ---: | ---: | ---: |"]
    for i, p in enumerate(pairs, start=1):
        lines.append(f"| {i} | {p['cold_ms']:.1f} | {p['warm_ms']:.1f} | {p['ratio']:.1f}x "
                     f"| {p['cache_bytes']} |")
    lines += ["", f"Median of {len(pairs)} pair ratios: **{record['median_ratio']:.1f}x** (median cold "
              f"{record['median_cold_ms']:.1f} ms, warm {record['median_warm_ms']:.1f} ms)."]
    if record.get("error"):
        lines.append(f"Stopped early: {record['error']}.")
    return lines


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_outputs(document: dict[str, Any], out_dir: str | os.PathLike[str], *, plot: bool = True) -> Path:
    """Write the JSON, the Markdown and (``plot`` and matplotlib permitting) the PNG into
    ``out_dir``; a missing matplotlib is noted in the document. Returns ``out_dir``."""
    target = Path(out_dir)
    target.mkdir(parents=True, exist_ok=True)
    if plot:
        try:
            write_plot(document, target / PLOT_NAME)
            document["plot"] = PLOT_NAME
        except ImportError as exc:
            document["plot"] = f"skipped: {exc}"
    _replace(target / JSON_NAME, (json.dumps(document, indent=1, default=str) + "\n").encode())
    _replace(target / MARKDOWN_NAME, render_markdown(document).encode())
    return target


def write_plot(document: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Per workload, horizontal bars of each measured row's median enqueue cost (top) and
    latency (bottom), labelled with the ratio to ``raw-prebound`` (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("plotting needs matplotlib: pip install -c constraints.txt -e '.[plot]'") from exc
    rows = [r for r in document.get("rows", []) if r.get("status") == "ok"]
    keys = list(dict.fromkeys(r["workload"] for r in rows))
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    info = document.get("environment", {})
    title = f"trt-runtime benchmarks: {info.get('device', 'no GPU')}, {info.get('date', '')}"
    if not rows:
        fig, ax = plt.subplots(figsize=(6, 2))
        ax.text(0.5, 0.5, "no row was measured (see the skipped reasons)", ha="center", va="center")
        ax.set_axis_off()
        ax.set_title(title, fontsize=9)
    else:
        # One row order for every workload, so bars line up with the labels of the first column.
        names = [n for n in ROWS_BY_NAME if any(r["row"] == n for r in rows)]
        names += [n for n in dict.fromkeys(r["row"] for r in rows) if n not in names]
        height = 0.45 * len(names) + 1.5
        fig, axes = plt.subplots(2, len(keys), figsize=(4.2 * len(keys), 2 * height), squeeze=False)
        for col, key in enumerate(keys):
            by_name = {r["row"]: r for r in rows if r["workload"] == key}
            mine = [by_name.get(n) for n in names]
            for line, (metric, label, ratio_key) in enumerate((
                ("enqueue", "enqueue µs/call (no sync)", "enqueue_vs_prebound"),
                ("latency", "latency µs/call (call + sync)", "latency_vs_prebound"),
            )):
                ax = axes[line][col]
                values = [(row_stat(r, metric) or 0.0) if r else 0.0 for r in mine]
                bars = ax.barh(range(len(names)), values, color=[_colour(n) for n in names])
                ax.set_yticks(range(len(names)), names if col == 0 else [""] * len(names), fontsize=7)
                ax.invert_yaxis()
                labels = [_bar_label(v, r, ratio_key) for v, r in zip(values, mine, strict=True)]
                ax.bar_label(bars, labels=labels, fontsize=6, padding=2)
                ax.set_xlim(0, max(values) * 1.45 if max(values) > 0 else 1)
                ax.set_xlabel(label, fontsize=7)
                ax.tick_params(axis="x", labelsize=6)
                ax.grid(axis="x", alpha=0.3)
                if line == 0:
                    ax.set_title(key, fontsize=9)
        fig.suptitle(title + "   (x: ratio to raw-prebound)", fontsize=9)
    try:
        fig.tight_layout()
        fig.savefig(target, dpi=120)
    finally:
        plt.close(fig)
    return target


def _bar_label(value: float, row: Mapping[str, Any] | None, ratio_key: str) -> str:
    if row is None:
        return "not measured"
    ratio = row.get("ratios", {}).get(ratio_key)
    return f"{value:.1f}" + (f" ({_x(ratio)})" if ratio else "")


def _colour(row: str) -> str:
    order = list(ROWS_BY_NAME)
    palette = ["#4c4c4c", "#8c8c8c", "#1f77b4", "#6baed6", "#2ca02c", "#98df8a", "#d62728", "#ff9896",
               "#9467bd"]
    return palette[order.index(row) % len(palette)] if row in order else "#bbbbbb"
