"""``python -m benchmarks`` / ``python benchmarks/bench_all.py``: the whole benchmark in one run.

Order of a run: install carried wheels (``--wheels``), import ``torch_tensorrt`` first
(when its row is wanted), probe the host, run the cold/warm cache pairs, then each
workload (engines built on the host, progress on stderr). Results are written to
``--out`` after every step, so a run cut short keeps what it measured. Exits 0 unless
the arguments are wrong (2); rows that cannot run are recorded as skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import cold_warm, environment, over_runs, report
from .rows import ROWS, RowSpec, parse_rows
from .runner import Budget, Plan, RowResult, run_workload
from .workloads import WORKLOADS, WORKLOADS_BY_KEY, build, make_tensors, parse_workloads

__all__ = ["Config", "main", "make_config", "parse_args"]

ENTRY = Path(__file__).resolve().parent / "bench_all.py"
#: Requirements of the cold/warm pairs.
COLD_WARM_NEEDS = ("gpu", "tensorrt", "backend:python")


@dataclasses.dataclass(frozen=True)
class Config:
    """One run's choices (recorded in the JSON)."""

    workloads: tuple[str, ...]
    rows: tuple[str, ...]
    budget_s: float
    plan: Plan
    pairs: int
    out: str
    plot: bool = True
    samples: bool = False
    wheels: str = ""
    command: str = ""

    def to_dict(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["plan"] = dataclasses.asdict(self.plan)
        return doc


def _echo(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench_all.py",
        description="trt-runtime benchmarks: every row on every workload in one run, with ratios and "
                    "the per-call overhead targets (see docs/benchmarks.md).",
    )
    parser.add_argument("--out", default=os.environ.get("OUT") or "bench-out",
                        help="folder for bench_all.json, bench_all.md and bench.png, rewritten after every "
                             "step (default: $OUT, else ./bench-out)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: few samples, 2 cache pairs, about 1.5 minutes")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="wall-clock budget in seconds (default 330, quick 100)")
    parser.add_argument("--workloads", default=",".join(w.key for w in WORKLOADS),
                        help="comma-separated subset of: " + ", ".join(w.key for w in WORKLOADS))
    parser.add_argument("--rows", default=",".join(r.name for r in ROWS),
                        help="comma-separated subset of: " + ", ".join(r.name for r in ROWS))
    parser.add_argument("--pairs", type=int, default=None,
                        help="cold/warm runtime-cache pairs of fresh processes (default 5, quick 2; 0: none)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved rounds per workload (default 10, quick 2)")
    parser.add_argument("--wheels", default="",
                        help="install the wheels in this folder (no index) and append them to sys.path "
                             "first: what torch-tensorrt's Python runtime needs on an offline host")
    parser.add_argument("--no-plot", action="store_true", help="do not draw bench.png")
    parser.add_argument("--samples", action="store_true", help="keep every per-call sample in the JSON")
    parser.add_argument("--render", metavar="JSON", default=None,
                        help="only redraw bench_all.md and bench.png from a results JSON (into --out)")
    parser.add_argument("--over-runs", nargs="+", metavar="JSON", default=None,
                        help="only print, for the results JSONs of several runs, each per-call target's runs "
                             "met, its rule on the medians over the runs and each run's figure")
    parser.add_argument("--first-inference", nargs=2, metavar=("PLAN", "CACHE"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def make_config(args: argparse.Namespace, argv: Sequence[str] | None = None) -> Config:
    """The run's :class:`Config` from parsed arguments (ValueError for a bad value)."""
    quick = bool(args.quick)
    rounds = args.rounds if args.rounds is not None else (2 if quick else 10)
    plan = Plan(
        rounds=rounds,
        min_rounds=max(1, min(2, rounds)),
        latency=60 if quick else 400,
        enqueue_chunks=4 if quick else 20,
        gpu_chunks=1 if quick else 2,
        warmup=10 if quick else 50,
    )
    pairs = args.pairs if args.pairs is not None else (2 if quick else 5)
    if pairs < 0:
        raise ValueError(f"--pairs must be >= 0; got {pairs}")
    budget = args.budget_s if args.budget_s is not None else (100.0 if quick else 330.0)
    if not budget > 0:
        raise ValueError(f"--budget-s must be > 0; got {budget}")
    given = list(sys.argv[1:] if argv is None else argv)
    return Config(
        workloads=tuple(parse_workloads(args.workloads)),
        rows=tuple(spec.name for spec in parse_rows(args.rows)),
        budget_s=float(budget),
        plan=plan,
        pairs=pairs,
        out=str(args.out),
        plot=not args.no_plot,
        samples=bool(args.samples),
        wheels=str(args.wheels),
        command=" ".join(["bench_all.py", *given]),
    )


class _Run:
    """The state of one run: what was measured so far, written out after every step."""

    def __init__(self, config: Config, env: environment.Environment, budget: Budget) -> None:
        self.config = config
        self.env = env
        self.budget = budget
        self.results: list[RowResult] = []
        self.workloads: dict[str, Any] = {}
        self.cold_warm: dict[str, Any] = {"skipped": "not run yet"}
        self.built: dict[str, tuple[Any, float]] = {}
        self.device: Any = None
        self.logger: Any = None

    def write(self, status: str, plot: bool = False) -> dict[str, Any]:
        document = report.make_document(
            self.env, self.config.to_dict(), self.workloads, self.results, self.cold_warm,
            self.budget.elapsed(), status, samples=self.config.samples,
        )
        report.write_outputs(document, self.config.out, plot=plot and self.config.plot)
        return document

    def engine(self, key: str) -> Any:
        if key not in self.built:
            if self.logger is None:
                self.logger = _python_logger()
            self.built[key] = build(WORKLOADS_BY_KEY[key], self.logger, _echo)
            self.workloads.setdefault(key, {})["build_s"] = round(self.built[key][1], 2)
        return self.built[key][0]

    def gpu(self) -> Any:
        if self.device is None:
            from .device import TorchDevice

            self.device = TorchDevice()
        return self.device


def _python_logger() -> Any:
    # TensorRT keeps the first logger of a process: use the python backend's for builds too.
    try:
        from trt_runtime import get_backend

        backend: Any = get_backend("python")
        return backend.logger
    except Exception:
        return None


def _cold_warm(run: _Run) -> None:
    config, env, budget = run.config, run.env, run.budget
    if config.pairs == 0:
        run.cold_warm = {"skipped": "--pairs 0"}
        return
    why = env.reason(COLD_WARM_NEEDS)
    if why:
        run.cold_warm = {"skipped": why}
        return
    _echo(f"cold/warm runtime cache: {config.pairs} pair(s) of fresh processes")
    try:
        plan = run.engine("convnet").plan
        deadline = budget.clock() + max(30.0, 0.3 * budget.remaining())
        with tempfile.TemporaryDirectory(prefix="trt-bench-") as tmp:
            run.cold_warm = cold_warm.run_pairs(
                plan, config.pairs, Path(tmp), cold_warm.spawn_first_inference(ENTRY),
                deadline=deadline, clock=budget.clock, echo=_echo,
            )
    except Exception as exc:
        run.cold_warm = {"skipped": f"error: {type(exc).__name__}: {environment.one_line(exc)}"}


def _workload(run: _Run, key: str, specs: list[RowSpec], left: int) -> None:
    workload = WORKLOADS_BY_KEY[key]
    run.workloads[key] = {
        **run.workloads.get(key, {}), "title": workload.title, "engine": workload.describe(),
        "shapes": [list(s) for s in workload.shapes], "chunk": workload.chunk,
    }
    deadline = run.budget.clock() + run.budget.share(left)
    _echo(f"workload {key}: {workload.title} (until +{run.budget.share(left):.0f} s)")

    def make_workbench() -> Any:
        from .row_base import Workbench

        device = run.gpu()
        built = run.engine(key)
        tensors = make_tensors(device.torch, built, workload)
        return Workbench(workload, built, tensors, device, torch=device.torch, logger=run.logger)

    results = run_workload(workload, specs, run.env, make_workbench, run.config.plan, deadline,
                           clock=run.budget.clock, echo=_echo)
    for r in results:
        done = r.note
        if r.ok:
            done = (f"enqueue {r.median('enqueue'):8.2f} us  latency {r.median('latency'):8.2f} us  "
                    f"gpu {r.median('gpu'):8.2f} us  {r.check}")
        _echo(f"  {key:<8} {r.row:<22} {done}")
    run.results.extend(results)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.first_inference:
        print(json.dumps(cold_warm.first_inference(*args.first_inference)))
        return 0
    if args.over_runs:
        try:
            documents = [report.read_document(path) for path in args.over_runs]
        except ValueError as exc:
            print(f"bench_all.py: {exc}", file=sys.stderr)
            return 2
        names = [str(path) for path in args.over_runs]
        print(over_runs.render_over_runs(over_runs.over_runs(documents), names), end="")
        return 0
    if args.render:
        try:
            document = report.read_document(args.render)
        except ValueError as exc:
            print(f"bench_all.py: {exc}", file=sys.stderr)
            return 2
        out = report.write_outputs(document, args.out, plot=not args.no_plot)
        print(report.render_markdown(document))
        _echo(f"bench_all: rendered into {out}")
        return 0
    try:
        config = make_config(args, argv)
    except ValueError as exc:
        print(f"bench_all.py: {exc}", file=sys.stderr)
        return 2
    budget = Budget(config.budget_s)
    installed: dict[str, Any] = {}
    if config.wheels:
        try:
            installed = environment.install_wheels(config.wheels)
            _echo(f"bench_all: installed {len(installed['wheels'])} wheel(s) into {installed['target']}")
        except Exception as exc:
            installed = {"error": f"{type(exc).__name__}: {environment.one_line(exc)}"}
            _echo(f"bench_all: --wheels failed: {installed['error']}")
    tt_error = environment.import_torch_tensorrt_first() if "torch-tensorrt-python" in config.rows else ""
    env = environment.probe(tt_error)
    if installed:
        env.info["wheels"] = installed
    _echo(f"bench_all: {report.environment_line(env.info)}")
    run = _Run(config, env, budget)
    run.write("running")
    _cold_warm(run)
    run.write("running")
    specs = parse_rows(",".join(config.rows))
    for index, key in enumerate(config.workloads):
        _workload(run, key, specs, len(config.workloads) - index)
        run.write("running")
    document = run.write("complete", plot=True)
    print(report.render_markdown(document))
    _echo(f"bench_all: done in {budget.elapsed():.0f} s; results in {config.out}")
    return 0

