"""``trt_runtime.load``: read an engine from bytes, a path or a file and hand it to a backend."""

from __future__ import annotations

import os
from typing import IO, Any

from trt_runtime.formats import EngineInput, read_engine_source
from trt_runtime.protocols import Backend, Engine
from trt_runtime.registry import get_backend
from trt_runtime.settings import RuntimeSettings, SettingsLike

__all__ = ["load"]


def load(
    source: EngineInput | str | os.PathLike[str] | IO[bytes],
    backend: str | Backend | None = None,
    *,
    device: int | None = None,
    settings: SettingsLike = None,
    name: str | None = None,
    contexts: int = 1,
    lease_timeout: float | None = None,
    **format_options: Any,
) -> Engine:
    """Load an engine (raw plan, TR01/TR02 blob or single-delegate ``.pte``).

    ``device`` overrides the device recorded in the container verbatim; without it
    the engine runs on the device its container names (``device_id``), or the current
    device for a raw plan. The container is validated before any byte reaches TensorRT.

    ``contexts``: how many execution contexts of the one deserialized engine serve
    concurrent callers (a call leases a free one; needs the backend's
    ``supports_multiple_contexts`` when above 1); ``lease_timeout``: seconds a call waits
    for a free context before :class:`~trt_runtime.ContextLeaseTimeout` (``None``: no
    limit). Both stay settable on the engine.
    """
    engine_source = read_engine_source(source, **format_options)
    if name is not None:
        from dataclasses import replace

        engine_source = replace(engine_source, name=name)
    chosen = get_backend(backend)
    if contexts != 1:
        _check_contexts(contexts)
        chosen.capabilities.require("supports_multiple_contexts", chosen.name)
    engine = chosen.load_engine(engine_source, device=device, settings=RuntimeSettings.coerce(settings))
    try:
        if lease_timeout is not None:
            engine.lease_timeout = lease_timeout  # type: ignore[attr-defined]
        if contexts != 1:
            engine.contexts = contexts  # type: ignore[attr-defined]
    except BaseException:
        engine.close()
        raise
    return engine


def _check_contexts(contexts: Any) -> None:
    if isinstance(contexts, bool) or not isinstance(contexts, int) or contexts < 1:
        raise ValueError(f"contexts must be an int >= 1; got {contexts!r}")
