"""A fake CUDA layer with several GPUs of mixed models, for device-placement tests on CPU.

:class:`FakeGpus` stands in for ``cuda.bindings.runtime``, ``cuda.bindings.driver`` and
``cuda.core.Device`` as the python backend's :mod:`~trt_runtime_backends.python.cuda`
uses them. It follows CUDA's rules where placement depends on them: the current context
is per thread (a new thread has none), and a stream or a buffer is created in the
context current at that moment, not on the device object it was asked of.
:class:`RecordingGuard` is a ``DeviceGuard`` that counts its entries and exits.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["FakeDriver", "FakeGpus", "RecordingGuard"]


class _Ok(int):
    """A cudaError_t / CUresult of 0."""

    name = "CUDA_SUCCESS"


_OK = _Ok(0)


class FakeStream:
    def __init__(self, handle: int, device: int, blocking: bool) -> None:
        self.handle = handle
        self.device = device
        self.blocking = blocking


class FakeBuffer:
    def __init__(self, handle: int, size: int, device: int) -> None:
        self.handle = handle
        self.size = size
        self.device = device


class FakeGpus:
    """``len(sms)`` GPUs; ``sms[i]`` is device i's compute capability, e.g. ``"9.0"``."""

    def __init__(self, sms: Sequence[str]) -> None:
        self.sms = list(sms)
        self._local = threading.local()
        self._handles = itertools.count(0x1000, 0x10)
        self.streams: list[FakeStream] = []
        #: Devices whose primary context was made current at least once (a context costs memory).
        self.contexts_made: set[int] = set()
        self.runtime = _Runtime(self)
        self.driver = _Driver(self)

    # -- the per-thread current context (device + 1; 0 is "none") ---------------------------
    def current(self) -> int | None:
        """The device current in the calling thread, or None when no context is current."""
        ctx = getattr(self._local, "ctx", 0)
        return ctx - 1 if ctx else None

    def make_current(self, device: int | None) -> None:
        self._local.ctx = 0 if device is None else device + 1

    def device(self, index: int) -> _Device:
        if not 0 <= index < len(self.sms):
            raise ValueError(f"fake device {index} does not exist")
        return _Device(self, index)

    def install(self, monkeypatch: Any) -> FakeGpus:
        """Route the python backend's cuda module to these GPUs (and forget its devices)."""
        from trt_runtime_backends.python import cuda

        monkeypatch.setattr(cuda, "_runtime", lambda: self.runtime)
        monkeypatch.setattr(cuda, "_driver", lambda: self.driver)
        monkeypatch.setattr(cuda, "_core_device", self.device)
        monkeypatch.setattr(cuda, "_devices", {})
        return self


class _Device:
    def __init__(self, gpus: FakeGpus, index: int) -> None:
        self._gpus = gpus
        self.device_id = index

    @property
    def compute_capability(self) -> tuple[int, int]:
        major, minor = self._gpus.sms[self.device_id].split(".")
        return int(major), int(minor)

    def set_current(self) -> None:
        self._gpus.contexts_made.add(self.device_id)
        self._gpus.make_current(self.device_id)

    def _in_context(self) -> int:
        current = self._gpus.current()
        if current is None:
            raise RuntimeError("CUDA_ERROR_INVALID_CONTEXT: no context is current in this thread")
        return current

    def create_stream(self, options: Any = None) -> FakeStream:
        blocking = options is not None and not options.nonblocking
        stream = FakeStream(next(self._gpus._handles), self._in_context(), blocking)
        self._gpus.streams.append(stream)
        return stream

    def allocate(self, nbytes: int, stream: Any = None) -> FakeBuffer:
        return FakeBuffer(next(self._gpus._handles), nbytes, self._in_context())


class _Runtime:
    def __init__(self, gpus: FakeGpus) -> None:
        self._gpus = gpus

    def cudaGetDeviceCount(self) -> tuple[int, int]:
        return _OK, len(self._gpus.sms)

    def cudaGetDevice(self) -> tuple[int, int]:
        current = self._gpus.current()
        return _OK, 0 if current is None else current

    def cudaSetDevice(self, device: int) -> tuple[int]:
        self._gpus.make_current(device)
        return (_OK,)

    def cudaDriverGetVersion(self) -> tuple[int, int]:
        return _OK, 13000


class _Driver:
    def __init__(self, gpus: FakeGpus) -> None:
        self._gpus = gpus

    def cuCtxGetCurrent(self) -> tuple[int, int]:
        current = self._gpus.current()
        return _OK, 0 if current is None else current + 1

    def cuCtxSetCurrent(self, ctx: Any) -> tuple[int]:
        ctx = int(ctx)
        self._gpus.make_current(None if ctx == 0 else ctx - 1)
        return (_OK,)


class FakeDriver:
    """``cuda.bindings.driver``'s current context (an int handle; 0: none), with each set recorded."""

    def __init__(self, current: int) -> None:
        self.current = current
        self.sets: list[int] = []

    def cuCtxGetCurrent(self) -> tuple[int, int]:
        return 0, self.current

    def cuCtxSetCurrent(self, ctx: int) -> tuple[int]:
        self.sets.append(int(ctx))
        self.current = int(ctx)
        return (0,)


class RecordingGuard:
    """A DeviceGuard that counts, and tells whether the work ran inside it."""

    def __init__(self) -> None:
        self.entered = 0
        self.exited = 0
        self._depth = threading.local()

    @property
    def depth(self) -> int:
        return getattr(self._depth, "value", 0)

    def enter(self) -> object:
        self.entered += 1
        self._depth.value = self.depth + 1
        return ("token", self.entered)

    def exit(self, token: object) -> None:
        assert isinstance(token, tuple) and token[0] == "token"
        self.exited += 1
        self._depth.value = self.depth - 1
