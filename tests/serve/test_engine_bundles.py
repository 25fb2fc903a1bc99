"""The engine process's bundles: requests of one read gathered out of their slots in one copy, run
as one request of many rows, their outputs scattered back (one process, CPU, a real batcher)."""

from __future__ import annotations

import asyncio
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _engine_side import engine_side

from trt_runtime import TensorSpec
from trt_runtime.errors import RequestError
from trt_runtime.serve.batcher import DynamicBatcher
from trt_runtime.serve.local.front import EnginePool
from trt_runtime.serve.local.transport import Slab, gather, scatter, slot_layout
from trt_runtime.serve.metrics import ServeMetrics
from trt_runtime.serve.validation import RequestChecker


def _checker(out_cols: int = 4, most: int = 8) -> RequestChecker:
    x = TensorSpec("x", "float32", (-1, 4), True, profiles=(((1, 4), (4, 4), (most, 4)),))
    return RequestChecker("m", [x], [TensorSpec("y", "float32", (-1, out_cols), False)])


class _Engine:
    """``y = 2 x + 1`` (repeated to ``cols`` columns); records the rows of every call."""

    def __init__(self, cols: int = 4, rows_out: Any = None, fail: bool = False) -> None:
        self.calls: list[int] = []
        self.cols, self.rows_out, self.fail = cols, rows_out, fail

    def execute(self, x: Any) -> list[Any]:
        self.calls.append(x.shape[0])
        if self.fail:
            raise ValueError("boom")
        y = np.tile(x * 2 + 1, (1, self.cols // 4))
        return [y[: self.rows_out] if self.rows_out is not None else y]


class _Spy(DynamicBatcher):
    """A real batcher that records the request count of every ``enqueue_call``."""

    counts: list[int]

    def enqueue_call(self, arrays: tuple[Any, ...], done: Any, count: int = 1) -> None:
        self.counts.append(count)
        super().enqueue_call(arrays, done, count)


async def _serve(batcher: Any, inputs: list[Any], slot_bytes: int = 256) -> list[Any]:
    """Send every input at once through one front's pool; each answer or error, in order."""
    where = Path(tempfile.mkdtemp(prefix="trt-b-"))
    server = await engine_side(where / "e.sock", batcher)
    slab = Slab.create(where / "slab", slots=64, slot_bytes=slot_bytes)
    pool = EnginePool([where / "e.sock"], slab)
    pool.start()
    await asyncio.wait_for(pool.wait_up(), 5)
    try:
        return await asyncio.wait_for(
            asyncio.gather(*(pool.infer((x,)) for x in inputs), return_exceptions=True), 10)
    finally:
        assert sorted(slab._free) == list(range(64))  # every slot given back
        await pool.close()
        if isinstance(batcher, DynamicBatcher):
            await batcher.aclose(1.0)
            batcher.close()
        server.close()
        slab.close()


def _batcher(engine: _Engine, checker: RequestChecker, on_loop: bool, max_batch: int = 16,
             metrics: ServeMetrics | None = None) -> _Spy:
    batcher = _Spy([engine.execute], checker, max_batch=max_batch, max_queue_delay_us=20_000,
                   on_loop=on_loop, metrics=metrics)
    batcher.counts = []
    return batcher


@pytest.mark.parametrize("on_loop", [True, False], ids=["loop", "threads"])
def test_bundles_answer_each_request_and_keep_calls_within_the_profile(on_loop: bool) -> None:
    engine = _Engine()
    metrics = ServeMetrics("m")
    batcher = _batcher(engine, _checker(), on_loop, metrics=metrics)
    inputs = [np.full((1, 4), i, np.float32) for i in range(40)]
    inputs += [np.full((2, 4), 100 + i, np.float32) for i in range(4)]  # another description: its own bundle
    inputs.append(np.full((20, 4), 7, np.float32))  # larger than a slot: inline, alone
    answers = asyncio.run(_serve(batcher, inputs))
    for x, answer in zip(inputs, answers, strict=True):
        assert not isinstance(answer, BaseException), answer
        np.testing.assert_array_equal(answer[0], x * 2 + 1)
    assert max(batcher.counts) > 1  # requests of one read went as bundles
    assert sum(batcher.counts) == len(inputs)
    calls = sorted(engine.calls)
    assert calls[-1] == 20 and calls[-2] <= 8  # the inline request alone; the rest within the profile
    assert len(calls) < len(inputs)
    text = metrics.render()[0].decode()
    assert 'trt_runtime_batch_requests_sum{model="m"} 45.0' in text  # a bundle counts each request
    assert 'trt_runtime_queue_seconds_count{model="m"} 45.0' in text


def test_bundles_of_a_batcher_without_batching_hold_one_request() -> None:
    engine = _Engine()
    batcher = _batcher(engine, _checker(), on_loop=True, max_batch=1)
    inputs = [np.full((1, 4), i, np.float32) for i in range(12)]
    answers = asyncio.run(_serve(batcher, inputs))
    assert all(np.array_equal(a[0], x * 2 + 1) for a, x in zip(answers, inputs, strict=True))
    assert batcher.counts == [1] * 12 and engine.calls == [1] * 12


def test_bundles_whose_answers_outgrow_a_slot_are_answered_inline() -> None:
    engine = _Engine(cols=128)  # 512 bytes per row: more than a 256-byte slot
    batcher = _batcher(engine, _checker(out_cols=128), on_loop=True)
    inputs = [np.full((1, 4), i, np.float32) for i in range(10)]
    answers = asyncio.run(_serve(batcher, inputs))
    for x, answer in zip(inputs, answers, strict=True):
        np.testing.assert_array_equal(answer[0], np.tile(x * 2 + 1, (1, 32)))
    assert max(batcher.counts) > 1


@pytest.mark.parametrize(("engine", "status", "match"), [
    (_Engine(rows_out=1), 500, r"engine outputs \[\(1, 4\)\] do not have the batch's \d+ rows first"),
    (_Engine(fail=True), 500, "ValueError: boom"),
], ids=["rows", "raises"])
def test_bundles_whose_call_fails_answer_every_request_with_the_error(engine: _Engine, status: int,
                                                                      match: str) -> None:
    batcher = _batcher(engine, _checker(), on_loop=True)
    answers = asyncio.run(_serve(batcher, [np.full((1, 4), i, np.float32) for i in range(6)]))
    assert max(batcher.counts) > 1
    for answer in answers:
        assert isinstance(answer, RequestError) and answer.status == status, answer
        assert re.search(match, str(answer)), answer


def test_bundles_answered_with_an_interrupt_get_a_500_each() -> None:
    """A batch whose runner was interrupted answers each request with the interrupt (the loop then
    handles it): every request of a bundle gets a 500 naming it, and the link goes on."""

    class Interrupted:
        max_batch = 8

        def __init__(self) -> None:
            self.counts: list[int] = []

        def max_rows(self, arrays: tuple[Any, ...]) -> int:
            return 8

        def enqueue_call(self, arrays: tuple[Any, ...], done: Any, count: int = 1) -> None:
            self.counts.append(count)
            asyncio.get_running_loop().call_soon(done, KeyboardInterrupt())

    batcher = Interrupted()
    answers = asyncio.run(_serve(batcher, [np.full((1, 4), i, np.float32) for i in range(5)]))
    assert max(batcher.counts) > 1
    assert all(isinstance(a, RequestError) and a.status == 500 and "KeyboardInterrupt" in str(a)
               for a in answers), answers


def test_batcher_counts_a_bundle_as_its_requests_when_it_fills_a_batch() -> None:
    async def main() -> list[int]:
        engine = _Engine()
        batcher = DynamicBatcher([engine.execute], _checker(most=16), max_batch=8, max_queue_delay_us=0,
                                 on_loop=True)
        answered = asyncio.get_running_loop().create_future()
        got: list[Any] = []

        def done(answer: Any) -> None:
            got.append(answer)
            if len(got) == 3:
                answered.set_result(None)

        for i in range(3):  # three bundles of three: 6 fit a batch of 8, the third waits
            batcher.enqueue_call((np.full((3, 4), i, np.float32),), done, 3)
        assert batcher.pending == 9
        await asyncio.wait_for(answered, 5)
        assert [a[0].shape for a in got] == [(3, 4)] * 3
        batcher.close()
        return engine.calls

    assert asyncio.run(main()) == [6, 3]


def test_slot_layout_gather_and_scatter_move_many_slots_in_one_copy(tmp_path: Path) -> None:
    from trt_runtime.serve.local.transport import describe

    slab = Slab.create(tmp_path / "s", slots=4, slot_bytes=256)
    a = [np.full((2, 3), i, np.float16) for i in range(4)]
    b = [np.arange(2, dtype=np.int64) + 10 * i for i in range(4)]
    description, _parts, _total = describe([a[0], b[0]])
    layout = slot_layout(description, slab.slot_bytes)
    assert layout is not None and [(d.str, shape, n, off) for d, shape, n, off in layout] == [
        ("<f2", (2, 3), 12, 0), ("<i8", (2,), 16, 64)]
    rows = slab.rows()
    for i in range(4):
        rows[i, :12] = a[i].view(np.uint8).ravel()
        rows[i, 64:80] = b[i].view(np.uint8)
    index = np.array([3, 1], np.intp)
    got_a, got_b = gather(rows, index, layout)
    np.testing.assert_array_equal(got_a, np.concatenate([a[3], a[1]]))
    np.testing.assert_array_equal(got_b, np.concatenate([b[3], b[1]]))
    out = scatter(rows, index, [got_a * 2, got_b + 1], slab.slot_bytes)
    assert out == description  # each request's part described once
    np.testing.assert_array_equal(rows[3, :12].view(np.float16).reshape(2, 3), a[3] * 2)
    np.testing.assert_array_equal(rows[1, 64:80].view(np.int64), b[1] + 1)
    assert scatter(rows, index, [np.zeros((2, 200), np.float32)], slab.slot_bytes) is None  # 400 > 256
    # Not gathered by rows: a 0-d array, arrays whose row counts differ, more than a slot.
    assert slot_layout(describe([np.float32(1).reshape(())])[0], 256) is None
    assert slot_layout(describe([a[0], np.zeros(3, np.int64)])[0], 256) is None
    assert slot_layout(describe([np.zeros((1, 100), np.float32)])[0], 256) is None
    slab.close()
    assert not slab.path.exists()


def test_one_slot_is_gathered_as_views_and_scattered_in_place(tmp_path: Path) -> None:
    """A bundle of one request (the usual read at a few clients per front) moves no extra copy: its
    inputs are views of its slot, its answer is written into the slot by plain slicing; the
    description is the same as for many, and an answer that cannot cross is still refused."""
    from trt_runtime.errors import InputError
    from trt_runtime.serve.local.transport import describe

    slab = Slab.create(tmp_path / "s", slots=3, slot_bytes=256)
    rows = slab.rows()
    x = np.arange(6, dtype=np.float16).reshape(2, 3)
    rows[2, :12] = x.view(np.uint8).ravel()
    layout = slot_layout(describe([x])[0], slab.slot_bytes)
    assert layout is not None
    (got,) = gather(rows, 2, layout)
    np.testing.assert_array_equal(got, x)
    assert np.shares_memory(got, rows[2]) and not np.shares_memory(got, rows[1])  # a view, no copy
    y = np.stack([x[:, 0].astype(np.float32) * 3, x[:, 1].astype(np.float32)], axis=1)  # (2, 2) f32
    transposed = np.asfortranarray(y)  # not C-contiguous: written in C order all the same
    for answer in ([y], [transposed]):
        rows[2, :] = 0
        assert scatter(rows, 2, answer, slab.slot_bytes) == describe([y])[0]
        np.testing.assert_array_equal(rows[2, :16].view(np.float32).reshape(2, 2), y)
        assert not rows[1].any()  # only its own slot
    assert scatter(rows, 2, [np.zeros((1, 100), np.float32)], slab.slot_bytes) is None  # 400 > 256
    with pytest.raises(InputError, match="object"):
        scatter(rows, 2, [np.array([[None]], dtype=object)], slab.slot_bytes)
    del got
    slab.close()
