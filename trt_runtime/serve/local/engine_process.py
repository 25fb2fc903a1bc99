"""The engine process: one per GPU; loads the engine once, batches every front's requests, runs them.

It listens on a unix socket; each front connects once, says which :class:`Slab` it owns
(:data:`~trt_runtime.serve.local.transport.HELLO`), then sends requests whose arrays sit in
that slab. Every request goes through one :class:`~trt_runtime.serve.batcher.DynamicBatcher`
(on the event loop, or one worker thread per execution context), so concurrent batch-1 requests
from all fronts become a few engine calls; the requests of one read that share dtypes and shapes
travel through the batcher as one bundle (:class:`FrontLink`). Each answer is written into the
request's slot and announced on the connection that brought it, the answers of one batch to one
front in one write.
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
import typing
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NoReturn

from trt_runtime.errors import SettingsError
from trt_runtime.serve.local import transport
from trt_runtime.serve.local.lifeline import run_loop, wait_orphaned
from trt_runtime.serve.local.transport import NO_SLOT, Slab
from trt_runtime.serve.options import ServeOptions

if typing.TYPE_CHECKING:
    from trt_runtime.serve.batching import Answer

__all__ = ["EngineProcessSpec", "FrontLink", "calls_on_loop", "engine_main", "listen"]


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
    engine_calls: str = "auto"  # LocalServerConfig.engine_calls: "auto", "threads" or "loop"
    poll_us: int = 0  # LocalServerConfig.engine_poll_us (where the calls run on the loop)
    overlap: bool = False  # LocalServerConfig.engine_overlap (where the calls run on the loop)


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
        in_flight = _in_flight()
    except SettingsError as exc:
        _refuse_start(ready, str(exc))
    try:
        engine, _cache = _open(spec)
    except Exception as exc:
        _refuse_start(ready, f"cannot open {spec.engine}: {exc}")
    try:
        run_loop(_serve(spec, engine, ready, in_flight), "engine")
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


async def _serve(spec: EngineProcessSpec, engine: Any, ready: Connection, in_flight: int = 2) -> None:
    from trt_runtime.serve.batcher import DynamicBatcher
    from trt_runtime.serve.metrics import ServeMetrics
    from trt_runtime.serve.replica import call_modes

    model = model_info(engine, spec)
    batching = spec.options.batching and model.checker.batchable
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    metrics = ServeMetrics(model.name)
    on_loop = calls_on_loop(spec.engine_calls, spec.options.contexts, batching)
    modes = call_modes(engine, spec.options)
    try:
        stager = _stager(engine, spec, model, on_loop, modes) if batching else None
    except Exception as exc:  # (CUDA refused a stream, an event or page-locked memory)
        _refuse_start(ready, f"cannot overlap the engine calls (--overlap): {exc}")
    if stager is not None:  # (its outer graph is in "view" mode now: calls it does not take copy)
        modes = call_modes(engine, spec.options)
    try:
        batcher = DynamicBatcher(
            [engine.execute] * spec.options.contexts, model.checker, max_batch=spec.options.max_batch,
            max_queue_delay_us=spec.max_queue_delay_us, metrics=metrics, copy_outputs=modes.copy_outputs,
            on_loop=on_loop, pad_rows=modes.pad_batches, poll_us=spec.poll_us if on_loop else 0,
            stager=stager, in_flight=in_flight,
        )
        spec.socket_path.unlink(missing_ok=True)  # a predecessor that was killed left it
        server = await listen(spec.socket_path, batcher)
        # (how the calls run, as "auto" resolved them: the supervisor's ready document says so)
        ready.send(("ready", model, {"outer_graph": modes.outer_graph, "pad_batches": modes.pad_batches,
                                     "overlap": stager is not None}))
        ready.close()
        orphaned = asyncio.create_task(wait_orphaned(os.getppid()))
        orphaned.add_done_callback(lambda _: stop.set())
        await stop.wait()
        orphaned.cancel()
        server.close()
        await batcher.aclose(spec.drain_s)
        batcher.close()  # waits for a call still running after the drain: never close the engine under it
    finally:
        if stager is not None:
            stager.wait()  # (its calls may still run after a drain that gave up)
            engine.close()  # (before the stager's stream goes: see CudaStager.close)
            stager.close()


#: Environment variable: how many batches an engine process's overlapped calls keep started at once
#: (1 to ``batcher.MAX_IN_FLIGHT``; default 2): the next batch starts while that many run only once
#: it is full or its queue delay is over.
IN_FLIGHT_ENV = "TRT_RUNTIME_SERVE_IN_FLIGHT"


def _in_flight() -> int:
    from trt_runtime.serve.batcher import MAX_IN_FLIGHT

    text = os.environ.get(IN_FLIGHT_ENV, "").strip()
    if not text:
        return 2
    if not text.isdigit() or not 1 <= int(text) <= MAX_IN_FLIGHT:
        raise SettingsError(f"{IN_FLIGHT_ENV} must be an integer in [1, {MAX_IN_FLIGHT}]; got {text!r}")
    return int(text)


def _stager(engine: Any, spec: EngineProcessSpec, model: Any, on_loop: bool, modes: Any) -> Any:
    """The engine process's :class:`~trt_runtime.serve.local.staging.CudaStager` (overlapped calls),
    where they apply: ``spec.overlap``, the calls on the loop, padded batches under the outer graph
    (:func:`~trt_runtime.serve.local.staging.stager_refusal` says the rest); else ``None``."""
    if not (spec.overlap and on_loop and modes.outer_graph and modes.pad_batches):
        return None
    from trt_runtime.serve.local.staging import open_stager

    checker = model.checker
    return open_stager(engine, checker.max_rows(checker.signature(checker.warmup_arrays())))


class FrontLink(transport.FrameProtocol):
    """One front's connection: its frames go to the batcher as they arrive (from the loop's read
    callback: no stream, task or future per request), and each answer is queued on the connection
    as its batch ends, so a batch's answers leave in one write.

    Requests whose arrays sit in a slot are bundled: those of one read that share a description
    (dtype and shape of every array) are gathered out of their slots in one copy per input and
    given to the batcher as one request of that many rows
    (:meth:`~trt_runtime.serve.batcher.DynamicBatcher.enqueue_call` with ``count``); their outputs
    go back into the slots in one copy per output. Per request, the engine process then does little
    more than read a frame header. A bundle never exceeds the batcher's ``max_batch`` requests or
    its ``max_rows`` rows; with a batcher that has neither, or a request that travels inline, a
    request goes alone.
    """

    def __init__(self, batcher: Any) -> None:
        super().__init__(self._take_frames)
        self._batcher = batcher
        self._bundles = hasattr(batcher, "max_rows") and hasattr(batcher, "max_batch")
        self._slab: Slab | None = None
        self._out: transport.FrameWriter | None = None
        self.transport: asyncio.Transport | None = None
        self._inflight = 0  # requests and bundles given to the batcher and not answered yet
        self._lost = False
        #: Per description: its layout and the most requests a bundle of it takes (``None``: alone).
        self._forms: dict[bytes, tuple[transport.Layout, int] | None] = {}

    def connection_made(self, transport_: asyncio.BaseTransport) -> None:
        self.transport = typing.cast(asyncio.Transport, transport_)  # (uvloop's is not a subclass)
        self._out = transport.FrameWriter(self.transport)

    def connection_lost(self, exc: Exception | None) -> None:
        """The front went away: its requests in flight are answered to no one (their answers are
        written into the slab, which stays mapped until the last of them)."""
        self._lost = True
        self._release()
        super().connection_lost(exc)

    def _release(self) -> None:
        if self._lost and not self._inflight and self._slab is not None:
            self._slab.close()
            self._slab = None

    def _take_frames(self, frames: list[transport.Frame]) -> None:
        slab = self._slab
        if slab is None:
            if self._lost:
                return
            _rid, _slot, status, payload = frames[0]
            if status != transport.HELLO:
                assert self.transport is not None
                self.transport.close()
                return
            slab = self._slab = Slab.attach(bytes(payload))
            frames = frames[1:]
        bundles: dict[bytes, tuple[list[int], list[int]]] = {}
        for rid, slot, _status, payload in frames:
            if slot == NO_SLOT or not self._bundles:
                self._take(rid, slot, payload, slab)
                continue
            bundle = bundles.get(payload)
            if bundle is None:
                bundles[payload] = ([rid], [slot])
            else:
                bundle[0].append(rid)
                bundle[1].append(slot)
        for key, (rids, slots) in bundles.items():
            self._take_bundle(key, rids, slots, slab)

    def _take(self, rid: int, slot: int, payload: bytes, slab: Slab) -> None:
        """Decode one request and hand it to the batcher; its answer is queued when its batch ends."""
        where = None if slot == NO_SLOT else slab.slot(slot)
        try:
            arrays = tuple(transport.decode_arrays(payload, where))
            done = functools.partial(self._answered, self._reply, rid, slot, where)
            self._batcher.enqueue_call(arrays, done)
        except Exception as exc:
            self._refuse([rid], exc)
            return
        self._inflight += 1

    def _form(self, key: bytes, slab: Slab, slot: int) -> tuple[transport.Layout, int] | None:
        """The layout of the description ``key`` and the most requests a bundle of it takes, worked
        out once (from the request in ``slot``); ``None``: its requests go alone."""
        if key in self._forms:
            return self._forms[key]
        form = None
        layout = transport.slot_layout(key, slab.slot_bytes)
        if layout is not None:
            most = self._batcher.max_batch
            if most > 1:
                sample = tuple(transport.decode_arrays(key, slab.slot(slot)))
                most = min(most, self._batcher.max_rows(sample) // layout[0][1][0])
            form = (layout, most) if most >= 1 else None
        if len(self._forms) >= 256:
            self._forms.clear()
        self._forms[key] = form
        return form

    def _take_bundle(self, key: bytes, rids: list[int], slots: list[int], slab: Slab) -> None:
        import numpy as np

        try:
            form = self._form(key, slab, slots[0])
        except Exception:  # (a description this process cannot read: each request says why)
            form = None
        if form is None:
            for rid, slot in zip(rids, slots, strict=True):
                self._take(rid, slot, key, slab)
            return
        layout, most = form
        rows = slab.rows()
        for start in range(0, len(rids), most):
            ids, where = rids[start:start + most], slots[start:start + most]
            index = where[0] if len(where) == 1 else np.array(where, np.intp)  # (one: a slot number)
            try:
                arrays = transport.gather(rows, index, layout)
                answer = functools.partial(self._answered, self._reply_bundle, ids, where, index,
                                           layout[0][1][0])
                self._batcher.enqueue_call(arrays, answer, len(ids))
            except Exception as exc:
                self._refuse(ids, exc)
                continue
            self._inflight += 1

    def _answered(self, reply: Callable[..., None], *args: Any) -> None:
        """The batcher's callback as a request's or a bundle's batch ends (it never raises): ``reply``
        (:meth:`_reply` or :meth:`_reply_bundle`) with ``args``, the answer last, unless the front
        went away (nobody reads it then)."""
        self._inflight -= 1
        try:
            if not self._lost:
                reply(*args)
        finally:
            self._release()

    def _reply_bundle(self, rids: list[int], slots: list[int], index: Any, step: int,
                      answer: Answer) -> None:
        """Write a bundle's outputs (``step`` rows per request) into its slots and queue one frame
        per request; a bundle whose answer does not fit a slot is answered request by request,
        inline; an error, to each request."""
        from trt_runtime.serve.batching import unsplittable

        slab, out = self._slab, self._out
        assert slab is not None and out is not None  # (both stay until the last answer)
        if isinstance(answer, BaseException):
            self._refuse(rids, answer)
            return
        try:
            error = unsplittable(answer, len(rids) * step)
            if error is not None:
                raise error
            description = transport.scatter(slab.rows(), index, answer, slab.slot_bytes)
        except Exception as exc:  # outputs that cannot be split, or cannot cross
            self._refuse(rids, exc)
            return
        if description is None:  # too big for a slot: each request's part inline
            for i, rid in enumerate(rids):
                self._reply(rid, NO_SLOT, None, [o[i * step:(i + 1) * step] for o in answer])
            return
        out.frames(rids, slots, 0, description)

    def _reply(self, rid: int, slot: int, where: memoryview | None, answer: Answer) -> None:
        """Queue the frame of one request's ``answer``: its outputs, written into its slot when they
        fit (``where``), else inline; or the error."""
        assert self._out is not None
        if not isinstance(answer, BaseException):
            try:
                description, inline = transport.encode_arrays(answer, where)
            except Exception as exc:  # an output that cannot cross: the request fails, not the connection
                answer = exc
            else:
                self._out.frame(rid, NO_SLOT if inline or where is None else slot, 0, description, inline)
                return
        self._refuse([rid], answer)

    def _refuse(self, rids: list[int], error: BaseException) -> None:
        """Answer each of ``rids`` with ``error``: its HTTP status for a refusal, else 500."""
        from trt_runtime.errors import RequestError

        out = self._out
        if out is None or self._lost:
            return
        if isinstance(error, RequestError):
            out.frames(rids, [NO_SLOT] * len(rids), error.status, str(error).encode())
        else:
            out.frames(rids, [NO_SLOT] * len(rids), 500, f"{type(error).__name__}: {error}".encode())


async def listen(path: Path, batcher: Any) -> asyncio.AbstractServer:
    """Serve fronts on the unix socket ``path``, every request through ``batcher``."""
    loop = asyncio.get_running_loop()
    return await loop.create_unix_server(lambda: FrontLink(batcher), path=os.fspath(path))
