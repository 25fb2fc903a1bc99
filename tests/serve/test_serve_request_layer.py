"""The request layer shared by every front: ModelInfo and DynamicBatcher (metrics: test_serve_metrics.py)."""

from __future__ import annotations

import asyncio
import functools
import json
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _serve_support import pair_engine

import trt_runtime
from trt_runtime import RequestError, TensorSpec
from trt_runtime.serve.batcher import DynamicBatcher
from trt_runtime.serve.model import ModelInfo, model_name

_X = TensorSpec("x", "float32", (-1, -1), True, profiles=(((1, 1), (4, 4), (6, 8)),))
_Y = TensorSpec("y", "float32", (-1, -1), False)


def _model(max_batch: int = 8) -> ModelInfo:
    return ModelInfo.from_specs("m", [_X], [_Y], max_batch=max_batch)


# -- ModelInfo -----------------------------------------------------------------------------
def test_model_info_metadata_pickles_and_round_trips_json() -> None:
    with trt_runtime.load(pair_engine(), "memory") as engine:
        model = ModelInfo.from_engine(engine, "pair", max_batch=4)
    assert model.metadata() == {
        "name": "pair", "versions": ["1"], "platform": "tensorrt_plan",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]},
                   {"name": "k", "datatype": "INT32", "shape": [-1, 2]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]},
                    {"name": "z", "datatype": "INT32", "shape": [-1, 2]}],
    }
    again = pickle.loads(pickle.dumps(model))
    assert again == model and again.checker.batchable and again.checker.names == ["x", "k"]
    assert ModelInfo.from_dict(json.loads(json.dumps(model.to_dict()))) == model


def test_model_name_is_the_stem_unless_named() -> None:
    assert model_name(Path("/models/mlp.plan")) == "mlp"
    assert model_name("mlp.plan", "classifier") == "classifier"
    with pytest.raises(ValueError, match="got 'a/b'"):
        model_name("mlp.plan", "a/b")
    with pytest.raises(ValueError, match="max_batch must be an integer >= 1; got 0"):
        _model(0)


# -- DynamicBatcher ------------------------------------------------------------------------
class _Engine:
    """Records each call's rows; ``y = 2 x + 1``; fails a call holding a row of -1s."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.calls: list[int] = []
        self.delay_s = delay_s
        self.threads: set[str] = set()
        self.lock = threading.Lock()
        self.active = 0
        self.most_active = 0

    def execute(self, x: np.ndarray) -> list[np.ndarray]:
        if not x.flags.c_contiguous:  # (as every engine refuses it)
            raise RequestError(f"input is not C-contiguous: strides {x.strides}", 400)
        with self.lock:
            self.calls.append(x.shape[0])
            self.threads.add(threading.current_thread().name)
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        try:
            time.sleep(self.delay_s)
            if (x == -1).all(axis=1).any():
                raise RuntimeError("poisoned row")
            return [x * 2 + 1]
        finally:
            with self.lock:
                self.active -= 1


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def _rows(*values: float, width: int = 4) -> tuple[np.ndarray]:
    return (np.array([[v] * width for v in values], np.float32),)


@pytest.mark.parametrize("on_loop", [False, True], ids=["threads", "loop"])
def test_batcher_gathers_concurrent_requests_and_splits_answers(on_loop: bool) -> None:
    engine = _Engine(delay_s=0.01)

    async def main() -> list[list[np.ndarray]]:
        batcher = DynamicBatcher([engine.execute], _model().checker, max_batch=8, max_queue_delay_us=5_000,
                                  on_loop=on_loop)
        answers = await asyncio.gather(*(batcher.submit(_rows(i)) for i in range(20)))
        await batcher.aclose(1)
        return answers

    answers = _run(main())
    for i, outputs in enumerate(answers):
        np.testing.assert_array_equal(outputs[0], _rows(i)[0] * 2 + 1)
    assert sum(engine.calls) == 20 and max(engine.calls) > 1
    assert max(engine.calls) <= 6, "one call never exceeds the profile's 6 rows"


@pytest.mark.parametrize("on_loop", [False, True], ids=["threads", "loop"])
def test_batcher_enqueue_returns_futures_that_one_batch_answers(on_loop: bool) -> None:
    engine = _Engine()

    async def main() -> list[Any]:
        batcher = DynamicBatcher([engine.execute], _model().checker, max_batch=4, max_queue_delay_us=50_000,
                                  on_loop=on_loop)
        futures = [batcher.enqueue(_rows(i)) for i in range(4)]  # no coroutine: futures at once
        assert all(isinstance(f, asyncio.Future) and not f.done() for f in futures)
        answers = await asyncio.gather(*futures)
        await batcher.aclose(1)
        with pytest.raises(RequestError, match="shutting down"):
            batcher.enqueue(_rows(9))
        return answers

    answers = _run(main())
    assert engine.calls == [4], "four requests enqueued in one pass: one full batch, no delay"
    for i, (y,) in enumerate(answers):
        np.testing.assert_array_equal(y, _rows(i)[0] * 2 + 1)


@pytest.mark.parametrize("on_loop", [False, True], ids=["threads", "loop"])
def test_batcher_max_batch_one_runs_each_request_alone(on_loop: bool) -> None:
    engine = _Engine()

    async def main() -> None:
        batcher = DynamicBatcher([engine.execute], _model().checker, max_batch=1, max_queue_delay_us=5_000,
                                  on_loop=on_loop)
        await asyncio.gather(*(batcher.submit(_rows(i)) for i in range(6)))
        await batcher.aclose(1)

    _run(main())
    assert engine.calls == [1] * 6


@pytest.mark.parametrize("on_loop", [False, True], ids=["threads", "loop"])
def test_batcher_groups_by_signature_and_isolates_a_failing_call(on_loop: bool) -> None:
    engine = _Engine(delay_s=0.01)

    async def main() -> list[Any]:
        batcher = DynamicBatcher([engine.execute], _model().checker, max_batch=8, max_queue_delay_us=20_000,
                                  on_loop=on_loop)
        requests = [_rows(1), _rows(2, width=3), _rows(-1, width=3), _rows(4)]
        answers = await asyncio.gather(*(batcher.submit(r) for r in requests), return_exceptions=True)
        await batcher.aclose(1)
        return answers

    ok4, bad3, bad3b, ok4b = _run(main())
    assert isinstance(bad3, RuntimeError) and isinstance(bad3b, RuntimeError)
    np.testing.assert_array_equal(ok4[0], _rows(1)[0] * 2 + 1)
    np.testing.assert_array_equal(ok4b[0], _rows(4)[0] * 2 + 1)
    assert sorted(engine.calls) == [2, 2], "width 4 and width 3 ran as separate calls"


@pytest.mark.parametrize("on_loop", [False, True], ids=["threads", "loop"])
def test_batcher_waits_the_queue_delay_only_when_idle(on_loop: bool) -> None:
    engine = _Engine()

    async def main() -> float:
        batcher = DynamicBatcher([engine.execute], _model().checker, max_batch=8, max_queue_delay_us=100_000,
                                  on_loop=on_loop)
        started = time.perf_counter()
        first = asyncio.ensure_future(batcher.submit(_rows(1)))
        await asyncio.sleep(0.02)
        await asyncio.gather(first, batcher.submit(_rows(2)))
        took = time.perf_counter() - started
        await batcher.aclose(1)
        return took

    took = _run(main())
    assert engine.calls == [2], "the second request joined the first one's batch"
    assert 0.08 < took < 2


def test_batcher_threads_take_batches_while_the_loop_is_busy() -> None:
    """The engine thread takes its next batch itself: it runs every queued request while the
    event loop is blocked (a loop that dispatched batches would have run only the first)."""
    engine = _Engine(delay_s=0.02)

    async def main() -> int:
        batcher = DynamicBatcher([engine.execute], _model().checker, max_batch=2, max_queue_delay_us=0)
        futures = [batcher.enqueue(_rows(i)) for i in range(6)]
        time.sleep(0.4)  # the loop is blocked: it sets no answer and hands out nothing
        ran = sum(engine.calls)
        answers = await asyncio.gather(*futures)
        for i, (y,) in enumerate(answers):
            np.testing.assert_array_equal(y, _rows(i)[0] * 2 + 1)
        await batcher.aclose(1)
        return ran

    assert _run(main()) == 6


def test_batcher_runs_one_thread_per_execute_function() -> None:
    engine = _Engine(delay_s=0.05)

    async def main() -> None:
        batcher = DynamicBatcher([engine.execute] * 3, _model().checker, max_batch=1, max_queue_delay_us=0)
        await asyncio.gather(*(batcher.submit(_rows(i)) for i in range(6)))
        await batcher.aclose(1)

    _run(main())
    assert len(engine.threads) == 3 and engine.most_active == 3


@pytest.mark.parametrize("on_loop", [False, True], ids=["threads", "loop"])
def test_batcher_drains_then_refuses_with_503(on_loop: bool) -> None:
    engine = _Engine(delay_s=0.05)

    async def main() -> tuple[list[Any], Any]:
        batcher = DynamicBatcher([engine.execute], _model().checker, max_batch=2, max_queue_delay_us=0,
                                  on_loop=on_loop)
        pending = [asyncio.ensure_future(batcher.submit(_rows(i))) for i in range(4)]
        await asyncio.sleep(0)
        await batcher.aclose(5)
        with pytest.raises(RequestError, match="shutting down") as refused:
            await batcher.submit(_rows(9))
        return await asyncio.gather(*pending), refused.value.status

    answers, status = _run(main())
    assert len(answers) == 4 and status == 503


@pytest.mark.parametrize("on_loop", [False, True], ids=["threads", "loop"])
def test_batcher_enqueue_call_hands_each_answer_to_its_callback_once(on_loop: bool) -> None:
    """``enqueue_call``: no future; the callback gets the outputs or the engine's error, on the loop,
    once; a request refused by a bounded drain while its call runs is not answered again after."""
    got: dict[int, list[Any]] = {}

    async def main() -> None:
        loop_thread = threading.current_thread()

        def done(i: int, answer: Any) -> None:
            assert threading.current_thread() is loop_thread
            got.setdefault(i, []).append(answer)

        batcher = DynamicBatcher([_Engine().execute], _model().checker, max_batch=2, max_queue_delay_us=0,
                                  on_loop=on_loop)
        for i, rows in enumerate([_rows(1), _rows(-1), _rows(3)]):  # -1 poisons the first call
            batcher.enqueue_call(rows, functools.partial(done, i))
        for _ in range(500):
            if len(got) == 3:
                break
            await asyncio.sleep(0.01)
        await batcher.aclose(1)
        batcher.close()
        slow = DynamicBatcher([_Engine(delay_s=0.3).execute], _model().checker, max_batch=1,
                              max_queue_delay_us=0, on_loop=on_loop)
        slow.enqueue_call(_rows(7), functools.partial(done, 3))
        await asyncio.sleep(0.05)  # threads: its call runs now (the loop: it ran inside the sleep)
        await slow.aclose(0.01)
        await asyncio.sleep(0.5)  # the call ends meanwhile
        slow.close()

    _run(main())
    assert sorted(got) == [0, 1, 2, 3] and all(len(a) == 1 for a in got.values()), got
    assert isinstance(got[0][0], RuntimeError) and isinstance(got[1][0], RuntimeError)  # one call
    np.testing.assert_array_equal(got[2][0][0], _rows(3)[0] * 2 + 1)
    (last,) = got[3]
    if on_loop:  # the loop ran the call before it could drain
        np.testing.assert_array_equal(last[0], _rows(7)[0] * 2 + 1)
    else:
        assert isinstance(last, RequestError) and last.status == 503


def test_batcher_drain_is_bounded() -> None:
    engine = _Engine(delay_s=0.3)

    async def main() -> list[Any]:
        batcher = DynamicBatcher([engine.execute], _model().checker, max_batch=1, max_queue_delay_us=0)
        pending = [asyncio.ensure_future(batcher.submit(_rows(i))) for i in range(3)]
        await asyncio.sleep(0)
        started = time.perf_counter()
        await batcher.aclose(0.1)
        assert time.perf_counter() - started < 0.25
        return await asyncio.gather(*pending, return_exceptions=True)

    late = _run(main())
    assert len(late) == 3 and all(isinstance(e, RequestError) and e.status == 503 for e in late)


def test_batcher_on_loop_runs_calls_on_the_loop_and_answers_before_the_next_call() -> None:
    """No engine thread: every call on the loop's thread. A batch's answers are written before the
    loop starts the next call: their callbacks run, and what those queue for the loop's next pass
    (the engine process's frame writes) runs too."""
    engine = _Engine(delay_s=0.002)
    written: list[int] = []  # calls started when each answer's queued write ran

    async def main() -> None:
        loop = asyncio.get_running_loop()
        batcher = DynamicBatcher([engine.execute], _model().checker, max_batch=2, max_queue_delay_us=0,
                                 on_loop=True)
        futures = [batcher.enqueue(_rows(i)) for i in range(6)]
        for f in futures:
            f.add_done_callback(lambda _: loop.call_soon(lambda: written.append(len(engine.calls))))
        await asyncio.gather(*futures)
        await batcher.aclose(1)

    _run(main())
    assert engine.threads == {threading.main_thread().name} and engine.calls == [2, 2, 2]
    assert written == [1, 1, 2, 2, 3, 3]


def test_batcher_on_loop_waits_the_delay_under_uvloop() -> None:
    """uvloop runs a timer of under half a millisecond at once; the batch still waits its delay."""
    uvloop = pytest.importorskip("uvloop")
    engine = _Engine()
    delay_us = 400

    async def main() -> float:
        batcher = DynamicBatcher([engine.execute], _model().checker, max_batch=8, max_queue_delay_us=delay_us,
                                 on_loop=True)
        started = time.perf_counter()
        await batcher.submit(_rows(1))
        took = time.perf_counter() - started
        await batcher.aclose(1)
        return took

    took = uvloop.run(main())
    assert engine.calls == [1] and took >= delay_us / 1e6


def test_batcher_on_loop_runs_what_came_in_during_a_call_without_the_delay() -> None:
    """A request read right after a call (it reached the socket while the loop was in the call)
    does not wait the queue delay again; the first request, to an idle engine, does."""
    engine = _Engine(delay_s=0.01)

    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        later: list[asyncio.Future[list[Any]]] = []

        def execute(x: np.ndarray) -> list[np.ndarray]:
            if not later:  # read by the loop only once the call is over
                loop.call_soon(lambda: later.extend(batcher.enqueue(_rows(v)) for v in (7, 8)))
            return engine.execute(x)

        batcher = DynamicBatcher([execute], _model().checker, max_batch=8, max_queue_delay_us=200_000,
                                 on_loop=True)
        started = time.perf_counter()
        await batcher.submit(_rows(1))
        first = time.perf_counter() - started
        await asyncio.gather(*later)
        second = time.perf_counter() - started - first
        await batcher.aclose(1)
        return first, second

    first, second = _run(main())
    assert engine.calls == [1, 2]
    assert first >= 0.2 and second < 0.15, (first, second)


@pytest.mark.parametrize(
    ("requests", "most", "calls"),
    [([1, 1, 1], 16, [4]), ([2, 3], 16, [8]), ([1], 16, [1]), ([3], 16, [4]), ([1] * 9, 16, [16]),
     ([9, 9], 16, [16, 16]), ([6, 5], 12, [12]), ([1] * 7, 12, [8])],
    ids=["3->4", "5->8", "1 stays 1", "one request of 3->4", "9->16", "two calls of 9->16",
         "11->12, the profile's most", "7->8"],
)
def test_batcher_pads_rows_to_a_power_of_two_and_drops_the_padding(requests: list[int], most: int,
                                                                   calls: list[int]) -> None:
    engine = _Engine()
    wide = TensorSpec("x", "float32", (-1, -1), True, profiles=(((1, 1), (4, 4), (most, 8)),))
    model = ModelInfo.from_specs("m", [wide], [_Y], max_batch=16)

    async def main() -> list[Any]:
        batcher = DynamicBatcher([engine.execute], model.checker, max_batch=16, max_queue_delay_us=0,
                                 on_loop=True, pad_rows=True)
        futures = [batcher.enqueue(_rows(*[i + r / 10 for r in range(n)])) for i, n in enumerate(requests)]
        answers = await asyncio.gather(*futures)
        await batcher.aclose(1)
        return answers

    answers = _run(main())
    assert engine.calls == calls
    for i, ((y,), n) in enumerate(zip(answers, requests, strict=True)):
        np.testing.assert_array_equal(y, _rows(*[i + r / 10 for r in range(n)])[0] * 2 + 1)


def test_batcher_on_loop_answers_a_batch_whose_call_raised_a_base_exception() -> None:
    """Not an ``Exception`` (an interrupt, an exit): the batch's requests get it, nothing stays
    counted as running, the loop is told (here its exception handler), and the requests that
    were waiting still run."""
    class Fatal(BaseException):
        pass

    engine = _Engine()

    def execute(x: np.ndarray) -> list[np.ndarray]:
        if not engine.calls:
            engine.calls.append(0)
            raise Fatal("stop")
        return engine.execute(x)

    async def main() -> tuple[BaseException | None, list[Any], int, list[Any]]:
        handled: list[Any] = []
        asyncio.get_running_loop().set_exception_handler(lambda _loop, context: handled.append(context))
        batcher = DynamicBatcher([execute], _model().checker, max_batch=1, max_queue_delay_us=0, on_loop=True)
        first, second = batcher.enqueue(_rows(1)), batcher.enqueue(_rows(2))
        try:
            await asyncio.wait_for(first, 2)
        except Fatal as exc:
            got: BaseException | None = exc
        else:
            got = None
        answer = await asyncio.wait_for(second, 2)
        return got, answer, batcher.pending, handled

    got, (y,), pending, handled = _run(main())
    assert isinstance(got, Fatal) and pending == 0
    np.testing.assert_array_equal(y, _rows(2)[0] * 2 + 1)
    assert any(isinstance(c.get("exception"), Fatal) for c in handled)


def test_batcher_on_loop_waits_sub_millisecond_delays_without_polling() -> None:
    """Requests one at a time, each to an idle engine, each waiting its 400 µs delay: the loop
    sleeps through the waits (a loop that polled until each delay ended would spend about the
    whole wait on the CPU)."""
    uvloop = pytest.importorskip("uvloop")
    engine = _Engine()

    async def main() -> tuple[float, float]:
        batcher = DynamicBatcher([engine.execute], _model().checker, max_batch=8, max_queue_delay_us=400,
                                 on_loop=True)
        wall = cpu = 0.0
        for i in range(100):
            await asyncio.sleep(0.002)  # the engine idle again: the request waits its delay
            t0, c0 = time.perf_counter(), time.thread_time()
            await batcher.submit(_rows(i))
            wall, cpu = wall + time.perf_counter() - t0, cpu + time.thread_time() - c0
        await batcher.aclose(1)
        return wall, cpu

    wall, cpu = uvloop.run(main())
    assert wall >= 100 * 400e-6, "each request waited its delay"
    assert cpu < 0.5 * wall, f"the loop's thread was on the CPU {cpu:.3f} s of the {wall:.3f} s waited"


def test_batcher_on_loop_takes_one_execute_function() -> None:
    with pytest.raises(ValueError, match=r"exactly one execute function \(one context\); got 2"):
        DynamicBatcher([_Engine().execute] * 2, _model().checker, max_batch=2, max_queue_delay_us=0,
                       on_loop=True)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"max_batch": 0}, "max_batch must be an integer >= 1; got 0"),
     ({"max_queue_delay_us": -1}, r"max_queue_delay_us must be an integer in \[0, 10000000\]; got -1"),
     ({"max_queue_delay_us": 0.5}, "got 0.5")],
)
def test_batcher_refuses_bad_settings(kwargs: dict[str, Any], match: str) -> None:
    settings = {"max_batch": 4, "max_queue_delay_us": 0, **kwargs}
    with pytest.raises(ValueError, match=match):
        DynamicBatcher([_Engine().execute], _model().checker, **settings)


def test_batcher_skips_requests_whose_caller_went_away() -> None:
    engine = _Engine(delay_s=0.05)

    async def main() -> list[np.ndarray]:
        batcher = DynamicBatcher([engine.execute], _model().checker, max_batch=4, max_queue_delay_us=0)
        first = asyncio.ensure_future(batcher.submit(_rows(1)))
        await asyncio.sleep(0.01)  # the first runs; the next ones wait
        gone = [asyncio.ensure_future(batcher.submit(_rows(v))) for v in (2, 3)]
        kept = asyncio.ensure_future(batcher.submit(_rows(4)))
        await asyncio.sleep(0)
        for task in gone:
            task.cancel()
        answers = [(await first)[0], (await kept)[0]]
        await batcher.aclose(1)
        return answers

    first, kept = _run(main())
    np.testing.assert_array_equal(first, _rows(1)[0] * 2 + 1)
    np.testing.assert_array_equal(kept, _rows(4)[0] * 2 + 1)
    assert engine.calls == [1, 1], "the two cancelled requests never reached the engine"


def test_import_serve_loads_no_http_or_metrics_library() -> None:
    heavy = "('ray', 'starlette', 'uvicorn', 'prometheus_client')"
    code = f"import sys, trt_runtime.serve; print(sorted(m for m in {heavy} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_batcher_close_refuses_what_is_still_queued() -> None:
    engine = _Engine(delay_s=0.2)

    async def main() -> list[Any]:
        batcher = DynamicBatcher([engine.execute], _model().checker, max_batch=1, max_queue_delay_us=0)
        futures = [batcher.enqueue(_rows(i)) for i in range(3)]
        await asyncio.sleep(0.05)  # the first runs, two wait
        await asyncio.get_running_loop().run_in_executor(None, batcher.close)  # from another thread
        return await asyncio.gather(*futures, return_exceptions=True)

    first, *late = _run(main())
    np.testing.assert_array_equal(first[0], _rows(0)[0] * 2 + 1)
    assert all(isinstance(e, RequestError) and e.status == 503 for e in late), late
    assert engine.calls == [1], "the queued requests never reached the engine"


def test_batcher_close_waits_for_the_running_call() -> None:
    engine = _Engine(delay_s=0.2)

    async def main() -> DynamicBatcher:
        batcher = DynamicBatcher([engine.execute], _model().checker, max_batch=1, max_queue_delay_us=0)
        running = asyncio.ensure_future(batcher.submit(_rows(1)))
        await asyncio.sleep(0.05)
        assert not running.done()
        return batcher

    batcher = _run(main())
    started = time.perf_counter()
    batcher.close()
    assert engine.active == 0 and time.perf_counter() - started > 0.1, "close() returned while the call ran"
    batcher.close()  # idempotent
