"""The HTTP front of a served model: the Open Inference Protocol (KServe v2) and a shorthand.

:func:`make_app` builds an ASGI app around an ``infer`` coroutine (the in-process
:class:`~trt_runtime.serve.batcher.DynamicBatcher`'s ``submit``, or a call to an engine
process). It decodes and checks every request on the event loop, awaits ``infer`` and
answers from the loop. The infer routes (``POST``) are answered by a bare ASGI handler, every
other route by a Starlette app behind it: Starlette's request, response, routing and
middleware objects cost more CPU per request than the decoding they wrap. Routes:

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
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from time import perf_counter
from typing import TYPE_CHECKING, Any

from trt_runtime.errors import RequestError, SettingsError
from trt_runtime.serve import codec, kserve
from trt_runtime.serve.model import ModelInfo

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import BaseRoute
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

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
) -> ASGIApp:
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
    model_routes = [("", ep.refusing(ep.model_metadata)), ("/ready", ep.refusing(ep.model_ready)),
                    ("/config", ep.refusing(ep.model_config))]
    infer_v2, shorthand = _AsgiEndpoint(ep.infer_v2_routed), _AsgiEndpoint(ep.infer_shorthand_routed)
    routes = [  # the infer routes are here for what _InferFirst leaves: 405, a trailing slash's redirect
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
    return _InferFirst(ep, Starlette(routes=routes, exception_handlers={404: ep.no_route, 405: ep.no_route}))


class _AsgiEndpoint:
    """An ASGI callable as a Starlette route's endpoint (Starlette wraps functions and methods in
    its request/response objects, other callables it calls as ASGI apps)."""

    def __init__(self, handle: ASGIApp) -> None:
        self.handle = handle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.handle(scope, receive, send)


class _InferFirst:
    """ASGI: ``POST`` to an infer route answered here, any other request by ``rest``.

    The same answers as the infer routes of ``rest`` give (bodies, headers, statuses,
    metrics), without the router's tries and the middleware's layers per request.
    """

    def __init__(self, endpoints: _Endpoints, rest: ASGIApp) -> None:
        self.endpoints = endpoints
        self.rest = rest

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            route = route_path(scope)
            ep = self.endpoints
            if route == "/" or route == "/infer":
                await ep.answer(ep.infer_shorthand(scope, receive), send)
                return
            named = _infer_route(route)
            if named is not None:
                await ep.answer(ep.infer_v2(scope, receive, *named), send)
                return
        await self.rest(scope, receive, send)


def _infer_route(route: str) -> tuple[str, str | None] | None:
    """``(name, version or None)`` of ``/v2/models/{name}[/versions/{version}]/infer``, else ``None``."""
    if not (route.startswith("/v2/models/") and route.endswith("/infer")):
        return None
    parts = route[11:-6].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], None
    if len(parts) == 3 and parts[0] and parts[1] == "versions" and parts[2]:
        return parts[0], parts[2]
    return None


def route_path(scope: Scope) -> str:
    """The request's path under the app's ``root_path`` (as Starlette's router matches it)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if not root or not path.startswith(root):
        return path
    if path == root:
        return ""
    return path[len(root):] if path[len(root)] == "/" else path


#: One answer: ``(status, body, content type, extra headers)``.
Answer = tuple[int, bytes, str, list[tuple[bytes, bytes]]]


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
        self.layouts: kserve.Layouts = {}  # the request forms clients repeat, parsed once
        self.heads: kserve.Heads = {}

    # -- wrappers ------------------------------------------------------------------------
    def refusing(self, endpoint: Endpoint) -> Endpoint:
        """``endpoint`` answering a ``RequestError`` as ``{"error": ...}`` with its status."""

        async def answer(request: Request) -> Response:
            try:
                return await endpoint(request)
            except RequestError as exc:
                return error_response(str(exc), exc.status)

        return answer

    async def answer(self, answering: Awaitable[Answer], send: Send) -> None:
        """Send what an infer route's ``answering`` gives, counted in the metrics (in flight, by
        status) before it leaves; a ``RequestError`` is its status, any other error 500."""
        metrics = self.metrics
        metrics.started()
        code = 500
        began = perf_counter()
        try:
            code, content, media, headers = await answering
        except RequestError as exc:
            code = exc.status
            content, media, headers = error_body(str(exc)), "application/json", []
        except Exception as exc:
            content, media, headers = error_body(_failure(self.model, exc)), "application/json", []
        finally:
            metrics.request_took(perf_counter() - began)
            metrics.answered(code)
            metrics.finished()
        headers.append((b"content-length", str(len(content)).encode()))
        headers.append((b"content-type", media.encode()))
        await send({"type": "http.response.start", "status": code, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    def known(self, name: str, version: str | None) -> None:
        """``RequestError`` (404) unless ``name`` and ``version`` (``None``: any) are this model's."""
        model = self.model
        if version is None:
            version = model.version
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
        self.known(request.path_params["name"], request.path_params.get("version"))
        return _json(self.model.metadata())

    async def model_config(self, request: Request) -> Response:
        self.known(request.path_params["name"], request.path_params.get("version"))
        return _json(self.model.config())

    async def model_ready(self, request: Request) -> Response:
        self.known(request.path_params["name"], request.path_params.get("version"))
        up = self.ready()
        return _json({"name": self.model.name, "ready": up}, 200 if up else 503)

    async def prometheus(self, request: Request) -> Response:
        from starlette.responses import Response

        content, media = self.metrics.render()
        return Response(content, headers={"Content-Type": media})

    # -- inference (bare ASGI: see _InferFirst) ----------------------------------------------
    async def infer_v2_routed(self, scope: Scope, receive: Receive, send: Send) -> None:
        params = scope["path_params"]
        await self.answer(self.infer_v2(scope, receive, params["name"], params.get("version")), send)

    async def infer_shorthand_routed(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.answer(self.infer_shorthand(scope, receive), send)

    async def infer_v2(self, scope: Scope, receive: Receive, name: str, version: str | None) -> Answer:
        self.known(name, version)
        headers = _headers(scope)
        body = await receive_body(receive, headers.get(b"content-length"), self.max_body_bytes)
        length = headers.get(b"inference-header-content-length")
        decoded = kserve.decode_infer(body, None if length is None else length.decode("latin-1"), self.model,
                                      self.layouts)
        outputs = await self.infer(decoded.arrays)
        content, media, split = kserve.encode_infer(self.model, decoded, outputs, self.heads)
        extra = [] if split is None else [(_HEADER_LENGTH, str(split).encode())]
        return 200, content, media, extra

    async def infer_shorthand(self, scope: Scope, receive: Receive) -> Answer:
        model = self.model
        headers = _headers(scope)
        body = await receive_body(receive, headers.get(b"content-length"), self.max_body_bytes)
        media_type = headers.get(b"content-type", b"").decode("latin-1")
        decoded = codec.decode_body(media_type, body, model.inputs, self.max_body_bytes)
        arrays = model.checker.check(decoded.args, decoded.named)
        outputs = await self.infer(arrays)
        content, media = codec.encode_result(outputs, model.output_names, decoded.encoding, decoded.bare)
        return 200, content, media, []

    # -- refusals ------------------------------------------------------------------------
    async def no_route(self, request: Request, exc: Exception) -> Response:
        """Starlette's 404 and 405, as one JSON line naming the route."""
        status = getattr(exc, "status_code", 404)
        route = route_path(request.scope)
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


def _failure(model: ModelInfo, exc: Exception) -> str:
    return f"model {model.name!r} failed: {type(exc).__name__}: {exc}"


def error_body(message: str) -> bytes:
    """``{"error": "<message on one line>"}`` and a newline (so ``curl`` prints it on its own line)."""
    return (json.dumps({"error": " ".join(message.split())}) + "\n").encode()


def error_response(message: str, status: int) -> Response:
    """:func:`error_body` as a JSON response with ``status``."""
    from starlette.responses import Response

    return Response(error_body(message), status_code=status, media_type="application/json")


_HEADER_LENGTH = kserve.HEADER_LENGTH.lower().encode()
_WANTED = (b"content-length", b"content-type", _HEADER_LENGTH)


def _headers(scope: Scope) -> dict[bytes, bytes]:
    """The request headers an infer route reads, by name (the first of each; ASGI servers give
    the names in lower case)."""
    found: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        if name in _WANTED and name not in found:
            found[name] = value
    return found


async def receive_body(receive: Receive, length: bytes | None, max_bytes: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed ``max_bytes`` (``length``: the
    Content-Length header, checked first)."""
    if length is not None:
        text = length.decode("latin-1")
        if not text.isdigit():
            raise RequestError(f"Content-Length {text!r} is not a number of bytes", 400)
        if int(text) > max_bytes:
            raise RequestError(f"request body of {text} bytes exceeds the limit of {max_bytes} bytes", 413)
    message = await receive()
    if message["type"] == "http.request" and not message.get("more_body", False):
        body: bytes = message.get("body", b"")  # the whole body in one message, the usual case
        if len(body) > max_bytes:
            raise RequestError(f"request body exceeds the limit of {max_bytes} bytes", 413)
        return body
    return await codec.read_body_limited(_chunks(message, receive), max_bytes)


async def _chunks(first: Message, receive: Receive) -> AsyncIterator[bytes]:
    message = first
    while True:
        if message["type"] == "http.disconnect":
            raise ConnectionError("the client went away before it sent the whole body")
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return
        message = await receive()
