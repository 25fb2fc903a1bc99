"""Serving engines as Ray Serve deployments (``pip install 'trt-runtime[serve]'``).

Importing this package does not import Ray: :class:`ServeOptions`, the request checker
and the HTTP codec work without it. :class:`EngineServer` and :func:`build_app` import
Ray on first access and raise :class:`~trt_runtime.BackendUnavailableError` naming the
extra when it is missing. See ``docs/serving.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trt_runtime.serve.options import DEFAULT_MAX_BODY_BYTES, ServeOptions
from trt_runtime.serve.replica import node_cache_path, open_engine
from trt_runtime.serve.validation import RequestChecker

if TYPE_CHECKING:
    from trt_runtime.serve.deployment import EngineServer, build_app

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "EngineServer",
    "RequestChecker",
    "ServeOptions",
    "build_app",
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

        raise BackendUnavailableError(
            f"serving needs Ray Serve ({exc}): pip install 'trt-runtime[serve]'"
        ) from exc
    return serve


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        require_ray()
        from trt_runtime.serve import deployment

        return getattr(deployment, name)
    raise AttributeError(f"module 'trt_runtime.serve' has no attribute {name!r}")
