"""N execution contexts per engine (``contexts=N``), leased to concurrent callers: the
core's :class:`ContextPool` (fairness, timeout, close) and both backends over their test
doubles (one context per lane, settings applied once per context, the cache drained once,
memory arithmetic)."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
from _python_doubles import FakeTorch, _fake_engine, fake_torch_fixture
from _torchbind_doubles import inputs as torchbind_inputs
from _torchbind_doubles import make_backend, source

import trt_runtime
from trt_runtime import (
    CapabilityError,
    ContextLeaseTimeout,
    EngineError,
    EngineSource,
    RuntimeCache,
    RuntimeSettings,
    TensorSpec,
)
from trt_runtime.lease import FAIR_AFTER, ContextPool
from trt_runtime.testing.memory import AffineOutput, MemoryBackend

#: The python backend's doubles report TensorRT-RTX 1.6.1, whose contexts warn (tests/core/test_hazards.py).
pytestmark = pytest.mark.filterwarnings("ignore::trt_runtime.ContextOverlapWarning")

AFFINE = MemoryBackend.build_engine(
    [TensorSpec("x", "float32", (-1, 4), True, profiles=(((1, 4), (2, 4), (8, 4)),))],
    [AffineOutput("y", "x", scale=2.0, bias=1.0)],
    name="affine",
)


def _threads(target: Any, n: int) -> list[threading.Thread]:
    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads


# -- the pool ----------------------------------------------------------------------------------------
def test_lease_pool_hands_out_each_lane_once() -> None:
    pool = ContextPool("e", ["a", "b"])
    assert {pool.acquire(), pool.acquire()} == {"a", "b"}
    with pytest.raises(ContextLeaseTimeout):
        pool.acquire(timeout=0.01)
    pool.release("a")
    assert pool.acquire(timeout=0) == "a"


def test_lease_slot_token_is_one_whatever_gives_it_back() -> None:
    """A slot's token: taken once without waiting, given back once; given back twice it is
    still one (else two callers could lease the lane at once)."""
    from trt_runtime.lease import Slot

    slot = Slot("lane")
    assert slot.take() and not slot.take()
    slot.put()
    slot.put()
    assert slot.take() and not slot.take()
    assert not Slot("lane", held=True).take()


def test_lease_engine_calls_from_threads_never_share_a_lane() -> None:
    """Eight threads calling an engine of two lanes through the inline lease: no lane is
    ever in two calls at once, and every call gets its own answer."""
    engine = MemoryBackend().load_engine(EngineSource(AFFINE))
    engine.contexts = 2
    inside: dict[int, int] = {}
    overlaps: list[int] = []
    guard = threading.Lock()
    for lane in engine._lanes:
        run = lane.ops.run

        def counted(context: Any, call: Any, stream: Any, outputs: Any, run: Any = run, key: int = id(lane)
                    ) -> list[Any]:
            with guard:
                inside[key] = inside.get(key, 0) + 1
                if inside[key] > 1:
                    overlaps.append(key)
            time.sleep(0)  # a switch to another thread in the middle of the call
            try:
                return run(context, call, stream, outputs)  # type: ignore[no-any-return]
            finally:
                with guard:
                    inside[key] -= 1

        lane.ops.run = counted
    wrong: list[float] = []

    def caller(i: int) -> None:
        for n in range(200):
            x = np.full((1, 4), float(i * 1000 + n), np.float32)
            (y,) = engine.execute(x)
            if float(y[0, 0]) != 2.0 * x[0, 0] + 1.0:
                wrong.append(float(y[0, 0]))

    for t in _threads(caller, 8):
        t.join()
    assert overlaps == [] and wrong == []
    assert all(slot.take() for slot in engine._pool._slots)  # every token back


def test_lease_pool_gives_each_thread_its_last_lane_back() -> None:
    pool = ContextPool("e", ["a", "b", "c", "d"])
    seen: dict[int, list[str]] = {}
    barrier = threading.Barrier(3)

    def caller(i: int) -> None:
        mine = seen.setdefault(i, [])
        barrier.wait()
        for _ in range(200):
            lane = pool.acquire()
            mine.append(lane)
            time.sleep(0)  # let the other threads run while this one holds its lane
            pool.release(lane)
            time.sleep(0)

    for t in _threads(caller, 3):
        t.join(10)
    # with lanes enough, every thread keeps the lane it got first
    assert all(len(set(lanes)) == 1 for lanes in seen.values()), {i: set(v) for i, v in seen.items()}
    assert len({lanes[0] for lanes in seen.values()}) == 3


def test_lease_pool_spreads_new_threads_then_falls_back_to_any_free_lane() -> None:
    pool = ContextPool("e", ["a", "b"])
    first = pool.acquire()
    pool.release(first)

    def take() -> str:
        got: list[str] = []
        thread = threading.Thread(target=lambda: got.append(pool.acquire()))
        thread.start()
        thread.join(5)
        return got[0]

    second = take()
    assert second != first  # a new thread takes a lane no thread has claimed yet
    assert take() == first  # none left unclaimed: any free lane, even another thread's
    with pytest.raises(ContextLeaseTimeout):
        pool.acquire(timeout=0)  # this thread's lane is leased by the last thread, and so is the other
    pool.release(second)
    assert pool.acquire(timeout=0) == second


def test_lease_pool_closed_keeps_free_and_returned_lanes() -> None:
    pool = ContextPool("e", ["a", "b"])
    held = pool.acquire()
    pool.close()
    pool.release(held)  # a call that was in flight gives its lane back
    for _ in range(2):
        with pytest.raises(EngineError, match="is closed"):
            pool.acquire(timeout=0)


def test_lease_pool_resize_keeps_held_lanes_and_adds_new_ones() -> None:
    pool = ContextPool("e", ["a", "b"])
    with pool.all_lanes() as lanes:
        assert sorted(lanes) == ["a", "b"]
        pool.resize(["a", "c", "d"])
        with pytest.raises(ContextLeaseTimeout):
            pool.acquire(timeout=0)  # every lane, old and new, is still held
    assert pool.lanes == ("a", "c", "d")
    assert sorted(pool.acquire(timeout=0) for _ in range(3)) == ["a", "c", "d"]
    with pytest.raises(EngineError, match="'b' is not one of its contexts"):
        pool.release("b")


def test_lease_pool_serves_waiters_in_arrival_order() -> None:
    pool = ContextPool("e", ["only"])
    held = pool.acquire()
    order: list[int] = []
    started: list[threading.Event] = [threading.Event() for _ in range(4)]

    def caller(i: int) -> None:
        started[i].set()
        lane = pool.acquire()
        order.append(i)
        time.sleep(0.001)
        pool.release(lane)

    threads = []
    for i in range(4):  # queue them one after the other
        threads += _threads(lambda _, i=i: caller(i), 1)
        started[i].wait()
        time.sleep(FAIR_AFTER * 2)
    pool.release(held)
    for t in threads:
        t.join(5)
    assert order == [0, 1, 2, 3]


def test_lease_timeout_names_the_contexts_and_the_wait() -> None:
    pool = ContextPool("mlp", ["a", "b"])
    pool.acquire()
    pool.acquire()
    with pytest.raises(ContextLeaseTimeout, match=(
        r"engine 'mlp': no execution context free after 0\.0[0-9]+ s \(lease_timeout=0\.02\); "
        r"all 2 context\(s\) are leased by other callers \(0 more waiting\)"
    )) as info:
        pool.acquire(timeout=0.02)
    assert isinstance(info.value, EngineError) and isinstance(info.value, TimeoutError)


def test_lease_close_wakes_waiters_with_an_engine_error() -> None:
    pool = ContextPool("e", ["only"])
    pool.acquire()
    errors: list[BaseException] = []

    def waiter(_: int) -> None:
        try:
            pool.acquire()
        except EngineError as exc:
            errors.append(exc)

    threads = _threads(waiter, 3)
    time.sleep(0.02)
    pool.close()
    for t in threads:
        t.join(5)
    assert len(errors) == 3
    assert all("was closed while this call waited for a context" in str(e) for e in errors)
    with pytest.raises(EngineError, match="is closed"):
        pool.acquire()


# -- engines --------------------------------------------------------------------------------------
@pytest.fixture
def torch(monkeypatch: pytest.MonkeyPatch) -> FakeTorch:
    return fake_torch_fixture(monkeypatch)


def test_lease_python_contexts_are_lanes_of_their_own_trt_engines(torch: FakeTorch) -> None:
    engine = _fake_engine()
    engine.contexts = 3
    assert engine.contexts == 3 and len({id(lane) for lane in engine._lanes}) == 3
    # dynamic shapes: an ICudaEngine per context (tests/backends/python/test_python_lanes.py)
    assert len({id(lane.ops.trt_engine) for lane in engine._lanes}) == 3
    streams = {lane.ops.stream.handle for lane in engine._lanes}
    assert len(streams) == 3  # a stream per context
    barrier = threading.Barrier(3)
    seen: list[int] = []
    lock = threading.Lock()

    def caller(i: int) -> None:
        x = torch.cuda_tensor((2 + i, 4))
        barrier.wait()
        for _ in range(50):
            (y,) = engine.execute(x)
            assert tuple(y.shape) == (2 + i, 4)
        with lock:
            seen.append(i)

    for t in _threads(caller, 3):
        t.join(10)
    assert sorted(seen) == [0, 1, 2]
    assert sum(len(lane.ops.trt_engine.contexts) for lane in engine._lanes) == engine.context_creations <= 3


def test_lease_settings_change_applies_to_every_context_once_and_cache_drains_once(torch: FakeTorch) -> None:
    cache = RuntimeCache()
    cache.load_bytes(b"kernels")
    engine = _fake_engine(settings=RuntimeSettings(runtime_cache=cache))
    engine.contexts = 3
    x = torch.cuda_tensor((2, 4))
    held = [engine._pool.acquire() for _ in range(3)]  # make every lane run once
    for lane in held:
        lane.call((x,), None, None, None)
    for lane in held:
        engine._pool.release(lane)
    assert engine.context_creations == 3 and cache.drain_count == 1
    natives = {lane.context.native_cache for lane in engine._lanes}
    assert len(natives) == 1 and next(iter(natives)).loaded == [b"kernels"]  # one native cache
    engine.runtime_settings = RuntimeSettings("whole_graph_capture", runtime_cache=cache)
    assert not engine.has_context()  # every context dropped, once
    assert all(lane.settings == engine.runtime_settings for lane in engine._lanes)
    engine.execute(x)
    assert engine.context_creations == 4 and cache.drain_count == 1


def test_lease_outer_graph_and_profile_reach_every_context(torch: FakeTorch) -> None:
    engine = _fake_engine()
    engine.contexts = 2
    engine.outer_graph = "view"
    engine.profile = 1
    assert all(lane.outer_graph == engine.outer_graph for lane in engine._lanes) and engine.profile == 1
    first = engine._lanes[0]
    engine.contexts = 4  # new lanes start with the engine's state
    assert all(lane.outer_graph == engine.outer_graph for lane in engine._lanes)
    assert {lane.ops.shared.profile for lane in engine._lanes} == {1}  # one value, the engine's
    engine.contexts = 1
    assert engine.contexts == 1 and engine._lanes == (first,)


def test_lease_close_while_calls_are_in_flight(torch: FakeTorch) -> None:
    engine = _fake_engine()
    x = torch.cuda_tensor((2, 4))
    engine(x)
    release = threading.Event()
    original = engine._lanes[0].fast_entry

    def slow(*args: Any) -> Any:
        release.wait(5)
        return original(*args)

    engine._lanes[0].fast_entry = slow
    results: dict[int, Any] = {}

    def caller(i: int) -> None:
        try:
            results[i] = engine(x)
        except EngineError as exc:
            results[i] = exc

    first = _threads(caller, 1)  # holds the only context
    time.sleep(0.02)
    waiting = [threading.Thread(target=caller, args=(i,)) for i in (1, 2)]
    for t in waiting:
        t.start()
    time.sleep(0.02)
    closer = threading.Thread(target=engine.close)
    closer.start()
    time.sleep(0.02)
    release.set()
    for t in (*first, *waiting, closer):
        t.join(5)
    assert not isinstance(results[0], BaseException)  # the call in flight finished
    assert engine.closed
    for i in (1, 2):  # queued before close: served; or refused with a clear error
        assert not isinstance(results[i], BaseException) or "closed" in str(results[i])
    with pytest.raises(EngineError, match="is closed"):
        engine(x)


def test_lease_memory_usage_counts_one_weights_and_n_activations(torch: FakeTorch) -> None:
    engine = _fake_engine()
    engine.trt_engine.device_memory_size_v2 = 1000
    engine.contexts = 3
    usage = engine.memory_usage()
    assert usage["contexts"] == 3 and usage["activations_per_context"] == 1000
    assert usage["activations_total"] == 3000 and usage["weights"] >= 0
    assert set(usage) == {"weights", "activations_per_context", "activations_total", "contexts"}


def test_lease_torchbind_lanes_are_engines_of_the_same_bytes() -> None:
    backend, _ = make_backend("2.14.0")
    engine = backend.load_engine(source())
    a, b = torchbind_inputs()
    want = engine(a, b).array
    engine.contexts = 2
    natives = {id(lane.ops.native) for lane in engine._lanes}
    assert len(natives) == 2 and all(lane.ops.shared.device == engine.device for lane in engine._lanes)
    held = [engine._pool.acquire() for _ in range(2)]  # each lane runs once
    for lane in held:
        (out,) = lane.call((a, b), None, None, None)
        np.testing.assert_array_equal(out.array, want)
    for lane in held:
        engine._pool.release(lane)
    assert engine.context_creations == 2


def test_lease_contexts_refused_without_the_capability_and_validated() -> None:
    backend = MemoryBackend(without=("supports_multiple_contexts",))
    engine = backend.load_engine(EngineSource(AFFINE))
    with pytest.raises(CapabilityError, match="multiple_contexts"):
        engine.contexts = 2
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match=r"contexts must be an int >= 1; got"):
            engine.contexts = bad  # type: ignore[assignment]
    with pytest.raises(ValueError, match=r"lease_timeout must be None or a number of seconds >= 0; got -1"):
        engine.lease_timeout = -1


def test_lease_load_takes_contexts_and_lease_timeout(tmp_path: Any) -> None:
    path = tmp_path / "affine.plan"
    path.write_bytes(AFFINE)
    engine = trt_runtime.load(path, backend="memory", contexts=3, lease_timeout=0.5)
    assert engine.contexts == 3 and engine.lease_timeout == 0.5  # type: ignore[attr-defined]
    x = np.ones((2, 4), np.float32)
    (y,) = engine.execute(x)
    np.testing.assert_array_equal(y, np.full((2, 4), 3.0, np.float32))
    with pytest.raises(ValueError, match="contexts must be an int >= 1; got 0"):
        trt_runtime.load(path, backend="memory", contexts=0)


def test_lease_calls_stay_right_while_settings_graphs_and_contexts_change() -> None:
    """8 threads call while the main thread changes settings, the outer graph and the number
    of contexts: every result is right, nothing deadlocks, every change waits for calls."""
    engine = MemoryBackend().load_engine(EngineSource(AFFINE))
    errors: list[BaseException] = []
    go = threading.Event()

    def caller(i: int) -> None:
        x = np.full((1 + i % 4, 4), float(i), np.float32)
        want = x * 2.0 + 1.0
        go.wait(5)
        try:
            for _ in range(300):
                (y,) = engine.execute(x)
                assert np.array_equal(y, want), (i, y, want)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = _threads(caller, 8)
    changes = 0
    go.set()
    while changes < 3 or (any(t.is_alive() for t in threads) and changes < 200):
        engine.contexts = 1 + changes % 4
        engine.outer_graph = None if changes % 3 else "copy"
        engine.runtime_settings = RuntimeSettings(
            dynamic_shapes_kernel_specialization_strategy="eager" if changes % 2 else "lazy"
        )
        changes += 1
    for t in threads:
        t.join(30)
    assert errors == [] and changes >= 3
    assert not any(t.is_alive() for t in threads)
    engine.close()
    assert engine.closed and engine.contexts >= 1


def test_lease_python_engine_survives_changes_under_threads(torch: FakeTorch) -> None:
    engine = _fake_engine()
    errors: list[BaseException] = []
    go = threading.Event()

    def caller(i: int) -> None:
        x = torch.cuda_tensor((1 + i % 4, 4))
        go.wait(5)
        try:
            for _ in range(200):
                (y,) = engine.execute(x)
                assert tuple(y.shape) == (1 + i % 4, 4)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = _threads(caller, 8)
    go.set()
    changes = 0
    while changes < 3 or (any(t.is_alive() for t in threads) and changes < 100):
        engine.contexts = 1 + changes % 3
        engine.outer_graph = "view" if changes % 2 else None
        engine.profile = None if changes % 4 else 0
        changes += 1
    for t in threads:
        t.join(30)
    assert errors == []
    engine.close()


def test_lease_writing_a_backend_describes_the_pool_as_it_is() -> None:
    """docs/writing-a-backend.md's account of leasing: per-lane tokens taken without waiting,
    the pool's lock and queue only under contention, and the fairness delay's value."""
    from pathlib import Path

    from trt_runtime.lease import FAIR_AFTER

    page = (Path(__file__).resolve().parents[2] / "docs" / "writing-a-backend.md").read_text()
    step = page.split("**Give the lane back**")[0].split("**Lease an execution context**")[1]
    lease = " ".join(step.split())
    assert "popleft" not in lease
    assert "`Slot.take`" in lease and "`FAIR_AFTER`" in lease
    assert f"{FAIR_AFTER * 1000:g} ms" in lease
