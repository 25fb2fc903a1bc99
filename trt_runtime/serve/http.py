"""The HTTP front of a served model: the Open Inference Protocol (KServe v2) and a shorthand.

:func:`make_app` builds a Starlette app around an ``infer`` coroutine (the in-process
:class:`~trt_runtime.serve.batcher.DynamicBatcher`'s ``submit``, or a call to an engine
process). It decodes and checks every request on the event loop, awaits ``infer`` and
answers from the loop. Routes:

* ``GET /v2/health/live``, ``GET /v2/health/ready``, ``GET /v2`` (server metadata);
* ``GET /v2/models/{name}`` (metadata), ``.../ready``, ``.../config``, and
  ``POST /v2/models/{name}/infer`` (JSON tensors and binary tensor data), each also under
  ``/v2/models/{name}/versions/{version}``;
* ``POST /`` and ``POST /infer``: a JSON, ``.npy`` or ``.npz`` body
  (:mod:`~trt_runtime.serve.codec`), answered in the same form;
* ``GET /metrics``: Prometheus text.

A refused request gets ``{"error": "<one line>"}``: 400 for a malformed request or
one that does not fit the model (datatype, shape, name, count), 404 for an unknown
model, 413 for a body over ``max_body_bytes``, 415 for an unknown content type on the
shorthand (whose checks answer 422, as they always have), 503 while not ready.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from trt_runtime.errors import RequestError, SettingsError
from trt_runtime.serve import codec, kserve
from trt_runtime.serve.model import ModelInfo

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import BaseRoute

    from trt_runtime.serve.metrics import ServeMetrics

__all__ = ["Infer", "make_app"]

#: ``await infer(arrays)``: one checked request's arrays in input order -> its outputs.
Infer = Callable[[tuple[Any, ...]], Awaitable[list[Any]]]
Endpoint = Callable[["Request"], Awaitable["Response"]]

_SERVER = "trt-runtime"


def make_app(
    model: ModelInfo,
    infer: Infer,
    *,
    metrics: ServeMetrics,
    ready: Callable[[], bool],
    max_body_bytes: int,
    extra_routes: Sequence[BaseRoute] = (),
) -> Starlette:
    """The ASGI app serving ``model``; ``ready()`` says whether every part of the server is up.

    ``extra_routes`` are served beside the protocol's (the Ray deployment adds ``/ready``
    and ``/stats``)."""
    try:
        from starlette.applications import Starlette
        from starlette.routing import Route
    except ImportError as exc:
        from trt_runtime.errors import BackendUnavailableError

        raise BackendUnavailableError(
            f"serving over HTTP needs starlette ({exc}): pip install -c constraints.txt -e '.[serve]'"
        ) from None
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 1:
        raise SettingsError(f"max_body_bytes must be an integer >= 1; got {max_body_bytes!r}")
    ep = _Endpoints(model, infer, metrics, ready, max_body_bytes)
    infer_v2, shorthand = ep.counted(ep.infer_v2), ep.counted(ep.infer_shorthand)
    model_routes = [("", ep.refusing(ep.model_metadata)), ("/ready", ep.refusing(ep.model_ready)),
                    ("/config", ep.refusing(ep.model_config))]
    routes = [  # the infer routes first: routes are tried in order, on every request
        Route("/v2/models/{name}/infer", infer_v2, methods=["POST"]),
        Route("/v2/models/{name}/versions/{version}/infer", infer_v2, methods=["POST"]),
        Route("/", shorthand, methods=["POST"]),
        Route("/infer", shorthand, methods=["POST"]),
        Route("/v2/health/live", ep.live, methods=["GET"]),
        Route("/v2/health/ready", ep.server_ready, methods=["GET"]),
        Route("/v2", ep.server_metadata, methods=["GET"]),
        *(Route(prefix + suffix, endpoint, methods=["GET"])
          for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}")
          for suffix, endpoint in model_routes),
        Route("/metrics", ep.prometheus, methods=["GET"]),
        *extra_routes,
    ]
    return Starlette(routes=routes, exception_handlers={404: ep.no_route, 405: ep.no_route})


class _Endpoints:
    """The app's endpoints, around one model and one ``infer``."""

    def __init__(self, model: ModelInfo, infer: Infer, metrics: ServeMetrics, ready: Callable[[], bool],
                 max_body_bytes: int) -> None:
        self.model = model
        self.infer = infer
        self.metrics = metrics
        self.ready = ready
        self.max_body_bytes = max_body_bytes
        self.server = {"name": _SERVER, "version": _release(), "extensions": ["binary_tensor_data"]}

    # -- wrappers ------------------------------------------------------------------------
    def refusing(self, endpoint: Endpoint) -> Endpoint:
        """``endpoint`` answering a ``RequestError`` as ``{"error": ...}`` with its status."""

        async def answer(request: Request) -> Response:
            try:
                return await endpoint(request)
            except RequestError as exc:
                return _error(exc)

        return answer

    def counted(self, endpoint: Endpoint) -> Endpoint:
        """An infer ``endpoint`` counted in the metrics (in flight, by status); other errors are 500."""
        metrics, model = self.metrics, self.model

        async def answer(request: Request) -> Response:
            metrics.started()
            code = 500
            try:
                response = await endpoint(request)
                code = response.status_code
                return response
            except RequestError as exc:
                code = exc.status
                return _error(exc)
            except Exception as exc:
                return _failed(model, exc)
            finally:
                metrics.answered(code)
                metrics.finished()

        return answer

    def known(self, request: Request) -> None:
        """``RequestError`` (404) unless the URL names this model and version."""
        model = self.model
        name = request.path_params["name"]
        version = request.path_params.get("version", model.version)
        if name != model.name or version != model.version:
            raise RequestError(
                f"unknown model {name!r} version {version!r}; this server serves {model.name!r} "
                f"version {model.version!r}",
                404,
            )

    # -- health and metadata -------------------------------------------------------------
    async def live(self, request: Request) -> Response:
        return _json({"live": True})

    async def server_ready(self, request: Request) -> Response:
        up = self.ready()
        return _json({"ready": up}, 200 if up else 503)

    async def server_metadata(self, request: Request) -> Response:
        return _json(self.server)

    async def model_metadata(self, request: Request) -> Response:
        self.known(request)
        return _json(self.model.metadata())

    async def model_config(self, request: Request) -> Response:
        self.known(request)
        return _json(self.model.config())

    async def model_ready(self, request: Request) -> Response:
        self.known(request)
        up = self.ready()
        return _json({"name": self.model.name, "ready": up}, 200 if up else 503)

    async def prometheus(self, request: Request) -> Response:
        from starlette.responses import Response

        content, media = self.metrics.render()
        return Response(content, headers={"Content-Type": media})

    # -- inference -----------------------------------------------------------------------
    async def infer_v2(self, request: Request) -> Response:
        from starlette.responses import Response

        self.known(request)
        body = await read_body(request, self.max_body_bytes)
        decoded = kserve.decode_infer(body, request.headers.get(kserve.HEADER_LENGTH), self.model)
        outputs = await self.infer(decoded.arrays)
        content, media, length = kserve.encode_infer(self.model, decoded, outputs)
        headers = None if length is None else {kserve.HEADER_LENGTH: str(length)}
        return Response(content, media_type=media, headers=headers)

    async def infer_shorthand(self, request: Request) -> Response:
        from starlette.responses import Response

        model = self.model
        body = await read_body(request, self.max_body_bytes)
        media_type = request.headers.get("content-type", "")
        decoded = codec.decode_body(media_type, body, model.inputs, self.max_body_bytes)
        arrays = model.checker.check(decoded.args, decoded.named)
        outputs = await self.infer(arrays)
        content, media = codec.encode_result(outputs, model.output_names, decoded.encoding, decoded.bare)
        return Response(content, media_type=media)

    # -- refusals ------------------------------------------------------------------------
    async def no_route(self, request: Request, exc: Exception) -> Response:
        """Starlette's 404 and 405, as one JSON line naming the route."""
        status = getattr(exc, "status_code", 404)
        path = request.scope.get("path", "/")
        root = request.scope.get("root_path", "")
        route = path[len(root):] if root and path.startswith(root) else path
        if status == 405:
            message = f"method {request.method} is not allowed on {route!r}"
        else:
            name = self.model.name
            message = f"no route {route!r}; POST /v2/models/{name}/infer or /, GET /v2/models/{name}"
        self.metrics.answered(status)  # every status is counted, refusals of the router too
        return error_response(message, status)


def _json(doc: Any, status: int = 200) -> Response:
    from starlette.responses import JSONResponse

    return JSONResponse(doc, status_code=status)


def _release() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trt-runtime")
    except PackageNotFoundError:  # pragma: no cover - a source tree without an install
        return "unknown"


def _error(exc: RequestError) -> Response:
    return error_response(str(exc), exc.status)


def _failed(model: ModelInfo, exc: Exception) -> Response:
    return error_response(f"model {model.name!r} failed: {type(exc).__name__}: {exc}", 500)


def error_response(message: str, status: int) -> Response:
    """``{"error": "<message on one line>"}`` and a newline (so ``curl`` prints it on its own line)."""
    from starlette.responses import Response

    body = json.dumps({"error": " ".join(message.split())}) + "\n"
    return Response(body, status_code=status, media_type="application/json")


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed ``max_bytes``."""
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise RequestError(f"Content-Length {length!r} is not a number of bytes", 400)
        if int(length) > max_bytes:
            raise RequestError(f"request body of {length} bytes exceeds the limit of {max_bytes} bytes", 413)
    return await codec.read_body_limited(request.stream(), max_bytes)
