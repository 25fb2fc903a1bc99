"""The Ray Serve deployment of an engine: :class:`EngineServer` and :func:`build_app`.

This module imports Ray; :mod:`trt_runtime.serve` loads it on first use only.

One replica loads its engine once (:func:`~trt_runtime.serve.replica.open_engine`),
checks every request against the engine's input specs before anything is queued,
gathers requests with Ray Serve's ``@serve.batch`` and runs each batch on a worker
thread (one per execution context), so the replica's event loop keeps taking requests
while the engine runs.
"""

from __future__ import annotations

import asyncio
import collections
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ray import serve
from ray.serve import metrics

from trt_runtime.errors import EngineError, RequestError, SettingsError
from trt_runtime.serve import codec
from trt_runtime.serve.batching import Answer, BatchRunner
from trt_runtime.serve.options import ServeOptions
from trt_runtime.serve.replica import open_engine
from trt_runtime.serve.validation import RequestChecker

__all__ = ["EngineServer", "build_app"]

_LATENCY_MS: list[float] = [0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000]
_SIZES: list[float] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


class _Stats:
    """What a replica has served, for :meth:`EngineServer.stats` and Ray's metrics."""

    def __init__(self, engine: str) -> None:
        self._lock = threading.Lock()
        self.by_status: collections.Counter[int] = collections.Counter()
        self.batch_requests: collections.Counter[int] = collections.Counter()
        self.call_rows: collections.Counter[int] = collections.Counter()
        tags = ("engine", "status")
        self.requests = metrics.Counter(
            "trt_runtime_serve_requests", description="Requests answered, by status.", tag_keys=tags,  # type: ignore[arg-type]
        )
        self.latency = metrics.Histogram(
            "trt_runtime_serve_latency_ms", description="Time from a request's arrival to its answer.",
            boundaries=_LATENCY_MS, tag_keys=("engine",),
        )
        self.batch_size = metrics.Histogram(
            "trt_runtime_serve_batch_size", description="Requests per batch.",
            boundaries=_SIZES, tag_keys=("engine",),
        )
        self.rows = metrics.Histogram(
            "trt_runtime_serve_call_rows", description="Rows per engine call.",
            boundaries=_SIZES, tag_keys=("engine",),
        )
        for metric in (self.requests, self.latency, self.batch_size, self.rows):
            metric.set_default_tags({"engine": engine})

    def answered(self, status: int, started: float) -> None:
        with self._lock:
            self.by_status[status] += 1
        self.requests.inc(1, tags={"status": str(status)})
        self.latency.observe((time.perf_counter() - started) * 1e3)

    def batch(self, size: int) -> None:
        with self._lock:
            self.batch_requests[size] += 1
        self.batch_size.observe(size)

    def call(self, rows: int) -> None:
        with self._lock:
            self.call_rows[rows] += 1
        self.rows.observe(rows)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": {str(k): v for k, v in sorted(self.by_status.items())},
                "batch_sizes": {str(k): v for k, v in sorted(self.batch_requests.items())},
                "call_rows": {str(k): v for k, v in sorted(self.call_rows.items())},
            }


class EngineServer:
    """One replica: an engine, its request checker, a batcher and an HTTP front.

    Ways in: ``handle.infer.remote(*arrays)`` or ``handle.infer.remote(name=array, ...)``
    (``handle.remote`` too) with numpy arrays or torch tensors, answered like
    ``engine(...)``: one output bare, several as a tuple, torch tensors for torch inputs;
    and HTTP (:mod:`~trt_runtime.serve.codec`): ``POST /`` or ``/infer`` to infer,
    ``GET /ready`` (engine and its first context exist) and ``GET /stats``.
    """

    def __init__(self, engine: bytes | str, options: ServeOptions | dict[str, Any] | None = None) -> None:
        import ray

        self.options = ServeOptions.coerce(options)
        # Ray narrows CUDA_VISIBLE_DEVICES to the replica's GPU: it is device 0 here.
        device = self.options.device
        if device is None and ray.is_initialized() and ray.get_gpu_ids():
            device = 0
        self.engine, self.cache = open_engine(engine, self.options, device=device)
        self.name = str(getattr(self.engine, "name", "engine"))
        self.checker = RequestChecker(self.name, self.engine.inputs, self.engine.outputs)
        self._output_names = [o.name for o in self.engine.outputs]
        self._stats = _Stats(self.name)
        graph = getattr(self.engine, "outer_graph", None)
        self._runner = BatchRunner(
            self.engine.execute,
            self.checker,
            copy_outputs=getattr(graph, "outputs", None) == "view",
            on_call=self._stats.call,
        )
        self._pool = ThreadPoolExecutor(max_workers=self.options.contexts, thread_name_prefix="trt-serve")
        batched: Any = self._batched  # @serve.batch adds the setters
        batched.set_max_batch_size(self.options.max_batch)
        batched.set_batch_wait_timeout_s(self.options.batch_wait_ms / 1e3)
        self._node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""

    # -- health --------------------------------------------------------------------------
    def check_health(self) -> None:
        """Ray Serve's health check: fails once the engine is closed or has no context."""
        if getattr(self.engine, "closed", False) or not self.engine.has_context():
            raise EngineError(f"engine {self.name!r} is closed or has no execution context")

    def describe(self) -> dict[str, Any]:
        """The engine's inputs and outputs and how this replica serves them."""
        spec = [
            {"name": s.name, "dtype": s.dtype, "shape": list(s.shape),
             "profiles": [[list(p) for p in t] for t in s.profiles]}
            for s in self.engine.inputs
        ]
        out = [{"name": s.name, "dtype": s.dtype, "shape": list(s.shape)} for s in self.engine.outputs]
        return {
            "engine": self.name, "backend": self.engine.backend.name, "inputs": spec, "outputs": out,
            "max_batch": self.options.max_batch, "batch_wait_ms": self.options.batch_wait_ms,
            "batchable": self.checker.batchable, "node_id": self._node, "pid": os.getpid(),
            "runtime_cache": None if self.cache is None else str(self.cache.path),
        }

    def stats(self) -> dict[str, Any]:
        """Requests by status, requests per batch and rows per engine call, since start."""
        return {**self._stats.snapshot(), "node_id": self._node, "pid": os.getpid()}

    # -- inference -----------------------------------------------------------------------
    async def __call__(self, *args: Any, **named: Any) -> Any:
        from starlette.requests import Request

        if len(args) == 1 and not named and isinstance(args[0], Request):
            return await self._http(args[0])
        return await self.infer(*args, **named)

    async def infer(self, *args: Any, **named: Any) -> Any:
        """Run one request given as arrays (by position or name); ``RequestError`` if it does not fit."""
        started = time.perf_counter()
        torch_out = any(_is_torch(v) for v in (*args, *named.values()))
        try:
            arrays = self.checker.check(
                [_to_numpy(v) for v in args], {k: _to_numpy(v) for k, v in named.items()}
            )
            outputs = await self._run(arrays)
        except RequestError as exc:
            self._stats.answered(exc.status, started)
            raise
        except Exception:
            self._stats.answered(500, started)
            raise
        self._stats.answered(200, started)
        if torch_out:
            import torch

            outputs = [torch.from_numpy(o) for o in outputs]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    async def _run(self, arrays: tuple[Any, ...]) -> list[Any]:
        if self.options.batching and self.checker.batchable:
            answer = await self._batched(arrays)
        else:
            self._stats.batch(1)
            loop = asyncio.get_running_loop()
            answer = (await loop.run_in_executor(self._pool, self._runner.run, [arrays]))[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.002)
    async def _batched(self, requests: list[tuple[Any, ...]]) -> list[Answer]:
        self._stats.batch(len(requests))
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._runner.run, requests)

    # -- HTTP ----------------------------------------------------------------------------
    async def _http(self, request: Any) -> Any:
        from starlette.responses import JSONResponse, Response

        started = time.perf_counter()
        route = _route(request)
        if request.method == "GET" and route == "/ready":
            self.check_health()
            return JSONResponse(self.describe())
        if request.method == "GET" and route == "/stats":
            return JSONResponse(self.stats())
        if route not in ("/", "/infer"):
            self._stats.answered(404, started)
            return _text(f"no route {route!r}; POST / or /infer, GET /ready or /stats", 404)
        if request.method != "POST":
            self._stats.answered(405, started)
            return _text(f"method {request.method} is not allowed on {route!r}; use POST", 405)
        try:
            body = await _read_body(request, self.options.max_body_bytes)
            decoded = codec.decode_body(
                request.headers.get("content-type", ""), body, self.engine.inputs, self.options.max_body_bytes
            )
            arrays = self.checker.check(decoded.args, decoded.named)
        except RequestError as exc:
            self._stats.answered(exc.status, started)
            return _text(str(exc), exc.status)
        try:
            outputs = await self._run(arrays)
            content, media = codec.encode_result(outputs, self._output_names, decoded.encoding, decoded.bare)
        except Exception as exc:  # the engine failed: the only 500, and counted
            self._stats.answered(500, started)
            return _text(f"engine {self.name!r} failed: {type(exc).__name__}: {exc}", 500)
        self._stats.answered(200, started)
        return Response(content, media_type=media)

    # -- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        """Close the engine and save the runtime cache; idempotent."""
        self._pool.shutdown(wait=True)
        self.engine.close()
        if self.cache is not None:
            self.cache.close()

    def __del__(self) -> None:  # Ray Serve's shutdown hook for a replica
        if hasattr(self, "cache"):
            self.close()


def _route(request: Any) -> str:
    path = request.scope.get("path", "/")
    root = request.scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root):]
    return "/" + path.strip("/")


async def _read_body(request: Any, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise RequestError(f"Content-Length {length!r} is not a number of bytes", 400)
        if int(length) > limit:
            raise RequestError(f"request body of {length} bytes exceeds the limit of {limit} bytes", 413)
    return await codec.read_body_limited(request.stream(), limit)


def _text(message: str, status: int) -> Any:
    from starlette.responses import PlainTextResponse

    return PlainTextResponse(" ".join(message.split()) + "\n", status_code=status)


def _is_torch(value: Any) -> bool:
    return type(value).__module__.startswith("torch")


def _to_numpy(value: Any) -> Any:
    if _is_torch(value):
        return value.detach().cpu().numpy()
    return value


def build_app(
    engine: bytes | str | os.PathLike[str],
    options: ServeOptions | dict[str, Any] | None = None,
    *,
    replicas: int = 1,
    gpus_per_replica: float = 0.0,
    cpus_per_replica: float = 1.0,
    max_ongoing_requests: int | None = None,
    name: str = "TrtEngine",
    server_class: type[EngineServer] | None = None,
    deployment_options: dict[str, Any] | None = None,
) -> Any:
    """A Ray Serve application serving ``engine`` (bytes travel to every node; a path must
    exist on every node); run it with ``serve.run(app, route_prefix=...)``.

    ``gpus_per_replica`` may be fractional (several replicas share a GPU). Each replica
    takes up to ``max_ongoing_requests`` at once (default: ``max(64, 2 * max_batch)``; Ray's
    default of 5 would cap every batch at 5).
    """
    opts = ServeOptions.coerce(options)
    for field, value, low in (("replicas", replicas, 1),):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise SettingsError(f"{field} must be an integer >= {low}; got {value!r}")
    for field, number in (("gpus_per_replica", gpus_per_replica), ("cpus_per_replica", cpus_per_replica)):
        if isinstance(number, bool) or not isinstance(number, (int, float)) or number < 0:
            raise SettingsError(f"{field} must be a number >= 0; got {number!r}")
    source: bytes | str = bytes(engine) if isinstance(engine, (bytes, bytearray)) else os.path.abspath(engine)
    ongoing = max_ongoing_requests or max(64, 2 * opts.max_batch)
    deployment = serve.deployment(
        name=name,
        num_replicas=replicas,
        max_ongoing_requests=ongoing,
        ray_actor_options={"num_cpus": cpus_per_replica, "num_gpus": gpus_per_replica},
        **(deployment_options or {}),
    )(server_class or EngineServer)
    return deployment.bind(source, opts)


