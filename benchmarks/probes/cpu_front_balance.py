"""How evenly do a local server's front processes share the clients' keep-alive connections?

Run from the repository root (CPU, memory backend; the GPU host's cores give the figure that matters)::

    python benchmarks/probes/cpu_front_balance.py [--fronts 16] [--connections 64] [--rounds 3]

Fronts that accept from one shared listening socket take what they find when they wake (an event
loop that wakes accepts every connection waiting); the server's supervisor hands the connections
out in turn instead (``trt_runtime.serve.local.dispatch``; ``TRT_RUNTIME_SERVE_DISPATCH=off``: the
shared socket). This starts the real ``trt-runtime serve`` (the memory backend's engine, batching
on) both ways, opens ``--connections`` keep-alive connections one after another as a client pool
does, sends one request on each (every answer checked), and counts the connections each front
process holds (Linux ``/proc``), sorted. The same count over sockets bound with ``SO_REUSEPORT`` (the
kernel's hash) is printed beside them. Even is ``connections / fronts`` each.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import http.client
import os
import socket
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _served(fronts: int, connections: int, port: int, work: Path, mode: str) -> list[int]:
    """Connections per front process of a real server (fronts holding none count as 0)."""
    from benchmarks import serve_fronts
    from benchmarks.bench_serve import TYPES, smoke_workload

    w = smoke_workload(work)
    serving = serve_fronts.local_server(w.path, w.backend, port, fronts, "all", 64, 500, None, dispatch=mode)
    with serving as doc:
        clients = []
        try:
            for _ in range(connections):
                c = http.client.HTTPConnection(serve_fronts.HOST, port, timeout=30)
                c.request("POST", "/", body=w.body("binary"), headers={"Content-Type": TYPES["binary"]})
                response = c.getresponse()
                body = response.read()
                if response.status != 200 or not w.expect("binary").right(body):
                    raise RuntimeError(f"wrong answer: HTTP {response.status}")
                clients.append(c)
            fronts_pids = doc["pids"]["fronts"]
            held = _held(fronts_pids, port)
        finally:
            for c in clients:
                c.close()
        return sorted((held.get(pid, 0) for pid in fronts_pids), reverse=True)


def _held(pids: list[int], port: int) -> collections.Counter[int]:
    """Established TCP connections on local ``port`` held by each of ``pids`` (Linux ``/proc``: the
    sockets' inodes in ``/proc/net/tcp*``, matched to each process's open file descriptors)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "01" and int(local.rsplit(":", 1)[1], 16) == port:
                    inodes.add(inode)
    held: collections.Counter[int] = collections.Counter()
    for pid in pids:
        fd_dir = Path(f"/proc/{pid}/fd")
        for fd in fd_dir.iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    held[pid] += 1
    return held


def _reuseport(sockets: int, connections: int) -> list[int]:
    """Connections per socket when ``sockets`` listeners share a port with ``SO_REUSEPORT``."""
    listeners: list[socket.socket] = []
    port = 0
    try:
        for _ in range(sockets):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind(("127.0.0.1", port))
            port = s.getsockname()[1]
            s.listen(connections)
            s.setblocking(False)
            listeners.append(s)
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(connections)]
        counts = []
        for s in listeners:
            n = 0
            while True:
                try:
                    conn, _ = s.accept()
                except BlockingIOError:
                    break
                conn.close()
                n += 1
            counts.append(n)
        for c in clients:
            c.close()
        return sorted(counts, reverse=True)
    finally:
        for s in listeners:
            s.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fronts", type=int, default=16)
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--port", type=int, default=8141)
    args = p.parse_args(argv)
    if not Path("/proc/net/tcp").exists():
        raise SystemExit("needs Linux's /proc to count each process's connections")
    even = args.connections / args.fronts
    print(f"{args.connections} connections over {args.fronts} fronts: even is {even:g} each", flush=True)
    with tempfile.TemporaryDirectory(prefix="front-balance-") as work:
        for r in range(args.rounds):
            for label, mode in (("handed out in turn", "on"), ("shared socket", "off")):
                got = _served(args.fronts, args.connections, args.port, Path(work), mode)
                print(f"round {r + 1}, {label}: {got} (most {max(got)}, {got.count(0)} with none)",
                      flush=True)
            spread = _reuseport(args.fronts, args.connections)
            print(f"round {r + 1}, SO_REUSEPORT: {spread} (most {max(spread)})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
