"""``trt_runtime.load``: read an engine from bytes, a path or a file and hand it to a backend."""

from __future__ import annotations

import os
from typing import IO, Any

from trt_runtime.errors import FormatError
from trt_runtime.formats import EngineInput, read_engine_source, unknown_magic
from trt_runtime.formats.source import open_buffer
from trt_runtime.protocols import Backend, Engine
from trt_runtime.registry import backend_for_engine, engine_magics, get_backend
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

    Without ``backend`` (and ``$TRT_RUNTIME_BACKEND``), a file in a format a backend
    declares (the ``memory`` test backend's ``.mem`` engines) goes to that backend, and a
    file whose first bytes match no known magic raises :class:`~trt_runtime.FormatError`;
    other engines go to the first available backend. A named backend is given the
    engine whatever its magic, and validates it itself.
    """
    from dataclasses import replace

    view, label = open_buffer(source)
    if isinstance(backend, str) or backend is None:
        chosen_name = backend_for_engine(view, backend)
        if chosen_name is None:
            declared = {magic: what for magic, (_owner, what) in engine_magics().items()}
            reason = unknown_magic(view, repr(label), declared)
            if reason:
                raise FormatError(reason)
        chosen = get_backend(chosen_name)
    else:
        chosen = backend
    engine_source = replace(read_engine_source(view, **format_options), name=name or label)
    return chosen.load_engine(engine_source, device=device, settings=RuntimeSettings.coerce(settings))
