"""A child process of the local server: its event loop, and its stop when the supervisor is gone
(killed with SIGKILL, say) instead of holding the port and the GPU as an orphan.

With :data:`PROFILE_ENV` set to a directory, each process runs its loop under :mod:`cProfile`
and writes ``<role>-<pid>.prof`` there when it stops (``python -m pstats`` reads it): where an
engine process or a front spends its time under real load, which ``benchmarks/probes/gpu_serve_profile.py``
prints. cProfile costs time per Python call, so the server serves less meanwhile."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any

__all__ = ["PROFILE_ENV", "run_loop", "wait_orphaned"]

#: Environment variable: a directory where each front and engine process writes its cProfile stats.
PROFILE_ENV = "TRT_RUNTIME_SERVE_PROFILE_DIR"


def run_loop(main: Coroutine[Any, Any, None], role: str = "process") -> None:
    """Run ``main`` on uvloop where it is installed (the ``serve`` extra), else on asyncio's loop;
    under cProfile when :data:`PROFILE_ENV` names a directory (``role`` names the stats file)."""
    folder = os.environ.get(PROFILE_ENV, "")
    if not folder:
        _run(main)
        return
    import cProfile

    profiler = cProfile.Profile()
    try:
        profiler.runcall(_run, main)
    finally:
        profiler.dump_stats(os.path.join(folder, f"{role}-{os.getpid()}.prof"))


def _run(main: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)


async def wait_orphaned(parent: int, poll_s: float = 0.5) -> None:
    """Return once ``parent`` is no longer this process's parent (it died; we were re-parented)."""
    while os.getppid() == parent:
        await asyncio.sleep(poll_s)
