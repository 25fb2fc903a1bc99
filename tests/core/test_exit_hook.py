"""The exit hook (:func:`trt_runtime.lease.hold_lanes_at_exit`) in this process, on a pool of
its own: a caller calling in a loop hands its lane to the hook instead of taking it again,
and a hook that gives up says so on stderr. (``_EXITING`` and ``_POOLS`` are swapped for
fresh ones, so the test process is not left exiting.)"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

import pytest

from trt_runtime import lease
from trt_runtime.lease import EXIT_REPORT_ENV, ContextPool


@pytest.fixture
def fresh_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lease, "_EXITING", threading.Event())
    monkeypatch.setattr(lease, "_POOLS", weakref.WeakSet())


def _start_hook(timeout: float) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}
    hook = threading.Thread(target=lambda: result.setdefault("held", lease.hold_lanes_at_exit(timeout)))
    hook.start()
    deadline = time.monotonic() + 5
    while not lease.exiting() and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(0.05)  # the hook is waiting for the lane
    return hook, result


@pytest.mark.usefixtures("fresh_exit")
def test_exit_hook_takes_the_lane_of_a_call_that_ends_before_the_caller_calls_again() -> None:
    pool = ContextPool("looping", ["lane"])
    slot = pool.lease()  # a daemon thread's call in flight
    hook, result = _start_hook(timeout=5.0)
    # the end of the call, as EngineBase.execute gives the lane back (EngineBase._lease_call) ...
    if pool.waiters:
        pool.give_back(slot)
    else:
        slot.put()
    # ... and the caller's next call, at once: its lane must be the hook's by now (a token
    # given back and free again would go to whichever thread runs first: the caller, mostly)
    again = slot.take()
    if again:
        slot.put()
    hook.join(5)
    assert not again, "the caller took its lane again before the exit hook"
    assert result == {"held": 1}
    with pytest.raises(Exception, match="exiting"):  # not parked: the main thread raises
        pool.acquire()


@pytest.mark.usefixtures("fresh_exit")
def test_exit_hook_names_the_lanes_it_could_not_hold(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(EXIT_REPORT_ENV, "1")
    stuck = ContextPool("stuck-engine", ["a", "b"])
    stuck.lease()  # a call that never returns
    free = ContextPool("idle-engine", ["c"])
    t0 = time.monotonic()
    held = lease.hold_lanes_at_exit(timeout=0.2)
    assert 0.15 < time.monotonic() - t0 < 2.0
    err = capsys.readouterr().err
    assert held == 2
    assert "lanes still in a call after 0.2 s: 'stuck-engine' (1 of 2)" in err
    assert "idle-engine" not in err
    assert "trt_runtime exit hook: held 2 of 3 lane(s) of 2 engine(s) in 0.2" in err
    assert free.closed is False


@pytest.mark.usefixtures("fresh_exit")
def test_exit_hook_is_silent_when_it_holds_everything(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(EXIT_REPORT_ENV, raising=False)
    pool = ContextPool("idle", ["a", "b"])
    assert lease.hold_lanes_at_exit(timeout=1.0) == len(pool) == 2
    assert capsys.readouterr().err == ""
