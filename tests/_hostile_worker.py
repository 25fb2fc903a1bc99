"""Workers and helpers for tests/core/test_hostile_*.py (workers importable by spawned children)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trt_runtime import RuntimeCache, TensorSpec


def load_and_save(path: str, payload: bytes, queue: Any) -> None:
    """Load the cache at ``path``, add ``payload``, save it; put what happened on ``queue``."""
    try:
        cache = RuntimeCache(path)
        loaded = cache.load()
        before = cache.serialize()
        cache.load_bytes(before + payload)
        cache.save()
        queue.put(("ok", loaded, before))
    except BaseException as exc:  # reported to the parent, which asserts on it
        queue.put(("error", f"{type(exc).__name__}: {exc}", b""))


def save_held_cache(cache: RuntimeCache, queue: Any) -> None:
    """Save a cache inherited through fork whose lock another parent thread holds."""
    try:
        cache.save()
        queue.put(("ok", True, b""))
    except BaseException as exc:
        queue.put(("error", f"{type(exc).__name__}: {exc}", b""))


def run_with_cache(directory: Path, cache_bytes: bytes, *flags: str) -> int:
    """``trt-runtime [FLAGS] run`` of a ``memory`` engine with ``--runtime-cache`` holding ``cache_bytes``."""
    from trt_runtime.cli import main
    from trt_runtime.testing.memory import AffineOutput, MemoryBackend

    engine = directory / "affine.eng"
    spec = TensorSpec("x", "float32", (-1, 4), True, profiles=(((1, 4), (2, 4), (8, 4)),))
    engine.write_bytes(MemoryBackend.build_engine([spec], [AffineOutput("y", "x", scale=2.0, bias=1.0)]))
    cache = directory / "c.bin"
    cache.write_bytes(cache_bytes)
    return main(
        [
            *flags,
            "run",
            os.fspath(engine),
            "--force",
            "--backend",
            "memory",
            "--runtime-cache",
            os.fspath(cache),
            "--output-dir",
            os.fspath(directory / "out"),
        ]
    )
