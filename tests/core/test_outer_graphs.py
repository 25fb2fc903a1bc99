"""The core's outer-graph manager (trt_runtime/outer.py) driven through a test-double backend
whose hooks record what they are asked: first call eager then captured, replays, copy-in
skipping, "view"/"copy", eviction after the lane's work, re-capture after a settings change,
the process-wide capture lock, refusals kept until the graphs go."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from trt_runtime import CapabilityError, OuterGraph
from trt_runtime.engine import EngineBase
from trt_runtime.errors import EngineError, InputError
from trt_runtime.lane import Lane, LaneOps
from trt_runtime.outer import OuterGraphs, default_graph_results
from trt_runtime.protocols import BackendCapabilities, TensorSpec

X = TensorSpec("x", "float32", (-1, 4), True, profiles=(((1, 4), (2, 4), (8, 4)),))
Y = TensorSpec("y", "float32", (-1, 4), False)


class _Backend:
    name = "double"
    capabilities = BackendCapabilities(
        supports_outer_cuda_graph=True, supports_multiple_contexts=True, supports_preallocated_outputs=True,
        supports_dynamic_shapes_kernel_specialization_strategy=True,
    )


class _Graph:
    def __init__(self, fn: Any, context: int) -> None:
        self.fn, self.context, self.destroyed = fn, context, False


class _Ops(LaneOps):
    """One lane's ops: y = 2 * x on numpy "device" buffers; every call is logged as
    (method, detail) in its engine's log."""

    def __init__(self, engine: _Engine, lane: Lane) -> None:
        self.engine = engine
        self.lane = lane
        self.log = engine.log
        self.graphs = self

    def create_context(self, settings: Any, cache: Any) -> int:
        self.engine.contexts_made += 1
        return self.engine.contexts_made

    def destroy_context(self, context: Any) -> None:
        self.log.append(("destroy_context", context))

    def sync(self) -> None:
        self.log.append(("sync", None))

    def run(self, context: Any, call: Any, stream: Any, outputs: Any) -> list[Any]:
        self.log.append(("eager", None))
        return [2 * call[0]]

    # -- the graph ops --
    def graph_call(self, call: Any) -> tuple[Any, list[Any], list[int], Any]:
        shapes = tuple(tuple(a.shape) for a in call)
        return (shapes, 0), list(call), [a.ctypes.data for a in call], None

    def alloc_static(self, shape: tuple[int, ...], spec: Any) -> tuple[Any, int]:
        buffer = np.zeros(shape, np.float32)
        self.log.append(("alloc", spec.name))
        return buffer, buffer.ctypes.data

    def bind_static(self, context: Any, slot: Any) -> None:
        self.log.append(("bind", slot.key))
        self.lane.outer_graphs.alloc_outputs(slot, slot.key[0])

    def enqueue(self, context: Any, slot: Any, stream: Any) -> None:
        self.log.append(("enqueue", stream))
        np.multiply(slot.inputs[0], 2, out=slot.outputs[0])

    def warm_up(self, context: Any, slot: Any, stream: Any) -> None:
        self.enqueue(context, slot, stream)

    def capture(self, fn: Any, stream: Any, slot: Any) -> tuple[_Graph, None]:
        self.log.append(("capture", stream))
        if self.engine.capture_hold is not None:
            self.engine.capture_hold.wait(0.3)
        if self.engine.fail_capture is not None:
            raise self.engine.fail_capture
        return _Graph(fn, self.lane.context), None

    def launch(self, graph: _Graph, stream: Any) -> None:
        assert not graph.destroyed and graph.context == self.lane.context
        self.log.append(("launch", stream))
        graph.fn("replay")

    def copy(self, dst: Any, src: Any, nbytes: int, stream: Any) -> None:
        self.log.append(("copy", nbytes))
        np.copyto(dst, src)

    def destroy_graph(self, graph: _Graph) -> None:
        graph.destroyed = True
        self.log.append(("destroy_graph", graph))

    def graph_enter(self, stream: Any, call: Any) -> Any:
        self.log.append(("enter", stream))
        return f"token:{stream}"

    def graph_exit(self, stream: Any) -> None:
        self.log.append(("exit", stream))

    def graph_capturable(self) -> bool:
        return True

    def input_views(self, slot: Any, as_torch: Any) -> list[Any]:
        return list(slot.inputs)

    def graph_results(self, context: Any, slot: Any, call: Any, outputs: Any, view: bool, stream: Any
                      ) -> list[Any]:
        return default_graph_results(self, self.engine.outputs, slot, outputs, view, stream)


class _Engine(EngineBase):
    """The engine of :class:`_Ops` lanes (``ops_type``)."""

    ops_type: type[_Ops] = _Ops

    def __init__(self, log: list[tuple[str, Any]] | None = None, settings: Any = None) -> None:
        self.log: list[tuple[str, Any]] = [] if log is None else log
        self.contexts_made = 0
        self.fail_capture: Exception | None = None
        self.capture_hold: threading.Event | None = None
        super().__init__(_Backend(), name="double", inputs=[X], outputs=[Y], settings=settings)  # type: ignore[arg-type]

    def _new_ops(self, lane: Lane) -> Any:
        return self.ops_type(self, lane)


def _ops(engine: _Engine, i: int = 0) -> Any:
    return engine._lanes[i].ops


def _outer(engine: _Engine, i: int = 0) -> OuterGraphs:
    outer = engine._lanes[i].outer_graphs
    assert outer is not None
    return outer


def _hooks(engine: _Engine, *names: str) -> list[str]:
    return [name for name, _ in engine.log if not names or name in names]


def _x(rows: int = 2, value: float = 1.0) -> Any:
    return np.full((rows, 4), value, np.float32)


def test_outer_graphs_first_call_runs_eagerly_then_captures_and_later_calls_launch() -> None:
    engine = _Engine()
    engine.outer_graph = True
    engine.log.clear()
    (y,) = engine.execute(_x(2, 1.0), stream="s")
    np.testing.assert_array_equal(y, np.full((2, 4), 2.0))  # the warm-up's result
    assert _hooks(engine) == [
        "enter", "alloc", "copy", "bind", "alloc", "enqueue", "capture", "alloc", "copy", "exit",
    ]  # static input; copy-in; static output (bind); warm-up; capture; "copy": a new output
    assert engine.log[5] == ("enqueue", "token:s")  # the warm-up, on the call's stream
    assert engine.graph_captures == 1 and engine.graph_stats()["captures"] == 1
    engine.log.clear()
    (y2,) = engine.execute(_x(2, 3.0), stream="s")
    assert _hooks(engine) == ["enter", "copy", "launch", "enqueue", "alloc", "copy", "exit"]
    assert engine.log[3] == ("enqueue", "replay")  # the captured enqueue, replayed
    np.testing.assert_array_equal(y2, np.full((2, 4), 6.0))
    np.testing.assert_array_equal(y, np.full((2, 4), 2.0))  # "copy": the first result stays
    assert engine.graph_captures == 1 and engine.graph_stats()["hits"] == 1


def test_outer_graphs_view_returns_the_static_outputs_copy_returns_new_arrays() -> None:
    engine = _Engine()
    engine.outer_graph = "view"
    (a,) = engine.execute(_x(2, 1.0))
    (b,) = engine.execute(_x(2, 2.0))
    assert a is b and a is _outer(engine).cache.peek((((2, 4),), 0)).outputs[0]
    engine.outer_graph = "copy"
    (c,) = engine.execute(_x(2, 1.0))
    (d,) = engine.execute(_x(2, 2.0))
    assert c is not d and c is not a
    np.testing.assert_array_equal(c, np.full((2, 4), 2.0))


def test_outer_graphs_preallocated_outputs_are_written_from_the_static_outputs() -> None:
    engine = _Engine()
    engine.outer_graph = "view"
    y = np.zeros((2, 4), np.float32)
    engine.execute(_x(2, 1.0))
    assert engine.execute(_x(2, 5.0), outputs=[y])[0] is y
    np.testing.assert_array_equal(y, np.full((2, 4), 10.0))


def test_outer_graphs_static_inputs_skip_the_copy_in() -> None:
    engine = _Engine()
    engine.outer_graph = "view"  # nothing copied out either: every copy is a copy-in
    (static,) = engine.static_inputs((2, 4))
    static[...] = 4.0
    engine.log.clear()
    (y,) = engine.execute(static)  # handed out before the capture: the capture reads it
    assert "copy" not in _hooks(engine) and engine.graph_captures == 1
    np.testing.assert_array_equal(y, np.full((2, 4), 8.0))
    engine.log.clear()
    engine.execute(static)
    engine.execute(static[:, :])  # another array at the same address
    assert _hooks(engine, "copy", "launch") == ["launch", "launch"]
    engine.execute(_x(2))
    assert _hooks(engine, "copy", "launch") == ["launch", "launch", "copy", "launch"]
    assert engine.static_inputs((2, 4))[0] is static


def test_outer_graphs_evict_the_least_recently_used_after_the_lanes_work() -> None:
    engine = _Engine()
    engine.outer_graph = OuterGraph(max_graphs=2)
    for rows in (1, 2, 1):
        engine.execute(_x(rows))
    (two,) = [s.graph for s in _outer(engine).cache.values() if s.key[0] == ((2, 4),)]
    engine.log.clear()
    engine.execute(_x(3))  # 2 was used least recently: it goes, after a sync
    names = _hooks(engine)
    assert names.index("sync") < names.index("destroy_graph") and two.destroyed
    stats = engine.graph_stats()
    assert stats == {"graphs": 2, "hits": 1, "misses": 3, "captures": 3, "evictions": 1, "updates": 0,
                     "max_graphs": 2}
    engine.execute(_x(2))  # captured again
    assert engine.graph_captures == 4 and engine.graph_stats()["evictions"] == 2


def test_outer_graphs_recaptured_after_a_settings_change() -> None:
    engine = _Engine()
    engine.outer_graph = True
    engine.execute(_x())
    (slot,) = _outer(engine).cache.values()
    first = slot.graph
    engine.runtime_settings = {"dynamic_shapes_kernel_specialization_strategy": "eager"}
    assert first.destroyed and len(_outer(engine)) == 0
    names = _hooks(engine)
    assert names.index("sync") < names.index("destroy_graph") < names.index("destroy_context")
    engine.execute(_x())
    assert engine.graph_captures == 2 and engine.context_creations == 2
    (slot,) = _outer(engine).cache.values()
    assert slot.graph.context == 2  # captured in the new context
    engine.reset_graphs()
    engine.execute(_x())
    assert engine.graph_captures == 3 and engine.context_creations == 2


def test_outer_graphs_a_refused_capture_is_kept_until_the_graphs_are_dropped() -> None:
    engine = _Engine()
    engine.outer_graph = True
    engine.fail_capture = CapabilityError("cannot capture this context")
    with pytest.raises(CapabilityError, match="cannot capture this context"):
        engine.execute(_x(2))
    assert _hooks(engine)[-1] == "exit"  # the caller's stream is ordered after a failure too
    engine.log.clear()
    with pytest.raises(CapabilityError, match="cannot capture this context"):
        engine.execute(_x(3))  # known: not tried again
    assert "capture" not in _hooks(engine) and engine.graph_captures == 0
    engine.fail_capture = None
    engine.reset_graphs()
    engine.execute(_x(3))
    assert engine.graph_captures == 1
    engine.fail_capture = EngineError("a one-off failure")  # not a CapabilityError: tried again
    with pytest.raises(EngineError):
        engine.execute(_x(4))
    engine.fail_capture = None
    engine.execute(_x(4))
    assert engine.graph_captures == 2


def test_outer_graphs_capture_lock_serializes_captures_of_two_lanes() -> None:
    engine = _Engine()
    engine.contexts = 2
    engine.outer_graph = True
    lanes = engine._lanes
    inside = []
    active = [0]
    guard = threading.Lock()
    arrived = threading.Event()

    def capturing(lane: Lane) -> None:
        ops = lane.ops
        original = ops.capture

        def capture(fn: Any, stream: Any, slot: Any) -> Any:
            with guard:
                active[0] += 1
                inside.append(active[0])
            arrived.set()
            time.sleep(0.05)
            try:
                return original(fn, stream, slot)
            finally:
                with guard:
                    active[0] -= 1

        ops.capture = capture

    for lane in lanes:
        capturing(lane)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            engine.execute(_x(2))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert errors == []
    assert engine.graph_captures == 2 and sorted(inside) == [1, 1], "two captures ran at once"


def test_outer_graphs_capture_lock_is_the_cores_one_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    from _recording_lock import RecordingLock

    from trt_runtime import outer

    lock = RecordingLock()
    monkeypatch.setattr(outer, "CAPTURE_LOCK", lock)
    engine = _Engine()
    engine.outer_graph = True
    engine.execute(_x(2))
    engine.execute(_x(2))  # a replay takes no lock
    assert lock.held == [True, False]


def test_outer_graphs_slot_kept_when_binding_dropped_the_graphs() -> None:
    # The python backend grows a context's memory in bind_static, which drops every graph
    # (they hold the old address): the slot being captured must stay in the cache.
    class _GrowsOps(_Ops):
        def bind_static(self, context: Any, slot: Any) -> None:
            self.sync()
            self.lane.drop_graphs()
            super().bind_static(context, slot)

    class _Grows(_Engine):
        ops_type = _GrowsOps

    engine = _Grows()
    engine.outer_graph = True
    engine.execute(_x(2))
    engine.execute(_x(2))
    assert len(_outer(engine)) == 1 and engine.graph_captures == 1
    assert _hooks(engine).count("launch") == 1


def test_outer_graphs_released_on_close() -> None:
    engine = _Engine()
    engine.outer_graph = True
    engine.execute(_x(2))
    (slot,) = _outer(engine).cache.values()
    graph = slot.graph
    engine.close()
    assert graph.destroyed and len(_outer(engine)) == 0


def test_outer_graphs_capture_runs_with_the_garbage_collector_off() -> None:
    """A collection inside a capture could finalize an unrelated TensorRT object on the
    capturing thread (its destructor's free invalidates the capture): the collector is off
    while the backend captures, back on after, also when the capture fails."""
    import gc

    engine = _Engine()
    seen: list[bool] = []
    capture = _ops(engine).capture

    def spying(fn: Any, stream: Any, slot: Any) -> Any:
        seen.append(gc.isenabled())
        return capture(fn, stream, slot)

    _ops(engine).capture = spying
    engine.outer_graph = True
    assert gc.isenabled()
    engine.execute(_x())
    assert seen == [False] and gc.isenabled()
    engine.reset_graphs()
    engine.fail_capture = RuntimeError("capture failed")
    with pytest.raises(RuntimeError, match="capture failed"):
        engine.execute(_x())
    assert seen == [False, False] and gc.isenabled()
    gc.disable()
    try:  # a caller that had it off keeps it off
        engine.fail_capture = None
        engine.execute(_x(3))
        assert not gc.isenabled()
    finally:
        gc.enable()


# -- copies as graph nodes (trt_runtime.graphs.build_copy_nodes) -------------------------------
class _NodeRecorder:
    """cuda-python's runtime for build_copy_nodes: records calls; ``refuse`` fails one."""

    cudaMemcpyKind = type("cudaMemcpyKind", (), {"cudaMemcpyDeviceToDevice": 3})

    def __init__(self, refuse: str | None = None) -> None:
        self.refuse = refuse
        self.calls: list[tuple[Any, ...]] = []
        self._ids = iter(range(100, 10**6))

    def _made(self, name: str, *args: Any) -> tuple[int, Any]:
        self.calls.append((name, *args))
        return (1, None) if name == self.refuse else (0, next(self._ids))

    def cudaGraphCreate(self, flags: int) -> Any:
        return self._made("create")

    def cudaGraphAddMemcpyNode1D(self, graph: int, deps: Any, n: int, dst: int, src: int, nbytes: int,
                                 kind: int) -> Any:
        return self._made("memcpy", tuple(deps or ()), dst, src, nbytes)

    def cudaGraphAddChildGraphNode(self, graph: int, deps: Any, n: int, child: Any) -> Any:
        return self._made("child", tuple(deps), child)

    def cudaGraphInstantiate(self, graph: int, flags: int) -> Any:
        return self._made("instantiate", graph)

    def cudaGraphExecMemcpyNodeSetParams1D(self, graph_exec: int, node: int, dst: int, src: int,
                                           nbytes: int, kind: int) -> tuple[int]:
        self.calls.append(("set", node, dst, src, nbytes))
        return (1,) if self.refuse == "set" else (0,)

    def cudaGraphDestroy(self, graph: int) -> tuple[int]:
        self.calls.append(("destroy", graph))
        return (0,)

    def cudaGraphExecDestroy(self, graph_exec: int) -> tuple[int]:
        self.calls.append(("destroy exec", graph_exec))
        return (0,)


def test_build_copy_nodes_topology_and_refusals() -> None:
    """memcpy in (static input <- placeholder) for each input, the captured graph as a child
    after them, memcpy out (placeholder <- static output) after it; the placeholder as large
    as the largest buffer and held until instantiated. None, with the built graph destroyed,
    when CUDA refuses a step; None without asking for memory when a call is missing, there is
    no input or a buffer is empty."""
    from trt_runtime.graphs import build_copy_nodes

    asked: list[int] = []

    def placeholder(nbytes: int) -> tuple[Any, int]:
        asked.append(nbytes)
        return bytearray(nbytes), 7

    rt = _NodeRecorder()
    made = build_copy_nodes(rt, "captured", [(1000, 64), (2000, 32)], [(3000, 128)], placeholder, 3)
    assert made is not None and asked == [128]
    _create, in0, in1, child, out, inst = rt.calls
    assert in0[1:] == ((), 1000, 7, 64) and in1[1:] == ((), 2000, 7, 32)
    assert child[1:] == ((101, 102), "captured") and out[1:] == ((103,), 7, 3000, 128)
    assert (made.ins, made.outs, made.exec, inst[1]) == ([101, 102], [104], 105, 100)
    made.destroy()
    assert rt.calls[-2:] == [("destroy exec", 105), ("destroy", 100)]
    for step in ("memcpy", "child", "instantiate"):
        rt = _NodeRecorder(refuse=step)
        assert build_copy_nodes(rt, "captured", [(1000, 64)], [(3000, 128)], placeholder, 3) is None
        assert rt.calls[-1] == ("destroy", 100), step
    asked.clear()
    rt = _NodeRecorder()
    rt.cudaGraphExecMemcpyNodeSetParams1D = None  # type: ignore[assignment,method-assign]  # an older runtime
    assert build_copy_nodes(rt, "captured", [(1000, 64)], [], placeholder, 3) is None
    rt = _NodeRecorder()
    assert build_copy_nodes(rt, "captured", [], [(3000, 128)], placeholder, 3) is None
    assert build_copy_nodes(rt, "captured", [(1000, 0)], [], placeholder, 3) is None
    assert build_copy_nodes(rt, "captured", [(1000, 64)], [(3000, 0)], placeholder, 3) is None
    assert asked == [] and rt.calls == []


def test_copy_nodes_point_sets_only_what_changed() -> None:
    """CopyNodes.point sets a node only when the side that changes per call (an input node's
    source, an output node's destination) differs from what it has; a refused address is
    reported and forgotten, so the next call sets it again."""
    from trt_runtime.graphs import build_copy_nodes

    rt = _NodeRecorder()
    made = build_copy_nodes(rt, "captured", [(1000, 64)], [(3000, 64)], lambda n: (None, 7), 3)
    assert made is not None
    (node_in,), (node_out,) = made.ins, made.outs
    rt.calls.clear()
    assert made.point(0, 1000, 5000, 64) and made.point(1, 6000, 3000, 64)
    assert made.point(0, 1000, 5000, 64) and made.point(1, 6000, 3000, 64)  # unchanged: no call
    assert made.point(0, 1000, 5100, 64)  # a new input buffer
    assert rt.calls == [("set", node_in, 1000, 5000, 64), ("set", node_out, 6000, 3000, 64),
                        ("set", node_in, 1000, 5100, 64)]
    rt.refuse = "set"
    assert not made.point(1, 6100, 3000, 64) and made.last[1] is None
    rt.refuse = None
    assert made.point(1, 6000, 3000, 64) and rt.calls[-1] == ("set", node_out, 6000, 3000, 64)


def test_outer_graphs_outputs_that_are_not_a_list_or_tuple_are_refused() -> None:
    """The core's general path names the type of an ``outputs=`` it cannot index, outer
    graph or not, before any hook runs."""
    engine = _Engine()
    for outer in (None, True):
        engine.outer_graph = outer
        engine.log.clear()
        with pytest.raises(InputError, match=r"outputs= must be a list or tuple of arrays, one per output; "
                                             r"got ndarray"):
            engine.execute(_x(2), outputs=np.zeros((2, 4), np.float32))
        assert _hooks(engine) == []
