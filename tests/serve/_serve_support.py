"""What the serving tests share: Ray or a skip (a failure in CI), engines, a reference, HTTP."""

from __future__ import annotations

import io
import json
import os
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trt_runtime import TensorSpec
from trt_runtime.testing.memory import AffineOutput, MemoryBackend

# Ray replaces 127.0.0.1 in a cluster address with the machine's own address unless
# "clusters" are off (its Windows/macOS mode): keep every node and driver on loopback.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

#: Set to 1 (CI does; CI=true too) to make a missing Ray Serve a failure instead of a skip.
REQUIRE_ENV = "TRT_RUNTIME_REQUIRE_SERVE"
#: Loopback only; fixed ports, one per test module so modules never collide.
HOST = "127.0.0.1"
PORT_SINGLE = 18619
PORT_CLUSTER_HEAD = 18621
PORT_CLUSTER_WORKER = 18622
PORT_CLI = 18623


def require_serve() -> Any:
    """``ray.serve``, or skip the module (fail it under CI or ``TRT_RUNTIME_REQUIRE_SERVE=1``)."""
    try:
        from ray import serve
    except ImportError as exc:
        reason = f"Ray Serve not importable ({exc}): pip install -c constraints.txt -e '.[serve]'"
        if os.environ.get(REQUIRE_ENV) == "1" or os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{REQUIRE_ENV}=1 or CI=true but {reason}", pytrace=False)
        pytest.skip(reason, allow_module_level=True)
    return serve


def keep_ray_on_loopback() -> None:
    """Make Ray keep 127.0.0.1 in cluster addresses even if it was imported before this module
    set the environment variable (it reads the constant at call time)."""
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


def ray_init_args(num_cpus: int) -> dict[str, Any]:
    """Small, loopback-only, dashboard-free local Ray."""
    return {
        "address": "local",  # a new Ray, never the last cluster this machine ran
        "num_cpus": num_cpus,
        "include_dashboard": False,
        "_node_ip_address": HOST,
        "object_store_memory": 80 * 1024 * 1024,
        "log_to_driver": False,
    }


def rows4_checker() -> Any:
    """The request checker of a model ``x`` float32 (-1, 4) (batches of 1 to 16 rows) -> ``y``,
    16 requests a batch: what the batcher's unit tests run requests through."""
    from trt_runtime.serve.model import ModelInfo

    x = TensorSpec("x", "float32", (-1, 4), True, profiles=(((1, 4), (4, 4), (16, 4)),))
    y = TensorSpec("y", "float32", (-1, 4), False)
    return ModelInfo.from_specs("m", [x], [y], max_batch=16).checker


def single_engine() -> bytes:
    """``y = 2 x + 1`` over float32 ``x`` of shape (batch 1..16, width 1..8)."""
    x = TensorSpec("x", "float32", (-1, -1), True, profiles=(((1, 1), (4, 4), (16, 8)),))
    return MemoryBackend.build_engine([x], [AffineOutput("y", "x", 2.0, 1.0)], name="affine")


def static_engine() -> bytes:
    """``y = 2 x + 1`` over float32 ``x`` of the fixed shape (2, 4): an engine that cannot batch."""
    x = TensorSpec("x", "float32", (2, 4), True)
    return MemoryBackend.build_engine([x], [AffineOutput("y", "x", 2.0, 1.0)], name="static")


def pair_engine() -> bytes:
    """Two inputs, two outputs: ``y = 2 x + 1`` (float32 [b, 4]) and ``z = 3 k - 1`` (int32 [b, 2])."""
    x = TensorSpec("x", "float32", (-1, 4), True, profiles=(((1, 4), (4, 4), (16, 4)),))
    k = TensorSpec("k", "int32", (-1, 2), True, profiles=(((1, 2), (4, 2), (16, 2)),))
    return MemoryBackend.build_engine(
        [x, k], [AffineOutput("y", "x", 2.0, 1.0), AffineOutput("z", "k", 3.0, -1.0)], name="pair"
    )


def reference(x: np.ndarray) -> np.ndarray:
    return (x.astype(np.float64) * 2.0 + 1.0).astype(x.dtype)


def post(url: str, body: bytes, content_type: str, timeout: float = 30.0) -> tuple[int, bytes, str]:
    """``(status, body, content type)`` of a POST; 4xx/5xx answers are returned, not raised."""
    request = urllib.request.Request(url, data=body, headers={"Content-Type": content_type}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("Content-Type", "")


def get_json(url: str, timeout: float = 30.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def load_npy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


def wait_for_port(port: int, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            if sock.connect_ex((HOST, port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {HOST}:{port} after {deadline_s} s")


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
