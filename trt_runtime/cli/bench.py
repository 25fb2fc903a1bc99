"""``trt-runtime bench FILE``: per-call latency and throughput of one engine on backends.

Each backend gets ``--warmup`` untimed calls, then ``--iterations`` timed ones (and, with
``--duration S``, as many more as fill S seconds), on the same inputs (random of
``--shapes``, or ``--load-inputs``); the harness is :mod:`trt_runtime.bench`. On a GPU
the host-to-device copies, the compute and the device-to-host copies are also timed
apart with CUDA events (:mod:`trt_runtime.bench_transfers`); on CPU backends the split is
reported as n/a. ``--backend all`` measures
every available backend that can load the file and says which it skipped and why.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from typing import Any

from trt_runtime.cli.engine_files import backend_reason, check_backend_name, engine_file_backend
from trt_runtime.cli.io_options import input_arrays, set_log_level
from trt_runtime.cli.output import CliError, Output, UsageError
from trt_runtime.cli.run import settings_dict, settings_overrides

__all__ = ["bench_command"]


def bench_command(args: argparse.Namespace, out: Output) -> int:
    """``trt-runtime bench``."""
    import trt_runtime
    from trt_runtime import bench

    if args.iterations < 1:
        raise UsageError(f"--iterations must be >= 1; got {args.iterations}")
    if args.warmup < 0:
        raise UsageError(f"--warmup must be >= 0; got {args.warmup}")
    if args.duration is not None and not args.duration >= 0:
        raise UsageError(f"--duration must be a number of seconds >= 0; got {args.duration}")
    set_log_level(args.log_level)
    for name in args.backend:
        check_backend_name(name, also=("all",))
    if args.plot is not None:
        bench.check_plotting()  # before the work, not after it
    first = engine_file_backend(args.file, force=args.force, out=out, require=False)
    from trt_runtime.errors import TrtRuntimeError

    names: list[str | None] = list(args.backend) or [first]
    every = "all" in names
    if every:
        names = list(trt_runtime.available_backends())
        if not names:
            raise CliError(f"no backend can run here: {backend_reason(None)}")
    for name in names:
        reason = backend_reason(name)
        if reason:
            on = f" on the {name!r} backend" if args.backend else ""
            raise CliError(f"cannot benchmark {args.file}{on}: {reason}")
    from trt_runtime.bench_transfers import transfer_split

    overrides = settings_overrides(args)
    splits: dict[str, dict[str, Any]] = {}
    results = []
    inputs: list[Any] | None = None
    for name in names:
        try:
            engine = trt_runtime.load(args.file, backend=trt_runtime.get_backend(name), device=args.device,
                                      settings=overrides)
        except TrtRuntimeError as exc:
            if not every:
                raise
            # 'all' includes backends for other engine kinds (the test backend 'memory').
            out.notice(f"skipped the {name!r} backend: it cannot load {args.file}: {exc}")
            continue
        with contextlib.closing(engine):
            if inputs is None:
                inputs = input_arrays(args, engine.inputs)
            label = engine.backend.name
            at_least = f" (at least {args.duration:g} s)" if args.duration else ""
            with out.status(f"benchmarking on {label!r}: {args.warmup} warmup + {args.iterations} calls"
                            f"{at_least}..."):
                result = bench.bench_engine(
                    engine, inputs, iterations=args.iterations, warmup=args.warmup, label=label,
                    metadata={"settings": settings_dict(engine)}, duration=args.duration,
                )
                split, why = transfer_split(engine, inputs, iterations=min(args.iterations, 50))
            splits[label] = split.to_dict() if split is not None else {"note": f"n/a: {why}"}
            results.append(result)
    if not results:
        raise CliError(f"no available backend could load {args.file}")
    meta = {"file": os.fspath(args.file), "iterations": args.iterations, "warmup": args.warmup,
            "duration_s": args.duration, "shapes": [list(a.shape) for a in inputs or []]}
    if args.json_path is not None:
        bench.write_json(results, args.json_path, meta)
        out.info(f"wrote {args.json_path}")
    if args.plot is not None:
        bench.plot_results(results, args.plot, title=f"{args.file.name}")
        out.info(f"wrote {args.plot}")
    summary = [{**{k: v for k, v in r.to_dict().items() if k not in ("latencies_us", "gpu_times_us")},
                "transfer_split": splits.get(r.label)} for r in results]
    out.emit({**meta, "results": summary})
    out.table(
        f"{args.file.name}: latency per call (µs)",
        ["backend", "median", "p90", "p99", "calls/s", "GPU median"],
        [[r.label, r.median_us, r.p90_us, r.p99_us, r.throughput, r.gpu_median_us] for r in results],
    )
    out.table(
        "where the time goes (GPU, µs per call, median)",
        ["backend", "H2D", "compute", "D2H"],
        [[label, s.get("h2d_us"), s.get("compute_us"), s.get("d2h_us")] if "note" not in s
         else [label, "n/a", "n/a", "n/a"] for label, s in splits.items()],
    )
    for r in results:
        if r.gpu_times_us is None:
            out.info(f"{r.label}: no GPU time ({r.gpu_note})")
        note = splits.get(r.label, {}).get("note")
        if note:
            out.info(f"{r.label}: no H2D / compute / D2H split ({note})")
    return 0
