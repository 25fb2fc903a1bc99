"""Fakes for the runtime cache tests, and a worker script for the multi-process ones.

Imported by tests/cache/test_cache*.py (the fake backend and handle), and run as
``python tests/_cache_worker.py MODE ...`` by tests/cache/test_cache_reliability.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from trt_runtime.cache import CacheKey
from trt_runtime.protocols import BackendCapabilities

KEY = CacheKey(flavour="tensorrt_rtx", version="1.6.1.120", compute_capability="9.0", driver="13000")
OTHER_KEY = CacheKey(flavour="tensorrt_rtx", version="1.6.1.120", compute_capability="8.9", driver="13000")


class FakeNative:
    """Stands in for an IRuntimeCache: a set of kernel names."""

    def __init__(self) -> None:
        self.kernels: list[bytes] = []


class FakeHandle:
    """A RuntimeCacheHandle that counts every call (a spy)."""

    def __init__(self, merges: bool = False) -> None:
        self.merges = merges
        self.native: FakeNative | None = None
        self.created = 0
        self.materialize_calls = 0
        self.deserialized: list[bytes] = []
        self._guard = threading.Lock()

    def has_cache(self) -> bool:
        return self.native is not None

    def ensure_materialized(self, config: Any) -> FakeNative:
        with self._guard:
            self.materialize_calls += 1
        if self.native is None:
            time.sleep(0.002)  # widen the window a missing lock in the caller would lose
            self.created += 1
            self.native = FakeNative()
        return self.native

    def deserialize(self, data: bytes) -> None:
        assert self.native is not None, "deserialize before the native cache exists"
        self.deserialized.append(bytes(data))
        kernels = [k for k in bytes(data).split(b"\n") if k]
        if self.merges:
            self.native.kernels = sorted(set(self.native.kernels) | set(kernels))
        else:
            self.native.kernels = kernels

    def serialize(self) -> bytes:
        assert self.native is not None, "serialize before the native cache exists"
        return b"\n".join(self.native.kernels)

    # test helper: "compile" a kernel
    def add_kernel(self, name: bytes) -> None:
        assert self.native is not None
        self.native.kernels.append(name)


class FakeBackend:
    """The smallest backend a RuntimeCache needs; remembers the handles it made."""

    def __init__(
        self,
        name: str = "fake",
        *,
        merges: bool = False,
        key: CacheKey = KEY,
        runtime_cache: bool = True,
    ) -> None:
        self.name = name
        self.key = key
        self.capabilities = BackendCapabilities(
            supports_runtime_cache=runtime_cache,
            cache_deserialize_merges=merges,
            notes={} if runtime_cache else {"supports_runtime_cache": "fake backend without cache"},
        )
        self.handles: list[FakeHandle] = []

    def create_cache_handle(self) -> FakeHandle:
        handle = FakeHandle(merges=self.capabilities.cache_deserialize_merges)
        self.handles.append(handle)
        return handle

    def cache_key(self, device: int | None = None) -> CacheKey:
        return self.key


# -- payloads that prove they are complete ------------------------------------------------
def make_payload(writer: int, iteration: int, size: int = 64 * 1024) -> bytes:
    """A payload of ``size`` bytes naming its writer; its last line checks the rest."""
    body = f"w{writer:03d}i{iteration:04d}".encode()
    filler = hashlib.sha256(body).hexdigest().encode() * (size // 64 + 1)
    lines = [body, filler[:size]]
    digest = hashlib.sha256(b"\n".join(lines)).hexdigest().encode()
    return b"\n".join([*lines, digest])


def check_payload(payload: bytes) -> tuple[int, int]:
    """``(writer, iteration)`` of a payload made by :func:`make_payload`; raises if torn."""
    lines = payload.split(b"\n")
    if len(lines) != 3:
        raise ValueError(f"payload has {len(lines)} lines, expected 3")
    if hashlib.sha256(b"\n".join(lines[:2])).hexdigest().encode() != lines[2]:
        raise ValueError("payload digest mismatch: torn or mixed payload")
    head = lines[0].decode()
    return int(head[1:4]), int(head[5:9])


# -- worker modes -------------------------------------------------------------------------
def _wait_for(path: Path, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.005)


def _saver(path: str, writer: str, iterations: str, start: str) -> dict[str, Any]:
    from trt_runtime.cache import RuntimeCache
    from trt_runtime.errors import CacheWarning, LostUpdateWarning

    warnings.simplefilter("error", CacheWarning)
    warnings.simplefilter("ignore", LostUpdateWarning)  # expected: last writer wins
    backend = FakeBackend()
    cache = RuntimeCache(path, lock_timeout=60)
    _wait_for(Path(start))
    seen: list[list[int]] = []
    for i in range(int(iterations)):
        if not cache.load():
            raise AssertionError(f"iteration {i}: load() found no cache")
        handle_native = cache.ensure_materialized(None, backend=backend)
        seen.append(list(check_payload(cache.serialize())))
        handle_native.kernels = make_payload(int(writer), i, 256 * 1024).split(b"\n")
        cache.save()
    return {"writer": int(writer), "seen": seen}


def _reader(path: str, stop: str, start: str) -> dict[str, Any]:
    from trt_runtime.cache import decode

    _wait_for(Path(start))
    reads = 0
    writers: set[int] = set()
    while True:
        stopping = Path(stop).exists()
        with open(path, "rb") as f:
            _key, payload = decode(f.read())  # checksum verified, raises if torn
        writers.add(check_payload(payload)[0])
        reads += 1
        if stopping:
            break
    return {"reads": reads, "writers": sorted(writers)}


def _pause(path: str, point: str, ready: str) -> None:
    from trt_runtime.cache import RuntimeCache, storage

    def checkpoint(name: str, target: Path) -> None:
        if name == point:
            Path(ready).write_text(str(os.getpid()))
            time.sleep(60)  # killed here

    storage.checkpoint = checkpoint  # the test hook, looked up at each call
    cache = RuntimeCache(path)
    cache.load()
    native = cache.ensure_materialized(None, backend=FakeBackend())
    native.kernels = make_payload(99, 1).split(b"\n")
    cache.save()


def _loop(path: str, ready: str) -> None:
    from trt_runtime.cache import RuntimeCache

    warnings.simplefilter("ignore")
    cache = RuntimeCache(path)
    native = cache.ensure_materialized(None, backend=FakeBackend())
    Path(ready).write_text(str(os.getpid()))
    i = 0
    while True:  # killed at a random moment
        native.kernels = make_payload(98, i % 10000).split(b"\n")
        cache.save()
        i += 1


def _hold_lock(path: str, ready: str, release: str) -> None:
    import filelock

    with filelock.FileLock(path + ".lock"):
        Path(ready).write_text("held")
        _wait_for(Path(release), limit=20)


def _exit_readonly(path: str) -> None:
    """Autosave at interpreter exit into a directory that refuses new files."""
    import errno

    from trt_runtime.cache import RuntimeCache

    directory = os.path.dirname(os.path.abspath(path))
    real_open = os.open

    def read_only_open(file: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_CREAT and os.path.dirname(os.path.abspath(os.fspath(file))) == directory:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(file))
        return real_open(file, flags, *args, **kwargs)

    os.open = read_only_open
    global _KEEP
    _KEEP = RuntimeCache(path, autosave=True)
    assert _KEEP.load()
    native = _KEEP.ensure_materialized(None, backend=FakeBackend())
    native.kernels = [b"new-kernel"]
    # returns; the finalizer saves at interpreter exit and must only warn


_KEEP: Any = None


def main(argv: list[str]) -> int:
    mode, *args = argv
    result: Any = None
    if mode == "saver":
        result = _saver(*args)
    elif mode == "reader":
        result = _reader(*args)
    elif mode == "pause":
        _pause(*args)
    elif mode == "loop":
        _loop(*args)
    elif mode == "hold-lock":
        _hold_lock(*args)
    elif mode == "exit-readonly":
        _exit_readonly(*args)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    if result is not None:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
