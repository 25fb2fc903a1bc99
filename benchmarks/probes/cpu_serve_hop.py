"""What does the local server's engine process (and a front's side of the hop) spend per request, and on what?

Run from the repository root (CPU, memory backend)::

    python benchmarks/probes/cpu_serve_hop.py [--clients 64] [--seconds 3] [--fronts 1] [--top 15]
        [--engine-calls auto|threads|loop] [--metrics shared|own]

Starts one real engine process (``trt_runtime.serve.local.engine_process``, batching on, max
batch 64, queue delay 500 µs, its engine calls as ``--engine-calls`` says, its metrics in
prometheus_client's multiprocess mode as the server keeps them unless ``--metrics own``) under
cProfile, and drives it from this process through
``--fronts`` :class:`~trt_runtime.serve.local.front.EnginePool` objects (each its own slab
and connection, as a front process has) with ``--clients`` closed-loop batch-1 requests,
every answer checked. Prints requests per second, the CPU µs per request of the engine
process and of this process (the fronts' side of the hop, without HTTP), requests per
engine call, and each side's top functions by own time. The HTTP part of a front is
uvicorn's; ``bench_serve.py``'s ``cpu`` columns show it under real load.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import multiprocessing
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _profiled_engine(spec: Any, ready: Any, out: str, profile: bool) -> None:
    from trt_runtime.serve.local.engine_process import engine_main

    profiler = cProfile.Profile()
    if profile:
        profiler.enable()
    try:
        engine_main(spec, ready)
    finally:
        profiler.disable()
        profiler.dump_stats(out)


async def _drive(sockets: list[Path], run_dir: Path, fronts: int, clients: int, seconds: float,
                 x: Any, want: Any) -> tuple[int, int]:
    import numpy as np

    from trt_runtime.serve.local.front import EnginePool
    from trt_runtime.serve.local.transport import Slab

    slabs = [Slab.create(run_dir / f"slab-{i}") for i in range(fronts)]
    pools = [EnginePool(sockets, slab) for slab in slabs]
    for pool in pools:
        pool.start()
    await asyncio.gather(*(pool.wait_up() for pool in pools))
    done = wrong = 0
    stop = time.perf_counter() + seconds

    async def client(pool: EnginePool) -> None:
        nonlocal done, wrong
        while time.perf_counter() < stop:
            (y,) = await pool.infer((x,))
            done += 1
            wrong += not np.array_equal(y, want)

    await asyncio.gather(*(client(pools[i % fronts]) for i in range(clients)))
    for pool in pools:
        await pool.close()
    for slab in slabs:
        slab.close()
    return done, wrong


def main(argv: list[str] | None = None) -> int:
    import numpy as np

    from trt_runtime import TensorSpec
    from trt_runtime.serve import ServeOptions
    from trt_runtime.serve.local.engine_process import EngineProcessSpec
    from trt_runtime.testing.memory import AffineOutput, MemoryBackend

    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--fronts", type=int, default=1)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--delay-us", type=int, default=500)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--engine-calls", default="auto", choices=("auto", "threads", "loop"))
    p.add_argument("--metrics", default="shared", choices=("shared", "own"),
                   help="shared: prometheus_client's multiprocess mode, as the server runs it")
    p.add_argument("--no-profile", dest="profile", action="store_false",
                   help="CPU per request without cProfile's own cost (no function tables)")
    args = p.parse_args(argv)
    run_dir = Path(tempfile.mkdtemp(prefix="serve-hop-"))
    x_spec = TensorSpec("x", "float32", (-1, 16), True, profiles=(((1, 16), (8, 16), (64, 16)),))
    engine = run_dir / "affine.mem"
    engine.write_bytes(MemoryBackend.build_engine([x_spec], [AffineOutput("y", "x", 2.0, 1.0)], name="a"))
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(1, 16)
    spec = EngineProcessSpec(engine=engine, options=ServeOptions(backend="memory", max_batch=64,
                                                                 runtime_cache=None),
                             device=None, socket_path=run_dir / "engine.sock", name="a",
                             max_queue_delay_us=args.delay_us, drain_s=5.0, engine_calls=args.engine_calls)
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    stats_path = os.fspath(run_dir / "engine.prof")
    proc = ctx.Process(target=_profiled_engine, args=(spec, send, stats_path, args.profile))
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    if args.metrics == "shared":  # (for the spawned engine process only: set after this one imported)
        (run_dir / "metrics").mkdir()
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = os.fspath(run_dir / "metrics")
    proc.start()
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    send.close()
    status = receive.recv()
    if status[0] != "ready":
        print(status, file=sys.stderr)
        return 1
    from benchmarks.serve_cpu import cpu_seconds

    assert proc.pid is not None
    engine_cpu0 = cpu_seconds(proc.pid) or 0.0  # from here: its start-up is not counted
    profiler = cProfile.Profile()
    cpu0 = time.process_time()
    if args.profile:
        profiler.enable()
    done, wrong = asyncio.run(_drive([spec.socket_path], run_dir, args.fronts, args.clients, args.seconds,
                                     x, x * 2 + 1))
    profiler.disable()
    front_cpu = time.process_time() - cpu0
    engine_cpu = (cpu_seconds(proc.pid) or 0.0) - engine_cpu0
    proc.terminate()
    proc.join(30)
    print(f"{done / args.seconds:.0f} req/s, {args.clients} clients, {args.fronts} front(s), wrong {wrong}")
    calls = 0
    if args.profile:
        engine_stats = pstats.Stats(stats_path)
        # cProfile sees the loop thread only: count the batches the batcher formed there.
        calls = sum(n for (_f, _l, name), (_c, n, *_r) in engine_stats.stats.items()  # type: ignore[attr-defined]
                    if name == "_pop_batch")
    how = "profiled" if args.profile else "not profiled"
    print(f"engine process: {1e6 * engine_cpu / max(1, done):.1f} µs CPU per request (while driven, "
          f"{how})" + (f", {done / max(1, calls):.1f} requests per batch" if args.profile else ""))
    print(f"fronts' side of the hop: {1e6 * front_cpu / max(1, done):.1f} µs CPU per request ({how})")
    if not args.profile:
        return 0 if wrong == 0 else 1
    for title, stats in (("engine process", engine_stats), ("fronts' side", pstats.Stats(profiler))):
        text = io.StringIO()
        stats.stream = text  # type: ignore[attr-defined]
        stats.sort_stats("tottime").print_stats(args.top)
        print(f"--- {title}: top {args.top} by own time\n" + text.getvalue().split("\n\n", 1)[-1].strip())
    return 0 if wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
