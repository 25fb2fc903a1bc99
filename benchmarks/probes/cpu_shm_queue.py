"""What would an engine process save with shared-memory request queues instead of unix-socket frames?

Run from the repository root (any Linux host with two free cores)::

    python benchmarks/probes/cpu_shm_queue.py [--fronts 16] [--per-front 1,2,4] [--rounds 3000]

The local server's engine process reads each front's requests from that front's unix socket (uvloop,
one read per front per pass) and writes the answers back (one write per front per batch); on the GPU host
that costs it about as much per pass as the engine call (``docs/serving.md``, two GPUs). This probe
measures the transport alone, with no engine and no batching, between two processes:
- ``socket``: ``--fronts`` socket pairs; per round the driver sends ``per-front`` 16-byte frames on each,
  the engine process (a uvloop protocol per socket) answers each read with one write of as many frames;
- ``shm``: one shared mapping with a request ring and an answer ring per front; the driver writes its
  entries and bumps the ring's counter, the engine process polls every counter in a loop, reads the
  new entries and writes the answers into the front's answer ring (both sides poll: no system call).
Printed per mode and requests per front: rounds per second, and the engine process's CPU µs per round
and per request (``time.process_time`` from its first request to its last). The ``shm`` engine polls a
core the whole time, so its CPU per round is the round's wall time (an upper bound of its work); the
``socket`` engine sleeps while it waits.
"""

from __future__ import annotations

import argparse
import asyncio
import mmap
import multiprocessing
import socket
import struct
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

FRAME = struct.Struct("<IIQ")  # request id, slot, a word of description
ENTRY = FRAME.size
RING = 64  # entries per ring
HEADER = 64  # per ring: the counter in its own cache line


# -- socket mode ---------------------------------------------------------------------------------------
class _Echo(asyncio.Protocol):
    """Answers each read with one write; ``counts``: [requests seen, total expected, CPU at the
    first request, CPU at the last]."""

    def __init__(self, counts: list[Any]) -> None:
        self._counts = counts
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        counts = self._counts
        if not counts[0]:
            counts[2] = time.process_time()
        out = bytearray()
        for rid, slot, word in FRAME.iter_unpack(data):  # (the engine process reads each frame)
            out += FRAME.pack(rid, slot, word + 1)
        assert self.transport is not None
        self.transport.write(bytes(out))
        counts[0] += len(data) // ENTRY
        if counts[0] >= counts[1]:
            counts[3] = time.process_time()


def _socket_engine(fds: list[int], total: int, result: Connection) -> None:
    loop: asyncio.AbstractEventLoop
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    counts: list[Any] = [0, total, 0.0, 0.0]

    async def serve() -> None:
        for fd in fds:
            await loop.connect_accepted_socket(lambda: _Echo(counts), socket.socket(fileno=fd))
        while not result.poll():
            await asyncio.sleep(0.01)
        result.recv()
        result.send((counts[3] - counts[2], counts[0]))

    loop.run_until_complete(serve())


def _socket_mode(fronts: int, per_front: int, rounds: int) -> tuple[float, float, int]:
    pairs = [socket.socketpair() for _ in range(fronts)]
    mine, theirs = multiprocessing.Pipe()
    engine = multiprocessing.get_context("fork").Process(
        target=_socket_engine, args=([b.fileno() for _, b in pairs], fronts * per_front * rounds, theirs),
        daemon=True)
    engine.start()
    for _, b in pairs:
        b.close()
    ends = [a for a, _ in pairs]
    payload = b"".join(FRAME.pack(i, i, i) for i in range(per_front))
    want = len(payload)
    time.sleep(0.2)
    started = time.perf_counter()
    for _ in range(rounds):
        for a in ends:
            a.sendall(payload)
        for a in ends:
            got = 0
            while got < want:
                got += len(a.recv(65536))
    wall = time.perf_counter() - started
    mine.send("stop")
    cpu, count = mine.recv()
    engine.join(5)
    for a in ends:
        a.close()
    return wall, cpu, count


# -- shared-memory mode -----------------------------------------------------------------------------
def _shm_engine(area: mmap.mmap, fronts: int, total: int, result: Connection) -> None:
    view = memoryview(area)
    counter = struct.Struct("<Q")
    ring_bytes = HEADER + RING * ENTRY
    requests = [f * 2 * ring_bytes for f in range(fronts)]
    answers = [(f * 2 + 1) * ring_bytes for f in range(fronts)]
    seen = [0] * fronts
    done = [0] * fronts
    stop_at = 2 * fronts * ring_bytes  # a flag after the rings
    count = 0
    started = ended = 0.0
    while not view[stop_at]:
        for f in range(fronts):
            head = counter.unpack_from(view, requests[f])[0]
            if head == seen[f]:
                continue
            base, out = requests[f] + HEADER, answers[f] + HEADER
            for i in range(seen[f], head):
                rid, slot, word = FRAME.unpack_from(view, base + (i % RING) * ENTRY)
                FRAME.pack_into(view, out + (done[f] % RING) * ENTRY, rid, slot, word + 1)
                done[f] += 1
            if not count:
                started = time.process_time()
            count += head - seen[f]
            seen[f] = head
            counter.pack_into(view, answers[f], done[f])  # published after its entries
            if count >= total and not ended:
                ended = time.process_time()
    result.send((ended - started, count))


def _shm_mode(fronts: int, per_front: int, rounds: int) -> tuple[float, float, int]:
    ring_bytes = HEADER + RING * ENTRY
    area = mmap.mmap(-1, 2 * fronts * ring_bytes + 64)
    mine, theirs = multiprocessing.Pipe()
    engine = multiprocessing.get_context("fork").Process(
        target=_shm_engine, args=(area, fronts, fronts * per_front * rounds, theirs), daemon=True)
    engine.start()
    view = memoryview(area)
    counter = struct.Struct("<Q")
    sent = [0] * fronts
    time.sleep(0.2)
    started = time.perf_counter()
    for _ in range(rounds):
        for f in range(fronts):
            base = f * 2 * ring_bytes
            for i in range(per_front):
                FRAME.pack_into(view, base + HEADER + ((sent[f] + i) % RING) * ENTRY, i, i, i)
            sent[f] += per_front
            counter.pack_into(view, base, sent[f])
        for f in range(fronts):
            answers = (f * 2 + 1) * ring_bytes
            while counter.unpack_from(view, answers)[0] < sent[f]:
                pass
    wall = time.perf_counter() - started
    view[2 * fronts * ring_bytes] = 1
    cpu, count = mine.recv()
    engine.join(5)
    view.release()
    area.close()
    return wall, cpu, count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fronts", type=int, default=16)
    parser.add_argument("--per-front", default="1,2,4", help="requests per front per round, comma-separated")
    parser.add_argument("--rounds", type=int, default=3000)
    args = parser.parse_args()
    print(f"{args.fronts} fronts, {args.rounds} rounds; engine process CPU per round and per request")
    for per_front in (int(p) for p in args.per_front.split(",")):
        for mode, run in (("socket", _socket_mode), ("shm", _shm_mode)):
            wall, cpu, count = run(args.fronts, per_front, args.rounds)
            requests = args.rounds * args.fronts * per_front
            if count != requests:
                raise SystemExit(f"{mode}: the engine process saw {count} requests of {requests}")
            print(f"{mode:>6}, {per_front} per front: {args.rounds / wall:9.1f} rounds/s, engine "
                  f"{cpu / args.rounds * 1e6:7.1f} µs per round, {cpu / requests * 1e6:5.2f} µs per request",
                  flush=True)

    return 0


if __name__ == "__main__":
    sys.exit(main())
