"""What does one batched engine call of the local server cost, by batch size, with sizes in turn or repeated?

Run on the GPU host (tensorrt_rtx, cuda-python)::

    python3 benchmarks/probes/gpu_batch_shapes.py [--out DIR] [--calls 400]

The local server's engine process calls ``engine.execute(batch)`` with a host (numpy) batch whose
row count changes from call to call (at 64 clients on one GPU: about 25 rows, 0.74 ms a call,
against 0.11 ms for a batch-1 call in a process of its own; 2026-11-27). This probe opens the
``bench_serve.py`` mlp engine (8 x (256x256) + ReLU, fp16, batch 1..64) the way an engine process
does (``trt_runtime.serve.replica.open_engine``: the node's runtime cache, a warm-up call) and
times ``engine.execute`` (median µs over ``--calls`` calls) for:

* ``repeated N``: the same row count every call (1, 8, 16, 25, 32, 64);
* ``in turn``: row counts 10..30 in a fixed shuffled order, as the server sees them;
* ``in turn, padded``: the same requests padded up to the next power of two (a few shapes only);
* ``in turn, busy loop``: as ``in turn`` while another thread runs Python without pause (the engine
  process's event loop competes for the GIL the same way).

The first three tell the cost of changing shapes (TensorRT-RTX re-plans a context for new input
shapes) from the cost of rows; the last the cost of sharing the GIL with a busy event loop.

Writes ``batch_shapes.json`` to ``--out`` (default ``$OUT`` or ``.``).
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import _gpu_tool  # noqa: E402


def _median_us(engine: Any, batches: list[Any], calls: int) -> float:
    for batch in batches[:8]:  # (new shapes compile once)
        engine.execute(batch)
    took = []
    for i in range(calls):
        batch = batches[i % len(batches)]
        t0 = time.perf_counter()
        engine.execute(batch)
        took.append(time.perf_counter() - t0)
    return round(statistics.median(took) * 1e6, 1)


def _busy(stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():
        n += 1


def main(argv: list[str] | None = None) -> None:
    made = _gpu_tool.parser(__doc__)
    made.add_argument("--calls", type=int, default=400)
    args = made.parse_args(argv)
    import numpy as np

    from benchmarks.bench_serve import mlp_workload
    from trt_runtime.serve.options import ServeOptions
    from trt_runtime.serve.replica import open_engine

    work = Path(tempfile.mkdtemp(prefix="batch-shapes-"))
    w = mlp_workload(work)
    engine, _cache = open_engine(w.path, ServeOptions(backend=w.backend, max_batch=64))
    row = w.x[0]

    def batch(rows: int) -> Any:
        return np.ascontiguousarray(np.broadcast_to(row, (rows, row.shape[0])))

    results: dict[str, float] = {}
    for rows in (1, 8, 16, 25, 32, 64):
        results[f"repeated {rows}"] = _median_us(engine, [batch(rows)], args.calls)
    order = list(range(10, 31))
    random.Random(0).shuffle(order)
    in_turn = [batch(rows) for rows in order]
    results["in turn 10..30"] = _median_us(engine, in_turn, args.calls)
    padded = [batch(1 << (rows - 1).bit_length()) for rows in order]
    results["in turn 10..30, padded to a power of two"] = _median_us(engine, padded, args.calls)
    stop = threading.Event()
    spinner = threading.Thread(target=_busy, args=(stop,), daemon=True)
    spinner.start()
    try:
        results["in turn 10..30, a busy Python thread beside"] = _median_us(engine, in_turn, args.calls)
        results["repeated 25, a busy Python thread beside"] = _median_us(engine, [batch(25)], args.calls)
    finally:
        stop.set()
        spinner.join()
    engine.close()
    for label, us in results.items():
        print(f"{label:48} {us:9.1f} µs", flush=True)
    _gpu_tool.write_json(args.out, "batch_shapes.json", results)


if __name__ == "__main__":
    main()
