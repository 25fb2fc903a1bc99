"""The servers ``bench_serve.py`` measures, each started and stopped as a context manager.

* :func:`baseline` - the 30-line starlette + uvicorn app a user would write: one process,
  ``engine(x)`` per request on the event loop (the figure to beat by 3x);
* :func:`trivial` - a canned-answer HTTP endpoint in several processes (asyncio protocol,
  ``SO_REUSEPORT``): what the load generator reaches when the server costs nothing;
* :func:`local_server` - ``trt-runtime serve`` (front processes, engine process per GPU);
* :func:`ray_app` - the Ray path (``trt_runtime.serve.build_app``) or a no-op Ray Serve
  deployment (Ray's own floor), on a Ray that :func:`ray_session` started.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from trt_runtime.serve.local.dispatch import DISPATCH_ENV
from trt_runtime.serve.local.engine_process import IN_FLIGHT_ENV, SWITCH_INTERVAL_ENV

HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on :data:`HOST` that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def wait_port(port: int, deadline_s: float, proc: Any = None) -> None:
    """Until something listens on ``port``; ``proc`` (a ``multiprocessing.Process`` or a
    ``subprocess.Popen``), if given, must not exit meanwhile."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        code = None if proc is None else proc.poll() if hasattr(proc, "poll") else (
            None if proc.is_alive() else proc.exitcode)
        if code is not None:
            raise RuntimeError(f"the server on port {port} exited with code {code}")
        with socket.socket() as sock:
            if sock.connect_ex((HOST, port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {HOST}:{port} after {deadline_s} s")


# -- the 30-line baseline ------------------------------------------------------------------------
def _baseline_main(engine_path: str, backend: str, port: int) -> None:
    import io

    import numpy as np
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    import trt_runtime
    from trt_runtime.dtypes import to_numpy

    engine = trt_runtime.load(engine_path, trt_runtime.get_backend(backend))
    dtype = to_numpy(engine.inputs[0].dtype)

    async def infer(request: Request) -> Response:
        body = await request.body()
        if request.headers.get("content-type") == "application/json":
            y = np.asarray(engine(np.asarray(json.loads(body), dtype)))
            return Response(json.dumps(y.tolist()), media_type="application/json")
        y = np.asarray(engine(np.load(io.BytesIO(body))))
        buffer = io.BytesIO()
        np.save(buffer, y)
        return Response(buffer.getvalue(), media_type="application/x-npy")

    app = Starlette(routes=[Route("/", infer, methods=["POST"])])
    uvicorn.run(app, host=HOST, port=port, log_level="warning", access_log=False)


def _spawned(target: Any, args: tuple[Any, ...], port: int, deadline_s: float,
             copies: int = 1) -> Iterator[None]:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=target, args=args, daemon=True) for _ in range(copies)]
    for p in procs:
        p.start()
    try:
        wait_port(port, deadline_s, procs[0])
        time.sleep(0.3 if copies > 1 else 0.0)  # the other copies bind too
        yield
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()


@contextlib.contextmanager
def baseline(engine_path: Path, backend: str, port: int) -> Iterator[None]:
    yield from _spawned(_baseline_main, (os.fspath(engine_path), backend, port), port, 300)


# -- the trivial endpoint --------------------------------------------------------------------------
def _trivial_main(port: int, answer: bytes, content_type: str) -> None:
    import asyncio

    response = (f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {len(answer)}\r\n\r\n"
                ).encode() + answer

    class Canned(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport = transport
            self.buffer = bytearray()

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            while True:
                end = self.buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(self.buffer[:end]).lower()
                at = head.find(b"content-length:")
                length = int(head[at + 15:].split(b"\r\n", 1)[0]) if at >= 0 else 0
                if len(self.buffer) < end + 4 + length:
                    return
                del self.buffer[:end + 4 + length]
                self.transport.write(response)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Canned, HOST, port, reuse_port=True, backlog=2048)
        await server.serve_forever()

    asyncio.run(main())


@contextlib.contextmanager
def trivial(port: int, answer: bytes, content_type: str, processes: int) -> Iterator[None]:
    yield from _spawned(_trivial_main, (port, answer, content_type), port, 30, copies=processes)


# -- the local server --------------------------------------------------------------------------------
@contextlib.contextmanager
def local_server(engine_path: Path, backend: str, port: int, workers: int, gpus: str, max_batch: int,
                 delay_us: int, runtime_cache: Path | None, *, engine_calls: str | None = None,
                 switch_interval_us: int | None = None, dispatch: str | None = None,
                 in_flight: int | None = None, extra: Sequence[str] = ()) -> Iterator[dict[str, Any]]:
    """``trt-runtime serve`` in a subprocess; yields its ready document (with ``supervisor``: the
    serving process's id); SIGINT at the end (exit 0). ``engine_calls``: its ``--engine-calls``;
    ``switch_interval_us``: the engine processes' GIL switch interval; ``dispatch``: its
    ``TRT_RUNTIME_SERVE_DISPATCH`` (``None``: the default); ``in_flight``: the engine processes'
    ``TRT_RUNTIME_SERVE_IN_FLIGHT``; ``extra``: more of its options (``--pad-batches``, say)."""
    command = [sys.executable, "-m", "trt_runtime.cli", "--json", "serve", os.fspath(engine_path),
               "--port", str(port), "--workers", str(workers), "--gpus", gpus, "--max-batch", str(max_batch),
               "--max-queue-delay-us", str(delay_us), "--backend", backend, "--drain-s", "5"]
    if runtime_cache is not None:
        command += ["--runtime-cache", os.fspath(runtime_cache)]
    if engine_calls is not None:
        command += ["--engine-calls", engine_calls]
    command += extra
    env = dict(os.environ)
    env.pop(SWITCH_INTERVAL_ENV, None)
    env.pop(IN_FLIGHT_ENV, None)
    env.pop(DISPATCH_ENV, None)  # (the rows are the CLI's defaults unless a variant says otherwise)
    if in_flight is not None:
        env[IN_FLIGHT_ENV] = str(in_flight)
    if switch_interval_us is not None:
        env[SWITCH_INTERVAL_ENV] = str(switch_interval_us)
    if dispatch is not None:
        env[DISPATCH_ENV] = dispatch
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    errors: list[str] = []
    threading.Thread(target=lambda: errors.extend(proc.stderr or ()), daemon=True).start()
    timer = threading.Timer(300, proc.kill)
    timer.start()
    text = ""
    doc = None
    try:
        for line in proc.stdout or ():
            text += line
            with contextlib.suppress(json.JSONDecodeError):
                doc = json.loads(text)
                break
    finally:
        timer.cancel()
    try:
        if doc is None:
            raise RuntimeError(f"trt-runtime serve did not start (exit {proc.poll()}): "
                               f"{''.join(errors)[-2000:]}")
        yield {**doc, "supervisor": proc.pid}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        if code != 0:
            print(f"trt-runtime serve exited with {code}: {''.join(errors)[-2000:]}", flush=True)


# -- Ray Serve ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def ray_session(port: int, gpus: int) -> Iterator[Any]:
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray
    from ray import serve

    extra: dict[str, Any] = {"num_gpus": gpus} if gpus else {"object_store_memory": 80 * 1024 * 1024}
    ray.init(address="local", include_dashboard=False, log_to_driver=False, _node_ip_address=HOST, **extra)
    serve.start(http_options={"host": HOST, "port": port})
    try:
        yield serve
    finally:
        serve.shutdown()
        ray.shutdown()


def noop_class() -> type:
    """A deployment that answers a canned body: Ray Serve's own per-request cost."""

    class NoOpServer:
        def __init__(self, answer: bytes, content_type: str) -> None:
            self.answer, self.content_type = answer, content_type

        async def __call__(self, request: Any) -> Any:
            from starlette.responses import Response

            await request.body()
            return Response(self.answer, media_type=self.content_type)

    return NoOpServer


@contextlib.contextmanager
def ray_app(serve: Any, kind: str, replicas: int, gpus_per_replica: float, *, engine: Path | None = None,
            options: Any = None, answer: bytes = b"", content_type: str = "") -> Iterator[str]:
    """Deploy the engine (``kind="ray"``) or the no-op (``"ray-noop"``); yields the route."""
    actor = {"num_cpus": 1, "num_gpus": gpus_per_replica}
    if kind == "ray-noop":
        deployment = serve.deployment(name="NoOp", num_replicas=replicas, max_ongoing_requests=256,
                                      ray_actor_options=actor)(noop_class())
        app = deployment.bind(answer, content_type)
    else:
        from trt_runtime.serve import build_app

        app = build_app(engine, options, replicas=replicas, gpus_per_replica=gpus_per_replica,
                        cpus_per_replica=1.0)
    serve.run(app, name="bench", route_prefix="/bench")
    try:
        yield "/bench"
    finally:
        serve.delete("bench")
