"""``trt-runtime serve ENGINE --ray``: deploy the engine on Ray Serve (clusters) until Ctrl-C.

Starts a local Ray (or joins a running cluster with ``--address``), deploys the engine
(:func:`trt_runtime.serve.build_app`), prints the URL and waits. Ctrl-C (SIGINT) or
SIGTERM stops it cleanly: the application is deleted, and a Ray this command started is
shut down; a joined cluster keeps running.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from typing import Any

from trt_runtime.cli.output import CliError, Output

__all__ = ["serve_ray"]


def serve_ray(args: argparse.Namespace, out: Output, options: Any, name: str) -> int:
    """Deploy with Ray Serve; returns 0 after Ctrl-C / SIGTERM."""
    from trt_runtime.errors import BackendUnavailableError
    from trt_runtime.serve import require_ray

    try:
        serve = require_ray()
    except BackendUnavailableError as exc:
        raise CliError(str(exc)) from None
    import ray

    from trt_runtime.serve import build_app

    replicas = args.replicas or 1
    try:
        engine: Any = args.file.read_bytes() if args.ship else args.file.resolve()
        app = build_app(engine, options, replicas=replicas, gpus_per_replica=args.gpus_per_replica or 0.0,
                        cpus_per_replica=1.0 if args.cpus_per_replica is None else args.cpus_per_replica,
                        model_name=name)
    except (ValueError, TypeError) as exc:
        raise CliError(str(exc)) from None
    prefix = "/" + (args.route_prefix or "/").strip("/")
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    started = not ray.is_initialized() and args.address is None
    try:
        # "local": always a new Ray here, never the last cluster this machine ran (Ray's default).
        # Ray's start and stop chatter stays off the user's screen unless --log-level info/verbose.
        quiet = args.log_level not in ("info", "verbose")
        if quiet:
            logging.getLogger("ray.serve").setLevel(logging.WARNING)
        ray.init(address=args.address or "local", log_to_driver=not quiet,
                 logging_level=logging.WARNING if quiet else logging.DEBUG)
        serve.start(http_options={"host": args.host, "port": args.port})
        out.info(f"deploying {args.file.name}: {replicas} replica(s), max batch {args.max_batch}, "
                 f"queue delay {args.max_queue_delay_us} µs")
        serve.run(app, name=name, route_prefix=prefix)
        url = f"http://{args.host}:{args.port}{prefix}"
        out.emit({"url": url, "engine": str(args.file), "replicas": replicas})
        out.notice(f"serving {args.file.name} at {url} (Ctrl-C to stop)")
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
        out.notice("stopping")
    finally:
        signal.signal(signal.SIGTERM, previous)
        _shutdown(serve, ray, name, started)
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
