"""The Ray Serve deployment of an engine: :class:`EngineServer` and :func:`build_app`.

This module imports Ray; :mod:`trt_runtime.serve` loads it on first use only.

A replica runs the same request layer as the local server: it loads its engine once
(:func:`~trt_runtime.serve.replica.open_engine`), describes it as a
:class:`~trt_runtime.serve.model.ModelInfo`, batches with a
:class:`~trt_runtime.serve.batcher.DynamicBatcher` (one engine thread per execution
context) and answers HTTP with the app of :func:`~trt_runtime.serve.http.make_app`
(the Open Inference Protocol and the ``POST /`` shorthand), plus ``GET /ready`` and
``GET /stats``. Handles call :meth:`EngineServer.infer` with arrays.
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import MutableMapping
from typing import Any

from ray import serve
from ray.serve import metrics as ray_metrics

from trt_runtime.errors import EngineError, RequestError, SettingsError
from trt_runtime.serve.batcher import DynamicBatcher
from trt_runtime.serve.http import make_app
from trt_runtime.serve.metrics import ServeMetrics
from trt_runtime.serve.model import ModelInfo
from trt_runtime.serve.model import model_name as served_name
from trt_runtime.serve.options import ServeOptions
from trt_runtime.serve.replica import call_modes, open_engine

__all__ = ["EngineServer", "build_app"]

_SIZES: list[float] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


class _ReplicaMetrics(ServeMetrics):
    """The request layer's metrics, also counted for :meth:`EngineServer.stats` and exported
    through Ray's metrics (which Ray sums over replicas and nodes)."""

    def __init__(self, model: str, engine: str) -> None:
        super().__init__(model)
        self._lock = threading.Lock()
        self.by_status: collections.Counter[int] = collections.Counter()
        self.batch_requests: collections.Counter[int] = collections.Counter()
        self.call_rows: collections.Counter[int] = collections.Counter()
        self._ray_requests = ray_metrics.Counter(
            "trt_runtime_serve_requests", description="Requests answered, by status.",
            tag_keys=("engine", "status"),  # type: ignore[arg-type]
        )
        self._ray_batch = ray_metrics.Histogram(
            "trt_runtime_serve_batch_size", description="Requests per batch.", boundaries=_SIZES,
            tag_keys=("engine",),
        )
        self._ray_rows = ray_metrics.Histogram(
            "trt_runtime_serve_call_rows", description="Rows per engine call.", boundaries=_SIZES,
            tag_keys=("engine",),
        )
        for metric in (self._ray_requests, self._ray_batch, self._ray_rows):
            metric.set_default_tags({"engine": engine})

    def answered(self, code: int) -> None:
        super().answered(code)
        with self._lock:
            self.by_status[code] += 1
        self._ray_requests.inc(1, tags={"status": str(code)})

    def batched(self, requests: int) -> None:
        super().batched(requests)
        with self._lock:
            self.batch_requests[requests] += 1
        self._ray_batch.observe(requests)

    def engine_call(self, rows: int, seconds: float) -> None:
        super().engine_call(rows, seconds)
        with self._lock:
            self.call_rows[rows] += 1
        self._ray_rows.observe(rows)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": {str(k): v for k, v in sorted(self.by_status.items())},
                "batch_sizes": {str(k): v for k, v in sorted(self.batch_requests.items())},
                "call_rows": {str(k): v for k, v in sorted(self.call_rows.items())},
            }


class EngineServer:
    """One replica: an engine, its model description, a batcher and an HTTP app.

    Ways in: ``handle.infer.remote(*arrays)`` or ``handle.infer.remote(name=array, ...)``
    (``handle.remote`` too) with numpy arrays or torch tensors, answered like
    ``engine(...)``: one output bare, several as a tuple, torch tensors for torch inputs;
    and HTTP (:func:`~trt_runtime.serve.http.make_app`): the Open Inference Protocol under
    ``/v2``, ``POST /`` or ``/infer``, ``GET /ready`` (engine and its first context
    exist) and ``GET /stats``. ``model_name``: the name under ``/v2/models/`` (default:
    the engine file's stem, or the engine's own name for bytes).
    """

    def __init__(
        self, engine: bytes | str, options: ServeOptions | dict[str, Any] | None = None,
        model_name: str | None = None,
    ) -> None:
        import ray
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        self.options = ServeOptions.coerce(options)
        # Ray narrows CUDA_VISIBLE_DEVICES to the replica's GPU: it is device 0 here.
        device = self.options.device
        if device is None and ray.is_initialized() and ray.get_gpu_ids():
            device = 0
        self.engine, self.cache = open_engine(engine, self.options, device=device)
        self.name = str(getattr(self.engine, "name", "engine"))
        served = served_name(engine, model_name) if isinstance(engine, str) else model_name or self.name
        self.model = ModelInfo.from_engine(self.engine, served, max_batch=self.options.max_batch)
        self.checker = self.model.checker
        self._metrics = _ReplicaMetrics(self.model.name, self.name)
        self._modes = call_modes(self.engine, self.options)
        self._batcher = DynamicBatcher(
            [self.engine.execute] * self.options.contexts, self.checker, max_batch=self.options.max_batch,
            max_queue_delay_us=round(self.options.batch_wait_ms * 1000), metrics=self._metrics,
            copy_outputs=self._modes.copy_outputs, pad_rows=self._modes.pad_batches,
        )

        async def ready_route(request: Any) -> Any:
            self.check_health()
            return JSONResponse(self.describe())

        async def stats_route(request: Any) -> Any:
            return JSONResponse(self.stats())

        self._app = make_app(
            self.model, self._batcher.submit, metrics=self._metrics, ready=self._healthy,
            max_body_bytes=self.options.max_body_bytes,
            extra_routes=[Route("/ready", ready_route, methods=["GET"]),
                          Route("/stats", stats_route, methods=["GET"])],
        )
        self._node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""

    # -- health --------------------------------------------------------------------------
    def check_health(self) -> None:
        """Ray Serve's health check: fails once the engine is closed or has no context."""
        if getattr(self.engine, "closed", False) or not self.engine.has_context():
            raise EngineError(f"engine {self.name!r} is closed or has no execution context")

    def _healthy(self) -> bool:
        try:
            self.check_health()
        except EngineError:
            return False
        return True

    def describe(self) -> dict[str, Any]:
        """The engine's inputs and outputs and how this replica serves them."""
        spec = [
            {"name": s.name, "dtype": s.dtype, "shape": list(s.shape),
             "profiles": [[list(p) for p in t] for t in s.profiles]}
            for s in self.engine.inputs
        ]
        out = [{"name": s.name, "dtype": s.dtype, "shape": list(s.shape)} for s in self.engine.outputs]
        return {
            "engine": self.name, "model": self.model.name, "backend": self.engine.backend.name,
            "inputs": spec, "outputs": out,
            "max_batch": self.options.max_batch, "batch_wait_ms": self.options.batch_wait_ms,
            "batchable": self.checker.batchable, "node_id": self._node, "pid": os.getpid(),
            "runtime_cache": None if self.cache is None else str(self.cache.path),
            "outer_graph": self._modes.outer_graph, "pad_batches": self._modes.pad_batches,
        }

    def stats(self) -> dict[str, Any]:
        """Requests by status, requests per batch and rows per engine call, since start."""
        return {**self._metrics.snapshot(), "node_id": self._node, "pid": os.getpid()}

    # -- inference -----------------------------------------------------------------------
    async def __call__(self, *args: Any, **named: Any) -> Any:
        from starlette.requests import Request

        if len(args) == 1 and not named and isinstance(args[0], Request):
            return await self._http(args[0])
        return await self.infer(*args, **named)

    async def infer(self, *args: Any, **named: Any) -> Any:
        """Run one request given as arrays (by position or name); ``RequestError`` if it does not fit."""
        torch_out = any(_is_torch(v) for v in (*args, *named.values()))
        try:
            arrays = self.checker.check(
                [_to_numpy(v) for v in args], {k: _to_numpy(v) for k, v in named.items()}
            )
            outputs = await self._batcher.submit(arrays)
        except RequestError as exc:
            self._metrics.answered(exc.status)
            raise
        except Exception:
            self._metrics.answered(500)
            raise
        self._metrics.answered(200)
        if torch_out:
            import torch

            outputs = [torch.from_numpy(o) for o in outputs]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    async def _http(self, request: Any) -> Any:
        """Run the request layer's ASGI app on Ray's request; its answer as one Response."""
        from starlette.responses import Response

        start: dict[str, Any] = {}
        body: list[bytes] = []

        async def send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                body.append(message.get("body", b""))

        scope = request.scope
        root = scope.get("root_path", "")
        if scope.get("path", "") in ("", root):  # the route prefix itself is the shorthand's "/"
            scope = {**scope, "path": root + "/"}
        await self._app(scope, request.receive, send)
        response = Response(b"".join(body), status_code=start["status"])
        response.raw_headers = list(start.get("headers", []))
        return response

    # -- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        """Wait for the engine calls running now, close the engine, save the runtime cache; idempotent."""
        self._batcher.close()
        self.engine.close()
        if self.cache is not None:
            self.cache.close()

    def __del__(self) -> None:  # Ray Serve's shutdown hook for a replica
        if hasattr(self, "cache"):
            self.close()


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
    model_name: str | None = None,
) -> Any:
    """A Ray Serve application serving ``engine`` (bytes travel to every node; a path must
    exist on every node); run it with ``serve.run(app, route_prefix=...)``.

    ``gpus_per_replica`` may be fractional (several replicas share a GPU). Each replica
    takes up to ``max_ongoing_requests`` at once (default: ``max(64, 2 * max_batch)``; Ray's
    default of 5 would cap every batch at 5). ``model_name``: the name clients use under
    ``/v2/models/`` (default: the engine file's stem, or the engine's own name for bytes).
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
    if model_name is None:
        return deployment.bind(source, opts)
    return deployment.bind(source, opts, model_name=model_name)


