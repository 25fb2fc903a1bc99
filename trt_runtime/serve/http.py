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
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from trt_runtime.errors import RequestError
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
        from starlette.exceptions import HTTPException
        from starlette.responses import JSONResponse, Response
        from starlette.routing import Route
    except ImportError as exc:
        from trt_runtime.errors import BackendUnavailableError

        raise BackendUnavailableError(
            f"serving over HTTP needs starlette ({exc}): pip install -c constraints.txt -e '.[serve]'"
        ) from None
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be an integer >= 1; got {max_body_bytes!r}")

    def known(request: Request) -> None:
        name = request.path_params["name"]
        version = request.path_params.get("version", model.version)
        if name != model.name or version != model.version:
            raise RequestError(
                f"unknown model {name!r} version {version!r}; this server serves {model.name!r} "
                f"version {model.version!r}",
                404,
            )

    async def live(request: Request) -> Response:
        return JSONResponse({"live": True})

    async def server_ready(request: Request) -> Response:
        up = ready()
        return JSONResponse({"ready": up}, status_code=200 if up else 503)

    server = {"name": _SERVER, "version": _release(), "extensions": ["binary_tensor_data"]}

    async def server_metadata(request: Request) -> Response:
        return JSONResponse(server)

    async def model_metadata(request: Request) -> Response:
        known(request)
        return JSONResponse(model.metadata())

    async def model_config(request: Request) -> Response:
        known(request)
        return JSONResponse(model.config())

    async def model_ready(request: Request) -> Response:
        known(request)
        up = ready()
        return JSONResponse({"name": model.name, "ready": up}, status_code=200 if up else 503)

    async def infer_v2(request: Request) -> Response:
        known(request)
        body = await read_body(request, max_body_bytes)
        decoded = kserve.decode_infer(body, request.headers.get(kserve.HEADER_LENGTH), model)
        outputs = await infer(decoded.arrays)
        content, media, length = kserve.encode_infer(model, decoded, outputs)
        headers = None if length is None else {kserve.HEADER_LENGTH: str(length)}
        return Response(content, media_type=media, headers=headers)

    async def infer_shorthand(request: Request) -> Response:
        body = await read_body(request, max_body_bytes)
        media_type = request.headers.get("content-type", "")
        decoded = codec.decode_body(media_type, body, model.inputs, max_body_bytes)
        arrays = model.checker.check(decoded.args, decoded.named)
        outputs = await infer(arrays)
        content, media = codec.encode_result(outputs, model.output_names, decoded.encoding, decoded.bare)
        return Response(content, media_type=media)

    def refusing(endpoint: Endpoint) -> Endpoint:
        """``endpoint`` answering a ``RequestError`` as ``{"error": ...}`` with its status."""

        async def answer(request: Request) -> Response:
            try:
                return await endpoint(request)
            except RequestError as exc:
                return _error(exc)

        return answer

    def counted(endpoint: Endpoint) -> Endpoint:
        """An infer ``endpoint`` counted in the metrics (in flight, by status); other errors are 500."""

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

    async def prometheus(request: Request) -> Response:
        content, media = metrics.render()
        return Response(content, headers={"Content-Type": media})

    model_routes = [
        ("", refusing(model_metadata), "GET"), ("/ready", refusing(model_ready), "GET"),
        ("/config", refusing(model_config), "GET"), ("/infer", counted(infer_v2), "POST"),
    ]
    routes = [  # the infer routes first: routes are tried in order, on every request
        Route("/v2/models/{name}/infer", counted(infer_v2), methods=["POST"]),
        Route("/", counted(infer_shorthand), methods=["POST"]),
        Route("/v2/health/live", live, methods=["GET"]),
        Route("/v2/health/ready", server_ready, methods=["GET"]),
        Route("/v2", server_metadata, methods=["GET"]),
        *(Route(prefix + suffix, endpoint, methods=[method])
          for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}")
          for suffix, endpoint, method in model_routes),
        Route("/", counted(infer_shorthand), methods=["POST"]),
        Route("/infer", counted(infer_shorthand), methods=["POST"]),
        Route("/metrics", prometheus, methods=["GET"]),
        *extra_routes,
    ]

    async def no_route(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        path = request.scope.get("path", "/")
        root = request.scope.get("root_path", "")
        route = path[len(root):] if root and path.startswith(root) else path
        if exc.status_code == 405:
            message = f"method {request.method} is not allowed on {route!r}"
        elif exc.status_code == 404:
            message = (f"no route {route!r}; POST /v2/models/{model.name}/infer or /, "
                       f"GET /v2/models/{model.name}")
        else:
            message = str(exc.detail)
        return _error(RequestError(message, exc.status_code))

    return Starlette(routes=routes, exception_handlers={404: no_route, 405: no_route})


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
    return await _read_body_limited(request.stream(), max_bytes)


async def _read_body_limited(chunks: AsyncIterator[bytes], max_bytes: int) -> bytes:
    # TODO: codec.read_body_limited
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > max_bytes:
            raise RequestError(f"request body exceeds the limit of {max_bytes} bytes", 413)
        parts.append(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)
