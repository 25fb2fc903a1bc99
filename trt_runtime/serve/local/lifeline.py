"""A child of the local server stops when the supervisor is gone (killed with SIGKILL, say),
instead of holding the port and the GPU as an orphan."""

from __future__ import annotations

import asyncio
import os

__all__ = ["wait_orphaned"]


async def wait_orphaned(parent: int, poll_s: float = 0.5) -> None:
    """Return once ``parent`` is no longer this process's parent (it died; we were re-parented)."""
    while os.getppid() == parent:
        await asyncio.sleep(poll_s)
