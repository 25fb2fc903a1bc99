"""The one exception and warning hierarchy of trt-runtime."""

from __future__ import annotations

__all__ = [
    "BackendError",
    "BackendNotFoundError",
    "BackendUnavailableError",
    "CacheError",
    "CacheLockTimeout",
    "CacheWarning",
    "CapabilityError",
    "DataDependentShapeError",
    "EngineError",
    "FormatError",
    "InputError",
    "LostUpdateWarning",
    "RequestError",
    "StaleCacheWarning",
    "TrtRuntimeError",
]


class TrtRuntimeError(Exception):
    """Base class of every error raised by trt-runtime."""


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


class DataDependentShapeError(EngineError):
    """The engine has outputs whose shapes are only known after it runs."""


class InputError(TrtRuntimeError, ValueError):
    """Inputs handed to an engine have the wrong count, dtype, shape or device."""


class RequestError(InputError):
    """A served request is malformed or does not fit the engine; ``status`` is its HTTP code."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


class FormatError(TrtRuntimeError, ValueError):
    """A serialized engine, blob, program or cache file is malformed."""


class CacheError(TrtRuntimeError):
    """A runtime cache could not be loaded, saved or materialized."""


class CacheLockTimeout(CacheError, TimeoutError):
    """Another process held the cache file's lock for longer than the timeout."""


class CacheWarning(UserWarning):
    """A runtime cache file was ignored or could not be saved; inference goes on."""


class StaleCacheWarning(CacheWarning):
    """A cache file was written for another TensorRT build, GPU or driver and was not loaded."""


class LostUpdateWarning(CacheWarning):
    """Another process replaced the cache file since it was loaded; its kernels were overwritten."""
