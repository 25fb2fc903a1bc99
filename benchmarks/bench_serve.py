"""Serving benchmark (issue 19): engines behind Ray Serve against direct calls and Ray's floor.

One command on the GPU host (``python benchmarks/bench_serve.py --out $OUT``):

1. builds the mlp and convnet engines (dynamic batch) with :mod:`trt_runtime.builders`;
2. measures direct in-process calls (batch 1, and batch = profile max) per outer-graph mode;
3. starts Ray Serve on loopback and, for every deployment (workload x batching x outer
   graph, scaled to 1, 2, 4 replicas sharing the GPU with fractional ``num_gpus``), drives
   it over HTTP with :class:`~benchmarks.serve_load.LoadGenerator` (several processes of
   async raw-socket clients) at 1, 16 and 64 concurrent clients sending batch-1 ``.npy``
   requests, measuring throughput and p50/p99 latency;
4. does the same for a no-op deployment (reads the body, answers it), batched and not:
   Ray's own per-request floor under the same load;
5. writes ``serve.json`` and ``serve.md`` under ``--out`` and checks the targets at the
   highest client count: throughput >= 0.8 x the no-op floor, and p50 <= floor p50 + 2 x
   the direct engine call.

Every cell runs ``--duration`` seconds after ``--warmup``; the plan's time is printed
first and the duration shrinks so the whole run fits ``--budget-s``. ``--smoke`` runs one
tiny cell with the memory backend on the CPU (the CI test of this script).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

HOST = "127.0.0.1"
# One machine: Ray's agents and addresses stay on loopback (Ray otherwise resolves the
# machine's own address for them). Set before Ray is imported.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
#: Seconds a new deployment, a scaling step and the fixed part of a run cost, for the time plan.
DEPLOY_S = 8.0
SCALE_S = 4.0
FIXED_S = 60.0


@dataclasses.dataclass(frozen=True)
class Workload:
    key: str
    engine: bytes
    body: bytes  # one batch-1 request as .npy
    backend: str
    max_rows: int


def _npy(array: Any) -> bytes:
    import numpy as np

    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def build_workloads(keys: list[str], out: Path) -> list[Workload]:
    """Build the GPU engines (plans written under ``out/engines``)."""
    from trt_runtime import builders

    recipes = {
        "mlp": lambda: builders.build_mlp(width=256, layers=8, batch=None, dtype="float16", max_batch=64),
        "convnet": lambda: builders.build_convnet(batch=None, dtype="float16", image_size=64, max_batch=32),
    }
    (out / "engines").mkdir(parents=True, exist_ok=True)
    workloads = []
    for key in keys:
        t0 = time.perf_counter()
        built = recipes[key]()
        (out / "engines" / f"{key}.plan").write_bytes(built.plan)
        max_rows = built.inputs[0].profiles[0][2][0]
        print(f"built {key} in {time.perf_counter() - t0:.1f} s (batch 1..{max_rows})", flush=True)
        workloads.append(Workload(key, built.plan, _npy(built.random_inputs(batch=1)[0]), "python", max_rows))
    return workloads


def smoke_workload() -> Workload:
    import numpy as np

    from trt_runtime import TensorSpec
    from trt_runtime.testing.memory import AffineOutput, MemoryBackend

    x = TensorSpec("x", "float32", (-1, 16), True, profiles=(((1, 16), (8, 16), (64, 16)),))
    engine = MemoryBackend.build_engine([x], [AffineOutput("y", "x", 2.0, 1.0)], name="smoke")
    return Workload("smoke", engine, _npy(np.ones((1, 16), np.float32)), "memory", 64)


# -- direct calls -----------------------------------------------------------------------------
def measure_direct(workload: Workload, outer: bool, seconds: float, cache: Path | None) -> dict[str, Any]:
    """Per-call latency and calls/s of the engine in this process, batch 1 and batch = max rows."""
    import numpy as np

    from benchmarks.serve_load import percentile
    from trt_runtime.serve import ServeOptions, open_engine

    options = ServeOptions(backend=workload.backend, outer_graph=outer, runtime_cache=cache)
    engine, engine_cache = open_engine(workload.engine, options)
    x1 = np.load(io.BytesIO(workload.body))
    result: dict[str, Any] = {"workload": workload.key, "outer_graph": outer}
    try:
        for label, x in (("batch1", x1), ("batch_max", np.repeat(x1, workload.max_rows, axis=0))):
            for _ in range(20):
                engine.execute(x)
            samples: list[float] = []
            end = time.perf_counter() + seconds / 2
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                engine.execute(x)
                samples.append((time.perf_counter() - t0) * 1e3)
            result[label] = {"calls_per_s": round(len(samples) / (sum(samples) / 1e3), 1),
                             "p50_ms": round(percentile(samples, 50), 4),
                             "p99_ms": round(percentile(samples, 99), 4), "rows": int(x.shape[0])}
    finally:
        engine.close()
        if engine_cache is not None:
            engine_cache.close()
    print(f"direct {workload.key} outer={outer}: {result['batch1']}", flush=True)
    return result


# -- Ray's floor ---------------------------------------------------------------------------------
def noop_class() -> type:
    """A deployment that reads the body and answers it: Ray Serve's own per-request cost."""
    from ray import serve

    class NoOpServer:
        def __init__(self, max_batch: int, batch_wait_ms: float) -> None:
            self.batching = max_batch > 1
            self._batched.set_max_batch_size(max_batch)
            self._batched.set_batch_wait_timeout_s(batch_wait_ms / 1e3)

        async def __call__(self, request: Any) -> Any:
            from starlette.responses import Response

            body = await request.body()
            answer = await self._batched(body) if self.batching else body
            return Response(answer, media_type="application/x-npy")

        @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.002)
        async def _batched(self, bodies: list[bytes]) -> list[bytes]:
            return bodies

    return NoOpServer


# -- the grid -----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Deployment:
    kind: str  # "engine" or "noop"
    workload: str
    batching: bool
    outer_graph: bool


def plan_grid(workloads: list[Workload], args: argparse.Namespace) -> list[Deployment]:
    grid = []
    for w in workloads:
        outers = (False, True) if w.key == "mlp" or args.smoke else (False,)
        for batching in (True, False):
            for outer in outers:
                grid.append(Deployment("engine", w.key, batching, outer))
    for batching in (True, False):
        grid.append(Deployment("noop", "noop", batching, False))
    if args.smoke:
        grid = [d for d in grid if d.batching and not d.outer_graph]
    return grid


def run_grid(grid: list[Deployment], workloads: dict[str, Workload], args: argparse.Namespace,
             out: Path, deadline: float) -> list[dict[str, Any]]:
    """Every cell; each cell's window shrinks (to 0.3 s at least) if deployments ran slower than
    planned, so the run still ends by ``deadline`` (a ``time.perf_counter`` value)."""
    from ray import serve

    from benchmarks.serve_load import LoadGenerator
    from trt_runtime.serve import ServeOptions, build_app

    gpus = 0.0 if args.smoke else 1.0 / max(args.replicas)
    body_of = {k: w.body for k, w in workloads.items()}
    body_of["noop"] = next(iter(workloads.values())).body
    load = LoadGenerator(args.procs)
    cells: list[dict[str, Any]] = []
    try:
        for dep in grid:
            max_batch = args.max_batch if dep.batching else 1
            for replicas in args.replicas:
                t0 = time.perf_counter()
                actor = {"num_cpus": args.cpus_per_replica, "num_gpus": gpus}
                if dep.kind == "noop":
                    noop = serve.deployment(name="NoOp", num_replicas=replicas, max_ongoing_requests=256,
                                            ray_actor_options=actor)(noop_class())
                    app = noop.bind(max_batch, args.batch_wait_ms)
                else:
                    w = workloads[dep.workload]
                    options = ServeOptions(backend=w.backend, outer_graph=dep.outer_graph,
                                           max_batch=max_batch, batch_wait_ms=args.batch_wait_ms,
                                           runtime_cache=out / "runtime.cache")
                    app = build_app(w.engine, options, replicas=replicas, gpus_per_replica=gpus,
                                    cpus_per_replica=args.cpus_per_replica, max_ongoing_requests=256,
                                    name="Engine")
                serve.run(app, name="bench", route_prefix="/bench")
                deploy_s = time.perf_counter() - t0
                for clients in args.clients:
                    left = len(grid) * len(args.replicas) * len(args.clients) - len(cells)
                    later_deploys = (left - 1) // len(args.clients) * SCALE_S
                    room = deadline - time.perf_counter() - 20 - later_deploys
                    seconds = min(args.duration, max(0.3, room / left - args.warmup - 0.4))
                    result = load.run(HOST, args.port, "/bench", body_of[dep.workload], "application/x-npy",
                                      clients, seconds, args.warmup)
                    cell = {**dataclasses.asdict(dep), "replicas": replicas, "max_batch": max_batch,
                            "deploy_s": round(deploy_s, 2), **result.summary()}
                    cells.append(cell)
                    print(_line(cell), flush=True)
                    _write(out, {"cells": cells, "partial": True})
            serve.delete("bench")
    finally:
        load.close()
    return cells


def _line(cell: dict[str, Any]) -> str:
    return (f"{cell['kind']:6} {cell['workload']:8} batch={'on ' if cell['batching'] else 'off'} "
            f"outer={'on ' if cell['outer_graph'] else 'off'} replicas={cell['replicas']} "
            f"clients={cell['clients']:3}: {cell['rps']:9.1f} req/s  p50 {cell['p50_ms']:8.3f} ms  "
            f"p99 {cell['p99_ms']:8.3f} ms  errors {cell['errors']}")


# -- targets and report ----------------------------------------------------------------------------
def evaluate(cells: list[dict[str, Any]], direct: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """At the highest client count: ours >= 0.8 x no-op floor; p50 <= floor p50 + 2 x engine call."""
    top = max(c["clients"] for c in cells)
    floor = {(c["batching"], c["replicas"]): c for c in cells if c["kind"] == "noop" and c["clients"] == top}
    call = {(d["workload"], d["outer_graph"]): d["batch1"]["p50_ms"] for d in direct}
    checks = []
    for c in cells:
        if c["kind"] != "engine" or c["clients"] != top or (c["batching"], c["replicas"]) not in floor:
            continue
        f = floor[(c["batching"], c["replicas"])]
        engine_ms = call.get((c["workload"], c["outer_graph"]), float("nan"))
        ratio = c["rps"] / f["rps"] if f["rps"] else float("nan")
        p50_limit = f["p50_ms"] + 2 * engine_ms
        checks.append({
            "workload": c["workload"], "batching": c["batching"], "outer_graph": c["outer_graph"],
            "replicas": c["replicas"], "clients": top, "rps": c["rps"], "floor_rps": f["rps"],
            "ratio": round(ratio, 3), "throughput_ok": ratio >= 0.8, "p50_ms": c["p50_ms"],
            "p50_limit_ms": round(p50_limit, 3), "p50_ok": c["p50_ms"] <= p50_limit,
        })
    return checks


def markdown(doc: dict[str, Any]) -> str:
    lines = ["# Serving benchmark", "", f"{doc['environment']}", "",
             "## Direct in-process calls", "", "| workload | outer graph | batch-1 calls/s | batch-1 p50 ms "
             "| max-batch rows | max-batch calls/s |", "|---|---|---|---|---|---|"]
    for d in doc["direct"]:
        b1, bm = d["batch1"], d["batch_max"]
        lines.append(f"| {d['workload']} | {d['outer_graph']} | {b1['calls_per_s']} | {b1['p50_ms']} "
                     f"| {bm['rows']} | {bm['calls_per_s']} |")
    lines += ["", "## Ray Serve over HTTP (batch-1 .npy requests)", "",
              "| deployment | workload | batching | outer graph | replicas | clients | req/s | p50 ms "
              "| p99 ms | errors |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in doc["cells"]:
        lines.append(f"| {c['kind']} | {c['workload']} | {'on' if c['batching'] else 'off'} "
                     f"| {'on' if c['outer_graph'] else 'off'} | {c['replicas']} | {c['clients']} "
                     f"| {c['rps']} | {c['p50_ms']} | {c['p99_ms']} | {c['errors']} |")
    lines += ["", "## Targets (highest client count)", "",
              "| workload | batching | outer | replicas | req/s | floor req/s | ratio (>= 0.8) | p50 ms "
              "| limit ms | pass |", "|---|---|---|---|---|---|---|---|---|---|"]
    for t in doc["targets"]:
        ok = "yes" if t["throughput_ok"] and t["p50_ok"] else "NO"
        lines.append(f"| {t['workload']} | {t['batching']} | {t['outer_graph']} | {t['replicas']} "
                     f"| {t['rps']} | {t['floor_rps']} | {t['ratio']} | {t['p50_ms']} | {t['p50_limit_ms']} "
                     f"| {ok} |")
    return "\n".join(lines) + "\n"


def _write(out: Path, doc: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "serve.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    os.replace(tmp, out / "serve.json")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "bench-out"))
    p.add_argument("--smoke", action="store_true", help="one tiny cell with the memory backend on the CPU")
    p.add_argument("--workloads", default="mlp,convnet")
    p.add_argument("--clients", default="1,16,64")
    p.add_argument("--replicas", default="1,2,4")
    p.add_argument("--duration", type=float, default=2.0, help="seconds measured per cell (may shrink)")
    p.add_argument("--warmup", type=float, default=0.5, help="seconds of load before each cell's window")
    p.add_argument("--budget-s", type=float, default=480.0, help="the whole run must fit this (seconds)")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--batch-wait-ms", type=float, default=1.0)
    p.add_argument("--procs", type=int, default=8, help="load-generator processes")
    p.add_argument("--cpus-per-replica", type=float, default=1.0)
    p.add_argument("--port", type=int, default=8123)
    args = p.parse_args(argv)
    if args.smoke:
        args.workloads, args.clients, args.replicas = "smoke", "4", "1"
        args.duration, args.warmup, args.procs, args.cpus_per_replica = 1.0, 0.3, 2, 0.0
    args.clients = [int(c) for c in args.clients.split(",")]
    args.replicas = sorted(int(r) for r in args.replicas.split(","))
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    workloads = [smoke_workload()] if args.smoke else build_workloads(args.workloads, out)
    grid = plan_grid(workloads, args)
    deployments = len(grid) * len(args.replicas)
    cells = deployments * len(args.clients)
    spent = time.perf_counter() - started
    setup = spent + FIXED_S + len(grid) * DEPLOY_S + (deployments - len(grid)) * SCALE_S
    per_cell = min(args.duration, max(0.5, (args.budget_s - setup) / max(1, cells) - args.warmup - 0.4))
    print(f"plan: {len(grid)} deployments scaled to {args.replicas} replicas, {cells} cells x "
          f"({per_cell:.2f} s + {args.warmup} s warm-up); about "
          f"{setup + cells * (per_cell + args.warmup + 0.4):.0f} s of a {args.budget_s:.0f} s budget",
          flush=True)
    args.duration = per_cell
    direct = [measure_direct(w, outer, 1.0, out / "runtime.cache" if not args.smoke else None)
              for w in workloads for outer in ((False, True) if w.key in ("mlp", "smoke") else (False,))]
    import ray
    from ray import serve

    small = {"num_cpus": 2, "object_store_memory": 80 * 1024 * 1024} if args.smoke else {"num_gpus": 1}
    ray.init(address="local", include_dashboard=False, log_to_driver=False, _node_ip_address=HOST, **small)
    serve.start(http_options={"host": HOST, "port": args.port})
    by_key = {w.key: w for w in workloads}
    try:
        cells_done = run_grid(grid, by_key, args, out, started + args.budget_s)
    finally:
        if ray.is_initialized():
            serve.shutdown()
            ray.shutdown()
    doc = {"environment": _environment(), "seconds": round(time.perf_counter() - started, 1),
           "settings": {k: str(v) for k, v in vars(args).items()}, "direct": direct, "cells": cells_done}
    doc["targets"] = evaluate(cells_done, direct)
    _write(out, doc)
    (out / "serve.md").write_text(markdown(doc))
    print(markdown(doc))
    print(f"wrote {out / 'serve.json'} and {out / 'serve.md'} in {doc['seconds']} s", flush=True)
    return 0


def _environment() -> str:
    import platform

    import ray

    parts = [f"Python {platform.python_version()}", f"ray {ray.__version__}", f"{os.cpu_count()} CPUs"]
    try:
        import torch

        if torch.cuda.is_available():
            parts.append(torch.cuda.get_device_name(0))
    except ImportError:
        pass
    return ", ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
