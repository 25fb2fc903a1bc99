"""Write an engine in the container a path or a format name asks for: plan, TR01 or ``.pte``.

The bindings (with their optimization profiles) are recorded by TR01 and ``.pte``; a raw
plan records nothing beside the engine. Every writer is atomic: a failed write leaves
no file.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from trt_runtime.errors import SettingsError
from trt_runtime.formats.plan import write_plan
from trt_runtime.formats.source import EngineData
from trt_runtime.formats.tr01 import write_tr01
from trt_runtime.protocols import TensorSpec

__all__ = ["ENGINE_FORMATS", "EXTENSIONS", "format_for_path", "write_engine"]

#: The containers :func:`write_engine` writes.
ENGINE_FORMATS = ("plan", "tr01", "pte")
#: File extensions and the container each means.
EXTENSIONS = {".plan": "plan", ".engine": "plan", ".trt": "plan", ".tr01": "tr01", ".pte": "pte"}


def format_for_path(path: str | os.PathLike[str], format: str | None = None) -> str:
    """``format`` checked, or the container ``path``'s extension names; ValueError if neither."""
    if format is not None:
        if format not in ENGINE_FORMATS:
            raise SettingsError(f"format must be one of {', '.join(ENGINE_FORMATS)}; got {format!r}")
        return format
    suffix = Path(path).suffix.lower()
    if suffix not in EXTENSIONS:
        known = ", ".join(f"{ext} ({kind})" for ext, kind in EXTENSIONS.items())
        raise SettingsError(
            f"cannot tell the format of {os.fspath(path)!r} from its extension {suffix or '(none)'!r}; "
            f"use one of {known}, or name the format (plan, tr01, pte)"
        )
    return EXTENSIONS[suffix]


def write_engine(
    path: str | os.PathLike[str],
    plan: EngineData,
    bindings: Sequence[TensorSpec],
    *,
    format: str | None = None,
    device_id: int = 0,
) -> str:
    """Write ``plan`` to ``path`` as ``format`` (default: from the extension); return the format.

    ``.pte`` needs nothing beyond trt-runtime (:func:`trt_runtime.executorch.to_pte`).
    """
    kind = format_for_path(path, format)
    if kind == "plan":
        write_plan(path, plan)
    elif kind == "tr01":
        write_tr01(path, plan, bindings, device_id=device_id)
    else:
        from trt_runtime.executorch import to_pte

        to_pte(plan, bindings, path, device_id=device_id)
    return kind
