"""What does a front's app spend per batch-1 binary request without its socket, and on what?

Run from the repository root (CPU)::

    python benchmarks/probes/cpu_serve_app.py [--requests 5000] [--top 20]

Calls the request layer's ASGI app (:func:`trt_runtime.serve.http.make_app`, the app every
front process serves) directly with a ``POST /`` of one ``.npy`` array of shape (1, 16),
answered by an ``infer`` that computes ``2 x + 1`` at once, so what is timed is the app's own
work: routing, body read, ``.npy`` decode, checks, encode, response, metrics. Prints the CPU µs
per request (not profiled), then the top functions by own time under cProfile. uvicorn's HTTP
parsing, the socket and the hop come on top: ``cpu_serve_front.py`` measures a front whole.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import sys
import time
from typing import Any


def main(argv: list[str] | None = None) -> int:
    import numpy as np

    from trt_runtime import TensorSpec
    from trt_runtime.serve.http import make_app
    from trt_runtime.serve.metrics import ServeMetrics
    from trt_runtime.serve.model import ModelInfo

    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--top", type=int, default=20)
    args = p.parse_args(argv)
    x_spec = TensorSpec("x", "float32", (-1, 16), True, profiles=(((1, 16), (8, 16), (64, 16)),))
    model = ModelInfo.from_specs("a", [x_spec], [TensorSpec("y", "float32", (-1, 16), False)], max_batch=64)

    async def infer(arrays: Any) -> list[Any]:
        return [arrays[0] * 2 + 1]

    app = make_app(model, infer, metrics=ServeMetrics("a"), ready=lambda: True, max_body_bytes=1 << 20)
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(1, 16)
    buffer = io.BytesIO()
    np.save(buffer, x)
    body = buffer.getvalue()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/", "raw_path": b"/", "query_string": b"", "root_path": "",
             "headers": [(b"host", b"probe"), (b"content-type", b"application/x-npy"),
                         (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    want = x * 2 + 1

    async def one(check: bool) -> None:
        sent: list[Any] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: Any) -> None:
            sent.append(message)

        await app(dict(scope), receive, send)
        if sent[0]["status"] == 200 and not check:
            return
        got = np.load(io.BytesIO(sent[1]["body"]))
        if sent[0]["status"] != 200 or not np.array_equal(got, want):
            raise SystemExit(f"wrong answer: {sent}")

    async def run(n: int, check: bool = False) -> None:
        for _ in range(n):
            await one(check)

    asyncio.run(run(500, check=True))  # warm; every answer checked here, the status only later
    t0 = time.process_time()
    asyncio.run(run(args.requests))
    print(f"app: {1e6 * (time.process_time() - t0) / args.requests:.1f} µs CPU per request "
          f"(not profiled)")
    profiler = cProfile.Profile()
    profiler.enable()
    asyncio.run(run(args.requests))
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.top)
    print(text.getvalue().split("\n\n", 1)[-1].strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
