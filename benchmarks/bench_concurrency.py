"""``python -m benchmarks.bench_concurrency --out DIR``: concurrent callers on one engine.

One run measures callers 1, 2, 4, 8, 16 x contexts 1, 2, 4, 8 on the tiny, mlp and
convnet workloads, for the ``raw`` loops and the ``python`` and ``torchbind`` backends,
``eager`` and under the ``outer`` CUDA graph (see :mod:`.concurrency_grid` for how a row
is measured and :mod:`.concurrency_callers` for what a caller does). It writes
``bench_concurrency.json`` (the rows of ``docs/bench_concurrency.json``),
``bench_concurrency.md`` and ``bench_concurrency.png`` (with matplotlib) to ``--out``
after every workload, prints the concurrency targets as met / missed, and exits 0 unless the
arguments are wrong (2). A backend that cannot run, or lacks
``supports_multiple_contexts`` for ``contexts > 1``, gets skipped rows with the reason.

``--backend memory`` is the CPU smoke mode: the in-package memory backend on a numpy
engine, no GPU, so CI runs this code.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import concurrency_callers as callers_mod
from .concurrency_grid import (
    BACKENDS,
    CALLERS,
    CONTEXTS,
    Row,
    estimate_seconds,
    evaluate_targets,
    grid,
    measure,
    merge_runs,
    row_label,
)

__all__ = ["main", "parse_args", "render_markdown", "write_outputs"]

JSON_NAME, MARKDOWN_NAME, PLOT_NAME = (
    "bench_concurrency.json",
    "bench_concurrency.md",
    "bench_concurrency.png",
)
WORKLOAD_KEYS = ("tiny", "mlp", "convnet")


def _echo(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _int_list(text: str, name: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"--{name} must be comma-separated integers >= 1; got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise ValueError(f"--{name} must be comma-separated integers >= 1; got {text!r}")
    return values


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_concurrency",
        description="Concurrent callers on one engine: callers x contexts x workloads, raw / python / "
        "torchbind, eager / outer graph; the concurrency targets (docs/concurrency.md).",
    )
    parser.add_argument(
        "--out",
        default=os.environ.get("OUT") or "bench-out",
        help="folder for bench_concurrency.json/.md/.png (default: $OUT, else ./bench-out)",
    )
    parser.add_argument("--duration", type=float, default=1.0, help="seconds measured per row (default 1.0)")
    parser.add_argument("--warmup", type=float, default=0.2, help="seconds of warm-up per row (default 0.2)")
    parser.add_argument("--callers", default=",".join(map(str, CALLERS)), help="caller threads per row")
    parser.add_argument("--contexts", default=",".join(map(str, CONTEXTS)), help="engine.contexts per row")
    parser.add_argument(
        "--workloads",
        default=",".join(WORKLOAD_KEYS),
        help="comma-separated subset of: " + ", ".join(WORKLOAD_KEYS),
    )
    parser.add_argument(
        "--backend",
        default=",".join(BACKENDS),
        help="comma-separated subset of raw, python, torchbind; or 'memory' (CPU smoke mode)",
    )
    parser.add_argument(
        "--check-every",
        type=int,
        default=16,
        help="compare every N-th output of a caller with its reference (default 16)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=540.0,
        help="stop measuring (rows left are recorded as skipped) after this many seconds",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="measure every row this many times, in interleaved passes over a workload's rows; "
        "a row shows the pass with the median calls/s and sums the passes' checks (default 1)",
    )
    parser.add_argument("--no-plot", action="store_true", help="do not draw bench_concurrency.png")
    parser.add_argument(
        "--wheels",
        default="",
        help="install the wheels in this folder (no index) and append them to sys.path first "
        "(matplotlib on an offline GPU host: --wheels .whl/bench)",
    )
    return parser.parse_args(argv)


# -- what a run sets up per workload ----------------------------------------------------------
class _Memory:
    """The CPU smoke mode's workload: an affine engine of the memory backend."""

    batch = 8

    def __init__(self) -> None:
        from trt_runtime import EngineSource, TensorSpec
        from trt_runtime.testing.memory import AffineOutput, MemoryBackend

        self.backend = MemoryBackend()
        data = MemoryBackend.build_engine(
            [TensorSpec("x", "float32", (8, 16), True)], [AffineOutput("y", "x", scale=2.0, bias=1.0)]
        )
        self.engine = self.backend.load_engine(EngineSource(data, name="tiny"))

    def callers(self, count: int) -> list[callers_mod.Caller]:
        return callers_mod.memory_callers(
            self.engine, lambda x: 2.0 * x.astype("float64") + 1.0, (8, 16), count
        )


def _environment(backends: Sequence[str]) -> dict[str, Any]:
    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    if "memory" in backends:
        return info
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except Exception as exc:
        info["torch"] = f"unavailable: {exc}"
    try:
        from trt_runtime import builders

        info["tensorrt"] = str(builders.import_tensorrt().__version__)
    except Exception as exc:
        info["tensorrt"] = f"unavailable: {exc}"
    return info


def _backend_reason(name: str) -> str | None:
    """Why the backend ``name`` cannot run here (``None``: it can)."""
    if name == "raw":
        for module in ("torch", "tensorrt_rtx"):
            if importlib.util.find_spec(module) is None:
                return f"the raw loops need {module}"
        return None
    try:
        from trt_runtime import backend_status

        status = backend_status().get(name)
    except Exception as exc:
        return f"backend status failed: {exc}"
    if status is None:
        return f"the {name!r} backend is not installed"
    return None if status else f"the {name!r} backend cannot run here: {status.reason}"


def _set_contexts(engine: Any, contexts: int) -> str | None:
    """Give ``engine`` ``contexts`` execution contexts; the reason when it cannot."""
    current = getattr(engine, "contexts", 1)
    if contexts == (current if isinstance(current, int) else 1):
        return None
    caps = engine.backend.capabilities
    if not caps.supports_multiple_contexts:
        note = caps.notes.get("supports_multiple_contexts", "")
        return f"backend {engine.backend.name!r} lacks supports_multiple_contexts" + (
            f" ({note})" if note else ""
        )
    try:
        engine.contexts = contexts
    except Exception as exc:
        return f"engine.contexts = {contexts} failed: {type(exc).__name__}: {exc}"
    return None


class _Workload:
    """The engines and callers of one GPU workload (built once, loaded once per backend)."""

    def __init__(self, key: str, logger: Any) -> None:
        import torch

        from .workloads import WORKLOADS_BY_KEY, build

        self.torch = torch
        self.logger = logger
        self.workload = WORKLOADS_BY_KEY[key]
        self.built, _ = build(self.workload, logger, _echo)
        self.shape = tuple(self.workload.shapes[0])
        self.batch = self.shape[0]
        self.engines: dict[str, Any] = {}
        self.raw: Any = None

    def engine(self, backend: str) -> Any:
        if backend not in self.engines:
            import trt_runtime

            self.engines[backend] = trt_runtime.load(self.built.plan, backend, name=self.workload.key)
        return self.engines[backend]

    def close(self) -> None:
        for engine in self.engines.values():
            with contextlib.suppress(Exception):
                engine.close()
        self.engines.clear()
        self.raw = None


def _run_row(row: Row, work: Any, args: argparse.Namespace) -> None:
    """Set up ``row``'s callers and measure them, or record why it is skipped."""
    if isinstance(work, _Memory):
        reason = _set_contexts(work.engine, row.contexts)
        if reason:
            row.skipped = reason
            return
        with contextlib.ExitStack() as stack:
            if row.mode == "outer":
                from trt_runtime import enable_cudagraphs

                stack.enter_context(enable_cudagraphs(work.engine, outer="copy"))
            measure(
                row,
                work.callers(row.callers),
                args.duration,
                args.warmup,
                batch=work.batch,
                check_every=args.check_every,
            )
        return
    torch = work.torch
    if row.backend == "raw":
        if work.raw is None:
            from .raw_rows import open_engine

            work.raw = open_engine(work.built.plan, work.logger)
        made = callers_mod.raw_callers(
            work.raw, torch, work.built, work.shape, row.callers, outer=row.mode == "outer", alloc=row.alloc
        )
        measure(row, made, args.duration, args.warmup, batch=work.batch, check_every=args.check_every)
        return
    engine = work.engine(row.backend)
    reason = _set_contexts(engine, row.contexts)
    if reason:
        row.skipped = reason
        return
    with contextlib.ExitStack() as stack:
        if row.mode == "outer":
            from trt_runtime import enable_cudagraphs

            stack.enter_context(enable_cudagraphs(engine, outer="copy"))
        made = callers_mod.backend_callers(engine, torch, work.built, work.shape, row.callers)
        measure(row, made, args.duration, args.warmup, batch=work.batch, check_every=args.check_every)


def _measure_row(row: Row, work: Any, args: argparse.Namespace, reasons: dict[str, str | None],
                 started: float) -> None:
    """Measure ``row``, or record why not (its backend cannot run, the budget is spent)."""
    if reasons.get(row.backend):
        row.skipped = reasons[row.backend]
    elif time.perf_counter() - started > args.budget_s:
        row.skipped = f"budget of {args.budget_s:.0f} s spent"
    else:
        try:
            _run_row(row, work, args)
        except Exception as exc:
            row.skipped = f"setup failed: {type(exc).__name__}: {exc}"


def _echo_row(row: Row, suffix: str) -> None:
    done = row.skipped or (
        f"{row.calls_per_s:>10,.0f} calls/s  p50 {row.p50_us:8.1f} us  "
        f"p99 {row.p99_us:8.1f} us  switches/call {_fmt(row.switches_per_call, '.2f')}  "
        f"wrong {row.wrong}  errors {row.errors}"
    )
    _echo(
        f"  {row.workload:<8} {row.label:<9} {row.mode:<5} callers {row.callers:>2} "
        f"contexts {row.contexts}{suffix}: {done}"
    )


# -- outputs ----------------------------------------------------------------------------------
def _label(row: dict[str, Any]) -> str:
    """A JSON row's backend as the table and the plot name it."""
    return row_label(str(row["backend"]), bool(row.get("alloc")))


def _fmt(value: Any, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def render_markdown(document: dict[str, Any]) -> str:
    """The run as Markdown: targets, then one table of rows per workload."""
    lines = ["# Concurrent callers (bench_concurrency)", ""]
    env = document.get("environment", {})
    lines.append(", ".join(f"{k} {v}" for k, v in env.items()))
    config = document.get("config", {})
    lines += [
        "",
        f"{config.get('duration', '?')} s per row after {config.get('warmup', '?')} s warm-up; "
        f"every {config.get('check_every', '?')}th output checked; status {document.get('status')}."
        + (f" Each row measured in {config['repeat']} interleaved passes: the pass with the median "
           "calls/s is shown, checks of all passes summed." if config.get("repeat", 1) > 1 else ""),
        "",
    ]
    lines += ["## Targets", "", "| target | status | figures |", "|---|---|---|"]
    for target in document.get("targets", []):
        lines.append(f"| {target['target']} | **{target['status']}** | {target.get('detail', '')} |")
    rows = document.get("rows", [])
    for workload in dict.fromkeys(r["workload"] for r in rows):
        lines += [
            "",
            f"## {workload}",
            "",
            "| backend | mode | callers | contexts | calls/s | items/s | p50 µs | p99 µs | switches/call "
            "| CPU µs/call | wrong | errors | serial error | note |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in (r for r in rows if r["workload"] == workload):
            note = r.get("skipped") or r.get("note") or ""
            lines.append(
                f"| {_label(r)} | {r['mode']} | {r['callers']} | {r['contexts']} "
                f"| {_fmt(r['calls_per_s'])} | {_fmt(r['items_per_s'])} "
                f"| {_fmt(r['p50_us'], '.1f')} | {_fmt(r['p99_us'], '.1f')} "
                f"| {_fmt(r.get('switches_per_call'), '.2f')} | {_fmt(r.get('cpu_us_per_call'), '.1f')} "
                f"| {_fmt(r['wrong'], 'd')} | {_fmt(r.get('errors'), 'd')} "
                f"| {_fmt(r.get('max_error'), '.1e')} | {note} |"
            )
    return "\n".join(lines) + "\n"


def _plot_reason() -> str | None:
    if importlib.util.find_spec("matplotlib") is None:
        return "matplotlib is not installed: pip install 'trt-runtime[plot]'"
    return None


def write_plot(document: dict[str, Any], path: Path) -> None:
    """calls/s against callers, one panel per workload, one line per backend and mode at its
    best contexts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in document["rows"] if r.get("calls_per_s")]
    workloads = list(dict.fromkeys(r["workload"] for r in rows)) or ["(none)"]
    fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 4), squeeze=False)
    for ax, workload in zip(axes[0], workloads, strict=True):
        mine = [r for r in rows if r["workload"] == workload]
        for backend, mode in dict.fromkeys((_label(r), r["mode"]) for r in mine):
            best: dict[int, float] = {}
            for r in mine:
                if (_label(r), r["mode"]) == (backend, mode):
                    best[r["callers"]] = max(best.get(r["callers"], 0.0), r["calls_per_s"])
            xs = sorted(best)
            style = ":" if backend.endswith("+alloc") else "-"
            ax.plot(xs, [best[x] for x in xs], style, marker="o", label=f"{backend} {mode}")
        ax.set_xscale("log", base=2)
        ax.set_title(workload)
        ax.set_xlabel("caller threads")
        ax.set_ylabel("calls/s (best contexts)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_outputs(document: dict[str, Any], out: str | os.PathLike[str], *, plot: bool) -> Path:
    """Write the JSON, the Markdown and (with ``plot`` and matplotlib) the PNG to ``out``."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    if plot and document.get("plot") is None:
        try:
            write_plot(document, folder / PLOT_NAME)
        except Exception as exc:
            document["plot"] = f"not drawn: {type(exc).__name__}: {exc}"
    _write_text(folder / JSON_NAME, json.dumps(document, indent=1) + "\n")
    _write_text(folder / MARKDOWN_NAME, render_markdown(document))
    return folder


# -- the run ----------------------------------------------------------------------------------
def _document(
    args: argparse.Namespace,
    env: dict[str, Any],
    rows: list[Row],
    status: str,
    plot_note: str | None,
    wall_s: float,
) -> dict[str, Any]:
    return {
        "schema": 1,
        "status": status,
        "environment": env,
        "config": {
            "duration": args.duration,
            "warmup": args.warmup,
            "check_every": args.check_every,
            "callers": list(args.callers_list),
            "contexts": list(args.contexts_list),
            "workloads": list(args.workload_list),
            "backends": list(args.backend_list),
            "budget_s": args.budget_s,
            "repeat": args.repeat,
        },
        "wall_s": round(wall_s, 1),
        "plot": plot_note,
        "rows": [r.to_dict() for r in rows],
        "targets": evaluate_targets(rows),
    }


def _configure(args: argparse.Namespace) -> None:
    args.callers_list = _int_list(args.callers, "callers")
    args.contexts_list = _int_list(args.contexts, "contexts")
    args.backend_list = tuple(b.strip() for b in args.backend.split(",") if b.strip())
    allowed = (*BACKENDS, "memory")
    bad = [b for b in args.backend_list if b not in allowed]
    if bad or not args.backend_list:
        raise ValueError(f"--backend must be some of {', '.join(BACKENDS)}, or memory; got {args.backend!r}")
    if "memory" in args.backend_list and len(args.backend_list) > 1:
        raise ValueError("--backend memory (the CPU smoke mode) runs alone")
    args.workload_list = tuple(w.strip() for w in args.workloads.split(",") if w.strip())
    if "memory" in args.backend_list:
        args.workload_list = ("tiny",)
    unknown = [w for w in args.workload_list if w not in WORKLOAD_KEYS]
    if unknown or not args.workload_list:
        raise ValueError(f"--workloads must be some of {', '.join(WORKLOAD_KEYS)}; got {args.workloads!r}")
    for name in ("duration", "budget_s"):
        if not getattr(args, name) > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0; got {getattr(args, name)}")
    if args.warmup < 0 or args.check_every < 1 or args.repeat < 1:
        raise ValueError(
            f"--warmup must be >= 0, --check-every >= 1 and --repeat >= 1; got {args.warmup}, "
            f"{args.check_every}, {args.repeat}"
        )


def main(argv: Sequence[str] | None = None, *, memory_factory: Callable[[], Any] = _Memory) -> int:
    args = parse_args(argv)
    try:
        _configure(args)
    except ValueError as exc:
        print(f"bench_concurrency: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    if args.wheels:
        from .environment import install_wheels, one_line

        try:
            _echo(f"bench_concurrency: installed {len(install_wheels(args.wheels)['wheels'])} wheel(s)")
        except Exception as exc:
            _echo(f"bench_concurrency: --wheels failed: {type(exc).__name__}: {one_line(exc)}")
    plot_note = None if not args.no_plot else "--no-plot"
    if plot_note is None:
        plot_note = _plot_reason()
        if plot_note:
            _echo(f"bench_concurrency: no plot will be drawn: {plot_note}")
    rows = grid(args.backend_list, args.workload_list, args.callers_list, args.contexts_list)
    estimate = estimate_seconds(len(rows) * args.repeat, args.duration, args.warmup)
    _echo(
        f"bench_concurrency: {len(rows)} rows x {args.repeat} pass(es) x ({args.duration} s + "
        f"{args.warmup} s warm-up) ~ "
        f"{estimate:.0f} s of measuring, builds aside (budget {args.budget_s:.0f} s)"
    )
    env = _environment(args.backend_list)
    reasons = {b: (None if b == "memory" else _backend_reason(b)) for b in args.backend_list}
    out = Path(args.out)

    def write(status: str, plot: bool = False) -> dict[str, Any]:
        document = _document(args, env, rows, status, plot_note, time.perf_counter() - started)
        write_outputs(document, out, plot=plot and plot_note is None)
        return document

    logger = None
    for workload in args.workload_list:
        work: Any = None
        try:
            if "memory" in args.backend_list:
                work = memory_factory()
            elif any(reasons[b] is None for b in args.backend_list):
                from .cli import _python_logger

                logger = logger or _python_logger()
                work = _Workload(workload, logger)
        except Exception as exc:
            for row in rows:
                if row.workload == workload:
                    row.skipped = f"workload setup failed: {type(exc).__name__}: {exc}"
        mine = [r for r in rows if r.workload == workload and r.skipped is None]
        trials: dict[int, list[Row]] = {id(r): [] for r in mine}
        for done_passes in range(args.repeat):
            for row in mine:
                trial = row if args.repeat == 1 else Row(
                    row.backend, row.workload, row.mode, row.callers, row.contexts, alloc=row.alloc
                )
                _measure_row(trial, work, args, reasons, started)
                trials[id(row)].append(trial)
                _echo_row(trial, f" pass {done_passes + 1}/{args.repeat}" if args.repeat > 1 else "")
        if args.repeat > 1:
            for row in mine:
                merge_runs(row, trials[id(row)])
        if work is not None and hasattr(work, "close"):
            work.close()
        write("running")
    document = write("complete", plot=True)
    print(render_markdown(document))
    for target in document["targets"]:
        print(f"{target['status']:>6}  {target['target']}: {target.get('detail', '')}")
    _echo(f"bench_concurrency: done in {time.perf_counter() - started:.0f} s; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
