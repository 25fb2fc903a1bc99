"""Which ASGI server should a front process run: uvicorn or granian?

Run from the repository root (CPU; granian is optional: ``pip install granian``)::

    python benchmarks/probes/cpu_asgi_servers.py [--clients 4,8] [--seconds 2] [--rounds 3] [--pin]

Serves the request layer's app (:func:`trt_runtime.serve.http.make_app`, what every front
serves) for a (1, 16) float32 model whose ``infer`` computes ``2 x + 1`` in the server process
(no engine process, no hop: what differs is the HTTP server alone) under each server with one
worker process: uvicorn as the fronts configure it (httptools, uvloop, lifespan off, no access
log, no proxy-headers layer) and granian (ASGI without lifespan, one worker, uvloop, HTTP/1, no
websockets, no access log). :class:`benchmarks.serve_load.LoadGenerator` drives each with
binary ``.npy`` ``POST /`` requests, every answer checked; servers and client counts are
interleaved round by round. Prints requests per second and the server's CPU µs per answered
request (every process of the server, from ``/proc/<pid>/stat``), the best of ``--rounds``
windows. ``--pin``: the server alone on one CPU, the load generator on the others.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import serve_fronts  # noqa: E402
from benchmarks.serve_cpu import CellProfile, pin_apart  # noqa: E402
from benchmarks.serve_load import Expect, LoadGenerator  # noqa: E402

#: The app both servers import (``probe_app:make``), written next to the probe's temporary files.
_APP = '''
import numpy as np
from trt_runtime import TensorSpec
from trt_runtime.serve.http import make_app
from trt_runtime.serve.metrics import ServeMetrics
from trt_runtime.serve.model import ModelInfo


def make():
    x = TensorSpec("x", "float32", (-1, 16), True, profiles=(((1, 16), (8, 16), (64, 16)),))
    model = ModelInfo.from_specs("a", [x], [TensorSpec("y", "float32", (-1, 16), False)], max_batch=64)

    async def infer(arrays):
        return [arrays[0] * 2 + 1]

    return make_app(model, infer, metrics=ServeMetrics("a"), ready=lambda: True, max_body_bytes=1 << 20)
'''

_UVICORN = ("import uvicorn, probe_app; uvicorn.run(probe_app.make(), host='127.0.0.1', port={port}, "
            "lifespan='off', access_log=False, log_level='warning', proxy_headers=False, "
            "http='httptools', loop='uvloop')")


#: granian's variants: its default runtime, and its single-threaded one (``--runtime-mode st``).
_GRANIAN = {"granian": [], "granian-st": ["--runtime-mode", "st"]}


def _command(server: str, port: int) -> list[str]:
    if server == "uvicorn":
        return [sys.executable, "-c", _UVICORN.format(port=port)]
    return [sys.executable, "-m", "granian", "--interface", "asginl", "--host", "127.0.0.1",
            "--port", str(port), "--workers", "1", "--loop", "uvloop", "--http", "1", "--no-ws",
            "--no-access-log", "--log-level", "warning", *_GRANIAN[server], "--factory", "probe_app:make"]


def _family(pid: int) -> list[int]:
    """``pid`` and its descendants (granian serves from a worker process of its own)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(parents.get(p, ()))
    return found


@contextlib.contextmanager
def _served(server: str, work: Path) -> Iterator[tuple[int, int]]:
    """``server`` serving the probe's app; yields ``(port, pid)``."""
    port = serve_fronts.free_port()
    path = os.pathsep.join([str(work), str(ROOT), os.environ.get("PYTHONPATH", "")])
    process = subprocess.Popen(_command(server, port), env={**os.environ, "PYTHONPATH": path},
                               stdout=subprocess.DEVNULL)
    try:
        serve_fronts.wait_port(port, 30, process)
        time.sleep(0.3)  # its worker up
        yield port, process.pid
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


def main(argv: list[str] | None = None) -> int:
    import numpy as np

    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--clients", default="4,8")
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pin", action="store_true")
    args = p.parse_args(argv)
    servers = ["uvicorn"]
    try:
        import granian  # noqa: F401

        servers += list(_GRANIAN)
    except ImportError:
        print("granian is not installed: uvicorn only", flush=True)
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(1, 16)
    buffer = io.BytesIO()
    np.save(buffer, x, allow_pickle=False)
    body = buffer.getvalue()
    expect = Expect("npy", (x.astype(np.float64) * 2 + 1).tolist(), 1e-6, 1e-6)
    best: dict[tuple[str, int], tuple[float, float]] = {}
    load = LoadGenerator(1)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "probe_app.py").write_text(_APP)
        try:
            for _ in range(args.rounds):
                for server in servers:
                    with _served(server, work) as (port, pid):
                        procs = _family(pid)
                        if args.pin:
                            pin_apart(procs, load.pids())
                        for clients in (int(c) for c in args.clients.split(",")):
                            profile = CellProfile({"server": procs})
                            result = load.run("127.0.0.1", port, "/", body, "application/x-npy", clients,
                                              args.seconds, 0.5, expect, profile.begin)
                            s = result.summary()
                            if s["wrong"] or s["errors"]:
                                raise RuntimeError(f"{server}: {s['wrong']} wrong, {s['errors']} errors")
                            share = profile.result()["cpu"]["server"]  # percent of a core, per process
                            per = share["mean"] * len(procs) / 100 / s["req_s"] * 1e6
                            key = (server, clients)
                            rate, cost = best.get(key, (0.0, float("inf")))
                            best[key] = (max(rate, s["req_s"]), min(cost, per))
        finally:
            load.close()
    for (server, clients), (rate, cost) in sorted(best.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"{server:10} {clients:3d} clients: {rate:9.0f} req/s, {cost:6.1f} µs CPU per request",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
