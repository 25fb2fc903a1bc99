"""CUDA plumbing for the python backend: devices, streams, events, buffers (cuda-python)."""

from __future__ import annotations

import threading
from typing import Any

from trt_runtime.errors import BackendError, EngineError

__all__ = [
    "close_quietly",
    "DeviceState",
    "check",
    "device_count",
    "driver_version",
    "get_device",
]

_lock = threading.Lock()
_devices: dict[int, DeviceState] = {}


def _runtime() -> Any:
    from cuda.bindings import runtime

    return runtime


def check(result: Any, what: str) -> Any:
    """Unpack a cuda.bindings ``(err, *values)`` tuple; raise BackendError on failure."""
    err = result[0]
    if int(err) != 0:
        try:
            _, name = _runtime().cudaGetErrorName(err)
        except Exception:
            name = err
        raise BackendError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def device_count() -> int:
    """Number of visible CUDA devices (0 when there is no driver or no device)."""
    rt = _runtime()
    err, count = rt.cudaGetDeviceCount()
    return int(count) if int(err) == 0 else 0


def driver_version() -> int:
    """``cudaDriverGetVersion``, e.g. 13000."""
    return int(check(_runtime().cudaDriverGetVersion(), "cudaDriverGetVersion"))


def current_device() -> int:
    return int(check(_runtime().cudaGetDevice(), "cudaGetDevice"))


def resolve_device(device: int | None) -> int:
    """``device`` verbatim if it exists, the current device for ``None``; else EngineError."""
    count = device_count()
    if device is None:
        if count == 0:
            raise EngineError("no CUDA device is visible to this process")
        return current_device()
    if isinstance(device, bool) or not isinstance(device, int):
        raise EngineError(f"device must be an int CUDA device id; got {device!r}")
    if not 0 <= device < count:
        valid = f"valid ids are 0..{count - 1}" if count else "none is visible"
        raise EngineError(
            f"CUDA device {device} does not exist: this process sees {count} device(s); {valid}"
        )
    return device


class DeviceState:
    """Per-device objects shared by the engines of one device: the cuda.core Device."""

    def __init__(self, index: int) -> None:
        from cuda.core import Device

        self.index = index
        self.device = Device(index)
        self.device.set_current()
        cc = self.device.compute_capability
        self.compute_capability = f"{cc[0]}.{cc[1]}"

    def activate(self) -> None:
        self.device.set_current()

    def create_stream(self, blocking: bool = False) -> Any:
        """A new cuda.core stream owned by the caller: non-blocking, or with ``blocking``
        one that CUDA orders with the legacy default stream."""
        if not blocking:
            return self.device.create_stream()
        from cuda.core import StreamOptions

        return self.device.create_stream(options=StreamOptions(nonblocking=False))

    def allocate(self, nbytes: int, stream: Any) -> Any:
        """A device buffer of at least one byte (stream-ordered allocation on ``stream``)."""
        return self.device.allocate(max(int(nbytes), 1), stream=stream)


def get_device(index: int) -> DeviceState:
    with _lock:
        state = _devices.get(index)
        if state is None:
            state = _devices[index] = DeviceState(index)
        return state


def create_event(rt: Any = None) -> Any:
    """A timing-disabled cudaEvent_t (cheap to record and wait on)."""
    rt = _runtime() if rt is None else rt
    event = check(rt.cudaEventCreateWithFlags(rt.cudaEventDisableTiming), "cudaEventCreateWithFlags")
    return event


def destroy_event(event: Any, rt: Any = None) -> None:
    try:
        (_runtime() if rt is None else rt).cudaEventDestroy(event)
    except Exception:  # interpreter shutdown
        pass


def close_quietly(stream: Any) -> None:
    """Close a cuda.core stream (``None``: nothing); a failure at teardown is not reported."""
    if stream is not None:
        try:
            stream.close()
        except Exception:
            pass
