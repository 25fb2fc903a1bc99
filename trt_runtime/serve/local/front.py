"""A front process: uvicorn serving the request layer's app on the supervisor's listening socket.

The app (:func:`~trt_runtime.serve.http.make_app`) decodes and checks requests on this
process's event loop and calls :meth:`EnginePool.infer`, which writes the arrays into
this front's :class:`~trt_runtime.serve.local.transport.Slab` and sends a small frame to
the front's home engine process, or to the least busy one when home is much busier
(:data:`SPILL_AFTER`); the answer comes back on the same
connection. The requests in flight to an engine process that died run once more on
another (or on its successor), and the link dials again until the successor listens.
SIGTERM: stop accepting, finish in-flight requests (at most ``drain_s``), exit 0; SIGINT
is ignored (the supervisor turns Ctrl-C into SIGTERM).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import math
import os
import signal
import socket
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from time import perf_counter
from typing import Any

from trt_runtime.errors import RequestError
from trt_runtime.serve.local import transport
from trt_runtime.serve.local.lifeline import run_loop, wait_orphaned
from trt_runtime.serve.local.transport import NO_SLOT, Slab
from trt_runtime.serve.polling import LoopPoller

__all__ = ["EngineLink", "EngineLost", "EnginePool", "FrontSpec", "front_main"]

_REDIAL_S = 0.05


class EngineLost(RequestError):
    """The engine process a request was sent to went away before it answered (503)."""

#: How long a request waits for an engine process to come back before it is answered 503.
WAIT_FOR_ENGINE_S = 2.0


@dataclasses.dataclass(frozen=True)
class FrontSpec:
    """What one front process needs (pickled into the spawned process)."""

    index: int
    model: Any  # ModelInfo
    engine_sockets: tuple[Path, ...]
    slab_path: Path
    max_body_bytes: int
    drain_s: float
    fronts: int = 1  # the server's front processes (the supervisor's ``workers``)
    #: The connections come handed over on the socket :func:`front_main` gets (a channel of
    #: :mod:`~trt_runtime.serve.local.dispatch`), not accepted from it.
    handed_over: bool = False
    #: µs this front's event loop keeps polling, instead of sleeping, after each request sent to an
    #: engine process and each answer (LocalServerConfig.front_poll_us; 0: it sleeps).
    poll_us: int = 0


class EngineLink:
    """This front's connection to one engine process; dials again whenever it drops."""

    def __init__(self, path: Path, slab: Slab, on_change: Any = None,
                 on_round_trip: Callable[[float], None] | None = None,
                 poller: LoopPoller | None = None) -> None:
        self.path = path
        self._poller = poller  # poked as each request leaves and each read of answers comes
        self._on_change = on_change  # called after the link went up or down
        self._on_round_trip = on_round_trip  # told each answer's seconds since its send
        self.outstanding = 0
        self.up = asyncio.Event()
        self._slab = slab
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[asyncio.Future[list[Any]], int, float]] = {}
        self._writer: asyncio.Transport | None = None
        self._out: transport.FrameWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # set by start()

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._writer is not None:
            self._writer.close()

    def usable(self) -> bool:
        """Whether a request may go here now. A connection whose transport already saw it break
        (the engine process died) marks the link down at once: :meth:`_run` wakes to do so only a
        loop step or two later, and uvloop refuses a write on such a connection."""
        writer = self._writer
        if writer is not None and writer.is_closing():
            self.up.clear()
        return self.up.is_set()

    def send(self, arrays: Sequence[Any]) -> asyncio.Future[list[Any]]:
        """Queue a request for the engine process; the future gets its outputs. ``outstanding``
        counts it until its answer arrives or the connection drops (a cancelled future included:
        the engine process still works on it)."""
        writer, out, loop = self._writer, self._out, self._loop
        if writer is None or out is None or loop is None or not self.up.is_set():
            raise RequestError(f"engine process at {self.path.name} is not up", 503)
        if writer.is_closing():  # broken under us: fail over now, not once the reader notices
            raise EngineLost(f"engine process at {self.path.name} went away", 503)
        slab = self._slab
        slot = slab.take()
        description, inline = transport.encode_arrays(arrays, None if slot == NO_SLOT else slab.slot(slot))
        if inline and slot != NO_SLOT:  # too large for a slot: travels on the socket
            slab.give(slot)
            slot = NO_SLOT
        rid = next(self._ids) & 0xFFFFFFFF
        future: asyncio.Future[list[Any]] = loop.create_future()
        self._pending[rid] = (future, slot, perf_counter())
        self.outstanding += 1
        # Sent with the other requests of this loop pass; a failed send closes the connection
        # and _run fails every pending request over (EngineLost).
        out.frame(rid, slot, 0, description, inline)
        if self._poller is not None:
            self._poller.poke()
        return future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sent, frames = await loop.create_unix_connection(
                    lambda: transport.FrameProtocol(self._answered), os.fspath(self.path))
            except OSError:
                await asyncio.sleep(_REDIAL_S)
                continue
            out = transport.FrameWriter(sent)
            out.frame(0, NO_SLOT, transport.HELLO, self._slab.hello())
            out.flush()
            self._writer, self._out = sent, out
            self.up.set()
            if self._on_change is not None:
                self._on_change()
            try:
                await frames.closed
            finally:
                self.up.clear()
                if self._on_change is not None:
                    self._on_change()
                self._writer = self._out = None
                sent.close()
                self._fail_pending()

    def _answered(self, frames: list[transport.Frame]) -> None:
        """Hand each answer to the request waiting for it (from the connection's read callback)."""
        slab = self._slab
        now = perf_counter()
        told = self._on_round_trip
        if self._poller is not None:  # (the client's next request is likely close behind)
            self._poller.poke()
        for rid, slot, status, payload in frames:
            entry = self._pending.pop(rid, None)
            if entry is None:
                continue
            self.outstanding -= 1
            future, mine, sent = entry
            if told is not None:
                told(now - sent)
            try:
                if status:
                    future.set_exception(RequestError(bytes(payload).decode(errors="replace"), status))
                else:
                    where = None if slot == NO_SLOT else slab.slot(slot)
                    future.set_result(transport.decode_arrays(payload, where))
            except asyncio.InvalidStateError:  # the client went away and its request was cancelled
                pass
            slab.give(mine)

    def _fail_pending(self) -> None:
        pending, self._pending = self._pending, {}
        self.outstanding -= len(pending)
        for future, slot, _sent in pending.values():
            self._slab.give(slot)  # nobody writes the slot any more: the connection is gone
            if not future.done():
                future.set_exception(EngineLost(f"engine process at {self.path.name} went away", 503))


#: A front sends to its home engine processes until this front has this many more requests outstanding
#: there than at the least busy one. Each engine process then reads from and writes to a part of the
#: fronts in each pass of its loop (a read and a write per front connection cost it more than a
#: request does), while a front with more clients than the rest still spreads them.
SPILL_AFTER = 16


class EnginePool:
    """Every engine process this front talks to. A request goes to the least busy of the front's
    home engine processes unless it has :data:`SPILL_AFTER` more requests outstanding than the least
    busy of all, which then takes it. Front ``first`` of ``fronts`` has one home, engine process
    ``first`` modulo their count, when there are at least as many fronts as engine processes; with
    fewer, every engine process ``j`` with ``j % fronts == first % fronts``. So every engine process
    is some front's home, and ``fronts=1`` (the default) makes every engine process home: the least
    busy one takes each request. Ties go to the first in a rotation that starts at link ``first``
    (none favours engine process 0), and when every home is down the next in the rotation is home.
    """

    def __init__(self, sockets: Sequence[Path], slab: Slab, on_change: Any = None, first: int = 0,
                 on_round_trip: Callable[[float], None] | None = None, fronts: int = 1,
                 poller: LoopPoller | None = None) -> None:
        self.links = [EngineLink(path, slab, on_change, on_round_trip, poller) for path in sockets]
        self._poller = poller
        count = len(self.links)
        start = first % count if count else 0
        fronts = max(1, fronts)
        homes = {start} if fronts >= count else {j for j in range(count) if j % fronts == first % fronts}
        #: ``(link, home)`` in this front's rotation.
        self._order = [(self.links[j % count], j % count in homes) for j in range(start, start + count)]
        self.wait_for_engine_s = WAIT_FOR_ENGINE_S

    def start(self) -> None:
        for link in self.links:
            link.start()

    async def wait_up(self) -> None:
        await asyncio.gather(*(link.up.wait() for link in self.links))

    def all_up(self) -> bool:
        return all(link.up.is_set() for link in self.links)

    async def infer(self, arrays: Sequence[Any]) -> list[Any]:
        """The engine's outputs for ``arrays``. A request whose engine process died before it
        answered runs once more elsewhere (an inference has no side effects to repeat)."""
        link = self._pick() or await self._wait_for_one()
        try:
            return await link.send(arrays)
        except EngineLost:
            return await (self._pick() or await self._wait_for_one()).send(arrays)

    async def _wait_for_one(self) -> EngineLink:
        """The link to send to once one is up: an engine process is being restarted."""
        best = self._pick()
        if best is None:
            waits = [asyncio.ensure_future(link.up.wait()) for link in self.links]
            await asyncio.wait(waits, timeout=self.wait_for_engine_s, return_when=asyncio.FIRST_COMPLETED)
            for waiting in waits:
                waiting.cancel()
            best = self._pick()
        if best is None:
            raise RequestError("no engine process is up; try again shortly", 503)
        return best

    def _pick(self) -> EngineLink | None:
        """The least busy usable home link unless it is :data:`SPILL_AFTER` busier than the least
        busy usable link, which is then the pick; ``None`` when no link is usable."""
        home = best = first = None
        for link, is_home in self._order:
            if not link.usable():
                continue
            if first is None:
                first = link
            if best is None or link.outstanding < best.outstanding:
                best = link
            if is_home and (home is None or link.outstanding < home.outstanding):
                home = link
        home = home or first
        if home is not None and best is not None and home.outstanding - best.outstanding < SPILL_AFTER:
            return home
        return best

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.close()
        await asyncio.gather(*(link.close() for link in self.links))


def front_main(spec: FrontSpec, sock: socket.socket, ready_flag: Any, ready: Connection) -> None:
    """Process entry: serve on ``sock`` until SIGTERM (the listening socket, or with
    ``spec.handed_over`` the channel the connections come on); ``ready`` gets one message once
    this front takes connections. ``ready_flag`` is shared by the server's processes: ``[0]`` is
    the supervisor's word that every process is up, ``[1 + index]`` this front's that all its
    engine links are."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    run_loop(_serve(spec, sock, ready_flag, ready), "front")


async def _serve(spec: FrontSpec, sock: socket.socket, ready_flag: Any, ready: Connection) -> None:
    import uvicorn

    from trt_runtime.serve.http import make_app
    from trt_runtime.serve.metrics import ServeMetrics

    slab = Slab.create(spec.slab_path)
    mine = 1 + spec.index

    def links_changed() -> None:
        ready_flag[mine] = 1 if pool.all_up() else 0

    metrics = ServeMetrics(spec.model.name)
    poller = LoopPoller(asyncio.get_running_loop(), spec.poll_us) if spec.poll_us else None
    pool = EnginePool(spec.engine_sockets, slab, links_changed, first=spec.index,
                      on_round_trip=metrics.round_trip, fronts=spec.fronts, poller=poller)
    pool.start()
    await pool.wait_up()
    app = make_app(
        spec.model, pool.infer, metrics=metrics,
        ready=lambda: all(ready_flag), max_body_bytes=spec.max_body_bytes,
    )
    config = uvicorn.Config(
        # No proxy-headers layer: the app reads neither the client's address nor the scheme.
        app, lifespan="off", access_log=False, log_level="warning", proxy_headers=False,
        timeout_graceful_shutdown=math.ceil(spec.drain_s),
        http="httptools" if _importable("httptools") else "h11", loop="none",
    )
    server = _Server(config)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, server.stop)

    async def announce() -> None:
        while not server.started and not server.should_exit:
            await asyncio.sleep(0.01)
        ready.send(("ready", os.getpid()))
        ready.close()

    announcer = asyncio.create_task(announce())
    orphaned = asyncio.create_task(wait_orphaned(os.getppid()))
    orphaned.add_done_callback(lambda _: server.stop())
    if spec.handed_over:
        server.take_handed_over(sock)
    try:
        await server.serve(sockets=[] if spec.handed_over else [sock])
    finally:
        announcer.cancel()
        orphaned.cancel()
        await pool.close()
        slab.close()


class _Server:
    """uvicorn's server without its signal handling: the process installs its own (SIGTERM only),
    so a Ctrl-C that reaches the whole process group does not cut in-flight requests."""

    def __init__(self, config: Any) -> None:
        import uvicorn

        class Quiet(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                yield

        self._server = Quiet(config)
        self._channel: socket.socket | None = None  # connections handed over (take_handed_over)
        self._starting: set[asyncio.Task[None]] = set()

    @property
    def started(self) -> bool:
        return bool(self._server.started)

    @property
    def should_exit(self) -> bool:
        return bool(self._server.should_exit)

    def stop(self) -> None:
        self._server.should_exit = True
        self._close_channel()

    async def serve(self, sockets: list[socket.socket]) -> None:
        await self._server.serve(sockets=sockets)

    # -- connections handed over (dispatch) ----------------------------------------------------
    def take_handed_over(self, channel: socket.socket) -> None:
        """Serve the connections that come on ``channel`` (file descriptors, one per message), each
        as uvicorn serves one it accepted, from when the server has started until :meth:`stop`.
        That needs uvicorn's protocol class for a connection: a uvicorn without it is refused here,
        at start, not found out connection by connection."""
        config = self._server.config
        if not config.loaded:
            config.load()
        if not hasattr(config, "http_protocol_class") or not hasattr(self._server, "server_state"):
            import uvicorn

            from trt_runtime.errors import SettingsError

            raise SettingsError(f"uvicorn {uvicorn.__version__} has no protocol class to hand connections "
                                "to; set TRT_RUNTIME_SERVE_DISPATCH=off")
        self._channel = channel
        channel.setblocking(False)
        asyncio.get_running_loop().add_reader(channel.fileno(), self._handed_over)

    def _handed_over(self) -> None:
        channel = self._channel
        if channel is None:
            return
        try:
            data, fds, _flags, _address = socket.recv_fds(channel, 16, 16)
        except BlockingIOError:
            return
        except OSError:
            data, fds = b"", []
        if not data and not fds:  # the supervisor is gone: nothing more will come
            self._close_channel()
            return
        server = self._server
        for fd in fds:
            conn = socket.socket(fileno=fd)
            if not server.started or server.should_exit:  # (not yet, or draining: the client retries)
                conn.close()
                continue
            task = asyncio.get_running_loop().create_task(self._serve_connection(conn))
            self._starting.add(task)  # (a task nothing references may be collected before it runs)
            task.add_done_callback(self._starting.discard)

    async def _serve_connection(self, conn: socket.socket) -> None:
        server = self._server
        config = server.config

        make: Callable[..., asyncio.Protocol] = config.http_protocol_class

        def protocol() -> asyncio.Protocol:  # what uvicorn's server makes for a connection it accepts
            return make(config=config, server_state=server.server_state, app_state=server.lifespan.state)

        try:
            await asyncio.get_running_loop().connect_accepted_socket(protocol, conn)
        except OSError:  # the client went away meanwhile
            conn.close()
        except BaseException:  # (closed, then the loop's exception handler reports it)
            conn.close()
            raise

    def _close_channel(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            with contextlib.suppress(Exception):  # (no loop any more at exit)
                asyncio.get_running_loop().remove_reader(channel.fileno())
            channel.close()


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
