"""Engines in a process forked after they were loaded: closed in the child, with a clear error.

CUDA does not cross ``fork()``: a child's copy of a CUDA context, stream or TensorRT object
is unusable, and releasing it there touches the parent's driver state. So in a forked child
every engine the parent had is *orphaned* (:meth:`EngineBase._orphan_after_fork
<trt_runtime.engine.EngineBase._orphan_after_fork>`): it reads as closed, a call or a change
raises :class:`~trt_runtime.EngineError` saying to start workers with ``spawn`` or
``forkserver`` and load the engine there, and its native objects are kept, never released,
in the child.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

__all__ = ["track"]

_ENGINES: weakref.WeakSet[Any] = weakref.WeakSet()
#: The orphans' attributes in a forked child: kept so that nothing native is released there.
_KEPT: list[dict[str, Any]] = []
_PARENT = os.getpid()


def track(engine: Any) -> None:
    """Remember ``engine`` (an EngineBase lane) for a fork."""
    _ENGINES.add(engine)


def _after_fork_in_child() -> None:
    global _PARENT
    parent, _PARENT = _PARENT, os.getpid()
    for engine in list(_ENGINES):
        _KEPT.append(dict(vars(engine)))
        engine._orphan_after_fork(parent)
    _ENGINES.clear()


def _before_fork() -> None:
    global _PARENT
    _PARENT = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
