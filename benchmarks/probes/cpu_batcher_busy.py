"""How much of the time is an engine inside its calls when the dynamic batcher feeds it, on the CPU?

Run from the repository root (CPU)::

    python benchmarks/probes/cpu_batcher_busy.py [--call-ms 0.5] [--clients 64,256] [--delays 500,0]

One :class:`~trt_runtime.serve.batcher.DynamicBatcher` on an asyncio loop, fed by ``clients``
coroutines that each send a batch-1 request again as soon as the previous one is answered; its
engine call sleeps ``--call-ms`` (the GIL released, as a GPU call does) and computes ``2 x + 1``.
Prints requests per second and the engine's busy share (time inside its calls over the window)
per (clients, delay): with requests always waiting the busy share says how long the engine sits
idle between two calls.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any


async def _cell(call_s: float, clients: int, delay_us: int, seconds: float) -> tuple[float, float]:
    import numpy as np

    from trt_runtime import TensorSpec
    from trt_runtime.serve.batcher import DynamicBatcher
    from trt_runtime.serve.model import ModelInfo

    busy = [0.0]

    def execute(x: Any) -> list[Any]:
        started = time.perf_counter()
        time.sleep(call_s)
        y = x * 2 + 1
        busy[0] += time.perf_counter() - started
        return [y]

    spec = TensorSpec("x", "float32", (-1, 16), True, profiles=(((1, 16), (8, 16), (64, 16)),))
    model = ModelInfo.from_specs("m", [spec], [TensorSpec("y", "float32", (-1, 16), False)], max_batch=64)
    batcher = DynamicBatcher([execute], model.checker, max_batch=64, max_queue_delay_us=delay_us)
    x = np.ones((1, 16), np.float32)
    done, stop = [0], [False]

    async def client() -> None:
        while not stop[0]:
            await batcher.submit((x,))
            done[0] += 1

    tasks = [asyncio.create_task(client()) for _ in range(clients)]
    await asyncio.sleep(min(0.5, seconds / 2))  # warm-up
    done[0], busy[0] = 0, 0.0
    started = time.perf_counter()
    await asyncio.sleep(seconds)
    elapsed = time.perf_counter() - started
    answered, inside = done[0], busy[0]
    stop[0] = True
    await asyncio.gather(*tasks)
    await batcher.aclose(5)
    batcher.close()
    return answered / elapsed, inside / elapsed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--call-ms", type=float, default=0.5)
    p.add_argument("--clients", default="64,256")
    p.add_argument("--delays", default="500,0", help="max_queue_delay_us values")
    p.add_argument("--seconds", type=float, default=2.0)
    args = p.parse_args(argv)
    for clients in (int(c) for c in args.clients.split(",")):
        for delay in (int(d) for d in args.delays.split(",")):
            rate, share = asyncio.run(_cell(args.call_ms / 1e3, clients, delay, args.seconds))
            print(f"call {args.call_ms:.2f} ms, {clients:4d} clients, delay {delay:4d} us: "
                  f"{rate:9.0f} req/s, engine busy {share * 100:5.1f}%", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
