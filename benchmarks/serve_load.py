"""A load generator for HTTP serving benchmarks that is not itself the bottleneck.

Clients are spread over worker processes; each process runs its clients as asyncio
tasks on raw keep-alive HTTP/1.1 connections (asyncio streams, no client library: one
``write`` per request, a minimal response parser), so one process drives thousands of
requests a second. Every client sends its next request as soon as the previous answer
arrived (closed loop). Only requests that *finish* inside the measuring window count.

Every answer is checked (:class:`Expect`): decoded (``.npy`` or JSON) and compared with a
float64 reference within the engine's tolerance. Identical answer bodies are decoded
once per process (a dict keyed by the body's bytes), so checking costs a hash per answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import math
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

__all__ = ["Expect", "LoadGenerator", "LoadResult", "percentile"]


@dataclasses.dataclass(frozen=True)
class Expect:
    """What a right answer is: ``body`` ``"npy"`` or ``"json"`` (a bare array, or ``{name: array}``
    whose ``output`` entry is compared), the float64 ``reference`` (nested lists) and tolerances."""

    body: str
    reference: Any
    rtol: float
    atol: float
    output: str | None = None

    def right(self, data: bytes) -> bool:
        import numpy as np

        try:
            if self.body == "npy":
                got = np.load(io.BytesIO(data), allow_pickle=False)
            else:
                doc = json.loads(data)
                got = np.asarray(doc[self.output] if isinstance(doc, dict) and self.output else doc)
            return bool(np.allclose(got.astype(np.float64), np.asarray(self.reference), rtol=self.rtol,
                                    atol=self.atol))
        except Exception:
            return False


@dataclasses.dataclass
class LoadResult:
    clients: int
    seconds: float
    completed: int
    errors: int
    wrong: int
    latencies_ms: list[float]

    @property
    def rps(self) -> float:
        return self.completed / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "clients": self.clients, "req_s": round(self.rps, 1),
            "p50_ms": round(percentile(self.latencies_ms, 50), 3),
            "p99_ms": round(percentile(self.latencies_ms, 99), 3),
            "wrong": self.wrong, "errors": self.errors, "seconds": round(self.seconds, 3),
        }


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[k]


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bool, bytes]:
    """Status, whether the server keeps the connection open, and the body."""
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
    body = b""
    if chunked:
        parts = []
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            parts.append((await reader.readexactly(size + 2))[:size])
            if size == 0:
                break
        body = b"".join(parts)
    elif length:
        body = await reader.readexactly(length)
    return status, keep, body


class _Tally:
    def __init__(self, expect: Expect | None) -> None:
        self.expect = expect
        self.completed = self.errors = self.wrong = 0
        self.latencies: list[float] = []
        self._verdicts: dict[bytes, bool] = {}

    def right(self, body: bytes) -> bool:
        if self.expect is None:
            return True
        verdict = self._verdicts.get(body)
        if verdict is None:
            verdict = self.expect.right(body)
            if len(self._verdicts) < 4096:
                self._verdicts[body] = verdict
        return verdict


async def _client(host: str, port: int, request: bytes, start: float, stop: float, tally: _Tally) -> None:
    reader = writer = None
    while time.time() < stop:
        if writer is None:
            try:
                reader, writer = await asyncio.open_connection(host, port)
            except OSError:
                tally.errors += 1
                await asyncio.sleep(0.05)
                continue
        t0 = time.perf_counter()
        try:
            writer.write(request)
            status, keep, body = await _read_response(reader)  # type: ignore[arg-type]
        except (ConnectionError, asyncio.IncompleteReadError, OSError, ValueError, IndexError):
            tally.errors += 1
            writer.close()
            reader = writer = None
            continue
        done = time.time()
        if start <= done <= stop:
            if status != 200:
                tally.errors += 1
            elif not tally.right(body):
                tally.wrong += 1
            else:
                tally.latencies.append((time.perf_counter() - t0) * 1e3)
                tally.completed += 1
        if not keep:
            writer.close()
            reader = writer = None
    if writer is not None:
        writer.close()


def drive(host: str, port: int, request: bytes, clients: int, start: float, stop: float,
          expect: Expect | None) -> tuple[int, int, int, list[float]]:
    """Run ``clients`` closed-loop clients in this process; ``(completed, errors, wrong, latencies)``."""

    async def main() -> _Tally:
        tally = _Tally(expect)
        await asyncio.gather(*(_client(host, port, request, start, stop, tally) for _ in range(clients)))
        return tally

    t = asyncio.run(main())
    return t.completed, t.errors, t.wrong, t.latencies


class LoadGenerator:
    """``processes`` worker processes, started once and reused for every cell."""

    def __init__(self, processes: int) -> None:
        import multiprocessing

        self.processes = max(1, processes)
        self._pool = ProcessPoolExecutor(self.processes, mp_context=multiprocessing.get_context("spawn"))
        list(self._pool.map(time.sleep, [0.0] * self.processes))  # start them now, not in a cell

    def pids(self) -> list[int]:
        """The worker processes' ids (their CPU time is the load generator's)."""
        return sorted(self._pool._processes or ())  # type: ignore[attr-defined]

    def run(self, host: str, port: int, path: str, body: bytes, content_type: str, clients: int,
            seconds: float, warmup: float, expect: Expect | None = None,
            window: Callable[[float, float], None] | None = None,
            headers: dict[str, str] | None = None) -> LoadResult:
        """One cell; ``window(start, stop)`` (``time.time()`` values) is told the measuring window first;
        ``headers`` go into every request beside ``Content-Type`` and ``Content-Length``."""
        extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
        request = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n"
        ).encode() + body
        start = time.time() + 0.3 + warmup  # every process has started its clients by then
        stop = start + seconds
        if window is not None:
            window(start, stop)
        share = [clients // self.processes + (1 if i < clients % self.processes else 0)
                 for i in range(self.processes)]
        futures = [self._pool.submit(drive, host, port, request, n, start, stop, expect) for n in share if n]
        completed = errors = wrong = 0
        latencies: list[float] = []
        for future in futures:
            c, e, w, lat = future.result()
            completed, errors, wrong = completed + c, errors + e, wrong + w
            latencies.extend(lat)
        return LoadResult(clients, seconds, completed, errors, wrong, latencies)

    def close(self) -> None:
        self._pool.shutdown()
