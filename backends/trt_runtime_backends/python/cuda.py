"""CUDA plumbing for the python backend: devices, streams, events, buffers (cuda-python)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from trt_runtime.contract import cuda_result
from trt_runtime.errors import EngineError
from trt_runtime.formats import resolve_device as _placement

__all__ = [
    "CallerDevice",
    "close_quietly",
    "DeviceState",
    "device_count",
    "driver_version",
    "get_device",
]

_lock = threading.Lock()
_devices: dict[int, DeviceState] = {}


def _runtime() -> Any:
    from cuda.bindings import runtime

    return runtime


def _driver() -> Any:
    from cuda.bindings import driver

    return driver


def _core_device(index: int) -> Any:
    from cuda.core import Device

    return Device(index)


def device_count() -> int:
    """Number of visible CUDA devices (0 when there is no driver or no device)."""
    rt = _runtime()
    err, count = rt.cudaGetDeviceCount()
    return int(count) if int(err) == 0 else 0


def driver_version() -> int:
    """``cudaDriverGetVersion``, e.g. 13000."""
    return int(cuda_result(_runtime().cudaDriverGetVersion(), "cudaDriverGetVersion"))


def current_device() -> int:
    return int(cuda_result(_runtime().cudaGetDevice(), "cudaGetDevice"))


def resolve_device(device: int | None, recorded: int | None = None, name: str | None = None) -> int:
    """The device an engine runs on: ``device`` verbatim, else ``recorded`` (the blob's
    ``device_id``), else the current device; one that does not exist is an EngineError.

    The policy is the core's (:func:`trt_runtime.formats.resolve_device`), so every
    backend places engines alike.
    """
    if device is not None and (isinstance(device, bool) or not isinstance(device, int)):
        raise EngineError(f"device must be an int CUDA device id; got {device!r}")
    count = device_count()
    if device is None and recorded is None:
        if count == 0:
            raise EngineError("no CUDA device is visible to this process")
        return current_device()
    return _placement(recorded, device, count, name=name)


class DeviceState:
    """Per-device objects shared by the engines of one device: the cuda.core Device.

    Making it creates no CUDA context and changes no thread's current device.
    :meth:`activate` makes the device current in the calling thread (an engine does it
    once per thread before its first call there); :meth:`scope` does it for a block and
    gives the caller its own context back, so loading an engine on device 1 leaves a
    caller on device 0 on device 0.
    """

    def __init__(self, index: int) -> None:
        self.index = index
        self.device = _core_device(index)
        self._context = 0  # the primary context's handle, once this device was made current
        self._primary: Any = None  # that context as cuda-python's CUcontext
        # A device attribute: no context is needed, so none is created for a cache key.
        cc = self.device.compute_capability
        self.compute_capability = f"{cc[0]}.{cc[1]}"

    def activate(self) -> None:
        """Make this device current in the calling thread (until something changes it)."""
        self.device.set_current()

    @contextlib.contextmanager
    def scope(self) -> Iterator[DeviceState]:
        """This device current for the block, the caller's context (even none) restored after."""
        driver = _driver()
        previous = cuda_result(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if self._context and int(previous) == self._context:
            yield self
            return
        self.device.set_current()
        if not self._context:
            self._primary = cuda_result(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
            self._context = int(self._primary)
        try:
            yield self
        finally:
            cuda_result(driver.cuCtxSetCurrent(previous), "cuCtxSetCurrent")

    def primary_context(self) -> Any:
        """This device's primary context (a ``CUcontext``), made current once to learn it."""
        if self._primary is None:
            with self.scope():
                pass
        return self._primary

    def create_stream(self, blocking: bool = False) -> Any:
        """A new cuda.core stream on this device (whatever device is current), owned by the
        caller: non-blocking, or with ``blocking`` one that CUDA orders with the legacy
        default stream."""
        with self.scope():
            if not blocking:
                return self.device.create_stream()
            from cuda.core import StreamOptions

            return self.device.create_stream(options=StreamOptions(nonblocking=False))

    def allocate(self, nbytes: int, stream: Any) -> Any:
        """A device buffer of at least one byte (stream-ordered allocation on ``stream``).

        On the hot path: the caller has made this device current (:meth:`activate`)."""
        return self.device.allocate(max(int(nbytes), 1), stream=stream)


class CallerDevice:
    """The :class:`~trt_runtime.protocols.DeviceGuard` of an engine when several GPUs are
    visible: the engine's primary context is made current for a call only when another one
    (or none) is, and the caller's is given back after, so the calling thread's current
    device (runtime API) and context (driver API) are as it had them. One
    ``cuCtxGetCurrent`` per call when the caller is on the engine's device already."""

    __slots__ = ("_get", "_ours", "_set")

    def __init__(self, state: DeviceState, driver: Any = None) -> None:
        driver = _driver() if driver is None else driver
        self._get = driver.cuCtxGetCurrent
        self._set = driver.cuCtxSetCurrent
        self._ours = state.primary_context()

    def enter(self) -> Any:
        err, previous = self._get()
        if previous == self._ours:  # (CUcontext compares handles; a failed get gives another)
            return None
        cuda_result(self._set(self._ours), "cuCtxSetCurrent")
        return previous if int(err) == 0 else None

    def exit(self, token: Any) -> None:
        if token is not None:
            cuda_result(self._set(token), "cuCtxSetCurrent")


def get_device(index: int) -> DeviceState:
    with _lock:
        state = _devices.get(index)
        if state is None:
            state = _devices[index] = DeviceState(index)
        return state


def create_event(rt: Any = None) -> Any:
    """A timing-disabled cudaEvent_t (cheap to record and wait on)."""
    rt = _runtime() if rt is None else rt
    event = cuda_result(rt.cudaEventCreateWithFlags(rt.cudaEventDisableTiming), "cudaEventCreateWithFlags")
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
