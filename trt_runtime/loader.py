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
    **format_options: Any,
) -> Engine:
    """Load an engine (raw plan, TR01/TR02 blob or single-delegate ``.pte``).

    ``device`` overrides the device recorded in the container verbatim; without it
    the engine runs on the device its container names (``device_id``), or the current
    device for a raw plan. The container is validated before any byte reaches TensorRT.
    """
    engine_source = read_engine_source(source, **format_options)
    if name is not None:
        from dataclasses import replace

        engine_source = replace(engine_source, name=name)
    chosen = get_backend(backend)
    return chosen.load_engine(engine_source, device=device, settings=RuntimeSettings.coerce(settings))
