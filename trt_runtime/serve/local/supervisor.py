"""The supervisor: binds the port, starts one engine process per GPU and N front processes, keeps them up.

Why processes and not threads: processes calling engines on one GPU time-slice it, so
the GPU gets exactly one engine process, which batches for everyone; parsing HTTP is
what one core cannot keep up with, so the fronts are several processes. The listening socket
is bound here; on Linux a thread here accepts and hands each connection to the fronts in turn
(:mod:`~trt_runtime.serve.local.dispatch`), elsewhere every front inherits the socket and
accepts from it. Every child is started with the ``spawn`` method (a CUDA context does not
survive ``fork``).

Readiness: ``/v2/health/ready`` answers 200 only while every process is up and every
front reaches every engine process (flags in shared memory: one this process sets, one per
front that the front sets). A child that dies is started again; until its successor is up
(and the fronts have dialled it) the flags say not ready.
SIGINT / SIGTERM: the flag goes down, the fronts get SIGTERM (they stop accepting and
finish in-flight requests, at most ``drain_s``), then the engine processes; exit 0.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from trt_runtime.errors import SettingsError
from trt_runtime.serve.local import dispatch
from trt_runtime.serve.local.engine_process import EngineProcessSpec, calls_on_loop, engine_main
from trt_runtime.serve.local.front import FrontSpec, front_main
from trt_runtime.serve.local.transport import shm_dir
from trt_runtime.serve.metrics import mark_process_dead
from trt_runtime.serve.options import DEFAULT_MAX_BODY_BYTES, ServeOptions
from trt_runtime.serve.polling import check_poll_us

__all__ = ["LocalServer", "LocalServerConfig", "ServeStartError", "bind_socket", "resolve_gpus"]

_RESTART_MAX_DELAY_S = 5.0
_STARTUP_S = 600.0  # an engine's first load on a GPU may compile kernels for minutes


class ServeStartError(Exception):
    """The server cannot start; ``usage``: the command line asked for something impossible (exit 2)."""

    def __init__(self, message: str, *, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


#: The values of :attr:`LocalServerConfig.engine_calls`.
ENGINE_CALLS = ("auto", "threads", "loop")


@dataclasses.dataclass(frozen=True)
class LocalServerConfig:
    """What ``trt-runtime serve`` (without ``--ray``) runs."""

    engine: Path
    options: ServeOptions
    name: str
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 2
    gpus: tuple[int | None, ...] = (None,)
    max_queue_delay_us: int = 500
    drain_s: float = 10.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: Where an engine process runs its calls: ``"threads"`` (one thread per context),
    #: ``"loop"`` (on its event loop, no thread; one context only) or ``"auto"``: ``"loop"``
    #: for one context with batching on, else ``"threads"`` (:attr:`calls_on_loop`).
    engine_calls: str = "auto"
    #: µs an engine process's event loop keeps polling its sockets, instead of sleeping, after each
    #: request and batch (:class:`~trt_runtime.serve.polling.LoopPoller`); where the calls run on
    #: the loop only. 0: it sleeps.
    engine_poll_us: int = 0
    #: The same for each front process's event loop, after each request it sends and answer it gets.
    front_poll_us: int = 0
    #: Overlapped calls: an engine process only starts each batch's call and reads its sockets while
    #: the GPU runs it (:mod:`~trt_runtime.serve.local.staging`), where its calls run on the loop,
    #: padded under the outer graph, for an engine whose dimensions are fixed but the batch's. Off by
    #: default: on the mlp engine at 64 clients its batches halved and it served fewer requests
    #: (docs/serving.md#overlapped-engine-calls).
    engine_overlap: bool = False

    def calls_on_loop(self, batchable: bool = True) -> bool:
        """Whether the engine processes run their calls on their event loops (:func:`calls_on_loop`),
        for an engine that can batch (``batchable``) or not."""
        return calls_on_loop(self.engine_calls, self.options.contexts, self.options.batching and batchable)

    def __post_init__(self) -> None:
        if self.engine_calls not in ENGINE_CALLS:
            raise SettingsError(f"engine_calls must be one of {', '.join(ENGINE_CALLS)}; "
                                f"got {self.engine_calls!r}")
        if self.engine_calls == "loop" and self.options.contexts != 1:
            raise SettingsError(f"engine_calls='loop' runs one context on the event loop; got contexts="
                                f"{self.options.contexts} (use 'threads')")
        check_poll_us("engine_poll_us", self.engine_poll_us)
        check_poll_us("front_poll_us", self.front_poll_us)
        if self.engine_poll_us and (self.engine_calls == "threads" or self.options.contexts != 1):
            raise SettingsError(f"engine_poll_us polls an engine process's event loop, which needs the "
                                f"engine calls on it (one context, engine_calls 'auto' or 'loop'); got "
                                f"engine_calls={self.engine_calls!r}, contexts={self.options.contexts}")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise SettingsError(f"workers must be an integer >= 1; got {self.workers!r}")
        if not 0 <= self.max_queue_delay_us <= 10_000_000:
            delay = self.max_queue_delay_us
            raise SettingsError(f"max_queue_delay_us must be in [0, 10000000]; got {delay!r}")
        if not 0 <= self.drain_s <= 3600:
            raise SettingsError(f"drain_s must be seconds in [0, 3600]; got {self.drain_s!r}")
        if not self.gpus:
            raise SettingsError("gpus must name at least one GPU (or None: the backend's default)")


def cuda_device_count() -> int:
    """Visible CUDA devices (0 without cuda-python, a driver or a GPU); creates no CUDA context."""
    try:
        from cuda.bindings import runtime
    except ImportError:
        return 0
    try:
        err, count = runtime.cudaGetDeviceCount()
    except Exception:
        return 0
    return int(count) if int(err) == 0 else 0


def resolve_gpus(text: str, count: int) -> tuple[int | None, ...]:
    """``--gpus``: ``all`` (every visible GPU; one engine process without a GPU) or ``0,1,...``."""
    if text.strip() == "all":
        return tuple(range(count)) if count else (None,)
    try:
        indices = [int(part) for part in text.split(",")]
    except ValueError:
        raise ServeStartError(f"--gpus must be 'all' or GPU indices like 0,1; got {text!r}",
                              usage=True) from None
    if len(set(indices)) != len(indices):
        raise ServeStartError(f"--gpus names a GPU twice: {text!r}", usage=True)
    bad = [i for i in indices if not 0 <= i < count]
    if bad:
        have = f"0..{count - 1}" if count else "none"
        raise ServeStartError(
            f"--gpus {text}: GPU index {bad[0]} does not exist; this machine has {count} GPU(s) ({have})",
            usage=True,
        )
    return tuple(indices)


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening socket every front shares; ``ServeStartError`` (usage) when the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ServeStartError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", usage=True) from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


@dataclasses.dataclass
class _Child:
    """One supervised process and how to start it again."""

    role: str
    index: int
    start: Callable[[Connection], Any]
    process: Any = None
    pipe: Connection | None = None
    ready: bool = False
    restarts: int = 0
    due: float = 0.0
    #: Our end of a front's dispatch channel while it runs (the dispatcher's once the front is up),
    #: and the front's end until the front has started with its own copy.
    channel: socket.socket | None = None
    theirs: socket.socket | None = None

    @property
    def label(self) -> str:
        return f"{self.role} {self.index}"


class LocalServer:
    """Runs the processes of one local server until a signal; :meth:`run` returns the exit code."""

    def __init__(self, config: LocalServerConfig, sock: socket.socket, log: Callable[[str], None]) -> None:
        self.config = config
        self._sock = sock
        self._log = log
        self._ctx = multiprocessing.get_context("spawn")
        # [0]: every process is up (set here); [1 + i]: front i reaches every engine process.
        self._ready_flag = self._ctx.RawArray("b", 1 + config.workers)
        self._stopping = False
        self._run_dir = Path(tempfile.mkdtemp(prefix="trt-serve-", dir=shm_dir()))
        self.model: Any = None
        #: How the first engine process runs its calls (``outer_graph``, ``pad_batches``: what
        #: ``"auto"`` resolved to; ``overlap``: whether its calls overlap), from its ready message.
        self.calls: dict[str, Any] = {}
        self._engines: list[_Child] = []
        self._fronts: list[_Child] = []
        self._front_starts = 0
        #: Hands the connections to the fronts in turn (``None``: they accept from the socket).
        self._dispatch = dispatch.Dispatcher(sock, log) if dispatch.supported() else None

    def pids(self) -> dict[str, list[int | None]]:
        """Process ids of the engine processes and the fronts now (``None``: being restarted)."""
        return {
            "engines": [c.process.pid if c.process is not None else None for c in self._engines],
            "fronts": [c.process.pid if c.process is not None else None for c in self._fronts],
        }

    # -- lifecycle -----------------------------------------------------------------------
    def run(self, on_ready: Callable[[Any], None] | None = None) -> int:
        """Start everything, call ``on_ready(model)`` once all processes are up, supervise until
        SIGINT/SIGTERM, stop; returns 0. ``ServeStartError`` if an engine process cannot load."""
        metrics_dir = self._run_dir / "metrics"
        metrics_dir.mkdir()
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = os.fspath(metrics_dir)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            if not self._start_engines():
                return 0  # stopped by a signal while loading
            self._fronts = [_Child("front", i, self._front_starter(i)) for i in range(self.config.workers)]
            for child in self._fronts:
                self._launch(child)
            if self._dispatch is not None:
                self._dispatch.start()
            self._supervise(on_ready)
            return 0
        finally:
            self._ready_flag[0] = 0
            if self._dispatch is not None:
                self._dispatch.stop()  # no new connection while the fronts drain
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._sock.close()
            shutil.rmtree(self._run_dir, ignore_errors=True)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._stopping = True
        self._ready_flag[0] = 0

    def _start_engines(self) -> bool:
        self._engines = [
            _Child("engine", i, self._engine_starter(i, gpu)) for i, gpu in enumerate(self.config.gpus)
        ]
        for child in self._engines:
            self._launch(child)
        deadline = time.monotonic() + _STARTUP_S
        while not all(c.ready for c in self._engines):
            if self._stopping:
                return False
            if time.monotonic() > deadline:
                raise ServeStartError(f"the engine processes were not ready after {_STARTUP_S:.0f} s")
            for child in self._engines:
                message = self._poll(child, 0.05)
                if message is not None and message[0] == "error":
                    raise ServeStartError(message[1])
                if not child.ready and child.pipe is None and not child.process.is_alive():
                    code = child.process.exitcode
                    raise ServeStartError(f"{child.label} exited with code {code} while loading")
        return True

    def _engine_starter(self, index: int, gpu: int | None) -> Callable[[Connection], Any]:
        cfg = self.config
        spec = EngineProcessSpec(
            engine=cfg.engine, options=cfg.options, device=gpu, socket_path=self._engine_socket(index),
            name=cfg.name, max_queue_delay_us=cfg.max_queue_delay_us, drain_s=cfg.drain_s,
            engine_calls=cfg.engine_calls, poll_us=cfg.engine_poll_us, overlap=cfg.engine_overlap,
        )
        return lambda pipe: self._ctx.Process(target=engine_main, args=(spec, pipe),
                                              name=f"trt-engine-{index}")

    def _front_starter(self, index: int) -> Callable[[Connection], Any]:
        def start(pipe: Connection) -> Any:
            self._front_starts += 1  # a new slab file per incarnation: a dead front's slots stay its own
            sockets = tuple(map(self._engine_socket, range(len(self._engines))))
            spec = FrontSpec(
                index=index, model=self.model, engine_sockets=sockets,
                slab_path=self._run_dir / f"slab-{index}-{self._front_starts}",
                max_body_bytes=self.config.max_body_bytes, drain_s=self.config.drain_s,
                fronts=self.config.workers, handed_over=self._dispatch is not None,
                poll_us=self.config.front_poll_us,
            )
            sock = self._sock
            if self._dispatch is not None:
                child = self._fronts[index]
                child.channel, child.theirs = dispatch.channel()
                sock = child.theirs
            return self._ctx.Process(target=front_main, args=(spec, sock, self._ready_flag, pipe),
                                     name=f"trt-front-{index}")

        return start

    def _engine_socket(self, index: int) -> Path:
        return self._run_dir / f"engine-{index}.sock"

    def _launch(self, child: _Child) -> None:
        receive, send = self._ctx.Pipe(duplex=False)
        child.process = child.start(send)
        child.process.start()
        send.close()
        if child.theirs is not None:
            child.theirs.close()  # (the front has its own copy now)
            child.theirs = None
        child.pipe = receive
        child.ready = False

    def _poll(self, child: _Child, timeout: float) -> Any:
        """The child's startup message if one came (and mark it ready), else ``None``."""
        if child.pipe is None or not child.pipe.poll(timeout):
            return None
        try:
            message = child.pipe.recv()
        except (EOFError, OSError):
            message = None
        child.pipe.close()
        child.pipe = None
        if message is not None and message[0] == "ready":
            child.ready = True
            if child.role == "engine" and self.model is None:
                self.model = message[1]
                self.calls = dict(message[2]) if len(message) > 2 else {}
            if child.channel is not None and self._dispatch is not None:  # it takes connections now
                self._dispatch.up(child.index, child.channel)
        return message

    # -- supervision ---------------------------------------------------------------------
    def _supervise(self, on_ready: Callable[[Any], None] | None) -> None:
        announced = False
        children = [*self._engines, *self._fronts]
        while not self._stopping:
            waitables: list[Any] = [c.pipe for c in children if c.pipe is not None]
            waitables += [c.process.sentinel for c in children if c.process is not None]
            wait(waitables, timeout=0.1)
            if self._stopping:
                break
            now = time.monotonic()
            for child in children:
                self._poll(child, 0)
                if child.process is not None and not child.process.is_alive():
                    self._ready_flag[0] = 0
                    if child.role == "front":
                        self._ready_flag[1 + child.index] = 0
                    code = child.process.exitcode
                    try:
                        mark_process_dead(child.process.pid)  # its in-flight gauge stops counting
                    except Exception as exc:  # metrics must never stop the supervision
                        self._log(f"metrics of {child.label} not cleared: {exc}")
                    child.process, child.ready = None, False
                    if child.channel is not None:  # no more connections for it
                        if self._dispatch is not None:
                            self._dispatch.down(child.index)
                        child.channel.close()
                        child.channel = None
                    if child.pipe is not None:
                        child.pipe.close()
                        child.pipe = None
                    # the first restart is at once; a process that keeps dying waits longer each time
                    delay = min(_RESTART_MAX_DELAY_S, 0.2 * 2 ** min(child.restarts, 5))
                    delay = delay if child.restarts else 0.0
                    child.due = now + delay
                    child.restarts += 1
                    self._log(f"{child.label} exited with code {code}; starting it again")
                if child.process is None and now >= child.due:
                    self._launch(child)
            up = all(c.ready and c.process is not None for c in children)
            self._ready_flag[0] = 1 if up else 0
            if up and not announced:
                announced = True
                if on_ready is not None:
                    on_ready(self.model)

    def _stop_all(self) -> None:
        """SIGTERM the fronts (they drain), then the engines; SIGKILL whatever outlives the drain."""
        grace = self.config.drain_s + 5.0
        for group in (self._fronts, self._engines):
            live = [c.process for c in group if c.process is not None and c.process.is_alive()]
            for process in live:
                os.kill(process.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            for process in live:
                process.join(max(0.0, deadline - time.monotonic()))
                if process.is_alive():
                    process.kill()
                    process.join()
            for child in group:
                if child.pipe is not None:
                    child.pipe.close()
                    child.pipe = None
