"""uvicorn's httptools protocol for the front processes, sending each response with one write.

uvicorn writes a response's status line and headers, then its body, as two writes on the
connection: two ``send`` system calls and two TCP segments per answer over loopback, each
waking the client. :class:`GatheredHttpToolsProtocol` hands uvicorn a transport that queues
the writes of one event-loop pass and sends them together at the end of the pass (as
:class:`~trt_runtime.serve.local.transport.FrameWriter` does for the hop), so a response
leaves in one. Imported only by a front process (it needs uvicorn and httptools).
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["GatheredHttpToolsProtocol", "GatheredWrites"]


class GatheredWrites:
    """``transport`` whose writes of one event-loop pass leave in one write; the rest is the
    transport's own. :meth:`close` sends what is queued first."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> None:
        parts = self._parts
        if not parts:
            self._loop.call_soon(self.flush)
        parts.append(data)

    def flush(self) -> None:
        """Send what is queued now (also called by the loop once per pass)."""
        parts, self._parts = self._parts, []
        if parts and not self._transport.is_closing():  # a closed connection has nobody to read it
            self._transport.write(parts[0] if len(parts) == 1 else b"".join(parts))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GatheredHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol on a :class:`GatheredWrites` transport."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(cast(asyncio.Transport, GatheredWrites(transport, self.loop)))
