"""The local server: front processes for HTTP, one engine process per GPU, shared memory between.

:class:`LocalServer` is what ``trt-runtime serve ENGINE`` runs without ``--ray``; see
``docs/serving.md`` ("How the local server is built").
"""

from __future__ import annotations

from trt_runtime.serve.local.supervisor import (
    LocalServer,
    LocalServerConfig,
    ServeStartError,
    bind_socket,
    cuda_device_count,
    resolve_gpus,
)

__all__ = [
    "LocalServer", "LocalServerConfig", "ServeStartError", "bind_socket", "cuda_device_count", "resolve_gpus",
]
