"""``trt-runtime serve ENGINE``: serve an engine over HTTP (the Open Inference Protocol) until Ctrl-C.

Without ``--ray`` it runs the local server (:mod:`trt_runtime.serve.local`): ``--workers``
front processes share the listening socket, one engine process per GPU (``--gpus``)
batches and runs the engine, tensors cross between them through shared memory. With
``--ray`` it deploys the same request layer on Ray Serve (:mod:`trt_runtime.cli.serve_ray`).
The backend is chosen from the engine file exactly as ``trt-runtime run`` chooses it.
SIGINT / SIGTERM: stop accepting, finish in-flight requests (``--drain-s``), exit 0. A
busy port or a GPU that does not exist: one line, exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from trt_runtime.cli.engine_files import FORCE_HELP, engine_file_backend
from trt_runtime.cli.io_options import LOG_LEVELS
from trt_runtime.cli.output import CliError, Output, UsageError
from trt_runtime.cli.run import settings_overrides

__all__ = ["add_serve_parser", "serve_command"]

_RAY_ONLY = ("replicas", "gpus_per_replica", "cpus_per_replica", "route_prefix", "ship", "device", "address")


class _StartError(CliError):
    """The server cannot start for a reason outside the engine (a busy port); exit 2, no usage hint."""

    exit_code = 2


def add_serve_parser(command: Any) -> argparse.ArgumentParser:
    """Add the ``serve`` subcommand (``command(name, help)`` makes a subparser)."""
    p = command("serve", "serve an engine over HTTP (Open Inference Protocol, tritonclient) with dynamic "
                         "batching: front processes and one engine process per GPU; --ray for Ray Serve")
    p.add_argument("file", type=Path, help="a raw plan, a TR01/TR02 blob, a .pte program or a .mem engine")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="front processes parsing HTTP (default: 4, at most the CPU count)")
    p.add_argument("--gpus", default="all", metavar="all|0,1",
                   help="GPUs to serve on, one engine process each (default: all; one process without a GPU)")
    p.add_argument("--name", default=None, help="model name in the URLs (default: the engine file's stem)")
    p.add_argument("--host", default="127.0.0.1", help="HTTP address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, metavar="P", help="HTTP port (default: 8000)")
    p.add_argument("--max-batch", type=int, default=64, metavar="B",
                   help="requests gathered into one batch; 1 turns batching off (default: 64)")
    p.add_argument("--max-queue-delay-us", type=int, default=500, metavar="T",
                   help="longest wait for a batch to fill once a request arrived, in µs (default: 500)")
    p.add_argument("--contexts", type=int, default=1, metavar="N",
                   help="execution contexts per engine process, one worker thread each (default: 1)")
    p.add_argument("--engine-calls", choices=("auto", "threads", "loop"), default=None,
                   help="where an engine process runs its calls: threads, one per context; loop, on "
                        "its event loop with no thread (one context; no GIL shared with a thread); "
                        "auto: loop for one context with batching on and an engine that can batch, "
                        "else threads (default: auto)")
    p.add_argument("--engine-poll-us", type=int, default=None, metavar="T",
                   help="an engine process's event loop polls its sockets instead of sleeping for T µs "
                        "after each request and batch (a core kept busy meanwhile; where its engine calls "
                        "run on the loop); 0: it sleeps (default: 0)")
    p.add_argument("--front-poll-us", type=int, default=None, metavar="T",
                   help="the same for each front process, after each request it sends and each answer "
                        "(default: 0)")
    p.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=None,
                   help="an engine process starts each batch's call and reads its sockets while the GPU "
                        "runs it, instead of waiting for it; applies where its calls run on the loop, padded "
                        "under the outer graph, with every dimension but the batch fixed (default: off)")
    p.add_argument("--outer-graph", action=argparse.BooleanOptionalAction, default=None,
                   help="wrap each engine call in an outer CUDA graph (default: on where batching is on, "
                        "the engine can batch and the backend supports it)")
    p.add_argument("--pad-batches", action=argparse.BooleanOptionalAction, default=None,
                   help="pad each batched call's rows up to a power of two, so the engine sees a few "
                        "shapes only (default: wherever the outer graph runs)")
    p.add_argument("--drain-s", type=float, default=10.0, metavar="S",
                   help="on SIGINT/SIGTERM, how long in-flight requests may take to finish (default: 10)")
    p.add_argument("--backend", metavar="NAME", default=None,
                   help="backend (default: the one that reads the file, else the first available)")
    p.add_argument("--runtime-cache", metavar="PATH", type=Path, default=None,
                   help="runtime cache file (default: one per node and GPU model in the user cache)")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("--log-level", choices=LOG_LEVELS, default="warning",
                   help="TensorRT's messages, and with --ray Ray's own, shown on stderr (default: warning)")
    ray = p.add_argument_group("Ray Serve (--ray)")
    ray.add_argument("--ray", action="store_true", help="deploy on Ray Serve instead (clusters)")
    ray.add_argument("--address", metavar="ADDR", default=None,
                     help="join the Ray cluster at ADDR ('auto': the one 'ray start' began here; "
                          "default: start a new local Ray)")
    ray.add_argument("--replicas", type=int, default=None, help="replicas of the engine (default: 1)")
    ray.add_argument("--gpus-per-replica", type=float, default=None, metavar="F",
                     help="GPUs per replica; a fraction shares one GPU (default: 0, no GPU reserved)")
    ray.add_argument("--cpus-per-replica", type=float, default=None, metavar="F",
                     help="CPUs per replica (default: 1)")
    ray.add_argument("--route-prefix", default=None, help="URL path of the engine (default: /)")
    ray.add_argument("--device", type=int, default=None,
                     help="CUDA device (default: the replica's GPU, else the container's)")
    ray.add_argument("--ship", action="store_true", default=None,
                     help="send the engine's bytes to every replica (default: each node reads FILE)")
    p.set_defaults(handler=serve_command)
    return p  # type: ignore[no-any-return]


def _auto(flag: bool | None) -> bool | str:
    """``--outer-graph``/``--no-outer-graph`` (and the same for padding): given, or ``"auto"``."""
    from trt_runtime.serve.options import AUTO

    return AUTO if flag is None else flag


def _check_numbers(args: argparse.Namespace) -> None:
    for flag, value, low in (("--workers", args.workers, 1), ("--max-batch", args.max_batch, 1),
                             ("--max-queue-delay-us", args.max_queue_delay_us, 0),
                             ("--contexts", args.contexts, 1), ("--drain-s", args.drain_s, 0),
                             ("--replicas", args.replicas, 1)):
        if value is not None and value < low:
            raise UsageError(f"{flag} must be >= {low}; got {value}", command="serve")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in 0..65535; got {args.port}", command="serve")
    if not args.ray:
        given = [f"--{k.replace('_', '-')}" for k in _RAY_ONLY if getattr(args, k) is not None]
        if given:
            verb = "apply" if len(given) > 1 else "applies"
            raise UsageError(f"{', '.join(given)} {verb} to --ray only", command="serve")
    elif (args.workers is not None or args.gpus != "all" or args.engine_calls is not None
          or args.engine_poll_us is not None or args.front_poll_us is not None or args.overlap is not None):
        raise UsageError("--workers, --gpus, --engine-calls, --engine-poll-us, --front-poll-us and --overlap "
                         "apply to the local server, not --ray (use --replicas and --gpus-per-replica)",
                         command="serve")


def serve_command(args: argparse.Namespace, out: Output) -> int:
    """``trt-runtime serve``."""
    from trt_runtime.errors import SettingsError
    from trt_runtime.serve import ServeOptions

    _check_numbers(args)
    # Ray places replicas on the cluster's nodes: this machine need not run the engine itself.
    backend_name = engine_file_backend(args.file, args.backend, force=args.force, out=out, action="serve",
                                       require=not args.ray)
    try:
        options = ServeOptions(
            backend=backend_name, device=args.device, settings=settings_overrides(args) or None,
            contexts=args.contexts, outer_graph=_auto(args.outer_graph), max_batch=args.max_batch,
            pad_batches=_auto(args.pad_batches),
            batch_wait_ms=args.max_queue_delay_us / 1000.0,
            runtime_cache=args.runtime_cache if args.runtime_cache is not None else "auto",
        )
    except (SettingsError, ValueError, TypeError) as exc:
        raise UsageError(str(exc), command="serve") from None
    from trt_runtime.serve.model import model_name

    try:
        name = model_name(args.file, args.name)
    except ValueError as exc:
        raise UsageError(f"--name: {exc}", command="serve") from None
    if args.ray:
        from trt_runtime.cli.serve_ray import serve_ray

        return serve_ray(args, out, options, name)
    return _serve_local(args, out, options, name)


def _serve_local(args: argparse.Namespace, out: Output, options: Any, name: str) -> int:
    from trt_runtime.errors import SettingsError
    from trt_runtime.serve import local
    from trt_runtime.serve.local import dispatch
    from trt_runtime.serve.options import AUTO

    workers = args.workers if args.workers is not None else min(4, os.cpu_count() or 1)
    try:
        _require_http()
        gpus = local.resolve_gpus(args.gpus, local.cuda_device_count())
        config = local.LocalServerConfig(
            engine=args.file.resolve(), options=options, name=name, host=args.host, port=args.port,
            workers=workers, gpus=gpus, max_queue_delay_us=args.max_queue_delay_us, drain_s=args.drain_s,
            engine_calls=args.engine_calls or "auto", engine_poll_us=args.engine_poll_us or 0,
            front_poll_us=args.front_poll_us or 0, engine_overlap=bool(args.overlap),
        )
        dispatch.supported()  # (a bad TRT_RUNTIME_SERVE_DISPATCH: a usage error, before the port)
        sock = local.bind_socket(args.host, args.port)
    except SettingsError as exc:
        raise UsageError(str(exc), command="serve") from None
    except local.ServeStartError as exc:
        if exc.usage and "--gpus" in str(exc):
            raise UsageError(str(exc), command="serve") from None
        raise _StartError(str(exc)) from None
    port = sock.getsockname()[1]
    url = f"http://{args.host}:{port}"

    def ready(model: Any) -> None:
        calls = {k: v for k, v in server.calls.items() if k in ("outer_graph", "pad_batches", "overlap")}
        out.emit({"url": url, "model": name, "engine": str(args.file), "workers": workers,
                  "gpus": [g for g in gpus if g is not None], "pids": server.pids(),
                  "engine_calls": "loop" if config.calls_on_loop(model.checker.batchable) else "threads",
                  **calls})
        out.notice(f"serving {name} at {url}/v2/models/{name} ({workers} front process(es), "
                   f"{len(gpus)} engine process(es); Ctrl-C to stop)")

    calls = {"auto": "on the event loop if the engine can batch", "threads": "on worker threads",
             "loop": "on the event loop"}[config.engine_calls]
    graph = {AUTO: "where the engine can batch", True: "on", False: "off"}[options.outer_graph]
    pad = {AUTO: "wherever the outer graph runs", True: "to powers of two", False: "off"}[options.pad_batches]
    out.info(f"loading {args.file.name}: max batch {args.max_batch}, queue delay "
             f"{args.max_queue_delay_us} µs, engine calls {calls}, outer graph {graph}, batches padded {pad}")
    server = local.LocalServer(config, sock, log=out.warn)
    try:
        code = server.run(on_ready=ready)
    except local.ServeStartError as exc:
        raise CliError(str(exc)) from None
    print("stopped", file=sys.stderr, flush=True)
    return code


def _require_http() -> None:
    """The local server's HTTP stack, or one line naming the extra."""
    import importlib.util

    needed = ("uvicorn", "starlette", "prometheus_client")
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        raise CliError(f"the local server needs {', '.join(missing)}: "
                       "pip install -c constraints.txt -e '.[serve]'")
