"""How long does a process take to answer another over a unix socket, asleep between messages or polling?

Run from the repository root (any Linux host; the GPU host's figure is the one that matters, as the
local server's requests cross two such hops)::

    python benchmarks/probes/cpu_wakeup.py [--pings 5000] [--gaps-us 0,100,500,2000]

Two processes play ping-pong over a ``socketpair`` of ``SOCK_STREAM`` (as a front and its engine
process do). The pinger sends 16 bytes, waits for the echo (polling, so its own wakeup is not timed),
then polls for ``gap`` µs before the next ping, so an echo side that sleeps between messages really
sleeps. The echo side runs one of:
- ``block``: a blocking ``recv`` (the thread sleeps in the kernel);
- ``loop``: an asyncio event loop (uvloop when installed) with a protocol that echoes (sleeps in epoll);
- ``loop-poll``: the same loop kept from sleeping by a callback that queues itself again
  (``call_soon``), so each pass polls the sockets with no wait.
Printed: the round trip's p50, p90 and p99 in µs per mode and gap. The difference between ``loop``
and ``loop-poll`` at a gap is what one hop's wakeup costs on that host.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable

MESSAGE = b"p" * 16


def _echo_block(sock: socket.socket) -> None:
    while True:
        data = sock.recv(64)
        if not data:
            return
        sock.sendall(data)


class _Echo(asyncio.Protocol):
    def __init__(self, done: asyncio.Future[None]) -> None:
        self._done = done
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._done.done():
            self._done.set_result(None)


def _echo_loop(sock: socket.socket, poll: bool) -> None:
    new_loop: Callable[[], asyncio.AbstractEventLoop]
    try:
        import uvloop

        new_loop = uvloop.new_event_loop
    except ImportError:
        new_loop = asyncio.new_event_loop
    loop = new_loop()

    async def serve() -> None:
        done: asyncio.Future[None] = loop.create_future()
        await loop.connect_accepted_socket(lambda: _Echo(done), sock)
        if poll:
            def again() -> None:
                if not done.done():
                    loop.call_soon(again)
            loop.call_soon(again)
        await done

    loop.run_until_complete(serve())
    loop.close()


def _echo(mode: str, fd: int, other: int) -> None:
    os.close(other)  # (the pinger's end, inherited by fork: closed here, its close is our end of file)
    sock = socket.socket(fileno=fd)
    if mode == "block":
        _echo_block(sock)
    else:
        _echo_loop(sock, poll=mode == "loop-poll")


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _round_trips(mode: str, pings: int, gap_s: float) -> list[float]:
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ctx = multiprocessing.get_context("fork")
    echo = ctx.Process(target=_echo, args=(mode, theirs.fileno(), mine.fileno()), daemon=True)
    echo.start()
    theirs.close()
    mine.setblocking(False)
    times: list[float] = []
    try:
        for i in range(pings + 200):
            start = time.perf_counter()
            mine.send(MESSAGE)
            got = 0
            while got < len(MESSAGE):
                try:
                    got += len(mine.recv(64))
                except BlockingIOError:
                    continue
            if i >= 200:  # (the first ones warm up both sides)
                times.append((time.perf_counter() - start) * 1e6)
            _spin(gap_s)
    finally:
        mine.close()
        echo.join(5)
        if echo.is_alive():
            echo.kill()
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pings", type=int, default=5000)
    parser.add_argument("--gaps-us", default="0,100,500,2000", help="comma-separated µs between pings")
    parser.add_argument("--modes", default="block,loop,loop-poll")
    parser.add_argument("--out", help="a JSON file for the figures")
    args = parser.parse_args()
    gaps = [int(g) for g in args.gaps_us.split(",")]
    modes = args.modes.split(",")
    rows = []
    print(f"{os.cpu_count()} cores; {args.pings} pings per cell; round trip in µs (p50 / p90 / p99)")
    for gap in gaps:
        cells = []
        for mode in modes:
            t = sorted(_round_trips(mode, args.pings, gap / 1e6))
            p50, p90, p99 = (t[int(q * (len(t) - 1))] for q in (0.5, 0.9, 0.99))
            rows.append({"mode": mode, "gap_us": gap, "p50_us": round(p50, 1), "p90_us": round(p90, 1),
                         "p99_us": round(p99, 1), "mean_us": round(statistics.fmean(t), 1)})
            cells.append(f"{mode} {p50:.1f} / {p90:.1f} / {p99:.1f}")
        print(f"gap {gap:>5} µs: " + "   ".join(cells), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"cores": os.cpu_count(), "pings": args.pings, "rows": rows}, f, indent=1)

    return 0


if __name__ == "__main__":
    sys.exit(main())
