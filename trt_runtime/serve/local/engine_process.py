"""The engine process: one per GPU; loads the engine once, batches every front's requests, runs them.

It listens on a unix socket; each front connects once, says which :class:`Slab` it owns
(:data:`~trt_runtime.serve.local.transport.HELLO`), then sends requests whose arrays sit in
that slab. Every request goes through one :class:`~trt_runtime.serve.batcher.DynamicBatcher`
(one worker thread per execution context), so concurrent batch-1 requests from all fronts
become a few engine calls; each answer is written into the request's slot and announced on
the connection that brought it, the answers of one batch to one front in one write.
SIGTERM: stop accepting, finish what is queued (at most ``drain_s``), close the engine,
exit 0. SIGINT is ignored: the supervisor decides.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import signal
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NoReturn

from trt_runtime.errors import SettingsError
from trt_runtime.serve.local import transport
from trt_runtime.serve.local.lifeline import run_loop, wait_orphaned
from trt_runtime.serve.local.transport import NO_SLOT, Slab
from trt_runtime.serve.options import ServeOptions

__all__ = ["EngineProcessSpec", "calls_on_loop", "engine_main"]


@dataclasses.dataclass(frozen=True)
class EngineProcessSpec:
    """What one engine process needs (pickled into the spawned process)."""

    engine: Path
    options: ServeOptions
    device: int | None
    socket_path: Path
    name: str
    max_queue_delay_us: int
    drain_s: float
    engine_calls: str = "threads"  # LocalServerConfig.engine_calls: "auto", "threads" or "loop"


def calls_on_loop(engine_calls: str, contexts: int, batching: bool) -> bool:
    """Whether an engine process runs its calls on its event loop. ``"auto"`` picks the loop for
    one context with batching on (``batching``: the options ask for it and the engine can batch):
    on 2x H100 it served more requests per second there than threads did
    (docs/serving.md#engine-calls-on-the-event-loop); one call per request keeps a thread, which
    reads the next requests while the engine runs."""
    if engine_calls == "auto":
        return contexts == 1 and batching
    return engine_calls == "loop"


def engine_main(spec: EngineProcessSpec, ready: Connection) -> None:
    """Process entry: open the engine, tell the supervisor (``ready``) its model, serve until SIGTERM."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _switch_interval()
    except SettingsError as exc:
        _refuse_start(ready, str(exc))
    try:
        engine, _cache = _open(spec)
    except Exception as exc:
        _refuse_start(ready, f"cannot open {spec.engine}: {exc}")
    try:
        run_loop(_serve(spec, engine, ready), "engine")
    finally:
        engine.close()


def _refuse_start(ready: Connection, message: str) -> NoReturn:
    ready.send(("error", message))
    ready.close()
    raise SystemExit(3) from None


#: Environment variable: the engine process's GIL switch interval in µs (``sys.setswitchinterval``;
#: Python's default is 5,000). A thread that waits for the GIL asks for it after that long.
SWITCH_INTERVAL_ENV = "TRT_RUNTIME_SERVE_SWITCH_INTERVAL_US"


def _switch_interval() -> None:
    text = os.environ.get(SWITCH_INTERVAL_ENV, "").strip()
    if not text:
        return
    try:
        us = float(text)
    except ValueError:
        us = -1.0
    if not 1 <= us <= 1_000_000:
        raise SettingsError(f"{SWITCH_INTERVAL_ENV} must be microseconds in [1, 1000000]; got {text!r}")
    sys.setswitchinterval(us / 1e6)


def _open(spec: EngineProcessSpec) -> tuple[Any, Any]:
    from trt_runtime.serve.replica import open_engine

    return open_engine(spec.engine, spec.options, device=spec.device)


def model_info(engine: Any, spec: EngineProcessSpec) -> Any:
    """The :class:`~trt_runtime.serve.model.ModelInfo` the fronts serve, from the loaded engine."""
    from trt_runtime.serve.model import ModelInfo

    return ModelInfo.from_engine(engine, spec.name, max_batch=spec.options.max_batch)


async def _serve(spec: EngineProcessSpec, engine: Any, ready: Connection) -> None:
    from trt_runtime.serve.batcher import DynamicBatcher
    from trt_runtime.serve.metrics import ServeMetrics

    model = model_info(engine, spec)
    batching = spec.options.batching and model.checker.batchable
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    metrics = ServeMetrics(model.name)
    batcher = DynamicBatcher(
        [engine.execute] * spec.options.contexts, model.checker, max_batch=spec.options.max_batch,
        max_queue_delay_us=spec.max_queue_delay_us, metrics=metrics,
        copy_outputs=bool(spec.options.outer_graph),  # answers are read after the next call may start
        on_loop=calls_on_loop(spec.engine_calls, spec.options.contexts, batching),
        pad_rows=spec.options.pad_batches,
    )
    spec.socket_path.unlink(missing_ok=True)  # a predecessor that was killed left it
    server = await asyncio.start_unix_server(
        lambda r, w: _connection(r, w, batcher), path=os.fspath(spec.socket_path)
    )
    ready.send(("ready", model))
    ready.close()
    orphaned = asyncio.create_task(wait_orphaned(os.getppid()))
    orphaned.add_done_callback(lambda _: stop.set())
    await stop.wait()
    orphaned.cancel()
    server.close()
    await batcher.aclose(spec.drain_s)
    batcher.close()  # waits for a call still running after the drain: never close the engine under it


async def _connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, batcher: Any) -> None:
    """Serve one front: every frame read goes to the batcher at once (no task and no future per
    request, :meth:`~trt_runtime.serve.batcher.DynamicBatcher.enqueue_call`); each answer is queued
    on ``out`` as its batch ends, so a batch's answers leave in one write."""
    slab: Slab | None = None
    frames = transport.FrameReader(reader)
    out = transport.FrameWriter(writer)
    inflight = _InFlight()
    try:
        batch = await frames.read()
        _rid, _slot, status, payload = batch[0]
        if status != transport.HELLO:
            return
        slab = Slab.attach(bytes(payload))
        batch = batch[1:]
        while True:
            for rid, slot, _status, payload in batch:
                _take(rid, slot, payload, slab, out, batcher, inflight)
            batch = await frames.read()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass  # the front went away; its requests in flight are answered to no one
    finally:
        await inflight.none()  # (their answers are written into the slab: keep it until then)
        writer.close()
        if slab is not None:
            slab.close()


class _InFlight:
    """A connection's requests given to the batcher and not answered yet."""

    __slots__ = ("count", "idle")

    def __init__(self) -> None:
        self.count = 0
        self.idle: asyncio.Event | None = None  # made by none(), set when the count reaches 0

    def done(self) -> None:
        self.count -= 1
        if not self.count and self.idle is not None:
            self.idle.set()

    async def none(self) -> None:
        if self.count:
            self.idle = asyncio.Event()
            await self.idle.wait()


def _take(rid: int, slot: int, payload: memoryview, slab: Slab, out: transport.FrameWriter, batcher: Any,
          inflight: _InFlight) -> None:
    """Decode one request and hand it to the batcher; its answer is queued when its batch ends."""
    from trt_runtime.errors import RequestError

    where = None if slot == NO_SLOT else slab.slot(slot)
    try:
        batcher.enqueue_call(tuple(transport.decode_arrays(payload, where)),
                             functools.partial(_answer, rid, slot, where, out, inflight))
    except RequestError as exc:
        out.frame(rid, NO_SLOT, exc.status, str(exc).encode())
        return
    except Exception as exc:
        out.frame(rid, NO_SLOT, 500, f"{type(exc).__name__}: {exc}".encode())
        return
    inflight.count += 1


def _answer(rid: int, slot: int, where: memoryview | None, out: transport.FrameWriter, inflight: _InFlight,
            answer: list[Any] | BaseException) -> None:
    """Queue the frame of one request's ``answer`` (its outputs, written into its slot when they
    fit, or the error): called by the batcher as the request's batch ends. It never raises."""
    from trt_runtime.errors import RequestError

    inflight.done()
    if not isinstance(answer, BaseException):
        try:
            description, inline = transport.encode_arrays(answer, where)
        except Exception as exc:  # an output that cannot cross: the request fails, not the connection
            answer = exc
        else:
            out.frame(rid, NO_SLOT if inline or where is None else slot, 0, description, inline)
            return
    if isinstance(answer, RequestError):
        out.frame(rid, NO_SLOT, answer.status, str(answer).encode())
    else:
        out.frame(rid, NO_SLOT, 500, f"{type(answer).__name__}: {answer}".encode())
