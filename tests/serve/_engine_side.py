"""An engine process's listening side in the test's own process (its batcher a double or a real one)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from trt_runtime.serve.local.engine_process import FrontLink


async def engine_side(path: Path, batcher: Any, links: list[FrontLink] | None = None,
                      link: type[FrontLink] = FrontLink) -> asyncio.AbstractServer:
    """Listen on the unix socket ``path``: each front's connection a ``link`` to ``batcher`` (kept
    in ``links``), as in an engine process."""
    def make() -> FrontLink:
        made = link(batcher)
        if links is not None:
            links.append(made)
        return made

    return await asyncio.get_running_loop().create_unix_server(make, path=os.fspath(path))
