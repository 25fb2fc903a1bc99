"""A load generator for HTTP serving benchmarks that is not itself the bottleneck.

Clients are spread over worker processes; each process runs its clients as asyncio
tasks on raw keep-alive HTTP/1.1 connections (asyncio streams, no client library: one
``write`` per request, a minimal response parser), so one process drives thousands of
requests a second. Every client sends its next request as soon as the previous answer
arrived (closed loop). Only requests that *finish* inside the measuring window count.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

__all__ = ["LoadResult", "LoadGenerator", "percentile"]


@dataclasses.dataclass
class LoadResult:
    clients: int
    seconds: float
    completed: int
    errors: int
    latencies_ms: list[float]

    @property
    def rps(self) -> float:
        return self.completed / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "clients": self.clients, "seconds": round(self.seconds, 3), "completed": self.completed,
            "errors": self.errors, "rps": round(self.rps, 1),
            "p50_ms": round(percentile(self.latencies_ms, 50), 3),
            "p99_ms": round(percentile(self.latencies_ms, 99), 3),
        }


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[k]


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """Status, and whether the server keeps the connection open."""
    line = await reader.readline()
    if not line:
        raise ConnectionError("the server closed the connection")
    status = int(line.split()[1])
    length, chunked, keep = 0, False, True
    while True:
        header = await reader.readline()
        if header in (b"\r\n", b"\n", b""):
            break
        name, _, value = header.decode("latin-1").partition(":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == "content-length":
            length = int(value)
        elif name == "transfer-encoding" and "chunked" in value:
            chunked = True
        elif name == "connection" and value == "close":
            keep = False
    if chunked:
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    elif length:
        await reader.readexactly(length)
    return status, keep


async def _client(host: str, port: int, request: bytes, start: float, stop: float,
                  latencies: list[float], counts: list[int]) -> None:
    reader = writer = None
    while time.time() < stop:
        if writer is None:
            reader, writer = await asyncio.open_connection(host, port)
        t0 = time.perf_counter()
        try:
            writer.write(request)
            status, keep = await _read_response(reader)  # type: ignore[arg-type]
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            counts[1] += 1
            writer.close()
            reader = writer = None
            continue
        done = time.time()
        if start <= done <= stop:
            if status == 200:
                latencies.append((time.perf_counter() - t0) * 1e3)
                counts[0] += 1
            else:
                counts[1] += 1
        if not keep:
            writer.close()
            reader = writer = None
    if writer is not None:
        writer.close()


def drive(
    host: str, port: int, request: bytes, clients: int, start: float, stop: float
) -> tuple[int, int, list[float]]:
    """Run ``clients`` closed-loop clients in this process; ``(completed, errors, latencies)``."""

    async def main() -> tuple[int, int, list[float]]:
        latencies: list[float] = []
        counts = [0, 0]
        await asyncio.gather(*(_client(host, port, request, start, stop, latencies, counts)
                               for _ in range(clients)))
        return counts[0], counts[1], latencies

    return asyncio.run(main())


class LoadGenerator:
    """``processes`` worker processes, started once and reused for every cell."""

    def __init__(self, processes: int) -> None:
        import multiprocessing

        self.processes = max(1, processes)
        self._pool = ProcessPoolExecutor(self.processes, mp_context=multiprocessing.get_context("spawn"))
        list(self._pool.map(time.sleep, [0.0] * self.processes))  # start them now, not in a cell

    def run(self, host: str, port: int, path: str, body: bytes, content_type: str,
            clients: int, seconds: float, warmup: float) -> LoadResult:
        request = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        start = time.time() + 0.3 + warmup  # every process has started its clients by then
        stop = start + seconds
        share = [clients // self.processes + (1 if i < clients % self.processes else 0)
                 for i in range(self.processes)]
        futures = [self._pool.submit(drive, host, port, request, n, start, stop) for n in share if n]
        completed = errors = 0
        latencies: list[float] = []
        for future in futures:
            c, e, lat = future.result()
            completed, errors = completed + c, errors + e
            latencies.extend(lat)
        return LoadResult(clients, seconds, completed, errors, latencies)

    def close(self) -> None:
        self._pool.shutdown()
