"""What an engine does to each of its lanes (one execution context each), lane by lane, on
the memory backend: changes reach every lane and the lanes ``contexts = N`` makes later;
the engine's counters add the lanes up; ``close()``, the exit-time close and a fork reach
every lane once; a thread's first call runs ``thread_start`` before the fast entry; the
fast entry goes back to ``call_fast`` when the context, the graphs or the wrap change; an
interrupted call gives its lane back; a context that cannot be made fails
``ensure_context()`` with the engine's name and the next attempt makes it."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from _device_doubles import RecordingGuard
from _python_doubles import FakeTorch, _fake_engine, fake_torch_fixture

from trt_runtime import (
    CapabilityError,
    ContextLeaseTimeout,
    EngineError,
    EngineSource,
    OuterGraph,
    RuntimeSettings,
    TensorSpec,
    lease,
)
from trt_runtime import engine as engine_module
from trt_runtime.lane import Lane
from trt_runtime.testing.memory import AffineOutput, MemoryBackend, MemoryEngine, MemoryLane

pytestmark = pytest.mark.filterwarnings("ignore::trt_runtime.ContextOverlapWarning")



@pytest.fixture
def torch(monkeypatch: pytest.MonkeyPatch) -> FakeTorch:
    return fake_torch_fixture(monkeypatch)


X = np.ones((2, 4), np.float32)
Y = np.full((2, 4), 3.0, np.float32)
CAPTURE = RuntimeSettings(cuda_graph_strategy="whole_graph_capture")


class _Recording(MemoryLane):
    """Memory lane ops that count what the core asks of them, keep a plan (a fast entry) for
    calls like their last eager one, and run the engine's ``before_run`` first."""

    engine: _Engine

    def __init__(self, engine: Any, lane: Lane) -> None:
        super().__init__(engine, lane)
        self.counts: Counter[str] = Counter()
        self.plan: Any = None

    def sync(self) -> None:
        self.counts["sync"] += 1
        self._depth()

    def release(self) -> None:
        self.counts["release"] += 1
        self._depth()

    def _depth(self) -> None:
        guard = self.lane.device_guard
        if isinstance(guard, RecordingGuard):
            self.engine.depths.append(guard.depth)

    def after_fork(self) -> None:
        self.counts["after_fork"] += 1

    def thread_start(self) -> None:
        self.counts["thread_start"] += 1
        self.engine.events.append(("thread_start", threading.get_ident(), self.lane))

    def create_context(self, settings: Any, cache: Any) -> Any:
        self._depth()
        if self.engine.fail:
            raise self.engine.fail.pop(0)
        return super().create_context(settings, cache)

    def destroy_context(self, context: Any) -> None:
        self.plan = None  # (what the backend remembered held the context)
        super().destroy_context(context)

    def call_fast(self, inputs: tuple[Any, ...], stream: Any, outputs: Sequence[Any] | None
                  ) -> list[Any] | None:
        if self.plan is None:
            return None
        return self.lane.switch_fast(self.plan, inputs, stream, outputs)

    def run(self, context: Any, call: Any, stream: Any, outputs: Sequence[Any] | None) -> list[Any]:
        before = self.engine.before_run
        if before is not None:
            before(self)
        results = super().run(context, call, stream, outputs)
        if outputs is None:
            self.plan = self._plan(context)
        return results

    def _plan(self, context: Any) -> Any:
        def plan(inputs: tuple[Any, ...], stream: Any, outputs: Sequence[Any] | None) -> list[Any] | None:
            if outputs is not None or self.lane.context is not context:
                return None
            self.engine.events.append(("fast", threading.get_ident(), self.lane))
            return self.finish(context, inputs, self.engine.compute(inputs), None)

        return plan


class _Engine(MemoryEngine):
    lane_type = _Recording
    fail: list[BaseException]
    events: list[tuple[str, int, Lane]]
    before_run: Any
    depths: list[int]


AFFINE = MemoryBackend.build_engine([TensorSpec("x", "float32", (2, 4), is_input=True)],
                                    [AffineOutput("y", "x", scale=2.0, bias=1.0)], name="lanes")


def _engine(contexts: int = 1) -> _Engine:
    backend = MemoryBackend()
    backend.engine_class = _Engine
    engine = backend.load_engine(EngineSource(AFFINE, name="lanes"))
    assert isinstance(engine, _Engine)
    engine.fail, engine.events, engine.before_run, engine.depths = [], [], None, []
    engine.contexts = contexts
    return engine


def _ops(lane: Lane) -> _Recording:
    assert isinstance(lane.ops, _Recording)
    return lane.ops


def _counts(engine: _Engine, what: str) -> list[int]:
    return [_ops(lane).counts[what] for lane in engine._lanes]


def _on_each_lane(engine: _Engine, times: int = 1) -> None:
    """A call on each lane in turn (the lease would give one thread the same lane)."""
    for lane in engine._lanes:
        for _ in range(times):
            np.testing.assert_array_equal(lane.guarded_call(False, (X,), None, None, None)[0], Y)


def _fast(lane: Lane) -> bool:
    """Whether the lane's fast entry is a plan (not the ops' ``call_fast``)."""
    return bool(lane.fast_entry != lane.ops.call_fast)


# -- changes reach every lane, and the lanes made later ------------------------------------------------
def test_engine_lanes_made_later_take_the_settings_the_wrap_and_the_guard() -> None:
    engine = _engine()
    guard = RecordingGuard()
    engine.runtime_settings = CAPTURE
    engine.outer_graph = OuterGraph(outputs="view", max_graphs=2)
    engine._set_device_guard(guard)
    engine.contexts = 3
    for lane in engine._lanes:
        assert lane.settings == CAPTURE and lane.outer_graph == engine.outer_graph
        assert lane.outer_graphs is not None and lane.outer_graphs.cache.max_graphs == 2
        assert lane.device_guard is guard
    _on_each_lane(engine)
    assert engine.context_settings == [CAPTURE] * 3 and engine.graph_captures == 3
    assert engine.graph_stats()["max_graphs"] == 2
    engine.outer_graph = OuterGraph(max_graphs=5)  # and a change after reaches them all
    assert all(lane.outer_graphs is not None and lane.outer_graphs.cache.max_graphs == 5
               for lane in engine._lanes)
    engine.close()
    assert guard.entered == guard.exited


def test_engine_lanes_counters_add_up_every_lane() -> None:
    engine = _engine(contexts=2)
    engine.outer_graph = "copy"
    assert not engine.has_context() and engine.graph_stats()["graphs"] == 0
    _on_each_lane(engine, times=3)
    assert engine.has_context() and engine.context_creations == 2
    assert engine.graph_captures == 2
    stats = engine.graph_stats()
    assert (stats["graphs"], stats["captures"], stats["misses"], stats["hits"]) == (2, 2, 2, 4)
    assert engine.memory_usage()["contexts"] == 2
    # reset_graphs: every lane's graphs go, after its work; the contexts stay
    graphs = [g for lane in engine._lanes for g in _slots_graphs(lane)]
    syncs = _counts(engine, "sync")
    engine.reset_graphs()
    assert all(g.destroyed for g in graphs) and len(graphs) == 2
    assert engine.graph_stats()["graphs"] == 0 and engine.has_context()
    assert all(after > before for after, before in zip(_counts(engine, "sync"), syncs, strict=True))
    # invalidate_context: every lane's context goes
    contexts = [lane.context for lane in engine._lanes]
    engine.invalidate_context()
    assert not engine.has_context() and all(c.destroyed for c in contexts)
    assert engine.context_creations == 2  # made again by the next calls only
    _on_each_lane(engine)
    assert engine.context_creations == 4 and engine.graph_captures == 4


def _slots_graphs(lane: Lane) -> list[Any]:
    outer = lane.outer_graphs
    assert outer is not None
    return [slot.graph for slot in outer.cache.values() if slot.graph is not None]


def test_engine_lanes_synchronize_waits_for_every_lane() -> None:
    engine = _engine(contexts=3)
    engine.synchronize()
    assert _counts(engine, "sync") == [1, 1, 1]


def test_engine_lanes_static_inputs_are_the_first_lanes() -> None:
    engine = _engine(contexts=2)
    engine.outer_graph = "view"
    (static,) = engine.static_inputs((2, 4))
    first, second = (lane.outer_graphs for lane in engine._lanes)
    assert first is not None and second is not None
    assert len(first) == 1 and len(second) == 0
    static[...] = 1.0
    (out,) = engine._lanes[0].guarded_call(False, (static,), None, None, None)
    np.testing.assert_array_equal(out, Y)
    assert engine.static_inputs((2, 4))[0] is static  # the same buffer until the graphs go


@pytest.mark.parametrize("change", [
    pytest.param(lambda e: setattr(e, "runtime_settings", CAPTURE), id="settings"),
    pytest.param(lambda e: setattr(e, "outer_graph", "copy"), id="outer_graph"),
    pytest.param(lambda e: setattr(e, "contexts", 1), id="contexts"),
    pytest.param(lambda e: e.invalidate_context(), id="invalidate_context"),
    pytest.param(lambda e: e.reset_graphs(), id="reset_graphs"),
    pytest.param(lambda e: (e.invalidate_context(), e.ensure_context()), id="ensure_context"),
    pytest.param(lambda e: e.close(), id="close"),
])
def test_engine_lanes_every_change_runs_inside_the_device_guard_on_every_lane(change: Any) -> None:
    engine = _engine(contexts=2)
    guard = RecordingGuard()
    engine._set_device_guard(guard)
    _on_each_lane(engine)
    engine.depths.clear()
    entered = guard.entered
    change(engine)
    assert guard.entered > entered and guard.entered == guard.exited and guard.depth == 0
    assert engine.depths and set(engine.depths) == {1}  # the lanes' work ran inside it, once deep


class _NoGraphs(MemoryLane):
    """Lane ops of a backend that declares ``supports_outer_cuda_graph`` but gives no graphs."""

    def __init__(self, engine: Any, lane: Lane) -> None:
        super().__init__(engine, lane)
        self.graphs = None


def test_engine_lanes_wrap_without_graph_ops_is_refused_not_run_eagerly() -> None:
    backend = MemoryBackend()
    backend.engine_class = type("NoGraphsEngine", (MemoryEngine,), {"lane_type": _NoGraphs})
    engine = backend.load_engine(EngineSource(AFFINE, name="lanes"))
    np.testing.assert_array_equal(engine(X), Y)
    engine.outer_graph = "copy"
    said = r"the 'memory' backend does not support outer_cuda_graph \(its lane ops have no graphs\)"
    with pytest.raises(CapabilityError, match=said):
        engine(X)
    with pytest.raises(CapabilityError, match=said):
        engine.static_inputs((2, 4))
    engine.outer_graph = None
    np.testing.assert_array_equal(engine(X), Y)


# -- the fast entry --------------------------------------------------------------------------------------
@pytest.mark.parametrize("change", [
    pytest.param(lambda e: setattr(e, "runtime_settings", CAPTURE), id="settings"),
    pytest.param(lambda e: setattr(e, "outer_graph", "copy"), id="outer_graph"),
    pytest.param(lambda e: e.invalidate_context(), id="invalidate_context"),
    pytest.param(lambda e: e.reset_graphs(), id="reset_graphs"),
])
def test_engine_lanes_fast_entry_goes_back_to_call_fast_on_every_lane(change: Any) -> None:
    engine = _engine(contexts=2)
    _on_each_lane(engine, times=2)  # the second call switches to the plan the first made
    assert all(_fast(lane) for lane in engine._lanes)
    change(engine)
    assert not any(_fast(lane) for lane in engine._lanes)
    _on_each_lane(engine)  # and the lanes serve on


# -- a thread's first call --------------------------------------------------------------------------------
def test_engine_lanes_thread_start_once_per_thread_and_engine_before_the_fast_entry() -> None:
    a, b = _engine(), _engine()
    a(X)
    a(X)  # the main thread's plan is a's fast entry now
    assert _fast(a._lanes[0])
    seen: dict[str, Any] = {}

    def worker() -> None:
        seen["a"] = [a(X) for _ in range(3)]
        seen["b"] = b(X)
        seen["ident"] = threading.get_ident()

    t = threading.Thread(target=worker)
    t.start()
    t.join(10)
    mine = [(what, lane) for what, ident, lane in a.events if ident == seen["ident"]]
    assert mine[0] == ("thread_start", a._lanes[0]) and mine[1][0] == "fast"
    assert [what for what, _ in mine].count("thread_start") == 1
    assert [what for what, ident, _ in b.events if ident == seen["ident"]].count("thread_start") == 1
    assert _counts(a, "thread_start") == [2]  # the main thread's first call, and the worker's
    a(X)
    assert _counts(a, "thread_start") == [2]


# -- close, exit, fork -------------------------------------------------------------------------------------
def test_engine_lanes_close_releases_every_lane_once() -> None:
    engine = _engine(contexts=3)
    _on_each_lane(engine)
    contexts = [lane.context for lane in engine._lanes]
    engine.close()
    engine.close()
    assert engine.closed and all(lane.closed for lane in engine._lanes)
    assert _counts(engine, "release") == [1, 1, 1] and all(c.destroyed for c in contexts)
    for attempt in (lambda: engine(X), engine.ensure_context, lambda: setattr(engine, "contexts", 2)):
        with pytest.raises(EngineError, match="engine 'lanes' is closed"):
            attempt()


def test_engine_lanes_close_serves_the_calls_queued_before_it_and_refuses_the_later_ones() -> None:
    engine = _engine()
    held = _Held(engine)
    outcome: dict[str, Any] = {}
    threads = []
    steps: Any = (("queued", engine, (X,)), ("close", engine.close, ()), ("later", engine, (X,)))
    for name, target, args in steps:
        threads.append(_start(outcome, name, target, *args))  # each queued before the next starts
        _queued(engine, len(threads))
    held.release()
    for t in threads:
        t.join(10)
    assert (held.outcome == Y).all() and (outcome["queued"] == Y).all()
    assert isinstance(outcome["later"], EngineError)
    assert "engine 'lanes' was closed while this call waited" in str(outcome["later"])
    assert engine.closed


def test_engine_lanes_close_at_exit_marks_every_lane_closed_and_releases_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine(contexts=2)
    _on_each_lane(engine)
    monkeypatch.setattr(engine_module, "exiting", lambda: True)
    engine.close()
    assert engine.closed and all(lane.closed for lane in engine._lanes)
    assert _counts(engine, "release") == [0, 0] and engine.has_context()  # the process releases it


def test_engine_lanes_fork_orphans_every_lane() -> None:
    engine = _engine(contexts=3)
    _on_each_lane(engine)
    engine._orphan_after_fork(4242)
    assert engine.closed and all(lane.closed for lane in engine._lanes)
    assert _counts(engine, "after_fork") == [1, 1, 1]
    with pytest.raises(EngineError, match="loaded in process 4242"):
        engine(X)
    engine.close()  # nothing to do
    assert _counts(engine, "release") == [0, 0, 0]


def test_engine_lanes_python_fork_detaches_every_lanes_finalizer(torch: FakeTorch) -> None:
    engine = _fake_engine()
    engine.contexts = 3
    engine._orphan_after_fork(4242)
    assert [lane.ops._finalizer.alive for lane in engine._lanes] == [False] * 3  # type: ignore[attr-defined]


# -- interrupted calls, leases ---------------------------------------------------------------------------
class _Held:
    """A call on another thread that holds the engine's only lane, inside its run, until
    :meth:`release` (then raises ``then``, if given); its result or error in :attr:`outcome`."""

    def __init__(self, engine: _Engine, then: BaseException | None = None) -> None:
        entered, self.go = threading.Event(), threading.Event()

        def hold(ops: _Recording) -> None:
            engine.before_run = None
            entered.set()
            self.go.wait(5)
            if then is not None:
                raise then

        engine.before_run = hold
        self._outcome: dict[str, Any] = {}
        self.thread = _start(self._outcome, "held", engine, X)
        assert entered.wait(5)

    @property
    def outcome(self) -> Any:
        return self._outcome["held"]

    def release(self) -> None:
        self.go.set()
        self.thread.join(10)


def _start(outcome: dict[str, Any], name: str, fn: Any, *args: Any) -> threading.Thread:
    """``fn(*args)`` on a thread of its own; its result or error goes to ``outcome[name]``."""

    def run() -> None:
        try:
            outcome[name] = fn(*args)
        except BaseException as exc:  # (a KeyboardInterrupt on purpose, too)
            outcome[name] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _queued(engine: _Engine, n: int) -> None:
    """Wait until ``n`` callers wait for the engine's lanes."""
    pause = threading.Event()
    while len(engine._pool.waiters) < n:
        pause.wait(0.001)


def test_engine_lanes_interrupted_call_gives_its_lane_back() -> None:
    engine = _engine()
    guard = RecordingGuard()
    engine._set_device_guard(guard)
    engine.lease_timeout = 2.0

    def interrupt(ops: _Recording) -> None:
        engine.before_run = None
        raise KeyboardInterrupt

    engine.before_run = interrupt
    with pytest.raises(KeyboardInterrupt):
        engine(X)
    assert guard.entered == guard.exited
    outcome: dict[str, Any] = {}
    _start(outcome, "other", engine, X).join(10)  # another thread: the only lane is free
    assert (outcome["other"] == Y).all()
    np.testing.assert_array_equal(engine(X), Y)


def test_engine_lanes_interrupted_call_hands_its_lane_to_a_waiter() -> None:
    engine = _engine()
    held = _Held(engine, then=KeyboardInterrupt())
    outcome: dict[str, Any] = {}
    waiter = _start(outcome, "waiter", engine, X)
    _queued(engine, 1)
    held.release()
    waiter.join(10)
    assert isinstance(held.outcome, KeyboardInterrupt) and (outcome["waiter"] == Y).all()


@pytest.mark.parametrize("handed", [False, True], ids=["waiting", "handed-a-lane"])
def test_engine_lanes_call_interrupted_while_waiting_for_a_lane_leaves_the_queue(
        handed: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C while a call waits for a lane: the call leaves the queue, and a lane handed
    to it just before goes back to the pool (else the engine would wait for it for good)."""
    engine = _engine()
    held = _Held(engine)

    class Interrupted(lease._Waiter):
        """A waiter interrupted in its wait (after the holder handed it the lane, if ``handed``)."""

        def __init__(self) -> None:
            super().__init__()
            real, waiter = self.lock, self

            class Lock:
                def acquire(self, *args: Any, **kwargs: Any) -> bool:
                    if handed:
                        waiter.since -= 1.0  # waited long enough to be handed the lane
                        held.release()
                        assert waiter.slot is not None
                    raise KeyboardInterrupt

                def release(self) -> None:
                    real.release()

            self.lock = Lock()  # type: ignore[assignment]

    monkeypatch.setattr(lease, "_Waiter", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        engine(X)
    monkeypatch.undo()
    assert not engine._pool.waiters
    held.release()
    engine.lease_timeout = 2.0
    np.testing.assert_array_equal(engine(X), Y)
    engine.close()


def test_engine_lanes_lease_timeout_refuses_a_call_while_every_lane_is_busy() -> None:
    engine = _engine()
    held = _Held(engine)
    engine.lease_timeout = 0.05
    with pytest.raises(ContextLeaseTimeout, match=r"engine 'lanes'.*lease_timeout=0\.05"):
        engine(X)
    held.release()
    np.testing.assert_array_equal(engine(X), Y)


# -- a context that cannot be made -----------------------------------------------------------------------
def test_engine_lanes_ensure_context_failure_names_the_engine_and_the_next_attempt_makes_it() -> None:
    engine = _engine()
    engine.fail.append(MemoryError("cudaMalloc: out of memory"))
    with pytest.raises(EngineError, match=r"engine 'lanes': creating an execution context failed "
                                          r"\(MemoryError: cudaMalloc: out of memory\)"):
        engine.ensure_context()
    assert not engine.has_context() and engine.context_creations == 0
    context = engine.ensure_context()
    assert context is engine._lanes[0].context and engine.context_creations == 1
    assert engine.ensure_context() is context


def test_engine_lanes_interrupt_in_context_creation_passes_unchanged() -> None:
    engine = _engine()
    engine.fail.append(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        engine(X)
    assert not engine.has_context()
    np.testing.assert_array_equal(engine(X), Y)
    assert engine.context_creations == 1
