"""A child process of the local server: its event loop, and its stop when the supervisor is gone
(killed with SIGKILL, say) instead of holding the port and the GPU as an orphan."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any

__all__ = ["run_loop", "wait_orphaned"]


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop where it is installed (the ``serve`` extra), else on asyncio's loop."""
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
