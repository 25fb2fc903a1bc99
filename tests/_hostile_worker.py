"""Workers for tests/test_hostile_hosts.py, importable by spawned and forkserver children."""

from __future__ import annotations

from typing import Any

from trt_runtime import RuntimeCache


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
