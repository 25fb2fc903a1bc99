"""The device policy: which CUDA device an engine runs on (:func:`resolve_device`)."""

from __future__ import annotations

from trt_runtime.errors import EngineError

__all__ = ["resolve_device"]


def resolve_device(
    device_id: int | None,
    explicit: int | None,
    device_count: int,
    *,
    current: int = 0,
    name: str | None = None,
) -> int:
    """The CUDA device an engine runs on.

    Policy: an ``explicit`` device from the caller (``load(device=...)``) is used
    verbatim; otherwise the container's ``device_id``; otherwise (raw plans) the
    ``current`` device. Whichever is chosen must exist among the ``device_count``
    devices: a blob built on GPU 3 never silently runs on GPU 0. ``name`` (the engine's)
    starts the error messages.
    """
    who = f"engine {name!r}: " if name else ""
    if device_count <= 0:
        raise EngineError("no CUDA device is visible on this machine; cannot run a TensorRT engine")
    if explicit is not None:
        if isinstance(explicit, bool) or not isinstance(explicit, int) or not 0 <= explicit < device_count:
            raise EngineError(
                f"{who}device={explicit!r} does not exist: this machine has {device_count} CUDA device(s) "
                f"(0..{device_count - 1})"
            )
        return explicit
    if device_id is None:
        return current
    if isinstance(device_id, bool) or not isinstance(device_id, int) or not 0 <= device_id < device_count:
        raise EngineError(
            f"{who}the engine's container names device_id {device_id!r}, but this machine has "
            f"{device_count} CUDA device(s) (0..{device_count - 1}); pass device=N to load() "
            "to run it on another GPU"
        )
    return device_id
