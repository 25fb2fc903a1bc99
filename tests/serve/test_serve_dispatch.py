"""The supervisor hands the clients' connections to the fronts in turn (Linux).

Unit tests drive :class:`~trt_runtime.serve.local.dispatch.Dispatcher` with plain sockets; the end
to end tests count the connections each front process of a real ``trt-runtime serve`` holds
(from ``/proc``), with the handing out on and with ``TRT_RUNTIME_SERVE_DISPATCH=off``.
"""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from _local_server import ServerProcess
from _serve_support import HOST, load_npy, npy, reference, single_engine

from trt_runtime.serve.local import dispatch

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="connections are handed over on Linux only (send_fds, /proc)")


def _listener() -> socket.socket:
    sock = socket.socket()
    sock.bind((HOST, 0))
    sock.listen(64)
    return sock


def _taken(theirs: socket.socket, timeout: float = 5.0) -> socket.socket:
    """The connection handed over on a front's end of a channel."""
    theirs.settimeout(timeout)
    data, fds, _flags, _address = socket.recv_fds(theirs, 16, 4)
    assert data == b"c" and len(fds) == 1
    return socket.socket(fileno=fds[0])


def _handed_to(theirs: socket.socket, client: socket.socket) -> None:
    """Assert that ``client``'s connection was handed over on ``theirs``: what the front's end
    writes reaches the client."""
    conn = _taken(theirs)
    conn.sendall(b"ok")
    client.settimeout(5)
    assert client.recv(2) == b"ok"
    conn.close()


def test_dispatch_hands_connections_to_the_fronts_up_in_turn() -> None:
    listener = _listener()
    port = listener.getsockname()[1]
    d = dispatch.Dispatcher(listener)
    pairs = [dispatch.channel() for _ in range(3)]
    for i, (ours, _theirs) in enumerate(pairs):
        d.up(i, ours)
    d.start()
    clients = [socket.create_connection((HOST, port)) for _ in range(6)]
    try:
        got = {i: [_taken(theirs) for _ in range(2)] for i, (_ours, theirs) in enumerate(pairs)}
        for i, conns in got.items():  # each front got two, and they are the clients' connections
            for conn in conns:
                conn.sendall(f"front {i}".encode())
                conn.close()
        for c in clients:
            c.settimeout(5)
        assert [c.recv(16).decode() for c in clients] == [f"front {k % 3}" for k in range(6)]
    finally:
        d.stop()
        for c in clients:
            c.close()
        listener.close()


def test_dispatch_skips_a_front_that_went_away_and_waits_while_none_is_up() -> None:
    logged: list[str] = []
    listener = _listener()
    port = listener.getsockname()[1]
    d = dispatch.Dispatcher(listener, logged.append)
    gone_ours, gone_theirs = dispatch.channel()
    d.up(0, gone_ours)
    gone_theirs.close()  # front 0 died: its channel is broken
    d.start()
    client = socket.create_connection((HOST, port))
    try:
        time.sleep(0.3)  # front 0 failed; no front is up: the connection waits here
        assert any("front 0 did not take a connection" in line for line in logged), logged
        ours, theirs = dispatch.channel()
        d.up(1, ours)  # a front comes up: it gets the waiting connection
        _handed_to(theirs, client)
    finally:
        d.stop()
        d.stop()  # idempotent
        client.close()
        listener.close()


def test_dispatch_env_names_a_bad_value(monkeypatch: pytest.MonkeyPatch) -> None:
    from trt_runtime.errors import SettingsError

    monkeypatch.setenv(dispatch.DISPATCH_ENV, "sometimes")
    message = "TRT_RUNTIME_SERVE_DISPATCH must be 'on' or 'off'; got 'sometimes'"
    with pytest.raises(SettingsError, match=message):
        dispatch.supported()
    monkeypatch.setenv(dispatch.DISPATCH_ENV, "off")
    assert dispatch.supported() is False
    monkeypatch.setenv(dispatch.DISPATCH_ENV, "on")
    assert dispatch.supported() is True


# -- end to end ----------------------------------------------------------------------------------
def _established(pid: int, port: int) -> int:
    """How many established TCP connections on local ``port`` process ``pid`` holds (``/proc``)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    held = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == "01" and fields[9] in inodes:
                held += 1
    return held


def _connections_per_front(tmp_path: Path, env: str) -> list[int]:
    engine = tmp_path / "affine.mem"
    engine.write_bytes(single_engine())
    probe = socket.socket()
    probe.bind((HOST, 0))
    port = probe.getsockname()[1]
    probe.close()
    os.environ[dispatch.DISPATCH_ENV] = env
    try:
        srv = ServerProcess(engine, port, "--workers", "4", "--max-batch", "8")
    finally:
        os.environ.pop(dispatch.DISPATCH_ENV, None)
    clients = []
    try:
        for i in range(12):  # one after another, as a client pool opens its connections
            c = http.client.HTTPConnection(HOST, port, timeout=30)
            x = np.full((1, 4), i / 4, np.float32)
            c.request("POST", "/", body=npy(x), headers={"Content-Type": "application/x-npy"})
            response = c.getresponse()
            assert response.status == 200 and np.array_equal(load_npy(response.read()), reference(x))
            clients.append(c)
        return sorted((_established(pid, port) for pid in srv.doc["pids"]["fronts"]), reverse=True)
    finally:
        for c in clients:
            c.close()
        code = srv.stop()
        assert code == 0, "".join(srv.stderr)[-3000:]


@pytest.mark.slow
def test_dispatch_spreads_keep_alive_connections_evenly_over_the_fronts(tmp_path: Path) -> None:
    assert _connections_per_front(tmp_path, "on") == [3, 3, 3, 3]


@pytest.mark.slow
def test_dispatch_off_lets_the_fronts_accept_from_the_shared_socket(tmp_path: Path) -> None:
    held = _connections_per_front(tmp_path, "off")
    assert sum(held) == 12 and len(held) == 4  # every connection served, however unevenly


def test_dispatch_bad_env_exits_2_before_the_port(tmp_path: Path) -> None:
    engine = tmp_path / "affine.mem"
    engine.write_bytes(single_engine())
    result = subprocess.run([sys.executable, "-m", "trt_runtime.cli", "serve", str(engine), "--port", "0"],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, dispatch.DISPATCH_ENV: "maybe"})
    assert result.returncode == 2
    assert "TRT_RUNTIME_SERVE_DISPATCH must be 'on' or 'off'; got 'maybe'" in result.stderr


def test_dispatch_stop_returns_while_a_connection_waits_for_a_front() -> None:
    listener = _listener()
    d = dispatch.Dispatcher(listener)
    d.start()
    client = socket.create_connection((HOST, listener.getsockname()[1]))
    time.sleep(0.1)
    done = threading.Event()
    threading.Thread(target=lambda: (d.stop(), done.set()), daemon=True).start()
    assert done.wait(5), "stop() hung while a connection waited for a front"
    client.close()
    listener.close()


def test_dispatch_keeps_accepting_after_an_accept_fails() -> None:
    """An accept that fails (out of file descriptors, say) is logged, and the next connection is
    still handed over: the thread does not end while the listener is open."""
    logged: list[str] = []

    class Flaky(socket.socket):
        failures = 1

        def accept(self) -> tuple[socket.socket, object]:
            if Flaky.failures:
                Flaky.failures -= 1
                raise OSError(24, "Too many open files")
            return super().accept()

    listener = Flaky()
    listener.bind((HOST, 0))
    listener.listen(8)
    d = dispatch.Dispatcher(listener, logged.append)
    ours, theirs = dispatch.channel()
    d.up(0, ours)
    d.start()
    client = socket.create_connection((HOST, listener.getsockname()[1]))
    try:
        _handed_to(theirs, client)
        assert any("accepting a connection failed (Too many open files)" in line for line in logged), logged
    finally:
        d.stop()
        client.close()
        listener.close()


def test_dispatch_passes_a_front_that_does_not_read_and_keeps_it_in_the_turn(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A front whose channel is full (it stopped reading) does not stall the others: after the
    send timeout the next front gets the connection, and the full one stays registered."""
    monkeypatch.setattr(dispatch, "_SEND_S", 0.2)
    logged: list[str] = []
    listener = _listener()
    port = listener.getsockname()[1]
    d = dispatch.Dispatcher(listener, logged.append)
    stuck_ours, stuck_theirs = dispatch.channel()
    stuck_ours.setblocking(False)
    try:
        while True:  # fill front 0's channel: it never reads
            stuck_ours.send(b"x" * 1024)
    except BlockingIOError:
        pass
    d.up(0, stuck_ours)
    ours, theirs = dispatch.channel()
    d.up(1, ours)
    d.start()
    client = socket.create_connection((HOST, port))
    try:
        _handed_to(theirs, client)
        assert any("front 0 did not take a connection within 0.2 s" in line for line in logged), logged
        assert 0 in d._channels  # still in the turn
    finally:
        d.stop()
        client.close()
        stuck_theirs.close()
        listener.close()


def test_dispatch_front_refuses_a_uvicorn_without_a_protocol_class_at_start() -> None:
    """A front serves handed-over connections with uvicorn's own protocol class; a uvicorn that has
    none (or no server state) is refused when the front starts, naming the way back."""
    import asyncio

    import uvicorn

    from trt_runtime.errors import SettingsError
    from trt_runtime.serve.local.front import _Server

    async def app(scope: object, receive: object, send: object) -> None:
        pass

    async def main() -> None:
        server = _Server(uvicorn.Config(app, lifespan="off", log_level="warning"))
        del server._server.server_state
        ours, theirs = dispatch.channel()
        try:
            with pytest.raises(SettingsError, match=r"no protocol class .* TRT_RUNTIME_SERVE_DISPATCH=off"):
                server.take_handed_over(theirs)
        finally:
            ours.close()
            theirs.close()

    asyncio.run(main())
