"""Backend discovery through the ``trt_runtime.backends`` entry-point group."""

from __future__ import annotations

import os
import threading
from importlib.metadata import EntryPoint, entry_points

from trt_runtime.errors import BackendNotFoundError, BackendUnavailableError
from trt_runtime.protocols import Availability, Backend

__all__ = [
    "DEFAULT_ORDER",
    "ENTRY_POINT_GROUP",
    "ENV_VAR",
    "available_backends",
    "backend_for_engine",
    "backend_status",
    "engine_magics",
    "get_backend",
    "installed_backends",
    "load_backend",
    "register_backend",
]

ENTRY_POINT_GROUP = "trt_runtime.backends"
ENV_VAR = "TRT_RUNTIME_BACKEND"
#: Order in which ``get_backend()`` tries backends when none is named. Installed
#: backends not listed here are only used when named.
DEFAULT_ORDER = ("python", "torchbind")

_lock = threading.RLock()
_entry_points: dict[str, EntryPoint] | None = None
_instances: dict[str, Backend] = {}
_extra: dict[str, Backend] = {}


def _discover() -> dict[str, EntryPoint]:
    global _entry_points
    with _lock:
        if _entry_points is None:
            _entry_points = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
        return _entry_points


def installed_backends() -> list[str]:
    """Names of all installed backends (available here or not), sorted."""
    return sorted(set(_discover()) | set(_extra))


def load_backend(name: str) -> Backend:
    """The backend instance named ``name`` whether or not it can run here (to read its
    capabilities or availability reason); :func:`get_backend` is the way to run engines."""
    return _instantiate(name)


def _instantiate(name: str) -> Backend:
    with _lock:
        if name in _extra:
            return _extra[name]
        if name in _instances:
            return _instances[name]
        eps = _discover()
        if name not in eps:
            installed = ", ".join(map(repr, installed_backends())) or "none"
            raise BackendNotFoundError(
                f"no trt-runtime backend named {name!r}; installed backends: {installed}"
            )
        factory = eps[name].load()
        backend: Backend = factory()
        _instances[name] = backend
        return backend


def backend_status() -> dict[str, Availability]:
    """Every installed backend and whether it can run here (with the reason if not)."""
    status: dict[str, Availability] = {}
    for name in installed_backends():
        try:
            status[name] = _instantiate(name).is_available()
        except Exception as exc:  # a broken plugin must not hide the others
            status[name] = Availability(False, f"failed to load: {exc}")
    return status


def available_backends() -> list[str]:
    """Names of the installed backends that can run here, sorted."""
    return [name for name, ok in backend_status().items() if ok]


def get_backend(name: str | Backend | None = None) -> Backend:
    """Return a backend instance.

    Choice: an explicit ``name`` > the ``TRT_RUNTIME_BACKEND`` environment variable >
    the first available of :data:`DEFAULT_ORDER`. A named backend that cannot run here
    raises :class:`BackendUnavailableError` with the install hint.
    """
    if name is not None and not isinstance(name, str):
        return name
    chosen = name or os.environ.get(ENV_VAR) or None
    if chosen:
        backend = _instantiate(chosen)
        availability = backend.is_available()
        if not availability:
            raise BackendUnavailableError(availability.reason)
        return backend
    reasons = []
    for candidate in DEFAULT_ORDER:
        if candidate not in installed_backends():
            continue
        backend = _instantiate(candidate)
        availability = backend.is_available()
        if availability:
            return backend
        reasons.append(f"{candidate}: {availability.reason}")
    detail = "; ".join(reasons) or f"none of {', '.join(DEFAULT_ORDER)} is installed"
    raise BackendUnavailableError(f"no trt-runtime backend can run here ({detail})")


def engine_magics() -> dict[bytes, tuple[str, str]]:
    """``{magic: (backend name, format)}`` of the engine formats installed backends declare.

    A backend that reads a format of its own (the ``memory`` test backend's ``.mem``
    engines) declares it in an optional ``engine_magics`` attribute, ``{magic: format}``;
    TensorRT plans, blobs and ``.pte`` programs need no declaration.
    """
    found: dict[bytes, tuple[str, str]] = {}
    for name in installed_backends():
        try:
            declared = getattr(_instantiate(name), "engine_magics", None) or {}
        except Exception:  # a broken plugin must not hide the others
            continue
        for magic, what in declared.items():
            found.setdefault(bytes(magic), (name, str(what)))
    return found


def backend_for_engine(data: bytes | bytearray | memoryview, name: str | None = None) -> str | None:
    """The backend :func:`trt_runtime.load` gives the engine ``data`` starts with.

    A named backend or ``$TRT_RUNTIME_BACKEND`` wins; otherwise the backend that declares
    ``data``'s magic, or ``None`` for the default order (:func:`get_backend`).
    """
    if name:
        return name
    if os.environ.get(ENV_VAR):
        return os.environ[ENV_VAR]
    head = bytes(memoryview(data)[:16])
    for magic, (owner, _what) in engine_magics().items():
        if head.startswith(magic):
            return owner
    return None


def register_backend(backend: Backend) -> None:
    """Register an instance under ``backend.name`` without an entry point (tests, plugins
    under development). Entry points are the normal route."""
    with _lock:
        _extra[backend.name] = backend


def _reset() -> None:
    """Forget discovered entry points and instances (for tests)."""
    global _entry_points
    with _lock:
        _entry_points = None
        _instances.clear()
        _extra.clear()
