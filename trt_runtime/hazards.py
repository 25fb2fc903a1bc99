"""Known hazards of TensorRT builds that the runtime warns about.

One so far: with TensorRT-RTX 1.6.1.120 on an H100, a conv net's outputs came out wrong
now and then when the executions of two of its contexts overlapped on the GPU (eager or
under graphs, one deserialized engine or two; reproduced with bare TensorRT-RTX, see
docs/concurrency.md). An engine given ``contexts > 1`` on such a build warns once with
:class:`~trt_runtime.ContextOverlapWarning`, naming the build and the command that checks
the engine (``trt-runtime check-contexts``). One context (the default) orders every call
after the previous one, so it never warns.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

from trt_runtime.errors import ContextOverlapWarning

__all__ = ["OVERLAP_HAZARDS", "overlap_hazard", "warn_overlap"]

#: ``(flavour, version prefix)`` of the builds where overlapping contexts gave wrong outputs.
#: TensorRT-RTX 1.7 refuses the one GPU model it was seen on (sm 9.0), so it is unchecked.
OVERLAP_HAZARDS: tuple[tuple[str, str], ...] = (("tensorrt_rtx", "1.6."),)

_DOCS = "docs/concurrency.md#contexts-that-overlap-on-the-gpu-a-tensorrt-rtx-161-hazard"
_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def overlap_hazard(key: Any) -> str | None:
    """The build of ``key`` (a :class:`~trt_runtime.cache.CacheKey`) as a sentence's subject
    when it is one of :data:`OVERLAP_HAZARDS`, else ``None``."""
    flavour, version = getattr(key, "flavour", None), getattr(key, "version", None)
    if not isinstance(flavour, str) or not isinstance(version, str):
        return None
    for known, prefix in OVERLAP_HAZARDS:
        if flavour == known and version.startswith(prefix):
            name = "TensorRT-RTX" if flavour == "tensorrt_rtx" else "TensorRT"
            return f"{name} {version} (sm {key.compute_capability})"
    return None


def warn_overlap(engine: Any, contexts: int) -> bool:
    """Warn once per engine (:class:`~trt_runtime.ContextOverlapWarning`) when ``engine``'s
    backend runs a build of :data:`OVERLAP_HAZARDS`; whether it warned now. Advisory: a
    backend that cannot name its build (its ``cache_key`` fails) gets no warning."""
    if getattr(engine, "_overlap_warned", False):
        return False
    try:
        build = overlap_hazard(engine.backend.cache_key(engine.device))
    except Exception:  # the key needs the GPU stack; without it there is no build to name
        return False
    if build is None:
        return False
    engine._overlap_warned = True
    warnings.warn(
        f"engine {engine.name!r}: contexts={contexts} lets calls overlap on the GPU, and with "
        f"{build} a conv net gave wrong outputs now and then when they did ({_DOCS}). Check this "
        f"engine first: trt-runtime check-contexts MODEL --contexts {contexts} (exit 0: no output "
        f"differed), or keep contexts=1. Once it passes, load it under warnings.catch_warnings() "
        f"ignoring trt_runtime.ContextOverlapWarning",
        ContextOverlapWarning,
        stacklevel=_user_stacklevel(),
    )
    return True


def _user_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside this package (the user's line)."""
    frame = sys._getframe(1)
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE + os.sep):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level
