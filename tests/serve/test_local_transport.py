"""The local server's front-to-engine hop: shared-memory slots, frames, links (one process, CPU)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _engine_side import engine_side as _engine

from trt_runtime.errors import RequestError
from trt_runtime.serve.local.engine_process import FrontLink
from trt_runtime.serve.local.front import EngineLost, EnginePool
from trt_runtime.serve.local.transport import NO_SLOT, Slab, decode_arrays, encode_arrays


@pytest.fixture
def slab(tmp_path: Path) -> Any:
    s = Slab.create(tmp_path / "slab", slots=4, slot_bytes=1024)
    yield s
    s.close()


def test_transport_arrays_round_trip_through_a_slot_and_inline(slab: Slab) -> None:
    arrays = [np.arange(12, dtype=np.float16).reshape(3, 4), np.array([[7, -8]], np.int32),
              np.zeros((0, 5), np.float32), np.float64(2.5).reshape(())]
    slot = slab.take()
    description, inline = encode_arrays(arrays, slab.slot(slot))
    assert inline == []  # everything fitted the slot: only the description crosses the socket
    assert len(description) < 120
    for got, want in zip(decode_arrays(memoryview(description), slab.slot(slot)), arrays, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    big = np.arange(1000, dtype=np.float32)  # 4000 bytes > a 1024-byte slot: inline
    description, inline = encode_arrays([big], slab.slot(slot))
    assert len(inline) == 1
    (got,) = decode_arrays(memoryview(description + b"".join(bytes(b) for b in inline)), None)
    np.testing.assert_array_equal(got, big)


def test_transport_keeps_dtype_byte_order_and_refuses_object_arrays(slab: Slab) -> None:
    arrays = [np.array([True, False]), np.arange(3, dtype=">i8"), np.ones((2, 1, 1), np.uint8)]
    description, inline = encode_arrays(arrays, None)
    got = decode_arrays(memoryview(description + b"".join(bytes(b) for b in inline)), None)
    assert [g.dtype for g in got] == [a.dtype for a in arrays]
    for g, a in zip(got, arrays, strict=True):
        np.testing.assert_array_equal(g, a)
    with pytest.raises(ValueError, match="dtype object cannot be shared"):
        encode_arrays([np.array([None])], None)


def test_transport_slots_run_out_then_come_back(slab: Slab) -> None:
    taken = [slab.take() for _ in range(4)]
    assert sorted(taken) == [0, 1, 2, 3] and slab.take() == NO_SLOT
    slab.give(taken[2])
    assert slab.take() == taken[2]


def test_transport_owner_removes_the_file_and_refuses_bad_geometry(tmp_path: Path) -> None:
    s = Slab.create(tmp_path / "s", slots=2, slot_bytes=128)
    peer = Slab.attach(s.hello())
    assert peer.slots == 2 and peer.path == s.path
    peer.close()
    assert s.path.exists()
    s.close()
    s.close()
    assert not s.path.exists()
    with pytest.raises(ValueError, match="multiple of 64; got 1 slots of 100 bytes"):
        Slab.create(tmp_path / "t", slots=1, slot_bytes=100)


class _Batcher:
    """What the engine process uses of a batcher: ``enqueue_call`` (the answer handed to a
    callback); doubles write ``submit``."""

    async def submit(self, arrays: tuple[Any, ...]) -> list[Any]:
        raise NotImplementedError

    def enqueue_call(self, arrays: tuple[Any, ...], done: Any) -> None:
        task = asyncio.ensure_future(self.submit(arrays))
        task.add_done_callback(lambda t: done(t.exception() or t.result()))


class _Held(_Batcher):
    """A batcher double that answers ``x + add`` once ``release`` is set."""

    def __init__(self, release: asyncio.Event, add: float = 0) -> None:
        self.release, self.add = release, add

    async def submit(self, arrays: tuple[Any, ...]) -> list[Any]:
        await self.release.wait()
        return [arrays[0] + self.add if self.add else arrays[0]]


class _Doubler(_Batcher):
    """A batcher double: answers ``2 x`` after a short wait; a negative first value is refused."""

    def __init__(self) -> None:
        self.seen = 0

    async def submit(self, arrays: tuple[Any, ...]) -> list[Any]:
        self.seen += 1
        await asyncio.sleep(0.001 * (self.seen % 3))  # answers come back out of order
        if arrays[0].size and arrays[0].flat[0] < 0:
            raise RequestError("input 'x' must not be negative; got -1", 400)
        return [arrays[0] * 2, np.full(arrays[0].shape[:1], arrays[0].shape[0], np.int32)]


def _short_dir() -> Path:
    import tempfile

    return Path(tempfile.mkdtemp(prefix="trt-t-"))  # unix socket paths must stay short




def test_transport_concurrent_requests_get_their_own_answers_and_refusals() -> None:
    async def main() -> None:
        where = _short_dir()
        path = where / "e.sock"
        batcher = _Doubler()
        server = await _engine(path, batcher)
        slab = Slab.create(where / "slab", slots=8, slot_bytes=256)
        pool = EnginePool([path], slab)
        pool.start()
        await asyncio.wait_for(pool.wait_up(), 5)
        inputs = [np.full((1 + i % 3, 4), i, np.float32) for i in range(60)]
        inputs.append(np.full((200, 4), 7, np.float32))  # larger than a slot: inline both ways
        answers = await asyncio.gather(*(pool.infer((x,)) for x in inputs))
        for x, (y, rows) in zip(inputs, answers, strict=True):
            np.testing.assert_array_equal(y, x * 2)
            assert list(rows) == [x.shape[0]] * x.shape[0]
        with pytest.raises(RequestError, match="must not be negative") as info:
            await pool.infer((np.full((1, 4), -1, np.float32),))
        assert info.value.status == 400
        assert sorted(slab._free) == list(range(8))  # every slot given back
        await pool.close()
        server.close()
        slab.close()

    asyncio.run(main())


def test_transport_lost_engine_fails_requests_with_503_and_link_redials() -> None:
    async def main() -> None:
        where = _short_dir()
        path = where / "e.sock"
        release = asyncio.Event()

        links: list[FrontLink] = []
        held = _Held(release)
        server = await _engine(path, held, links)
        slab = Slab.create(where / "slab", slots=4, slot_bytes=256)
        pool = EnginePool([path], slab)
        pool.wait_for_engine_s = 0.2
        pool.start()
        await asyncio.wait_for(pool.wait_up(), 5)
        pending = asyncio.gather(*(pool.infer((np.ones((1, 2), np.float32),)) for _ in range(3)),
                                 return_exceptions=True)
        await asyncio.sleep(0.05)
        server.close()
        assert links[0].transport is not None
        links[0].transport.abort()  # the engine process dies
        results = await asyncio.wait_for(pending, 5)
        # Sent again once (no other engine process here), then 503 after the wait for one.
        assert all(isinstance(r, RequestError) and r.status == 503 for r in results), results
        assert sorted(slab._free) == [0, 1, 2, 3]
        assert not pool.all_up()
        started = time.monotonic()
        with pytest.raises(RequestError, match="no engine process is up") as info:
            await pool.infer((np.ones((1, 2), np.float32),))
        assert info.value.status == 503 and time.monotonic() - started >= 0.2
        pool.wait_for_engine_s = 5.0
        late = asyncio.ensure_future(pool.infer((np.full((1, 2), 4, np.float32),)))  # waits for the successor
        release.set()
        server = await _engine(path, held, links)  # its successor
        await asyncio.wait_for(pool.wait_up(), 5)
        (y,) = await asyncio.wait_for(late, 5)
        np.testing.assert_array_equal(y, np.full((1, 2), 4, np.float32))
        (y,) = await pool.infer((np.full((1, 2), 3, np.float32),))
        np.testing.assert_array_equal(y, np.full((1, 2), 3, np.float32))
        await pool.close()
        server.close()
        slab.close()

    asyncio.run(main())


def test_local_gpus_option_and_config_refuse_bad_values() -> None:
    from trt_runtime.serve.local import LocalServerConfig, ServeStartError, resolve_gpus
    from trt_runtime.serve.options import ServeOptions

    assert resolve_gpus("all", 0) == (None,)  # no GPU: one engine process, the backend's default device
    assert resolve_gpus("all", 2) == (0, 1)
    assert resolve_gpus("1,0", 2) == (1, 0)
    for text, match in (("2", "GPU index 2 does not exist; this machine has 2 GPU"),
                        ("0,0", "names a GPU twice"), ("x", "must be 'all' or GPU indices")):
        with pytest.raises(ServeStartError, match=match) as info:
            resolve_gpus(text, 2)
        assert info.value.usage
    with pytest.raises(ValueError, match="workers must be an integer >= 1; got 0"):
        LocalServerConfig(Path("e.mem"), ServeOptions(), "e", workers=0)
    with pytest.raises(ValueError, match="engine_calls must be one of auto, threads, loop; got 'fast'"):
        LocalServerConfig(Path("e.mem"), ServeOptions(), "e", engine_calls="fast")


@pytest.mark.parametrize(
    ("calls", "contexts", "max_batch", "on_loop"),
    [("auto", 1, 64, True), ("auto", 1, 1, False), ("auto", 2, 64, False), ("threads", 1, 64, False),
     ("loop", 1, 1, True)],
)
def test_local_engine_calls_auto_picks_the_loop_for_one_batching_context(
    calls: str, contexts: int, max_batch: int, on_loop: bool
) -> None:
    from trt_runtime.serve.local import LocalServerConfig
    from trt_runtime.serve.options import ServeOptions

    options = ServeOptions(backend="memory", contexts=contexts, max_batch=max_batch)
    config = LocalServerConfig(Path("e.mem"), options, "e", engine_calls=calls)
    assert config.calls_on_loop() is on_loop
    assert config.calls_on_loop(batchable=False) is (calls == "loop"), "an engine that cannot batch: threads"


def test_transport_pool_spreads_over_engines_and_survives_losing_one() -> None:
    async def main() -> None:
        where = _short_dir()
        batchers = [_Doubler(), _Doubler()]
        links: list[list[FrontLink]] = [[], []]
        servers = [await _engine(where / f"e{i}.sock", batchers[i], links[i]) for i in range(2)]
        slab = Slab.create(where / "slab", slots=64, slot_bytes=256)
        pool = EnginePool([where / "e0.sock", where / "e1.sock"], slab)
        pool.start()
        await asyncio.wait_for(pool.wait_up(), 5)
        xs = [np.full((1, 4), i, np.float32) for i in range(64)]
        answers = await asyncio.gather(*(pool.infer((x,)) for x in xs))
        assert all(np.array_equal(a[0], x * 2) for a, x in zip(answers, xs, strict=True))
        assert batchers[0].seen >= 16 and batchers[1].seen >= 16, [b.seen for b in batchers]  # least busy
        servers[1].close()
        links[1][0].transport.abort()  # type: ignore[union-attr]  # engine process 1 dies: all to engine 0
        await asyncio.sleep(0.05)
        before = batchers[0].seen
        answers = await asyncio.gather(*(pool.infer((x,)) for x in xs))
        assert all(np.array_equal(a[0], x * 2) for a, x in zip(answers, xs, strict=True))
        assert batchers[0].seen == before + 64
        await pool.close()
        servers[0].close()
        slab.close()

    asyncio.run(main())


def test_transport_requests_of_a_lost_engine_run_again_on_another() -> None:
    async def main() -> None:
        where = _short_dir()
        links: list[FrontLink] = []

        class Never(_Batcher):
            async def submit(self, arrays: tuple[Any, ...]) -> list[Any]:
                await asyncio.Event().wait()  # hangs until its process dies
                raise AssertionError("unreachable")

        servers = [await _engine(where / "e0.sock", _Doubler()),
                   await _engine(where / "e1.sock", Never(), links)]
        slab = Slab.create(where / "slab", slots=64, slot_bytes=256)
        pool = EnginePool([where / "e0.sock", where / "e1.sock"], slab)
        pool.start()
        await asyncio.wait_for(pool.wait_up(), 5)
        xs = [np.full((1, 4), i, np.float32) for i in range(32)]
        pending = asyncio.gather(*(pool.infer((x,)) for x in xs))
        await asyncio.sleep(0.1)
        assert pool.links[1].outstanding > 0  # some requests wait on the stuck engine process
        servers[1].close()
        links[0].transport.abort()  # type: ignore[union-attr]
        answers = await asyncio.wait_for(pending, 5)
        assert all(np.array_equal(a[0], x * 2) for a, x in zip(answers, xs, strict=True))
        await pool.close()
        servers[0].close()
        slab.close()

    asyncio.run(main())


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_transport_request_sent_as_a_connection_breaks_goes_to_another_engine(loop: str) -> None:
    """The transport sees the engine process gone a loop step before the link's reader wakes;
    a request picked in that step must not be written to the dead connection (uvloop raised,
    and the client got 500)."""
    run = asyncio.run if loop == "asyncio" else pytest.importorskip("uvloop").run

    async def main() -> None:
        where = _short_dir()
        batchers = [_Doubler(), _Doubler()]
        servers = [await _engine(where / f"e{i}.sock", b) for i, b in enumerate(batchers)]
        slab = Slab.create(where / "slab", slots=8, slot_bytes=256)
        pool = EnginePool([where / "e0.sock", where / "e1.sock"], slab)
        pool.start()
        await asyncio.wait_for(pool.wait_up(), 5)
        servers[0].close()
        pool.links[0]._writer.abort()  # type: ignore[union-attr]  # engine process 0 died
        await asyncio.sleep(0)  # the connection is closed; the link's reader has not woken yet
        assert pool.links[0].up.is_set() and pool.links[0].outstanding == pool.links[1].outstanding
        x = np.full((1, 4), 3, np.float32)
        y, _rows = await pool.infer((x,))  # runs in this step: the tie would pick link 0
        np.testing.assert_array_equal(y, x * 2)
        assert batchers[0].seen == 0 and batchers[1].seen == 1
        pool.links[1]._writer.abort()  # type: ignore[union-attr]
        await asyncio.sleep(0)
        with pytest.raises(EngineLost, match=r"e1\.sock went away") as info:  # a link sent to directly
            await pool.links[1].send((x,))
        assert info.value.status == 503 and batchers[1].seen == 1
        assert sorted(slab._free) == list(range(8))
        await pool.close()
        servers[1].close()
        slab.close()

    run(main())


class _CountingWriter:
    """A StreamWriter double that records each write (a write is one send on a real socket)."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closing = False
        self.transport = self

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def abort(self) -> None:
        self.closing = True


def test_transport_frame_protocol_hands_over_whole_frames_as_they_arrive() -> None:
    from trt_runtime.serve.local.transport import HEADER, FrameProtocol

    def frame(rid: int, payload: bytes, status: int = 0) -> bytes:
        return HEADER.pack(len(payload), rid, NO_SLOT, status) + payload

    async def main() -> None:
        got: list[list[Any]] = []
        protocol = FrameProtocol(lambda frames: got.append([(f[0], f[2], bytes(f[3])) for f in frames]))
        stream = frame(1, b"one") + frame(2, b"") + frame(3, b"three" * 100, 503)
        protocol.data_received(stream[:20])  # the first frame whole, the second cut in its header
        assert got == [[(1, 0, b"one")]]
        protocol.data_received(stream[20:30])  # still no whole frame
        assert len(got) == 1
        protocol.data_received(stream[30:])
        assert got[1:] == [[(2, 0, b""), (3, 503, b"three" * 100)]]
        protocol.data_received(frame(4, b"x") + frame(5, b"y"))  # several whole frames in one read
        assert got[2:] == [[(4, 0, b"x"), (5, 0, b"y")]]
        assert not protocol.closed.done()
        protocol.connection_lost(None)
        assert protocol.closed.done()

    asyncio.run(main())


def test_transport_frames_of_one_loop_pass_leave_in_one_write_and_read_back_whole() -> None:
    from trt_runtime.serve.local.transport import FrameProtocol, FrameWriter

    async def main() -> None:
        sink = _CountingWriter()
        out = FrameWriter(sink)  # type: ignore[arg-type]
        big = bytes(range(256)) * 2000  # 512 kB: more than one read of the socket
        for rid in range(1, 41):
            out.frame(rid, rid % 7, 0, b"d%d" % rid)
        out.frame(41, NO_SLOT, 0, b"head", [memoryview(big)])
        out.frame(42, NO_SLOT, 503, b"engine gone")
        assert sink.writes == []  # nothing sent until the loop's pass is over
        await asyncio.sleep(0)
        assert len(sink.writes) == 1  # 42 frames, one send
        reads: list[list[Any]] = []
        protocol = FrameProtocol(reads.append)  # how an engine process reads them
        stream = sink.writes[0]
        protocol.data_received(stream[:10])  # a header cut in two: nothing complete yet
        assert reads == []
        protocol.data_received(stream[10:1000])
        (first,) = reads
        assert [f[:3] for f in first] == [(rid, rid % 7, 0) for rid in range(1, len(first) + 1)]
        assert bytes(first[0][3]) == b"d1"
        for start in range(1000, len(stream), 65536):  # the big frame arrives a socket's worth at a time
            protocol.data_received(stream[start:start + 65536])
        rest = [f for frames in reads[1:] for f in frames]
        assert [f[0] for f in first + rest] == list(range(1, 43))
        assert bytes(rest[-2][3]) == b"head" + big
        assert (rest[-1][2], bytes(rest[-1][3])) == (503, b"engine gone")
        sink.closing = True  # the reader went away: later frames are dropped, not sent
        out.frame(43, NO_SLOT, 0, b"x")
        await asyncio.sleep(0)
        assert len(sink.writes) == 1

    asyncio.run(main())


def test_transport_engine_answers_a_batch_to_one_front_in_one_write() -> None:
    """The engine process answers from the batch's done-callbacks: no task per request, one send."""

    async def main() -> None:
        where = _short_dir()
        path = where / "e.sock"
        gate = asyncio.Event()  # every request answered in the same pass, as a batch is

        sends: list[int] = []

        class Counting(FrontLink):
            def connection_made(self, transport_: asyncio.BaseTransport) -> None:
                real = transport_.write  # type: ignore[attr-defined]
                transport_.write = lambda data: (sends.append(len(data)), real(data))[1]  # type: ignore[attr-defined]
                super().connection_made(transport_)

        server = await _engine(path, _Held(gate, add=1), link=Counting)
        slab = Slab.create(where / "slab", slots=64, slot_bytes=256)
        pool = EnginePool([path], slab)
        pool.start()
        await asyncio.wait_for(pool.wait_up(), 5)
        requests = asyncio.gather(*(pool.infer((np.full((1, 4), i, np.float32),)) for i in range(32)))
        await asyncio.sleep(0.05)
        gate.set()
        answers = await asyncio.wait_for(requests, 5)
        for i, (y,) in enumerate(answers):
            np.testing.assert_array_equal(y, np.full((1, 4), i + 1, np.float32))
        assert len(sends) == 1, sends
        await pool.close()
        server.close()
        slab.close()

    asyncio.run(main())


def test_transport_fronts_send_home_and_spill_to_the_least_busy(slab: Slab) -> None:
    """Front i of 4 sends to engine process i % 3 (so each engine process reads from part of the
    fronts) until it has SPILL_AFTER more requests outstanding there than at the least busy one."""
    from trt_runtime.serve.local.front import SPILL_AFTER

    paths = [Path("e0.sock"), Path("e1.sock"), Path("e2.sock")]
    pools = [EnginePool(paths, slab, first=i, fronts=4) for i in range(4)]
    for pool in pools:
        for link in pool.links:
            link.up.set()
        assert [link.path for link in pool.links] == paths  # the links keep the sockets' order
    assert [pool._pick() is pool.links[i % 3] for i, pool in enumerate(pools)] == [True] * 4
    home, other, third = pools[1].links[1], pools[1].links[0], pools[1].links[2]
    home.outstanding, third.outstanding = SPILL_AFTER - 1, 1
    assert pools[1]._pick() is home  # busier, but not by SPILL_AFTER
    home.outstanding = SPILL_AFTER
    assert pools[1]._pick() is other  # the least busy takes it
    home.up.clear()
    other.outstanding = 2
    assert pools[1]._pick() is third  # home down: the next in the rotation is home now


def test_transport_fewer_fronts_than_engines_share_them_out(slab: Slab) -> None:
    """With 2 fronts and 4 engine processes front 0 is home at 0 and 2, front 1 at 1 and 3 (every
    engine process serves someone), each sending to the least busy of its homes; one front alone
    (``fronts=1``, the default) has every engine process as home."""
    paths = [Path(f"e{i}.sock") for i in range(4)]
    pools = [EnginePool(paths, slab, first=i, fronts=2) for i in range(2)] + [EnginePool(paths, slab)]
    for pool in pools:
        for link in pool.links:
            link.up.set()

    def picks(pool: EnginePool, sends: int) -> list[int]:
        for link in pool.links:
            link.outstanding = 0
        chosen = []
        for _ in range(sends):
            link = pool._pick()
            assert link is not None
            link.outstanding += 1
            chosen.append(pool.links.index(link))
        return chosen

    assert picks(pools[0], 4) == [0, 2, 0, 2]
    assert picks(pools[1], 4) == [1, 3, 1, 3]
    assert picks(pools[2], 4) == [0, 1, 2, 3]  # alone: the least busy of all
