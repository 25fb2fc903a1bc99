"""``trt-runtime serve ENGINE``: serve an engine with Ray Serve until Ctrl-C.

Starts a local Ray (or joins a running cluster with ``--address``), deploys the engine
(:func:`trt_runtime.serve.build_app`), prints the URL and waits. Ctrl-C (SIGINT) or
SIGTERM stops it cleanly: the application is deleted, and a Ray this command started is
shut down; a joined cluster keeps running.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from trt_runtime.cli.engine_files import FORCE_HELP, check_engine_file
from trt_runtime.cli.output import CliError, Output
from trt_runtime.cli.run import settings_overrides

__all__ = ["add_serve_parser", "serve_command"]


def add_serve_parser(command: Any) -> argparse.ArgumentParser:
    """Add the ``serve`` subcommand (``command(name, help)`` makes a subparser)."""
    p = command("serve", "serve an engine over HTTP and Ray Serve handles, with dynamic batching")
    p.add_argument("file", type=Path, help="a raw plan, a TR01/TR02 blob or a .pte program")
    p.add_argument("--replicas", type=int, default=1, help="replicas of the engine (default: 1)")
    p.add_argument("--gpus-per-replica", type=float, default=0.0, metavar="F",
                   help="GPUs per replica; a fraction shares one GPU (default: 0, no GPU reserved)")
    p.add_argument("--cpus-per-replica", type=float, default=1.0, metavar="F",
                   help="CPUs per replica (default: 1)")
    p.add_argument("--max-batch", type=int, default=16, metavar="B",
                   help="requests per batch; 1 turns batching off (default: 16)")
    p.add_argument("--batch-wait-ms", type=float, default=2.0, metavar="T",
                   help="longest wait for a batch to fill, in ms (default: 2)")
    p.add_argument("--host", default="127.0.0.1", help="HTTP address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, metavar="P", help="HTTP port (default: 8000)")
    p.add_argument("--route-prefix", default="/", help="URL path of the engine (default: /)")
    p.add_argument("--name", default="trt-engine", help="Ray Serve application name (default: trt-engine)")
    p.add_argument("--address", metavar="ADDR", default=None,
                   help="join the Ray cluster at ADDR ('auto': the one 'ray start' began here; "
                        "default: start a new local Ray)")
    p.add_argument("--backend", metavar="NAME", default=None, help="backend (default: first available)")
    p.add_argument("--device", type=int, default=None,
                   help="CUDA device (default: the replica's GPU, else the container's)")
    p.add_argument("--contexts", type=int, default=1, metavar="N", help="execution contexts per replica")
    p.add_argument("--outer-graph", action="store_true", help="wrap each call in an outer CUDA graph")
    p.add_argument("--runtime-cache", metavar="PATH", type=Path, default=None,
                   help="runtime cache file (default: one per node and GPU model in the user cache)")
    p.add_argument("--ship", action="store_true",
                   help="send the engine's bytes to every replica (default: each node reads FILE)")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.set_defaults(handler=serve_command)
    return p  # type: ignore[no-any-return]


def serve_command(args: argparse.Namespace, out: Output) -> int:
    """``trt-runtime serve``."""
    from trt_runtime.errors import BackendUnavailableError
    from trt_runtime.serve import ServeOptions, require_ray

    try:
        serve = require_ray()
    except BackendUnavailableError as exc:
        raise CliError(str(exc)) from None
    import ray

    from trt_runtime.serve import build_app

    if args.backend is None:  # a named backend judges its own files (the memory backend's .mem)
        check_engine_file(args.file, force=args.force, out=out)
    elif not args.file.is_file():
        raise CliError(f"no such file: {args.file}")
    try:
        options = ServeOptions(
            backend=args.backend, device=args.device, settings=settings_overrides(args) or None,
            contexts=args.contexts, outer_graph=args.outer_graph, max_batch=args.max_batch,
            batch_wait_ms=args.batch_wait_ms,
            runtime_cache=args.runtime_cache if args.runtime_cache is not None else "auto",
        )
        engine: Any = args.file.read_bytes() if args.ship else args.file.resolve()
        app = build_app(engine, options, replicas=args.replicas, gpus_per_replica=args.gpus_per_replica,
                        cpus_per_replica=args.cpus_per_replica)
    except (ValueError, TypeError) as exc:
        raise CliError(str(exc)) from None
    prefix = "/" + args.route_prefix.strip("/")
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    started = not ray.is_initialized() and args.address is None
    try:
        # "local": always a new Ray here, never the last cluster this machine ran (Ray's default).
        ray.init(address=args.address or "local", log_to_driver=False)
        serve.start(http_options={"host": args.host, "port": args.port})
        out.info(f"deploying {args.file.name}: {args.replicas} replica(s), max batch {args.max_batch}, "
                 f"batch wait {args.batch_wait_ms} ms")
        serve.run(app, name=args.name, route_prefix=prefix)
        url = f"http://{args.host}:{args.port}{prefix}"
        out.emit({"url": url, "engine": str(args.file), "replicas": args.replicas})
        out.notice(f"serving {args.file.name} at {url} (Ctrl-C to stop)")
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
        out.notice("stopping")
    finally:
        signal.signal(signal.SIGTERM, previous)
        _shutdown(serve, ray, args.name, started)
    print("stopped", file=sys.stderr, flush=True)
    return 0


def _shutdown(serve: Any, ray: Any, name: str, started: bool) -> None:
    if not ray.is_initialized():
        return
    try:
        if started:
            serve.shutdown()
        else:
            serve.delete(name)
    finally:
        ray.shutdown()
