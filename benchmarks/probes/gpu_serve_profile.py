"""Where does the local server's engine process spend its time under load, function by function?

Run on a GPU host from the repository root::

    python benchmarks/probes/gpu_serve_profile.py --out bench-out/profile [--gpus 1] [--clients 64]
        [--seconds 6] [--serve-args "--pad-batches --outer-graph"] [--top 30]

``--smoke`` runs it on the CPU with the memory backend's engine (2 fronts, a few clients).

Builds the mlp engine of ``bench_serve.py``, starts ``trt-runtime serve`` (16 fronts, batching on)
with every front and engine process under cProfile (``TRT_RUNTIME_SERVE_PROFILE_DIR``), drives it
with the benchmark's load generator (batch-1 ``.npy`` requests, every answer checked), stops it
(SIGINT), and prints, for the engine processes (their stats merged) and for one front, the top
functions by own time and by cumulative time, with the requests served. cProfile slows every
Python call, so the rate is lower than ``bench_serve.py``'s; the shares are what it is for. The
``.prof`` files stay under ``--out``.
"""

from __future__ import annotations

import argparse
import io
import os
import pstats
import shlex
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _report(files: list[Path], label: str, top: int) -> str:
    if not files:
        return f"--- {label}: no stats written\n"
    stats = pstats.Stats(*map(str, files), stream=(text := io.StringIO()))
    total = stats.total_tt  # type: ignore[attr-defined]
    # (the whole life of each process: start, warm-up and idle waits in the loop's own time included)
    text.write(f"--- {label}: {len(files)} process(es), {total:.2f} s profiled\n")
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return text.getvalue()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--procs", type=int, default=10, help="load generator processes")
    p.add_argument("--serve-args", default="", help="more trt-runtime serve options, e.g. '--pad-batches'")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--port", type=int, default=8131)
    p.add_argument("--smoke", action="store_true", help="the memory backend on the CPU, briefly")
    args = p.parse_args(argv)
    if args.smoke:
        args.gpus, args.workers, args.clients, args.seconds, args.procs = 0, 2, 4, 1.0, 2

    from benchmarks import serve_fronts
    from benchmarks.bench_serve import TYPES, mlp_workload, smoke_workload
    from benchmarks.serve_load import LoadGenerator
    from trt_runtime.serve.local.lifeline import PROFILE_ENV

    args.out.mkdir(parents=True, exist_ok=True)
    w = smoke_workload(args.out) if args.smoke else mlp_workload(args.out)
    stats_dir = Path(tempfile.mkdtemp(prefix="profile-", dir=args.out))
    os.environ[PROFILE_ENV] = str(stats_dir)
    gpus = ",".join(map(str, range(args.gpus))) or "all"
    load = LoadGenerator(args.procs)
    try:
        with serve_fronts.local_server(w.path, w.backend, args.port, args.workers, gpus, 64, 500,
                                       None if args.smoke else args.out / "runtime.cache",
                                       extra=shlex.split(args.serve_args)):
            result = load.run(serve_fronts.HOST, args.port, "/", w.body("binary"), TYPES["binary"],
                              args.clients, args.seconds, 1.0, w.expect("binary"))
            summary = result.summary()
    finally:
        load.close()
        os.environ.pop(PROFILE_ENV, None)
    print(f"served {summary['req_s']} req/s (profiled) at {args.clients} clients, {args.gpus} GPU(s), "
          f"p50 {summary['p50_ms']} ms, wrong {summary['wrong']}, errors {summary['errors']}; "
          f"serve args: {args.serve_args or '(defaults)'}", flush=True)
    engines = sorted(stats_dir.glob("engine-*.prof"))
    fronts = sorted(stats_dir.glob("front-*.prof"))
    report = _report(engines, "engine processes", args.top) + _report(fronts[:1], "one front", args.top)
    (args.out / "profile.txt").write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
