"""Serving benchmark: every front against the same load, batch-1 requests, answers checked.

One command on the GPU host (``python benchmarks/bench_serve.py --out docs --gpus 1,2``):

1. builds the mlp engine (8 x (256 x 256) + ReLU, fp16, dynamic batch 1..64) with
   :mod:`trt_runtime.builders` and its float64 reference;
2. measures direct in-process calls (batch 1; eager and under the outer CUDA graph);
3. drives every front over HTTP keep-alive with :class:`~benchmarks.serve_load.LoadGenerator`
   (several processes of asyncio raw-socket clients; every answer decoded and compared
   with the float64 reference, counted ``wrong`` when off): a trivial canned-answer
   endpoint (what the load generator itself reaches), the 30-line starlette + uvicorn app
   (the baseline), ``trt-runtime serve`` (1, 2, 4, 8 front processes; batching on and off;
   1 and 2 GPUs), the Ray path (1 and 2 replicas) and a no-op Ray Serve deployment;
   at 1, 16, 64 and 256 clients, with ``.npy`` (``binary``) and JSON bodies;
4. writes ``bench_serve.json`` (rows ``{front, workers, gpus, batching, body, clients,
   req_s, p50_ms, p99_ms, wrong, errors, cpu, engine}``, the targets and the environment) and, with
   matplotlib, ``bench_serve.png`` under ``--out``.

``cpu``: percent of one core (``mean`` per process and ``max``) of each role over the cell's
window: ``front``, ``engine`` (and of its processes the event-loop thread, ``engine_loop``,
apart from the other threads, ``engine_threads``), ``supervisor`` and ``load`` (the load
generator); a role near 100 is the bottleneck. ``engine`` (local server): requests per batch,
rows and milliseconds per engine call, calls per second and ``engine_busy``, the share of the
window each engine process spent inside engine calls (:mod:`benchmarks.serve_cpu`).

Every cell runs ``--duration`` seconds after ``--warmup``; the durations shrink so the
whole run fits ``--budget-s``, and cells that would not fit are listed as skipped.
``--smoke`` runs a few tiny cells with the memory backend on the CPU (a CI test runs it).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import serve_fronts, serve_pinning  # noqa: E402
from benchmarks.serve_cpu import CellProfile, describe  # noqa: E402
from benchmarks.serve_load import Expect, LoadGenerator, percentile  # noqa: E402

#: Seconds one server start costs, for the time plan (a GPU engine process loads, a Ray deploys).
START_S = {"baseline": 8.0, "trivial": 2.0, "local": 10.0, "ray": 15.0, "ray-noop": 8.0}
TYPES = {"binary": "application/x-npy", "json": "application/json"}
#: Ray Serve's HTTP proxy listens on --port + this (it starts once, for every Ray row).
RAY_PORT_OFFSET = 1


@dataclasses.dataclass(frozen=True)
class Workload:
    key: str
    path: Path  # the engine file
    backend: str
    x: Any  # one batch-1 input
    reference: Any  # float64 output for x
    tolerance: tuple[float, float]

    def body(self, kind: str) -> bytes:
        import numpy as np

        if kind == "json":
            return json.dumps(self.x.tolist()).encode()
        buffer = io.BytesIO()
        np.save(buffer, self.x, allow_pickle=False)
        return buffer.getvalue()

    def expect(self, kind: str) -> Expect:
        return Expect("npy" if kind == "binary" else "json", self.reference.tolist(), *self.tolerance)

    def answer(self) -> bytes:
        """A right ``.npy`` answer (the trivial endpoint sends it back)."""
        import numpy as np

        buffer = io.BytesIO()
        np.save(buffer, self.reference.astype(self.x.dtype), allow_pickle=False)
        return buffer.getvalue()


def mlp_workload(out: Path, mlp: tuple[int, int] = (256, 8)) -> Workload:
    from trt_runtime import builders

    t0 = time.perf_counter()
    width, layers = mlp
    built = builders.build_mlp(width=width, layers=layers, batch=None, dtype="float16", max_batch=64)
    name = "mlp" if mlp == (256, 8) else f"mlp{width}x{layers}"
    path = out / "engines" / f"{name}.plan"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(built.plan)
    x = built.random_inputs(batch=1)[0]
    print(f"built {name} in {time.perf_counter() - t0:.1f} s", flush=True)
    # (other sizes: answers checked loosely, for garbage only; 16 fp16 layers of 4096 gave errors above the
    # default's 2e-2 in batched calls on the H200 host, in every row, the bare server's included)
    tolerance = built.tolerance if mlp == (256, 8) else (0.5, 0.5)
    return Workload(name, path, "python", x, built.reference(x)[0], tolerance)


def smoke_workload(out: Path) -> Workload:
    import numpy as np

    from trt_runtime import TensorSpec
    from trt_runtime.testing.memory import AffineOutput, MemoryBackend

    x_spec = TensorSpec("x", "float32", (-1, 16), True, profiles=(((1, 16), (8, 16), (64, 16)),))
    path = out / "engines" / "smoke.mem"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(MemoryBackend.build_engine([x_spec], [AffineOutput("y", "x", 2.0, 1.0)], name="smoke"))
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(1, 16)
    return Workload("smoke", path, "memory", x, x.astype(np.float64) * 2 + 1, (1e-6, 1e-6))


# -- direct calls ----------------------------------------------------------------------------------
def measure_direct(w: Workload, outer: bool, seconds: float, gpus: int) -> dict[str, Any]:
    """Batch-1 calls per second in this process (one row)."""
    import numpy as np

    from trt_runtime.serve import ServeOptions, open_engine

    options = ServeOptions(backend=w.backend, outer_graph=outer, runtime_cache=None)
    engine, cache = open_engine(w.path, options)
    samples: list[float] = []
    wrong = 0
    try:
        for _ in range(20):
            engine.execute(w.x)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            (y,) = engine.execute(w.x)
            samples.append((time.perf_counter() - t0) * 1e3)
        y = np.asarray(y, dtype=np.float64)
        wrong = 0 if np.allclose(y, w.reference, rtol=w.tolerance[0], atol=w.tolerance[1]) else 1
    finally:
        engine.close()
        if cache is not None:
            cache.close()
    return {"front": "direct-outer" if outer else "direct", "workers": 1, "gpus": min(gpus, 1),
            "batching": False, "body": "none", "clients": 1,
            "req_s": round(len(samples) / (sum(samples) / 1e3), 1),
            "p50_ms": round(percentile(samples, 50), 4),
            "p99_ms": round(percentile(samples, 99), 4), "wrong": wrong, "errors": 0}


# -- the plan ----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Front:
    """One server configuration and the (body, clients) cells measured against it."""

    front: str  # "trivial", "baseline", "local", "ray", "ray-noop"
    workers: int
    gpus: int
    batching: bool
    cells: tuple[tuple[str, int], ...]
    variant: str = ""  # local server: a --variants name ("" = the CLI's defaults)

    def options(self) -> Variant:
        """Its ``variant``, parsed (the CLI's defaults for none)."""
        return parse_variant(self.variant) if self.variant else Variant()


class Variant(NamedTuple):
    """A ``--variants`` name, parsed: the local server's options it sets."""

    engine_calls: str | None = None  # --engine-calls
    switch_us: int | None = None  # the engine processes' GIL switch interval
    pad: bool = False  # --pad-batches
    outer: bool = False  # --outer-graph
    pin: bool = False  # cores of their own for the engine processes and fronts (serve_pinning)
    shared: bool = False  # the fronts accept from the shared socket (TRT_RUNTIME_SERVE_DISPATCH=off)
    engine_poll_us: int | None = None  # --engine-poll-us
    front_poll_us: int | None = None  # --front-poll-us
    eager: bool = False  # --no-outer-graph --no-pad-batches (the defaults before the outer graph was)
    overlap: bool = False  # --overlap (overlapped engine calls)
    in_flight: int | None = None  # the engine processes' TRT_RUNTIME_SERVE_IN_FLIGHT

    def options(self) -> list[str]:
        """The ``trt-runtime serve`` options it adds."""
        polls = [(flag, us) for flag, us in (("--engine-poll-us", self.engine_poll_us),
                                              ("--front-poll-us", self.front_poll_us)) if us is not None]
        return (["--pad-batches"] * self.pad + ["--outer-graph"] * self.outer
                + ["--no-outer-graph", "--no-pad-batches"] * self.eager + ["--overlap"] * self.overlap
                + [part for flag, us in polls for part in (flag, str(us))])


#: ``--variants`` parts that take a number of µs, and the Variant field each sets.
_NUMBERED = {"si": "switch_us", "poll": "engine_poll_us", "fpoll": "front_poll_us", "fly": "in_flight"}
_FLAGS = ("pad", "outer", "pin", "shared", "eager", "overlap")


def parse_variant(name: str) -> Variant:
    """A ``--variants`` name: ``threads`` or ``loop`` (the engine processes' ``--engine-calls``), then
    ``+siN`` for a GIL switch interval of N µs in the engine processes, ``+pollN`` for
    ``--engine-poll-us N``, ``+fpollN`` for ``--front-poll-us N``, ``+pad`` for ``--pad-batches``,
    ``+outer`` for ``--outer-graph``, ``+eager`` for ``--no-outer-graph --no-pad-batches``, ``+overlap``
    for ``--overlap``, ``+flyN`` for N overlapped batches at once (``TRT_RUNTIME_SERVE_IN_FLIGHT``),
    ``+pin`` for a core of its own for each engine process and front (:mod:`benchmarks.serve_pinning`)
    and ``+shared`` for fronts that accept from the shared listening socket themselves
    (``TRT_RUNTIME_SERVE_DISPATCH=off``)."""
    calls, *extras = name.split("+")
    numbers: dict[str, int] = {}
    flags: list[str] = []
    bad = calls not in ("threads", "loop")
    for extra in extras:
        prefix = extra.rstrip("0123456789")
        if prefix in _NUMBERED and extra != prefix and _NUMBERED[prefix] not in numbers:
            numbers[_NUMBERED[prefix]] = int(extra[len(prefix):])
        elif extra in _FLAGS and extra not in flags:
            flags.append(extra)
        else:
            bad = True
    if bad:
        raise argparse.ArgumentTypeError(f"--variants: {name!r} is not threads|loop[+siN][+pollN][+fpollN]"
                                         "[+flyN][+pad][+outer][+eager][+overlap][+pin][+shared] (e.g. loop, "
                                         "threads+si100, "
                                         "loop+pad+outer+pin, loop+eager, loop+poll500+fpoll500)")
    return Variant(calls, **numbers, **{f: f in flags for f in _FLAGS})


def plan(args: argparse.Namespace) -> list[Front]:
    top = 64 if 64 in args.clients else max(args.clients)
    every = tuple(("binary", c) for c in args.clients)
    g1 = min(args.gpus)
    most = max(args.clients)
    fronts = [Front("trivial", args.trivial_procs, 0, False, (("binary", most), ("binary", top))),
              Front("baseline", 1, g1, False, (*every, ("json", top))),
              Front("local", args.workers[len(args.workers) // 2], g1, True, (*every, ("json", top)))]
    main_workers = fronts[-1].workers
    fronts += [Front("local", w, g1, True, (("binary", top),)) for w in args.workers if w != main_workers]
    fronts.append(Front("local", main_workers, g1, False, (("binary", top),)))
    for g in args.gpus:
        if g != g1:
            fronts += [Front("local", w, g, True, (("binary", top), ("binary", max(args.clients))))
                       for w in args.workers[-2:]]
            # Without batching the engine calls set the pace: where a second GPU shows most.
            fronts.append(Front("local", main_workers, g, False, (("binary", top),)))
    batchings = (True,) if args.variants_batching_only else (True, False)
    for v in args.variants:  # the same server, another way of running the engine calls
        fronts += [Front("local", main_workers, g, batching, (("binary", top),), v)
                   for g in args.gpus for batching in batchings]
    if args.ray:
        for r in (1, 2):
            fronts += [Front("ray", r, min(r, max(args.gpus)), True, (("binary", top),)),
                       Front("ray-noop", r, 0, False, (("binary", top),))]
    return [f for f in fronts if f.cells]


# -- running ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def started(front: Front, w: Workload, args: argparse.Namespace,
            ray: Any) -> Iterator[tuple[int, str, dict[str, list[int]]]]:
    """Start ``front``; yields the port, the URL path requests go to and the server's process ids
    by role (``front``, ``engine``, ``supervisor``; empty where unknown)."""
    port = args.port
    if front.front == "trivial":
        with serve_fronts.trivial(port, w.answer(), TYPES["binary"], front.workers):
            yield port, "/", {}
    elif front.front == "baseline":
        with serve_fronts.baseline(w.path, w.backend, port):
            yield port, "/", {}
    elif front.front == "local":
        gpus = "all" if front.gpus == 0 else ",".join(map(str, range(front.gpus)))
        cache = None if args.smoke else args.work / "runtime.cache"
        v = front.options()
        with serve_fronts.local_server(w.path, w.backend, port, front.workers, gpus,
                                       args.max_batch if front.batching else 1, args.delay_us, cache,
                                       engine_calls=v.engine_calls, switch_interval_us=v.switch_us,
                                       dispatch="off" if v.shared else None, in_flight=v.in_flight,
                                       extra=v.options()) as doc:
            pids = doc.get("pids", {})
            yield port, "/", {"front": [p for p in pids.get("fronts", ()) if p],
                              "engine": [p for p in pids.get("engines", ()) if p],
                              "supervisor": [doc["supervisor"]]}
    else:
        from trt_runtime.serve import ServeOptions

        options = ServeOptions(backend=w.backend, max_batch=args.max_batch, batch_wait_ms=args.delay_us / 1e3)
        per_replica = min(1.0, front.gpus / front.workers)  # 2 replicas on 1 GPU: half a GPU each
        with serve_fronts.ray_app(ray, front.front, front.workers, per_replica, engine=w.path,
                                  options=options, answer=w.answer(), content_type=TYPES["binary"]) as path:
            yield RAY_PORT_OFFSET + port, path, {}


def run_plan(fronts: list[Front], w: Workload, args: argparse.Namespace, deadline: float,
             save: Callable[[list[dict[str, Any]], list[str]], None],
             rows: list[dict[str, Any]]) -> list[str]:
    """Measure every cell that fits before ``deadline``; returns what was skipped."""
    load = LoadGenerator(args.procs)
    skipped: list[str] = []
    try:
        with contextlib.ExitStack() as stack:
            ray = None
            for i, front in enumerate(fronts):
                if front.front.startswith("ray") and ray is None:  # Ray's daemons idle only while it runs
                    ray = stack.enter_context(serve_fronts.ray_session(args.port + RAY_PORT_OFFSET,
                                                                       max(args.gpus)))
                later = fronts[i:]
                need = sum(START_S[f.front] + len(f.cells) * (args.warmup + 0.6) for f in later)
                cells_left = sum(len(f.cells) for f in later)
                room = deadline - time.perf_counter()
                seconds = min(args.duration, (room - need) / max(1, cells_left) + 0.3)
                if seconds < 0.3:
                    skipped += [f"{front.front} workers={front.workers} gpus={front.gpus} {b} {c}"
                                for b, c in front.cells]
                    continue
                try:
                    with contextlib.ExitStack() as server:
                        port, path, roles = server.enter_context(started(front, w, args, ray))
                        pins: dict[str, Any] = {}
                        if front.options().pin:
                            cores = server.enter_context(serve_pinning.pinned(roles, load.pids()))
                            pins = {"pinned": cores is not None}
                        for body, clients in front.cells:
                            profile = _profile(roles, load, port)
                            result = load.run(serve_fronts.HOST, port, path, w.body(body), TYPES[body],
                                              clients, seconds, args.warmup, w.expect(body), profile.begin)
                            row = {**{k: getattr(front, k) for k in ("front", "workers", "gpus", "batching")},
                                   **({"variant": front.variant} if front.variant else {}),
                                   "body": body, **result.summary(), **profile.result(), **pins}
                            rows.append(row)
                            print(_line(row), flush=True)
                            save(rows, skipped)
                except Exception as exc:  # one front failing must not lose the others' rows
                    print(f"{front.front} workers={front.workers} gpus={front.gpus} failed: {exc}",
                          flush=True)
                    skipped.append(f"{front.front} workers={front.workers} gpus={front.gpus}: {exc}")
    finally:
        load.close()
    return skipped


def _profile(roles: dict[str, list[int]], load: LoadGenerator, port: int) -> CellProfile:
    """The CPU of the server's processes and of the load generator over one cell, and (local server)
    the engine processes' batching figures from its metrics."""
    url = f"http://{serve_fronts.HOST}:{port}/metrics" if "engine" in roles else None
    return CellProfile({**roles, "load": load.pids()}, url, engines=len(roles.get("engine", ())))


def _line(r: dict[str, Any]) -> str:
    batching = "on " if r["batching"] else "off"
    variant = f" [{r['variant']}]" if r.get("variant") else ""
    if "pinned" in r:
        variant += " (pinned)" if r["pinned"] else " (not pinned: too few cores)"
    return (f"{r['front']:9}{variant} workers={r['workers']} gpus={r['gpus']} batch={batching} "
            f"{r['body']:6} clients={r['clients']:3}: {r['req_s']:9.1f} req/s  p50 {r['p50_ms']:8.3f} ms  "
            f"p99 {r['p99_ms']:8.3f} ms  wrong {r['wrong']}  errors {r['errors']}{describe(r)}")


# -- targets and report --------------------------------------------------------------------------
def evaluate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets on this run's rows (``None`` where a row is missing), on the rows of the
    servers as the CLI starts them; ``variants``: the same figures for each ``--variants`` name."""
    variants = sorted({r["variant"] for r in rows if r.get("variant")})
    targets = _targets([r for r in rows if not r.get("variant")])
    if variants:
        plain = [r for r in rows if not r.get("variant") and r["front"] != "local"]
        targets["variants"] = {v: _targets(plain + [r for r in rows if r.get("variant") == v])
                               for v in variants}
    return targets


def _targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def best(pred: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
        found = [r for r in rows if pred(r)]
        return max(found, key=lambda r: r["req_s"]) if found else None

    served = [r for r in rows if r["front"] in ("baseline", "local", "ray")]
    top = 64 if any(r["clients"] == 64 for r in served) else max((r["clients"] for r in served), default=0)
    def local(gpus: int, batching: bool) -> dict[str, Any] | None:
        return best(lambda r: r["front"] == "local" and max(r["gpus"], 1) == gpus and r["body"] == "binary"
                    and r["clients"] == top and r["batching"] == batching)

    one = local(1, True)
    base = best(lambda r: r["front"] == "baseline" and r["body"] == "binary" and r["clients"] == top)
    trivial = best(lambda r: r["front"] == "trivial")
    best_served = max((r["req_s"] for r in served), default=0.0)
    targets: dict[str, Any] = {"clients": top}
    if one is not None:
        targets["one_gpu"] = {
            "req_s": one["req_s"], "workers": one["workers"], "p99_ms": one["p99_ms"],
            "ge_10000": one["req_s"] >= 10_000, "p99_le_25ms": one["p99_ms"] <= 25.0,
            "x_baseline": round(one["req_s"] / base["req_s"], 2) if base and base["req_s"] else None,
            "clean": one["wrong"] == 0 and one["errors"] == 0,
        }
    for batching in (True, False):
        single, double = local(1, batching), local(2, batching)
        if single is not None and double is not None and single["req_s"]:
            key = "two_gpus_x_one" if batching else "two_gpus_x_one_without_batching"
            targets[key] = round(double["req_s"] / single["req_s"], 2)
    for r in (1, 2):
        ray = best(lambda x, r=r: x["front"] == "ray" and x["workers"] == r)
        noop = best(lambda x, r=r: x["front"] == "ray-noop" and x["workers"] == r)
        if ray and noop and noop["req_s"]:
            targets[f"ray_{r}_x_noop"] = round(ray["req_s"] / noop["req_s"], 2)
    if trivial is not None:
        ratio = round(trivial["req_s"] / best_served, 2) if best_served else None
        targets["load_generator_x_best_served"] = ratio
    targets["wrong"] = sum(r["wrong"] for r in rows)
    targets["errors"] = sum(r["errors"] for r in rows if r["front"] != "trivial")
    return targets


#: Each front's colour in the plot (the load generator's ceiling is grey and dashed).
_COLOURS = {"baseline": "tab:orange", "local": "tab:blue", "ray": "tab:green", "ray-noop": "tab:olive",
            "trivial": "tab:gray"}


def _label(r: dict[str, Any]) -> str:
    """A row's server in a few words, for the plot."""
    if r["front"] == "trivial":
        return "trivial endpoint (the load generator's ceiling)"
    if r["front"] == "baseline":
        return f"30-line app, {'JSON' if r['body'] == 'json' else r['body']}"
    what = {"local": "local", "ray": "Ray path", "ray-noop": "no-op Ray Serve"}[r["front"]]
    unit = "replica" if r["front"].startswith("ray") else "front"
    text = f"{what}, {r['workers']} {unit}{'s' if r['workers'] != 1 else ''}"
    if r["front"] != "ray-noop":
        text += f", {r['gpus']} GPU{'s' if r['gpus'] != 1 else ''}"
    if r["front"] == "local":
        text += ("" if r["batching"] else ", no batching") + (", JSON" if r["body"] == "json" else "")
        text += f", {r['variant']}" if r.get("variant") else ""
    return text


def plot(rows: list[dict[str, Any]], path: Path) -> bool:
    """Draw ``rows`` into ``path``: requests/s by client count for every server measured at several
    counts (left), and every server at the top count with binary bodies, or JSON where that is all
    it has, as bars (right); both on log scales, so the 30-line app and Ray sit beside the local
    server. ``False`` without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    served = [r for r in rows if r["body"] != "none" and r["req_s"] > 0]
    series: dict[str, list[dict[str, Any]]] = {}
    for r in served:
        series.setdefault(_label(r), []).append(r)
    counts = {r["clients"] for r in served}
    top = 64 if 64 in counts else max(counts, default=0)
    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 7), gridspec_kw={"width_ratios": [1, 1.15]})
    markers = "osD^v<>Ph*X"
    for i, (name, points) in enumerate(sorted(series.items())):
        if len(points) < 2:
            continue
        points.sort(key=lambda r: r["clients"])
        front = points[0]["front"]
        left.plot([r["clients"] for r in points], [r["req_s"] for r in points], label=name,
                  color=_COLOURS.get(front), marker=markers[i % len(markers)],
                  linestyle="--" if front == "trivial" else "-")
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    left.set_xlabel("concurrent clients (closed loop)")
    left.set_ylabel("requests/s (batch-1, every answer checked)")
    left.set_title("by client count")
    left.legend(fontsize=8)
    left.grid(True, which="both", alpha=0.3)
    at_top = [r for r in served if r["clients"] == top and r["front"] != "trivial"]
    bars = sorted(at_top, key=lambda r: r["req_s"])
    right.barh([_label(r) for r in bars], [r["req_s"] for r in bars],
               color=[_COLOURS.get(r["front"], "tab:purple") for r in bars])
    for y, r in enumerate(bars):
        right.text(r["req_s"], y, f" {r['req_s']:,.0f}", va="center", fontsize=8)
    right.set_xscale("log")
    right.set_xlabel("requests/s")
    right.set_title(f"every server at {top} clients")
    right.tick_params(axis="y", labelsize=8)
    right.grid(True, axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def render(source: Path, target: Path) -> int:
    """``--render``: draw ``target`` from the rows of the ``bench_serve.json`` at ``source``; 2 with
    one line when that file has no rows or matplotlib is missing."""
    try:
        rows = json.loads(source.read_text())["rows"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"bench_serve: --render needs a bench_serve.json with rows; {source}: {exc}", file=sys.stderr)
        return 2
    if not plot(rows, target):
        print("bench_serve: --render needs matplotlib (pip install matplotlib)", file=sys.stderr)
        return 2
    print(f"wrote {target}")
    return 0


def _write(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    os.replace(tmp, path)


def _mlp_size(text: str) -> tuple[int, int]:
    width, _, layers = text.partition("x")
    if not (width.isdigit() and layers.isdigit() and 8 <= int(width) <= 8192 and 1 <= int(layers) <= 64):
        raise argparse.ArgumentTypeError(f"--mlp must be WIDTHxLAYERS, a width in [8, 8192] and 1 to 64 "
                                         f"layers; got {text!r}")
    return int(width), int(layers)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "bench-out"))
    p.add_argument("--smoke", action="store_true", help="a few tiny cells with the memory backend on the CPU")
    p.add_argument("--gpus", default="1", help="GPU counts of the local server rows, e.g. 1,2 (default: 1)")
    p.add_argument("--workers", default="1,2,4,8", help="front processes of the local server rows")
    p.add_argument("--clients", default="1,16,64,256")
    p.add_argument("--duration", type=float, default=3.0, help="seconds measured per cell (may shrink)")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds of load before each cell's window")
    p.add_argument("--budget-s", type=float, default=420.0, help="the whole run must fit this (seconds)")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--mlp", type=_mlp_size, default=(256, 8), metavar="WIDTHxLAYERS",
                   help="the served mlp engine: layers of WIDTH x WIDTH matmul + ReLU, fp16; answers of "
                        "another size are checked within 0.5 only (default: 256x8)")
    p.add_argument("--delay-us", type=int, default=500, help="the local server's --max-queue-delay-us")
    p.add_argument("--procs", type=int, default=max(2, (os.cpu_count() or 4) // 3),
                   help="load-generator processes (default: a third of the CPUs)")
    p.add_argument("--trivial-procs", type=int, default=max(2, (os.cpu_count() or 4) // 4))
    p.add_argument("--no-ray", dest="ray", action="store_false", help="leave out the Ray rows")
    p.add_argument("--render", metavar="JSON", type=Path, default=None,
                   help="only draw bench_serve.png into --out from the rows of this bench_serve.json")
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--variants", default="",
                   help="also measure the local server's main cells (1 and 2 GPUs, batching on and off, "
                        "the top client count) with these engine-process variants: "
                        "threads|loop[+siN][+pollN][+fpollN][+flyN][+pad][+outer][+eager][+overlap][+pin]"
                        "[+shared] (--engine-calls; siN: a GIL switch interval of N µs; pollN: "
                        "--engine-poll-us N; fpollN: --front-poll-us N; flyN: N overlapped batches at once; "
                        "pad: --pad-batches; outer: --outer-graph; eager: --no-outer-graph --no-pad-batches; "
                        "overlap: --overlap; "
                        "pin: a core of its own for each engine process "
                        "and front; shared: the fronts accept from the shared socket), e.g. "
                        "loop,loop+eager,loop+pad+outer+pin")
    p.add_argument("--variants-batching-only", action="store_true",
                   help="measure the variants with batching on only (not also with --max-batch 1)")
    args = p.parse_args(argv)
    if args.smoke:
        args.gpus, args.workers, args.clients, args.ray = "0", "2", "4", False
        args.duration, args.warmup, args.procs, args.trivial_procs = 0.6, 0.2, 2, 2
    args.gpus = sorted({int(g) for g in args.gpus.split(",")})
    args.workers = sorted(int(w) for w in args.workers.split(","))
    args.clients = sorted(int(c) for c in args.clients.split(","))
    args.variants = [v for v in args.variants.split(",") if v]
    for v in args.variants:
        try:
            parse_variant(v)
        except argparse.ArgumentTypeError as exc:
            p.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.render is not None:
        return render(args.render, args.out / "bench_serve.png")
    t0 = time.perf_counter()
    deadline = t0 + args.budget_s
    # Engines and the runtime cache live apart from --out (which may be docs/), removed at the end.
    args.work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    try:
        return _run(args, t0, deadline)
    finally:
        shutil.rmtree(args.work, ignore_errors=True)


def _run(args: argparse.Namespace, t0: float, deadline: float) -> int:
    w = smoke_workload(args.work) if args.smoke else mlp_workload(args.work, args.mlp)
    rows = [measure_direct(w, outer, 1.0, max(args.gpus)) for outer in (False, True)]
    for row in rows:
        print(_line(row), flush=True)
    fronts = plan(args)
    cells = sum(len(f.cells) for f in fronts)
    print(f"plan: {len(fronts)} servers, {cells} cells, budget {args.budget_s:.0f} s", flush=True)
    target = args.out / "bench_serve.json"
    base = {"environment": _environment(), "workload": w.key,
            "settings": {k: str(v) for k, v in vars(args).items()}}

    def save(rows: list[dict[str, Any]], skipped: list[str]) -> None:
        _write(target, {**base, "partial": True, "rows": rows, "skipped": skipped})

    skipped = run_plan(fronts, w, args, deadline, save, rows)
    doc = {**base, "seconds": round(time.perf_counter() - t0, 1), "rows": rows, "skipped": skipped,
           "targets": evaluate(rows)}
    _write(target, doc)
    plotted = plot(rows, args.out / "bench_serve.png")
    print(json.dumps(doc["targets"], indent=1))
    print(f"wrote {target}{' and bench_serve.png' if plotted else ''} in {doc['seconds']} s", flush=True)
    return 0


def _environment() -> dict[str, Any]:
    import platform

    env: dict[str, Any] = {"python": platform.python_version(), "cpus": os.cpu_count()}
    for name in ("uvicorn", "starlette", "ray", "numpy"):
        with contextlib.suppress(Exception):
            env[name] = __import__(name).__version__
    with contextlib.suppress(Exception):
        import subprocess

        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
        env["gpus"] = listing.stdout.strip()
    return env


if __name__ == "__main__":
    sys.exit(main())
