"""Serving engines over HTTP (the ``serve`` extra).

One request layer serves every front: :class:`ModelInfo` (what clients see),
:class:`DynamicBatcher` (requests gathered on an event loop, engine calls on one thread
per execution context), :class:`ServeMetrics` (Prometheus) and :func:`make_app` (the
Open Inference Protocol and the ``POST /`` shorthand). :class:`InProcessServer` runs them
in one process; ``trt-runtime serve`` runs them in front processes and one engine
process per GPU; :func:`build_app` deploys them on Ray Serve.

Importing this package does not import Ray, starlette or prometheus_client.
:class:`EngineServer` and :func:`build_app` import Ray on first access and raise
:class:`~trt_runtime.BackendUnavailableError` naming the extra when it is missing.
See ``docs/serving.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trt_runtime.serve.batcher import DynamicBatcher
from trt_runtime.serve.http import make_app
from trt_runtime.serve.inprocess import InProcessServer
from trt_runtime.serve.metrics import ServeMetrics
from trt_runtime.serve.model import ModelInfo
from trt_runtime.serve.options import DEFAULT_MAX_BODY_BYTES, ServeOptions
from trt_runtime.serve.replica import node_cache_path, open_engine
from trt_runtime.serve.validation import RequestChecker

if TYPE_CHECKING:
    from trt_runtime.serve.deployment import EngineServer, build_app

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DynamicBatcher",
    "EngineServer",
    "InProcessServer",
    "ModelInfo",
    "RequestChecker",
    "ServeMetrics",
    "ServeOptions",
    "build_app",
    "make_app",
    "node_cache_path",
    "open_engine",
    "require_ray",
]

_LAZY = ("EngineServer", "build_app")


def require_ray() -> Any:
    """Import and return ``ray.serve``; ``BackendUnavailableError`` naming the extra if missing."""
    try:
        from ray import serve
    except ImportError as exc:
        from trt_runtime.errors import BackendUnavailableError
        from trt_runtime.extras import install_hint

        raise BackendUnavailableError(f"serving needs Ray Serve ({exc}): {install_hint('serve')}") from exc
    return serve


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        require_ray()
        from trt_runtime.serve import deployment

        return getattr(deployment, name)
    raise AttributeError(f"module 'trt_runtime.serve' has no attribute {name!r}")
