"""What does one front process spend per batch-1 binary request, socket and HTTP included, and on what?

Run from the repository root (CPU, memory backend)::

    python benchmarks/probes/cpu_serve_front.py [--clients 4] [--seconds 3] [--rounds 3]
        [--route npy,kserve] [--tree before=/path/to/an/older/checkout] [--profile] [--top 25]

Starts the real local server (``trt-runtime serve``, as ``bench_serve.py`` does) with ONE front
process and ONE engine process on an engine of the memory backend (``y = 2 x + 1`` on a (1, 16)
float32 input, so the engine costs next to nothing), and drives it with
:class:`benchmarks.serve_load.LoadGenerator` (``--clients`` closed-loop clients in one process):
binary ``.npy`` requests to ``POST /`` (``npy``) and binary-tensor KServe requests to
``POST /v2/models/smoke/infer`` (``kserve``). The front's CPU time comes from
``/proc/<pid>/stat`` over each measuring window; the figure is CPU µs per answered request,
the best of ``--rounds`` windows.

``--tree LABEL=PATH`` (repeatable) serves the same load from another source tree (a checkout of
an earlier commit: its ``trt_runtime`` goes first on the server's ``PYTHONPATH``); ``this`` is the
tree the probe runs from. Trees and routes are interleaved round by round, so a busy machine
weighs on every variant alike. ``--profile`` then serves once more per tree under cProfile (a
``sitecustomize`` that only this probe puts on the path) and prints the front's top functions by
own time.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pstats
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import serve_fronts  # noqa: E402
from benchmarks.serve_cpu import CellProfile, pin_apart  # noqa: E402
from benchmarks.serve_load import Expect, LoadGenerator  # noqa: E402

_PROFILE_ENV = "TRT_RUNTIME_PROBE_PROFILE_DIR"
_SITECUSTOMIZE = f"""
import atexit, cProfile, os, time

_out = os.environ.get({_PROFILE_ENV!r})
if _out:
    _profiler = cProfile.Profile(time.process_time)  # CPU time: a wait is not a cost
    _profiler.enable()

    def _dump():
        _profiler.disable()
        _profiler.dump_stats(os.path.join(_out, f"{{os.getpid()}}.prof"))

    atexit.register(_dump)
"""


def _requests(x: Any) -> dict[str, tuple[str, bytes, str, dict[str, str]]]:
    """``{route: (path, body, content type, extra headers)}``."""
    import numpy as np

    buffer = io.BytesIO()
    np.save(buffer, x)
    header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape),
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    return {
        "npy": ("/", buffer.getvalue(), "application/x-npy", {}),
        "kserve": ("/v2/models/smoke/infer", header + x.tobytes(), "application/octet-stream",
                   {"Inference-Header-Content-Length": str(len(header))}),
    }


def _kserve_right(body: bytes, split: int, want: Any) -> bool:
    import numpy as np

    doc = json.loads(body[:split])
    got = np.frombuffer(body[split:], np.float32).reshape(doc["outputs"][0]["shape"])
    return bool(np.allclose(got, want))


@contextlib.contextmanager
def _served(engine: Path, tree: Path | None, profile_dir: Path | None, pin: bool,
            load_pids: list[int]) -> Iterator[tuple[int, int]]:
    """The local server from ``tree`` (``None``: this one); yields ``(port, front pid)``. ``pin``:
    the front alone on the last CPU, the server's other processes and ``load_pids`` on the rest."""
    saved = os.environ.get("PYTHONPATH")
    paths = [os.fspath(p) for p in (profile_dir, tree) if p is not None]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + ([saved] if saved else []))
    if profile_dir is not None:
        os.environ[_PROFILE_ENV] = os.fspath(profile_dir)
    port = serve_fronts.free_port()
    here = os.getcwd()
    os.chdir(tree or ROOT)  # ``python -m`` puts the working directory first on the server's path
    try:
        with serve_fronts.local_server(engine, "memory", port, 1, "all", 64, 100, None) as doc:
            front = int(doc["pids"]["fronts"][0])
            if pin:
                pin_apart([front], [doc["supervisor"], *doc["pids"]["engines"], *load_pids])
            yield port, front
    finally:
        os.chdir(here)
        os.environ.pop(_PROFILE_ENV, None)
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def _check(port: int, route: str, request: tuple[str, bytes, str, dict[str, str]], want: Any) -> None:
    import urllib.request

    path, body, content_type, headers = request
    sent = urllib.request.Request(f"http://{serve_fronts.HOST}:{port}{path}", data=body,
                                  headers={"Content-Type": content_type, **headers})
    with urllib.request.urlopen(sent, timeout=10) as answer:
        data = answer.read()
        split = int(answer.headers.get("Inference-Header-Content-Length") or 0)
    right = Expect("npy", want.tolist(), 1e-6, 1e-6).right(data) if route == "npy" else \
        _kserve_right(data, split, want)
    if not right:
        raise SystemExit(f"wrong answer on route {route}: {data[:200]!r}")


def _measure(load: LoadGenerator, port: int, front: int, request: tuple[str, bytes, str, dict[str, str]],
             clients: int, seconds: float) -> tuple[float, float]:
    """``(requests/s, front CPU µs per request)`` of one window."""
    path, body, content_type, headers = request
    profile = CellProfile({"front": [front]})
    result = load.run(serve_fronts.HOST, port, path, body, content_type, clients, seconds, 0.5,
                      window=profile.begin, headers=headers)
    if result.errors or result.wrong or not result.completed:
        raise SystemExit(f"the load saw {result.errors} errors and {result.wrong} wrong answers")
    percent = profile.result()["cpu"]["front"]["mean"]
    return result.rps, percent * 1e4 / result.rps


def main(argv: list[str] | None = None) -> int:
    import numpy as np

    from trt_runtime import TensorSpec
    from trt_runtime.testing.memory import AffineOutput, MemoryBackend

    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--seconds", type=float, default=3.0, help="seconds per measuring window")
    p.add_argument("--rounds", type=int, default=3, help="windows per variant; the best is kept")
    p.add_argument("--route", default="npy,kserve", help="npy, kserve or both (comma-separated)")
    p.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH",
                   help="also serve from this source tree (repeatable)")
    p.add_argument("--profile", action="store_true", help="then profile the front of each tree")
    p.add_argument("--pin", action="store_true",
                   help="the front alone on the last CPU, the engine process and the load on the others")
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)
    trees: dict[str, Path | None] = {"this": None}
    for entry in args.tree:
        label, _, path = entry.partition("=")
        if not label or not path or not (Path(path) / "trt_runtime").is_dir():
            raise SystemExit(f"--tree must be LABEL=PATH of a tree holding trt_runtime/; got {entry!r}")
        trees[label] = Path(path).resolve()
    routes = [r for r in args.route.split(",") if r]
    known = _requests(np.zeros((1, 16), np.float32))
    if not routes or any(r not in known for r in routes):
        raise SystemExit(f"--route must name some of {sorted(known)}; got {args.route!r}")

    x_spec = TensorSpec("x", "float32", (-1, 16), True, profiles=(((1, 16), (8, 16), (64, 16)),))
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(1, 16)
    want = x * 2 + 1
    requests = _requests(x)
    best: dict[tuple[str, str], tuple[float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="cpu-serve-front-") as work:
        engine = Path(work) / "smoke.mem"
        engine.write_bytes(MemoryBackend.build_engine([x_spec], [AffineOutput("y", "x", 2.0, 1.0)],
                                                      name="smoke"))
        load = LoadGenerator(1)
        try:
            for round_ in range(args.rounds):
                for label, tree in trees.items():
                    with _served(engine, tree, None, args.pin, load.pids()) as (port, front):
                        for route in routes:
                            _check(port, route, requests[route], want)
                            rps, us = _measure(load, port, front, requests[route], args.clients, args.seconds)
                            print(f"round {round_} {label:>8} {route:>6}: {rps:8.0f} req/s, "
                                  f"front {us:6.1f} µs CPU per request", flush=True)
                            if (label, route) not in best or us < best[label, route][1]:
                                best[label, route] = (rps, us)
            print(f"\nbest of {args.rounds} ({args.clients} clients, {args.seconds:g} s windows): "
                  "front CPU µs per request")
            for route in routes:
                cells = "  ".join(f"{label} {best[label, route][1]:6.1f}" for label in trees)
                print(f"  {route:>6}: {cells}")
            if args.profile:
                for label, tree in trees.items():
                    _profile(load, engine, label, tree, requests[routes[0]], args)
        finally:
            load.close()
    return 0


def _profile(load: LoadGenerator, engine: Path, label: str, tree: Path | None,
             request: tuple[str, bytes, str, dict[str, str]], args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="front-profile-") as out:
        (Path(out) / "sitecustomize.py").write_text(_SITECUSTOMIZE)
        with _served(engine, tree, Path(out), args.pin, load.pids()) as (port, front):
            _measure(load, port, front, request, args.clients, args.seconds)
        stats = Path(out) / f"{front}.prof"
        if not stats.exists():
            print(f"{label}: the front left no profile")
            return
        text = io.StringIO()
        pstats.Stats(os.fspath(stats), stream=text).sort_stats("tottime").print_stats(args.top)
        print(f"\n== {label}: the front's top functions by own time ==")
        print(text.getvalue().split("\n\n", 1)[-1].strip())


if __name__ == "__main__":
    sys.exit(main())
