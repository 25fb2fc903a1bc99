"""``LoopPoller`` and the batcher's polling loop (``poll_us``); the local server's polling options are
run end to end by test_local_server.py's ``loop-polling`` server."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np
import pytest
from _serve_support import rows4_checker

from trt_runtime.errors import SettingsError
from trt_runtime.serve.batcher import DynamicBatcher
from trt_runtime.serve.polling import LoopPoller

uvloop = pytest.importorskip("uvloop")

_checker = rows4_checker


class _Calls:
    """``y = x + 1``, each call's rows recorded."""

    def __init__(self) -> None:
        self.rows: list[int] = []

    def execute(self, x: np.ndarray) -> list[np.ndarray]:
        self.rows.append(int(x.shape[0]))
        return [x + 1]


def test_poller_keeps_the_loop_passing_for_its_window_then_lets_it_sleep() -> None:
    """While polling, the loop passes over its callbacks (and sockets) again and again; once the
    window after the last poke is over it stops, so an idle loop sleeps."""
    async def main() -> tuple[int, int, bool, bool]:
        passes = [0]
        poller = LoopPoller(asyncio.get_running_loop(), 20_000, lambda: passes.__setitem__(0, passes[0] + 1))
        poller.poke()
        assert poller.active
        await asyncio.sleep(0.01)
        during = passes[0]
        await asyncio.sleep(0.05)  # the window ended 20 ms after the poke
        after = passes[0]
        stopped = not poller.active
        await asyncio.sleep(0.02)
        return during, after, stopped, passes[0] == after

    during, after, stopped, still = uvloop.run(main())
    assert during >= 50, f"only {during} passes in the first 10 ms of a 20 ms window"
    assert stopped and still, "the loop kept polling after the window"
    assert after >= during


def test_poller_polls_until_a_later_deadline_and_stops_when_closed() -> None:
    async def main() -> tuple[float, bool]:
        loop = asyncio.get_running_loop()
        poller = LoopPoller(loop, 1_000)
        started = time.perf_counter()
        poller.poke(until=started + 0.03)
        while poller.active:
            await asyncio.sleep(0)
        polled = time.perf_counter() - started
        poller.poke()
        poller.close()
        await asyncio.sleep(0.005)
        return polled, poller.active

    polled, active = uvloop.run(main())
    assert polled >= 0.03, f"polled {polled * 1e3:.1f} ms of a 30 ms deadline"
    assert not active


def test_poller_last_pass_sees_a_deadline_given_as_until(monkeypatch: pytest.MonkeyPatch) -> None:
    """Time passes during a pass: the pass that ends the polling must still run ``on_pass`` at or after
    the deadline (a queue delay's end), or a batch waits for a poke that may never come (a request
    to an idle engine process hung that way once)."""
    import trt_runtime.serve.polling as polling

    clock = [0.0]
    monkeypatch.setattr(polling, "perf_counter", lambda: clock[0])
    seen: list[float] = []

    def on_pass() -> None:
        seen.append(clock[0])
        clock[0] += 0.6  # the pass itself took that long

    async def main() -> bool:
        poller = LoopPoller(asyncio.get_running_loop(), 0, on_pass)
        poller.poke(until=1.0)
        for _ in range(20):
            await asyncio.sleep(0)
        return poller.active

    active = asyncio.run(main())
    assert not active and seen and seen[-1] >= 1.0, seen


def test_poller_stays_usable_after_on_pass_raised() -> None:
    async def main() -> tuple[int, list[Any]]:
        loop = asyncio.get_running_loop()
        errors: list[Any] = []
        loop.set_exception_handler(lambda _loop, context: errors.append(context.get("exception")))
        passes = [0]

        def on_pass() -> None:
            passes[0] += 1
            if passes[0] == 1:
                raise RuntimeError("first pass fails")

        poller = LoopPoller(loop, 2_000, on_pass)
        poller.poke()
        await asyncio.sleep(0.01)
        poller.poke()
        await asyncio.sleep(0.01)
        return passes[0], errors

    passes, errors = asyncio.run(main())
    assert passes > 2 and len(errors) == 1 and isinstance(errors[0], RuntimeError)


@pytest.mark.parametrize("bad", [-1, 1_000_001, 0.5, True, "100"])
def test_poller_and_batcher_refuse_a_bad_window(bad: Any) -> None:
    with pytest.raises(SettingsError, match=r"must be an integer number of µs in \[0, 1000000\]; got "):
        LoopPoller(asyncio.new_event_loop(), bad)
    with pytest.raises(SettingsError, match=r"poll_us must be an integer number of µs"):
        DynamicBatcher([_Calls().execute], _checker(), max_batch=8, max_queue_delay_us=0, on_loop=True,
                       poll_us=bad)


def test_batcher_polls_only_with_its_calls_on_the_loop() -> None:
    with pytest.raises(SettingsError, match="poll_us needs the engine calls on the event loop"):
        DynamicBatcher([_Calls().execute], _checker(), max_batch=8, max_queue_delay_us=0, poll_us=100)


def test_polling_batcher_waits_the_delay_on_its_passes_and_needs_no_alarm_thread() -> None:
    """Requests to an idle engine wait the queue delay together (one call of three), timed by the
    polling loop itself: no alarm thread is started."""
    engine = _Calls()
    delay_us = 3_000

    async def main() -> tuple[list[Any], float, Any]:
        batcher = DynamicBatcher([engine.execute], _checker(), max_batch=8, max_queue_delay_us=delay_us,
                                 on_loop=True, poll_us=500)
        started = time.perf_counter()
        answers = await asyncio.gather(*(batcher.submit((np.full((1, 4), i, np.float32),)) for i in range(3)))
        took = time.perf_counter() - started
        alarm = batcher._alarm
        await batcher.aclose(1)
        return answers, took, alarm

    threads_before = {t.name for t in threading.enumerate()}
    answers, took, alarm = uvloop.run(main())
    assert engine.rows == [3], engine.rows
    for i, (y,) in enumerate(answers):
        np.testing.assert_array_equal(y, np.full((1, 4), i + 1, np.float32))
    assert took >= delay_us / 1e6, f"answered after {took * 1e3:.2f} ms, before the {delay_us} µs delay"
    assert alarm is None
    assert "trt-serve-batch-alarm" not in {t.name for t in threading.enumerate()} - threads_before


def test_polling_batcher_answers_requests_spread_over_time() -> None:
    """Requests that come while the loop polls and after it went back to sleep: all answered,
    each to an idle engine after its delay, none lost between the two."""
    engine = _Calls()

    async def main() -> list[Any]:
        batcher = DynamicBatcher([engine.execute], _checker(), max_batch=8, max_queue_delay_us=200,
                                 on_loop=True, poll_us=1_000)
        answers = []
        for i, pause in enumerate([0, 0.0002, 0.0005, 0.003, 0.0001, 0.01, 0]):
            await asyncio.sleep(pause)
            answers.append(await batcher.submit((np.full((2, 4), i, np.float32),)))
        await batcher.aclose(1)
        return answers

    answers = uvloop.run(main())
    assert engine.rows == [2] * 7
    for i, (y,) in enumerate(answers):
        np.testing.assert_array_equal(y, np.full((2, 4), i + 1, np.float32))
