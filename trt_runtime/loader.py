"""``trt_runtime.load``: read an engine from bytes, a path or a file and hand it to a backend."""

from __future__ import annotations

import os
from typing import IO, Any

from trt_runtime.errors import FormatError, SettingsError
from trt_runtime.formats import EngineInput, read_engine_source, unknown_magic
from trt_runtime.formats.source import open_buffer
from trt_runtime.protocols import Backend, Engine
from trt_runtime.registry import backend_for_engine, engine_magics, get_backend
from trt_runtime.settings import RuntimeSettings, SettingsLike
from trt_runtime.validation import show

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

    ``contexts``: how many execution contexts serve concurrent callers (a call leases a
    free one; needs the backend's ``supports_multiple_contexts`` when above 1); of one
    deserialized engine, but a backend may deserialize a dynamic-shape engine once per
    context, as TensorRT wants no two concurrent contexts on one optimization profile.
    ``lease_timeout``: seconds a call waits
    for a free context before :class:`~trt_runtime.ContextLeaseTimeout` (``None``: no
    limit). Both stay settable on the engine. Several contexts let calls overlap on the
    GPU, which some engines do not survive (TensorRT-RTX 1.6.1 on an H100 gave a conv net
    wrong outputs then): check an engine with ``trt-runtime check-contexts FILE`` first
    (docs/concurrency.md).

    Without ``backend`` (and ``$TRT_RUNTIME_BACKEND``), a file in a format a backend
    declares (the ``memory`` test backend's ``.mem`` engines) goes to that backend, and a
    file whose first bytes match no known magic raises :class:`~trt_runtime.FormatError`;
    other engines go to the first available backend. A named backend is given the
    engine whatever its magic, and validates it itself.
    """
    from dataclasses import replace

    if contexts != 1:
        _check_contexts(contexts)
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
    if contexts != 1:
        chosen.capabilities.require("supports_multiple_contexts", chosen.name)
    engine_source = replace(read_engine_source(view, **format_options), name=name or label)
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
        raise SettingsError(f"contexts must be an int >= 1; got {show(contexts)}")
