"""How many µs of its own Python does the runtime spend per call, per backend (CPU, test doubles)?

Run from the repository root::

    python benchmarks/probes/cpu_call_overhead.py [--calls 20000] [--threads 8] [--json out.json]

The doubles of tests/_python_doubles.py and tests/_torchbind_doubles.py stand in for
TensorRT, the CUDA runtime and torch, so what is timed is the runtime's Python: checks,
cache lookups, binding, stream ordering, graph bookkeeping. Rows (µs per call, best of
five runs):

* ``natural``: ``engine(x)`` with a CUDA torch tensor (the python backend's natural call);
* ``pre-bound``: ``engine.execute(x, outputs=[y], stream=s)`` with the same arrays;
* ``outer-replay``: ``engine(x)`` under ``outer_graph="view"`` (a replay);
* ``dynamic``: ``engine(x)`` alternating batches 1/8/16 (two profiles; eager) and
  ``dynamic-outer`` (under the outer graph); python's ``dynamic-user-managed``: batches
  1/4/8 of one profile with USER_MANAGED contexts (the runtime's activation memory);
* ``threads-1`` / ``threads-N``: calls per second of ``engine(x)`` from 1 and N threads
  sharing one engine (each thread its own stream), and, where the backend supports it,
  with ``contexts=N``.

Only the public API is used, so the same script measures any commit.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))


def _best(fn: Any, calls: int, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - t0)
    return best / calls * 1e6


def _threads(make_call: Any, threads: int, seconds: float) -> float:
    """Calls per second of ``threads`` threads each running its own ``make_call()``."""
    counts = [0] * threads
    stop = threading.Event()
    start = threading.Barrier(threads + 1)

    def worker(i: int) -> None:
        call = make_call(i)
        start.wait()
        n = 0
        while not stop.is_set():
            for _ in range(50):
                call()
            n += 50
        counts[i] = n

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    start.wait()
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for w in workers:
        w.join()
    return sum(counts) / (time.perf_counter() - t0)


def _dynamic_rows(rows: dict[str, float], engine: Any, xs: list[Any], calls: int) -> None:
    """``dynamic`` and ``dynamic-outer``: ``engine(x)`` cycling through ``xs`` (shapes)."""
    for t in xs:
        engine(t)
    it = iter(range(1 << 62))

    def alternate() -> Any:
        return engine(xs[next(it) % len(xs)])

    rows["dynamic"] = _best(alternate, calls)
    engine.outer_graph = "view"
    for t in xs:
        engine(t)
    rows["dynamic-outer"] = _best(alternate, calls)
    engine.outer_graph = None


class _Stream:
    """A caller stream object (``__cuda_stream__``), one per thread."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def python_rows(calls: int, threads: int, seconds: float) -> dict[str, float]:
    import _python_doubles as d

    torch = d.FakeTorch()
    sys.modules["torch"] = torch
    rows: dict[str, float] = {}
    engine = d._fake_engine(batch=8)
    x = torch.cuda_tensor((8, 4), torch.float32)
    y = torch.cuda_tensor((8, 4), torch.float32)
    engine(x)
    rows["natural"] = _best(lambda: engine(x), calls)
    s = _Stream(77)
    engine.execute(x, outputs=[y], stream=s)
    rows["pre-bound"] = _best(lambda: engine.execute(x, outputs=[y], stream=s), calls)
    engine.outer_graph = "view"
    engine(x)
    rows["outer-replay"] = _best(lambda: engine(x), calls)
    engine.outer_graph = None

    dyn = d._fake_engine()
    _dynamic_rows(rows, dyn, [torch.cuda_tensor((b, 4), torch.float32) for b in (1, 8, 16)], calls)
    # Batches of one profile with TensorRT-RTX's USER_MANAGED contexts (the runtime owns
    # the activation memory, as on the GPU): what a change of shapes costs beyond the shapes.
    um = d._user_managed_engine()
    um.trt_engine.device_memory_size_v2 = 1 << 20
    xs = [torch.cuda_tensor((b, 4), torch.float32) for b in (1, 4, 8)]
    for t in xs:
        um(t)
    it = iter(range(1 << 62))
    rows["dynamic-user-managed"] = _best(lambda: um(xs[next(it) % 3]), calls)

    def make_call(i: int) -> Any:
        xi = torch.cuda_tensor((8, 4), torch.float32)
        si = _Stream(1000 + i)
        return lambda: engine(xi, stream=si)

    rows["threads-1 calls/s"] = _threads(make_call, 1, seconds)
    rows[f"threads-{threads} calls/s"] = _threads(make_call, threads, seconds)
    if engine.backend.capabilities.supports_multiple_contexts:
        engine.contexts = threads
        rows[f"threads-{threads} contexts-{threads} calls/s"] = _threads(make_call, threads, seconds)
    del sys.modules["torch"]
    return rows


def torchbind_rows(calls: int, threads: int, seconds: float) -> dict[str, float]:
    import _torchbind_doubles as d
    import numpy as np

    rows: dict[str, float] = {}
    # ``ordering``: the bridge's own stream ordering (TorchBridge.execute_on) runs over the
    # doubles' torch, so what it costs per call is in the rows (doubles before it had none).
    try:
        backend, _bridge = d.make_backend("2.14.0", ordering=True)
    except TypeError:
        backend, _bridge = d.make_backend("2.14.0")
    engine = backend.load_engine(d.source())
    a, b = d.inputs()
    out = d.cuda(np.zeros((2, 4)))
    engine(a, b)
    rows["natural"] = _best(lambda: engine(a, b), calls)
    engine.execute(a, b, outputs=[out])
    rows["pre-bound"] = _best(lambda: engine.execute(a, b, outputs=[out]), calls)
    engine.outer_graph = "view"
    engine(a, b)
    rows["outer-replay"] = _best(lambda: engine(a, b), calls)
    engine.outer_graph = None

    from trt_runtime.settings import RuntimeSettings

    eager = RuntimeSettings(dynamic_shapes_kernel_specialization_strategy="eager")
    dyn = backend.load_engine(d.source(bindings=(d.DYNAMIC_X, d.DYNAMIC_Y)), settings=eager)
    _dynamic_rows(rows, dyn, [d.FakeTensor(np.ones((n, 4), np.float32)) for n in (1, 4, 8)], calls)

    def make_call(i: int) -> Any:
        ai, bi = d.inputs()
        return lambda: engine(ai, bi)

    rows["threads-1 calls/s"] = _threads(make_call, 1, seconds)
    rows[f"threads-{threads} calls/s"] = _threads(make_call, threads, seconds)
    if engine.backend.capabilities.supports_multiple_contexts:
        engine.contexts = threads
        rows[f"threads-{threads} contexts-{threads} calls/s"] = _threads(make_call, threads, seconds)
    return rows


def _torchbind_section(calls: int, threads: int, seconds: float) -> dict[str, float]:
    return torchbind_rows(calls // 4, threads, seconds)


SECTIONS = {"python": python_rows, "torchbind": _torchbind_section}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--backend", choices=("python", "torchbind"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.backend is not None:  # one section, in this process
        rows = SECTIONS[args.backend](args.calls, args.threads, args.seconds)
        print(json.dumps(rows))
        return 0
    # Each backend in a fresh process: the doubles log every call, and what one section
    # leaves behind would slow the next one's threads.
    result = {}
    for name in SECTIONS:
        argv_ = [sys.executable, __file__, "--backend", name, "--calls", str(args.calls),
                 "--threads", str(args.threads), "--seconds", str(args.seconds)]
        out = subprocess.run(argv_, check=True, capture_output=True, text=True).stdout
        result[name] = json.loads(out.strip().splitlines()[-1])
    for backend, rows in result.items():
        for row, value in rows.items():
            unit = "" if "calls/s" in row else " µs"
            print(f"{backend:10s} {row:32s} {value:12.2f}{unit}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
