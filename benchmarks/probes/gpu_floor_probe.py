"""How close can a thread-safe pure-Python call come to the raw loops' floors, beside ours?

Run on the GPU host (tensorrt_rtx, cuda-python, torch with CUDA)::

    python3 benchmarks/probes/gpu_floor_probe.py [--out DIR] [--workloads tiny] [--repeats 60] [--number 40]

The per-call targets ask the python backend's outer replay to cost at most 1.5 µs (or 1.10x) more
than a bare ``torch.cuda.CUDAGraph.replay()``, and its pre-bound ``execute`` at most 1.5 µs
(or 1.10x) more than a bare ``execute_async_v3``. This probe times, interleaved in one
process (as ``benchmarks/probes/gpu_step_costs.py`` does), the floors, our calls, and *minimal* calls:
the least a runtime written in Python must do per call to be safe when threads share an
engine, written as tightly as Python allows (a closure, every constant a local):

* a lease: one ``threading.Lock`` taken without blocking and given back;
* the input checked to be what the graph or the bindings were made for (type, dtype,
  contiguity, address, shape; for the pre-bound call, the very arrays at their addresses
  and shapes);
* the caller's stream (torch's current one; for the pre-bound call, the ``stream=`` given);
* the launch or enqueue, and the outputs handed back.

Statements (µs per call, median of ``--repeats`` samples of ``--number`` calls):

* ``replay: torch CUDAGraph.replay()`` / ``replay: cuda-python launch``: the floors;
* ``replay: minimal`` (one frame) and ``replay: minimal, entry + plan`` (the same work in
  two frames, as a core entry calling a backend's plan is);
* ``replay: ours o(s)``: ``engine(s)`` under ``enable_cudagraphs(engine, outer="view")``;
* ``pre: execute_async_v3``, ``pre: minimal`` (keyword arguments as the user passes them),
  ``pre: ours e.execute(x, outputs=[y], stream=s)``;
* ``launch:`` the cuda-python launch alone of the raw graph and of ours, on our stream and on
  the legacy one; ``nodes:`` the node count of a graph captured from each context.

Then the pieces of our replay plan alone (``piece:``: the lease's thread-local read, a lock,
the LRU touch, the caller's stream, the input checks, the shape and device reads), and our
plain replay plan called as the entry calls it (``plan: ours``). (The probe once also
compiled the plan's generated source again without each piece; the plans are closures now,
with no source to take apart.)

Writes ``floor_probe.json`` to ``--out``.
"""

from __future__ import annotations

import sys
from pathlib import Path
import threading
from typing import Any

# _gpu_tool (the GPU tools' --out and JSON helpers) is shared with tools/.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import _gpu_tool  # noqa: E402
from gpu_step_costs import _raw_side, raw_graph, timed_then


def minimal_replay(torch: Any, launch: Any, graph: Any, static: Any, views: list[Any], device: int) -> Any:
    """The least a thread-safe replay in Python does (see the module docstring)."""
    lock = threading.Lock()
    acquire, release = lock.acquire, lock.release
    tensor, dtype, ptr, shape = torch.Tensor, static.dtype, static.data_ptr(), static.shape
    raw_stream = torch._C._cuda_getCurrentRawStream

    def call(x: Any) -> Any:
        if not acquire(False):
            raise RuntimeError("busy")
        try:
            if (type(x) is not tensor or x.dtype is not dtype or not x.is_contiguous()
                    or x.data_ptr() != ptr or x.shape != shape):
                raise ValueError("not the static buffer")
            (err,) = launch(graph, raw_stream(device))
            if err:
                raise RuntimeError(err)
            return views[0]
        finally:
            release()
    return call


def split_replay(torch: Any, launch: Any, graph: Any, static: Any, views: list[Any], device: int) -> Any:
    """:func:`minimal_replay`'s work in two frames: an entry (lease) calling a plan (the rest)."""
    lock = threading.Lock()
    acquire, release = lock.acquire, lock.release
    tensor, dtype, ptr, shape = torch.Tensor, static.dtype, static.data_ptr(), static.shape
    raw_stream = torch._C._cuda_getCurrentRawStream

    def plan(inputs: tuple[Any, ...], stream: Any, outputs: Any) -> Any:
        if outputs is not None or len(inputs) != 1:
            return None
        x, = inputs
        if (type(x) is not tensor or x.dtype is not dtype or not x.is_contiguous()
                or x.data_ptr() != ptr or x.shape != shape):
            return None
        (err,) = launch(graph, raw_stream(device) if stream is None else stream)
        if err:
            raise RuntimeError(err)
        return list(views)

    def entry(*inputs: Any, stream: Any = None, outputs: Any = None) -> Any:
        if not acquire(False):
            raise RuntimeError("busy")
        try:
            result = plan(inputs, stream, outputs)
        finally:
            release()
        return result[0] if len(result) == 1 else tuple(result)
    return entry


def minimal_prebound(execute: Any, x: Any, y: Any, own: Any, handle: int) -> Any:
    """The least a thread-safe pre-bound ``execute(x, outputs=[y], stream=s)`` does."""
    lock = threading.Lock()
    acquire, release = lock.acquire, lock.release
    px, py, sx, sy = x.data_ptr(), y.data_ptr(), x.shape, y.shape

    def call(*inputs: Any, stream: Any = None, outputs: Any = None) -> Any:
        if not acquire(False):
            raise RuntimeError("busy")
        try:
            if outputs is None or len(inputs) != 1 or len(outputs) != 1:
                raise ValueError("arity")
            x0, = inputs
            y0, = outputs
            if x0 is not x or y0 is not y or x0.data_ptr() != px or y0.data_ptr() != py \
                    or x0.shape != sx or y0.shape != sy:
                raise ValueError("not the bound arrays")
            if stream is not own:
                raise ValueError("another stream")
            if not execute(handle):
                raise RuntimeError("execute_async_v3 returned False")
            return [y0]
        finally:
            release()
    return call


def count_nodes(rt: Any, context: Any, stream: int) -> int:
    """The nodes of a graph captured (with cuda-python) from one ``execute_async_v3`` of
    ``context`` on ``stream``."""
    _gpu_tool.ok(rt.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
    mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
    _gpu_tool.ok((rt.cudaStreamBeginCapture(stream, mode)[0], None), "cudaStreamBeginCapture")
    try:
        context.execute_async_v3(stream)
    finally:
        graph = _gpu_tool.ok(rt.cudaStreamEndCapture(stream), "cudaStreamEndCapture")
    try:
        return int(_gpu_tool.ok(rt.cudaGraphGetNodes(graph, 0), "cudaGraphGetNodes")[1])
    finally:
        rt.cudaGraphDestroy(graph)


def cycle_floors(key: str, torch: Any, built: Any, workload: Any, tensors: Any, repeats: int, number: int
                 ) -> dict[str, float]:
    """A workload of several shapes fed in turn: a bare ``CUDAGraph.replay()`` per shape (a
    context and graph each, as bench_all's ``raw-graph-replay``) against ``o(s)`` with the
    static input of each shape, and a minimal replay that finds the graph by the shape."""
    from cuda.bindings import runtime as rt

    from benchmarks import raw_rows
    from trt_runtime import EngineSource, enable_cudagraphs, get_backend

    raw = raw_rows.open_engine(built.plan)
    side = torch.cuda.Stream()
    keep: list[Any] = [raw]
    graphs = []
    for x, y in zip(tensors.inputs, tensors.outputs, strict=True):
        rc, memory, _ = raw_rows.new_context(raw, torch, workload.shapes)
        rc.set_input_shape(raw.input_name, tuple(x.shape))
        rc.set_tensor_address(raw.input_name, x.data_ptr())
        rc.set_tensor_address(raw.output_name, y.data_ptr())
        graph = raw_graph(torch, rc, side)
        keep += [rc, memory, graph]
        graphs.append(graph)
    outer = get_backend("python").load_engine(EngineSource(built.plan, name=f"{key}-floor-outer"))
    wrap = enable_cudagraphs(outer, outer="view")
    wrap.__enter__()
    statics = []
    for x in tensors.inputs:
        (s,) = outer.static_inputs(tuple(x.shape), as_torch=True)
        s.copy_(x)
        statics.append(s)
    for _ in range(3):
        for s in statics:
            outer(s)
    torch.cuda.synchronize()
    device = torch.cuda.current_device()
    by_shape = {x.shape: (rt.cudaGraphExec_t(int(g.raw_cuda_graph_exec())), x, y)
                for g, x, y in zip(graphs, tensors.inputs, tensors.outputs, strict=True)}
    minimal = minimal_cycle(torch, rt.cudaGraphLaunch, by_shape, device)
    ns: dict[str, Any] = {"tgs": graphs, "o": outer, "ss": statics, "xs": tensors.inputs, "n": len(graphs),
                          "it": iter(range(1 << 62)), "md": minimal}
    stmts = {
        "cycle: torch CUDAGraph.replay()": "tgs[next(it) % n].replay()",
        "cycle: minimal (graph by shape)": "md(xs[next(it) % n])",
        "cycle: ours o(s)": "o(ss[next(it) % n])",
    }
    return timed_then(stmts, ns, torch, repeats, number, keep.clear, lambda: wrap.__exit__(None, None, None),
                      outer.close)


def minimal_cycle(torch: Any, launch: Any, by_shape: dict[Any, Any], device: int) -> Any:
    """:func:`minimal_replay` for several shapes: the graph, buffer and output found by the
    input's shape (one dict lookup)."""
    lock = threading.Lock()
    acquire, release = lock.acquire, lock.release
    tensor = torch.Tensor
    raw_stream = torch._C._cuda_getCurrentRawStream
    table = {shape: (graph, x.dtype, x.data_ptr(), y) for shape, (graph, x, y) in by_shape.items()}

    def call(x: Any) -> Any:
        if not acquire(False):
            raise RuntimeError("busy")
        try:
            entry = table.get(x.shape) if type(x) is tensor else None
            if entry is None or x.dtype is not entry[1] or not x.is_contiguous() or x.data_ptr() != entry[2]:
                raise ValueError("not a static buffer")
            (err,) = launch(entry[0], raw_stream(device))
            if err:
                raise RuntimeError(err)
            return entry[3]
        finally:
            release()
    return call


def workload_floors(key: str, torch: Any, repeats: int, number: int) -> dict[str, float]:
    from benchmarks import workloads
    from trt_runtime import EngineSource, enable_cudagraphs, get_backend
    from trt_runtime.contract import stream_handle

    workload = workloads.WORKLOADS_BY_KEY[key]
    built, _ = workloads.build(workload)
    tensors = workloads.make_tensors(torch, built, workload)
    if len(tensors.inputs) != 1:
        return cycle_floors(key, torch, built, workload, tensors, repeats, number)
    backend = get_backend("python")
    engine = backend.load_engine(EngineSource(built.plan, name=f"{key}-floor"))
    outer = backend.load_engine(EngineSource(built.plan, name=f"{key}-floor-outer"))
    wrap = enable_cudagraphs(outer, outer="view")
    wrap.__enter__()
    x, y = tensors.inputs[0], tensors.outputs[0]
    (s,) = outer.static_inputs(tuple(x.shape), as_torch=True)
    s.copy_(x)
    for _ in range(3):
        engine.execute(x, outputs=[y], stream=engine.stream)
        outer(s)
    torch.cuda.synchronize()
    from cuda.bindings import runtime as rt

    ns: dict[str, Any] = {"e": engine, "o": outer, "x": x, "y": y, "s": s, "own": engine.stream,
                          "ctx": engine._lanes[0].ops._res.context, "rt": rt}
    keep = _raw_side(ns, torch, built, workload, [x], [y], engine._lanes[0].ops._res.context)
    launch = rt.cudaGraphLaunch
    graph = ns["tg_exec"]
    views = [y]  # the raw graph writes the y the raw context was bound to (_raw_side)
    device = torch.cuda.current_device()
    handle = stream_handle(engine.stream)
    ns.update(
        hnd=handle,
        mr=minimal_replay(torch, launch, graph, x, views, device),
        sr=split_replay(torch, launch, graph, x, views, device),
        mp=minimal_prebound(ns["ctx"].trt_context.execute_async_v3, x, y, engine.stream, handle),
        tc=ns["ctx"].trt_context,
    )
    stmts = {
        "replay: torch CUDAGraph.replay()": "tg.replay()",
        "replay: cuda-python launch": "rt.cudaGraphLaunch(tg_exec, 0)",
        "replay: minimal": "mr(x)",
        "replay: minimal, entry + plan": "sr(x)",
        "replay: ours o(s)": "o(s)",
        "pre: execute_async_v3": "tc.execute_async_v3(hnd)",
        "pre: minimal": "mp(x, outputs=[y], stream=own)",
        "pre: ours e.execute(x, outputs=[y], stream=s)": "e.execute(x, outputs=[y], stream=own)",
    }
    lane = outer._pool.local.slot.lane.ops
    slot = lane.lane.outer_graphs.shortcuts[(s.shape,)]
    from trt_runtime_backends.python import replay_plans

    ns["plan"] = slot.plan or replay_plans.replay_plan(lane, slot, (s.shape,), lane.lane.outer_graphs)
    stmts["plan: ours"] = "plan(ss, None, None)"
    ns.update(ss=(s,), pool=outer._pool, lk=threading.Lock(), key=slot.key, cache=lane.lane.outer_graphs.cache,
              raw=torch._C._cuda_getCurrentRawStream, dev=device, s0=s.shape, d0=s.dtype)
    stmts.update({
        "piece: pool.local.slot": "pool.local.slot",
        "piece: lock acquire(False) + release": "lk.acquire(False); lk.release()",
        "piece: cache.touch(key)": "cache.touch(key)",
        "piece: raw_stream(device)": "raw(dev)",
        "piece: type/dtype/contiguity": "type(s) is not T or s.dtype is not d0 or not s.is_contiguous()",
        "piece: s.shape != s0": "s.shape != s0",
        "piece: s.data_ptr()": "s.data_ptr()",
        "piece: s.get_device()": "s.get_device()",
    })
    ns["T"] = torch.Tensor
    # the launch alone: our graph and the raw one, on our stream and on the legacy stream
    ours = lane._order.ours
    ns.update(og=slot.graph, ours=ours)
    stmts.update({
        "launch: raw graph on ours": "rt.cudaGraphLaunch(tg_exec, ours)",
        "launch: our graph on ours": "rt.cudaGraphLaunch(og, ours)",
        "launch: our graph on 0": "rt.cudaGraphLaunch(og, 0)",
    })
    nodes = {"nodes: raw context": count_nodes(rt, ns["rc"], ours),
             "nodes: our context": count_nodes(rt, lane.lane.context.trt_context, ours)}
    closers = (keep.clear, lambda: wrap.__exit__(None, None, None), outer.close, engine.close)
    return {**timed_then(stmts, ns, torch, repeats, number, *closers), **nodes}


def main(argv: list[str] | None = None) -> int:
    return _gpu_tool.statement_tool(__doc__, argv, "tiny,mlp,convnet,dynamic", "floor_probe.json",
                                    workload_floors)


if __name__ == "__main__":
    raise SystemExit(main())
