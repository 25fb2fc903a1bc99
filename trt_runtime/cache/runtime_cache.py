"""RuntimeCache: a facade over a backend's runtime cache, with pending bytes and persistence.

A :class:`RuntimeCache` holds the bytes of a TensorRT(-RTX) runtime cache before the
backend's native cache exists ("pending" bytes), creates the native cache through the
backend's :class:`~trt_runtime.protocols.RuntimeCacheHandle` on first use and drains the
pending bytes into it exactly once. It persists to a framed file
(:mod:`trt_runtime.cache.framing`) through :mod:`trt_runtime.cache.storage` (file lock,
atomic replace), and detects lost updates from other processes.
See ``docs/cache.md`` for the multi-process behaviour.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from trt_runtime.cache import storage
from trt_runtime.cache.framing import decode, encode
from trt_runtime.cache.key import CacheKey
from trt_runtime.errors import (
    CacheError,
    CacheWarning,
    FormatError,
    LostUpdateWarning,
    StaleCacheWarning,
)
from trt_runtime.validation import seconds

__all__ = ["RuntimeCache"]


def _key_text(key: CacheKey | None) -> str:
    return "an unknown stack" if key is None else key.slug()


# -- the state behind a RuntimeCache --------------------------------------------------------
class _State:
    """Everything a :class:`RuntimeCache` holds; kept apart so its finalizer can save it."""

    def __init__(self, path: Path | None, autosave: bool, lock_timeout: float) -> None:
        self.path = path
        self.autosave = autosave
        self.lock_timeout = lock_timeout
        self.lock = threading.RLock()
        self.pending: bytes | None = None
        self.pending_key: CacheKey | None = None
        self.pending_origin = ""
        self.pending_from_disk = False
        self.backend: Any = None
        self.handle: Any = None
        self.key: CacheKey | None = None
        #: The key the file is named for (a default path): no other key may bind.
        self.named_for: CacheKey | None = None
        self.drains = 0
        self.known_disk: bytes | None = None  # sha256 of the file as last loaded or saved
        self.lazy = False
        self.closed = False

    # -- state -----------------------------------------------------------------------
    def where(self) -> str:
        return str(self.path) if self.path is not None else "(in memory)"

    def check_open(self) -> None:
        if self.closed:
            raise CacheError(f"runtime cache {self.where()} is closed")

    def ensure_loaded(self) -> None:
        if self.lazy:
            self.lazy = False
            self.load(None)

    def materialized(self) -> bool:
        return self.handle is not None and bool(self.handle.has_cache())

    def needs_save(self) -> bool:
        return self.path is not None and (
            self.materialized() or (self.pending is not None and not self.pending_from_disk)
        )

    def record_key(self) -> CacheKey | None:
        if not self.materialized() and self.pending is not None:
            return self.pending_key
        return self.key

    def stale(self, key: CacheKey | None, origin: str) -> bool:
        if key is None or self.key is None or key == self.key:
            return False
        warnings.warn(
            f"runtime cache {origin} was written for {_key_text(key)}, not for this stack "
            f"({_key_text(self.key)}); it was not loaded",
            StaleCacheWarning,
            stacklevel=4,
        )
        return True

    def deserialize(self, data: bytes, origin: str) -> None:
        # A handle says no by returning False or by raising CacheError (the python backend's
        # names TensorRT-RTX's reason); either way the cache starts empty and the engine runs:
        # a cache is an optimization, never a reason not to serve (a cache file that another
        # GPU of the same model wrote was refused this way on a 2xH100 host).
        reason = ""
        try:
            accepted = self.handle.deserialize(data) is not False
        except CacheError as exc:
            accepted, reason = False, f" ({exc})"
        if not accepted:
            warnings.warn(
                f"the backend rejected the runtime cache from {origin} ({len(data)} bytes){reason}; "
                "it starts empty",
                CacheWarning,
                stacklevel=4,
            )

    # -- binding and materialization ---------------------------------------------------
    def bind(self, backend: Any, key: CacheKey | None) -> None:
        if backend is None:
            if self.backend is None:
                raise CacheError(
                    f"runtime cache {self.where()} is not bound to a backend; "
                    "pass backend= to ensure_materialized() or call bind(backend)"
                )
        elif self.backend is None:
            backend.capabilities.require("supports_runtime_cache", backend.name)
            self.handle = backend.create_cache_handle()
            self.backend = backend
            if self.key is None and key is None:
                try:
                    self.key = backend.cache_key(None)
                except Exception:  # a backend that cannot say its key gets no stale check
                    self.key = None
        elif backend is not self.backend:
            raise CacheError(
                f"runtime cache {self.where()} is bound to the {self.backend.name!r} backend; it cannot "
                f"serve the {backend.name!r} backend (move its bytes with serialize() and load_bytes())"
            )
        if key is not None:
            if not isinstance(key, CacheKey):
                raise TypeError(f"key must be a CacheKey or None; got {type(key).__name__}")
            if self.named_for is not None and key != self.named_for:
                raise CacheError(
                    f"runtime cache {self.where()} is the file of {_key_text(self.named_for)}; an "
                    f"engine of {_key_text(key)} needs its own (RuntimeCache.default(backend, device) "
                    "gives each GPU model its file)"
                )
            if self.key is not None and key != self.key and self.materialized():
                raise CacheError(
                    f"runtime cache {self.where()} holds kernels for {_key_text(self.key)}; "
                    f"it cannot serve {_key_text(key)}"
                )
            self.key = key

    def ensure_materialized(self, config: Any, backend: Any, key: CacheKey | None) -> Any:
        with self.lock:
            self.check_open()
            self.ensure_loaded()
            self.bind(backend, key)
            native = self.handle.ensure_materialized(config)
            if self.pending is not None and self.handle.has_cache():
                data, pkey, origin = self.pending, self.pending_key, self.pending_origin
                self.pending, self.pending_key, self.pending_from_disk = None, None, False
                if not self.stale(pkey, origin):
                    self.deserialize(data, origin)
                    self.drains += 1
            return native

    # -- bytes in ----------------------------------------------------------------------
    def accept(self, payload: bytes, key: CacheKey | None, origin: str, from_disk: bool) -> bool:
        if self.stale(key, origin):
            return False
        if self.materialized():
            if payload:
                self.deserialize(payload, origin)
            return True
        if payload:
            self.pending, self.pending_key = payload, key
            self.pending_origin, self.pending_from_disk = origin, from_disk
        else:
            self.pending, self.pending_key, self.pending_from_disk = None, None, False
        return True

    def load(self, path: str | os.PathLike[str] | None) -> bool:
        with self.lock:
            self.check_open()
            target = self.resolve(path)
            own = target == self.path
            if own:
                self.lazy = False
            try:
                directory_ok = os.path.isdir(target.parent)
                if directory_ok:
                    storage.check_directory(target.parent, target)
                raw = storage.read_file(target) if directory_ok else None
            except CacheError:
                raise
            except OSError as exc:
                warnings.warn(
                    f"runtime cache {target} was not loaded: {storage.describe_os_error(exc)}",
                    CacheWarning,
                    stacklevel=3,
                )
                return False
            if raw is None:
                if own:
                    self.known_disk = None
                return False
            if own:
                self.known_disk = hashlib.sha256(raw).digest()
            try:
                key, payload = decode(raw)
            except FormatError as exc:
                warnings.warn(f"ignored runtime cache file {target}: {exc}", CacheWarning, stacklevel=3)
                return False
            return self.accept(payload, key, str(target), own)

    def load_from_stream(self, stream: IO[bytes]) -> bool:
        with self.lock:
            self.check_open()
            self.ensure_loaded()
            raw = stream.read()
            if not raw:
                return False
            try:
                key, payload = decode(raw)
            except FormatError as exc:
                name = getattr(stream, "name", None) or repr(stream)
                warnings.warn(f"ignored runtime cache stream {name}: {exc}", CacheWarning, stacklevel=3)
                return False
            return self.accept(payload, key, f"stream {getattr(stream, 'name', '') or '<bytes>'}", False)

    # -- bytes out ---------------------------------------------------------------------
    def serialize(self) -> bytes:
        with self.lock:
            self.check_open()
            self.ensure_loaded()
            if self.materialized():
                return bytes(self.handle.serialize())
            return self.pending if self.pending is not None else b""

    def resolve(self, path: str | os.PathLike[str] | None) -> Path:
        if path is not None:
            return storage.absolute_path(path)
        if self.path is None:
            raise CacheError("this runtime cache has no path; pass one to load() or save()")
        return self.path

    def reconcile(self, target: Path) -> bool:
        """Under the file lock: deal with a file another process wrote. True: nothing to write."""
        try:
            raw = storage.read_file(target)
        except OSError:
            return False
        if raw is None:
            return False
        digest = hashlib.sha256(raw).digest()
        if digest == self.known_disk:
            return False
        try:
            key, payload = decode(raw)
        except FormatError:
            return False  # a broken file holds nothing worth keeping
        ours = self.record_key()
        if key is not None and ours is not None and key != ours:
            return False  # another stack's kernels are of no use here
        if not self.materialized() and (self.pending is None or self.pending_from_disk):
            # We hold nothing newer than an older copy of that file: adopt theirs, write nothing.
            self.pending, self.pending_key = payload or None, key if payload else None
            self.pending_origin, self.pending_from_disk = str(target), True
            self.known_disk = digest
            return True
        if self.materialized() and self.backend.capabilities.cache_deserialize_merges:
            self.deserialize(payload, str(target))
            return False
        warnings.warn(
            f"runtime cache {target} was replaced by another process since this one last loaded or "
            "saved it; the native cache cannot merge it, so that process's kernels are overwritten "
            "(last writer wins)",
            LostUpdateWarning,
            stacklevel=4,
        )
        return False

    def save(self, path: str | os.PathLike[str] | None) -> None:
        with self.lock:
            self.check_open()
            target = self.resolve(path)
            self.ensure_loaded()
        directory = target.parent
        try:
            if not directory.exists():
                directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            storage.check_directory(directory, target)
        except OSError as exc:
            raise CacheError(
                f"could not save runtime cache to {target}: {storage.describe_os_error(exc)}"
            ) from exc
        storage.refuse_symlink(target, target, "cache path")
        with storage.locked(target, self.lock_timeout), self.lock:
            self.check_open()
            storage.checkpoint("locked", target)
            storage.clean_stray_temps(target)
            own = target == self.path
            if own and self.reconcile(target):
                return
            blob = encode(self.serialize(), self.record_key())
            storage.atomic_write(target, blob)
            if own:
                self.known_disk = hashlib.sha256(blob).digest()
                if self.pending is not None:
                    self.pending_from_disk = True

    def save_to_stream(self, stream: IO[bytes]) -> None:
        with self.lock:
            stream.write(encode(self.serialize(), self.record_key()))

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.pending = None
            self.handle = None


def _finalize(state: _State) -> None:
    """Autosave (at close, garbage collection or interpreter exit); warns, never raises."""
    try:
        with state.lock:
            due = state.autosave and not state.closed and state.needs_save()
        if due:
            state.save(None)
    except Exception as exc:
        warnings.warn(f"runtime cache was not saved to {state.path}: {exc}", CacheWarning, stacklevel=2)
    finally:
        state.close()


_SHARED: dict[Path, RuntimeCache] = {}
_SHARED_GUARD = threading.Lock()
_STATES: weakref.WeakSet[_State] = weakref.WeakSet()


def _renew_locks_after_fork() -> None:
    """In a forked child, locks another thread of the parent held would stay held forever."""
    global _SHARED_GUARD
    _SHARED_GUARD = threading.Lock()
    for state in list(_STATES):
        state.lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_locks_after_fork)


# -- the facade ---------------------------------------------------------------------------
class RuntimeCache:
    """A runtime cache shared by engines, with pending bytes and safe persistence.

    Bytes loaded before the backend's native cache exists stay *pending*; the first
    :meth:`ensure_materialized` creates the native cache and drains them into it exactly
    once. A cache is bound to one backend. Files and streams use the framed format of
    :func:`encode`; :meth:`load_bytes` and :meth:`serialize` move raw TensorRT bytes.

    Thread-safety: every method may be called from any thread. :meth:`save` takes a file
    lock on ``<path>.lock`` (``lock_timeout`` seconds) and replaces the file atomically.
    With ``autosave=True`` the cache is saved at :meth:`close`, when it is garbage
    collected and at interpreter exit; failures there warn (:class:`CacheWarning`).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        autosave: bool = False,
        lock_timeout: float = 30.0,
    ) -> None:
        timeout = seconds(lock_timeout, "lock_timeout")
        target = None if path is None else storage.absolute_path(path)
        self._state = _State(target, bool(autosave), timeout)
        _STATES.add(self._state)
        self._finalizer = weakref.finalize(self, _finalize, self._state)

    @property
    def path(self) -> Path | None:
        """The file this cache loads from and saves to by default (absolute), or ``None``."""
        return self._state.path

    @property
    def autosave(self) -> bool:
        return self._state.autosave

    @property
    def lock_timeout(self) -> float:
        return self._state.lock_timeout

    # -- factories -------------------------------------------------------------------
    @classmethod
    def shared(cls, path: str | os.PathLike[str]) -> RuntimeCache:
        """The one process-wide cache for ``path`` (engines whose settings hold a path).

        It is loaded from the file on first use and saved at exit (``autosave=True``).
        """
        target = storage.absolute_path(path)
        with _SHARED_GUARD:
            cache = _SHARED.get(target)
            if cache is None or cache.closed:
                cache = cls(target, autosave=True)
                cache._state.lazy = True
                _SHARED[target] = cache
            return cache

    @classmethod
    def default(cls, backend: Any, device: int | None = None) -> RuntimeCache:
        """A cache at the per-user default location for ``backend`` on ``device``, bound to it.

        The path is ``default_cache_path(backend.cache_key(device))`` (``device`` ``None``:
        the current device); see :meth:`in_directory`.
        """
        return cls.in_directory(None, backend, device)

    @classmethod
    def in_directory(
        cls, directory: str | os.PathLike[str] | None, backend: Any, device: int | None = None
    ) -> RuntimeCache:
        """The cache file of ``backend`` on ``device`` in ``directory`` (``None``: the per-user
        default one), bound to it: ``runtime-cache-<key slug>.bin``, one file per stack and
        GPU model, so the kernels of an sm89 GPU never land in the file of an sm90 one.

        The cache refuses to serve any other key (:class:`CacheError`); the file is not
        loaded (call :meth:`load`).
        """
        key = backend.cache_key(device)
        if directory is None:
            path = storage.default_cache_path(key)
        else:
            path = storage.absolute_path(directory) / storage.file_name(key)
        cache = cls(path)
        cache.bind(backend, key=key)
        cache._state.named_for = key
        return cache

    # -- loading -----------------------------------------------------------------------
    def load(self, path: str | os.PathLike[str] | None = None) -> bool:
        """Load the framed file at ``path`` (default: :attr:`path`); ``False`` if nothing was loaded.

        A missing file is an empty cache. A corrupt file (truncated, bit-flipped, empty,
        foreign) or one written for another stack warns once and is ignored: the backend
        never sees its bytes. A symlink or an unsafe directory raises :class:`CacheError`.
        """
        return self._state.load(path)

    def load_bytes(self, data: bytes | bytearray | memoryview) -> None:
        """Load *raw* TensorRT cache bytes (as returned by :meth:`serialize`, no framing).

        Before materialization they become the pending bytes; afterwards they go
        straight into the native cache. Raw bytes carry no key, so they are not checked.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"load_bytes() takes bytes; got {type(data).__name__}")
        with self._state.lock:
            self._state.check_open()
            self._state.ensure_loaded()
            self._state.accept(bytes(data), None, "bytes", False)

    def load_from_stream(self, stream: IO[bytes]) -> bool:
        """Load a framed cache from a binary file object; ``False`` if empty or corrupt (warns)."""
        return self._state.load_from_stream(stream)

    # -- saving ------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str] | None = None) -> None:
        """Write the cache to ``path`` (default: :attr:`path`) atomically under the file lock.

        Raises :class:`CacheLockTimeout` naming the lock file if another process holds it
        past ``lock_timeout`` (the cache stays in memory, so a retry works), and
        :class:`CacheError` naming the path and errno if the write fails (the previous
        file is intact, no temp file is left) or the location is unsafe.
        """
        self._state.save(path)

    def save_to_stream(self, stream: IO[bytes]) -> None:
        """Write the framed cache to a binary file object."""
        self._state.save_to_stream(stream)

    @contextlib.contextmanager
    def locked(self) -> Iterator[RuntimeCache]:
        """Hold the file lock of :attr:`path` for the block (re-entrant in one thread)."""
        target = self._state.resolve(None)
        with storage.locked(target, self._state.lock_timeout):
            yield self

    # -- bytes and state ---------------------------------------------------------------
    def serialize(self) -> bytes:
        """Raw TensorRT cache bytes: the native cache's, or the pending bytes before it exists."""
        return self._state.serialize()

    def has_cache(self) -> bool:
        """Whether the backend's native cache exists (has been materialized)."""
        with self._state.lock:
            return self._state.materialized()

    @property
    def has_pending(self) -> bool:
        """Whether loaded bytes wait for the native cache to be created."""
        with self._state.lock:
            if not self._state.closed:
                self._state.ensure_loaded()
            return self._state.pending is not None

    @property
    def drain_count(self) -> int:
        """How many times pending bytes were drained into a native cache (at most 1 per load)."""
        return self._state.drains

    @property
    def backend(self) -> Any:
        """The backend this cache is bound to, or ``None``."""
        return self._state.backend

    @property
    def key(self) -> CacheKey | None:
        """The stack this cache serves, once known (from :meth:`bind` or the backend)."""
        return self._state.key

    # -- binding -----------------------------------------------------------------------
    def bind(self, backend: Any, *, key: CacheKey | None = None) -> None:
        """Bind to ``backend`` (creating its not yet materialized handle); binding another is an error."""
        with self._state.lock:
            self._state.check_open()
            self._state.bind(backend, key)

    def ensure_materialized(self, config: Any, *, backend: Any = None, key: CacheKey | None = None) -> Any:
        """Create the native cache if needed, drain pending bytes once, return the native cache.

        ``backend`` binds the cache on first use; ``key`` (or ``backend.cache_key()``) is
        compared with the key of the loaded file: a mismatch warns
        :class:`StaleCacheWarning` and the pending bytes are dropped. Thread-safe: racing
        callers get the same native object and the bytes are drained once.
        """
        return self._state.ensure_materialized(config, backend, key)

    # -- lifetime ----------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._state.closed

    def close(self) -> None:
        """Save if ``autosave`` (failures warn), then release the native cache; idempotent."""
        self._finalizer()
        with _SHARED_GUARD:
            if self._state.path is not None and _SHARED.get(self._state.path) is self:
                del _SHARED[self._state.path]

    def __enter__(self) -> RuntimeCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        s = self._state
        status = (
            "closed"
            if s.closed
            else "materialized"
            if s.materialized()
            else ("pending" if s.pending is not None else "empty")
        )
        backend = None if s.backend is None else s.backend.name
        return f"<RuntimeCache {s.where()} {status} backend={backend!r}>"
