"""The one exception and warning hierarchy of trt-runtime.

Every failure trt-runtime reports on bad input, a bad file, a bad host or a failing
backend is a :class:`TrtRuntimeError`, one class per layer: :class:`SettingsError` for
values handed to settings, cache options, writers, builders and other calls;
:class:`FormatError` for engine containers and cache files; :class:`CacheError` for the
cache's storage; :class:`StorageError` for writing other files (disk full);
:class:`InputError` for the arrays handed to an engine; :class:`EngineError` and
:class:`BackendError` for what happens below. Python's own limits met on hostile input
(``RecursionError``, ``OverflowError``, the int-digits ``ValueError``) are translated
into the class of the layer that met them. Classes about bad values also derive from
:class:`ValueError`, so ``except ValueError`` keeps working; :class:`StorageError` is an
:class:`OSError`. An argument of the wrong Python type is a programming error and raises ``TypeError``.
"""

from __future__ import annotations

__all__ = [
    "ArraySizeError",
    "BackendError",
    "BackendNotFoundError",
    "BackendUnavailableError",
    "BuildError",
    "CacheError",
    "CacheLockTimeout",
    "ContextLeaseTimeout",
    "ContextOverlapWarning",
    "CacheWarning",
    "CapabilityError",
    "DataDependentShapeError",
    "EngineError",
    "FormatError",
    "InputError",
    "LostUpdateWarning",
    "RequestError",
    "SettingsError",
    "StaleCacheWarning",
    "StorageError",
    "TrtRuntimeError",
]


class TrtRuntimeError(Exception):
    """Base class of every error trt-runtime raises on bad values, files, hosts or backends."""


class SettingsError(TrtRuntimeError, ValueError):
    """A setting, option or argument has an invalid value (settings, cache options, paths, numbers)."""


class BackendError(TrtRuntimeError):
    """A backend failed, or TensorRT / CUDA / torch failed underneath it."""


class BackendNotFoundError(BackendError, LookupError):
    """No backend of that name is installed."""


class BackendUnavailableError(BackendError):
    """The backend is installed but cannot run here (missing dependency, no GPU)."""


class CapabilityError(BackendError, NotImplementedError):
    """The backend does not have the capability the call needs."""


class EngineError(TrtRuntimeError):
    """An engine could not be deserialized, inspected or executed."""


class ContextLeaseTimeout(EngineError, TimeoutError):
    """No execution context of the engine became free within ``lease_timeout``."""


class DataDependentShapeError(EngineError):
    """The engine has outputs whose shapes are only known after it runs."""


class BuildError(TrtRuntimeError):
    """A model could not be parsed or built into an engine; ``failures`` has one line per error."""

    def __init__(self, message: str, failures: tuple[str, ...] | list[str] = ()) -> None:
        super().__init__(message)
        self.failures: tuple[str, ...] = tuple(failures) or (message,)


class InputError(TrtRuntimeError, ValueError):
    """Inputs handed to an engine have the wrong count, dtype, shape or device."""


class RequestError(InputError):
    """A served request is malformed or does not fit the engine; ``status`` is its HTTP code."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


class FormatError(TrtRuntimeError, ValueError):
    """A serialized engine, blob, program or cache file is malformed."""


class ArraySizeError(FormatError):
    """An array file or archive is larger than the size budget it is read under."""


class StorageError(TrtRuntimeError, OSError):
    """A file could not be written or replaced (disk full, I/O error); names the path and errno."""

    def __str__(self) -> str:  # the message, not OSError's "[Errno N] ...: 'path'"
        return str(self.args[0]) if self.args else super().__str__()


class CacheError(TrtRuntimeError):
    """A runtime cache could not be loaded, saved or materialized."""


class CacheLockTimeout(CacheError, TimeoutError):
    """Another process held the cache file's lock for longer than the timeout."""


class CacheWarning(UserWarning):
    """A runtime cache file was ignored or could not be saved; inference goes on."""


class StaleCacheWarning(CacheWarning):
    """A cache file was written for another TensorRT build, GPU or driver and was not loaded."""


class ContextOverlapWarning(RuntimeWarning):
    """An engine got ``contexts > 1`` on a TensorRT build where executions that overlap on
    the GPU have given wrong outputs (:mod:`trt_runtime.hazards`); check it with
    ``trt-runtime check-contexts``."""


class LostUpdateWarning(CacheWarning):
    """Another process replaced the cache file since it was loaded; its kernels were overwritten."""
