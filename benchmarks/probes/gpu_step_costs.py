"""What does each step of the python backend's fast paths cost on the CPU, statement by statement?

Run on the GPU host (tensorrt_rtx, cuda-python, torch with CUDA)::

    python3 benchmarks/probes/gpu_step_costs.py [--out DIR] [--repeats 60] [--number 40]

For the ``tiny`` and ``dynamic`` workloads of ``benchmarks/`` it loads a python-backend
engine, makes one call of each fast path (pre-bound ``execute``, ``engine(x)``, an outer
replay in ``"view"`` mode with the static input) and then times single statements with
:mod:`timeit`: the whole call, the backend function behind it, and each step inside it,
beside the bare TensorRT and CUDA calls. Statements are interleaved, ``number`` runs per
sample with a device synchronize between samples; the median of ``repeats`` samples is
reported in µs. This is where the per-call µs over the raw loops of ``bench_all`` go.

Writes ``step_costs.json`` to ``--out`` (default ``$OUT`` or ``.``).
"""

from __future__ import annotations

import functools
import operator
import statistics
import sys
import timeit
from pathlib import Path
from typing import Any

# _gpu_tool (the GPU tools' --out and JSON helpers) is shared with tools/.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import _gpu_tool


def time_statements(statements: dict[str, str], ns: dict[str, Any], sync: Any, repeats: int, number: int
                    ) -> dict[str, float]:
    """Median µs per run of each statement (interleaved samples of ``number`` runs)."""
    timers = {}
    for label, stmt in statements.items():
        timer = timeit.Timer(stmt, globals=ns)
        try:  # one stale or failing statement is reported and left out, never fatal
            timer.timeit(number=number)
        except Exception as exc:
            print(f"  skipped {label!r}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            continue
        timers[label] = timer
    sync()
    samples: dict[str, list[float]] = {label: [] for label in timers}
    for _ in range(repeats):
        for label, timer in timers.items():
            samples[label].append(timer.timeit(number=number) / number * 1e6)
            sync()
    return {label: round(statistics.median(values), 3) for label, values in samples.items()}


def timed_then(stmts: dict[str, str], ns: dict[str, Any], torch: Any, repeats: int, number: int,
               *closers: Any) -> dict[str, float]:
    """:func:`time_statements` on the device's synchronize, then each of ``closers`` called
    in turn (whatever happened)."""
    try:
        return time_statements(stmts, ns, torch.cuda.synchronize, repeats, number)
    finally:
        for close in closers:
            close()


def workload_steps(key: str, torch: Any, repeats: int, number: int) -> dict[str, float]:
    from trt_runtime_backends.python import fast_path

    from benchmarks import workloads
    from trt_runtime import EngineSource, enable_cudagraphs, get_backend

    workload = workloads.WORKLOADS_BY_KEY[key]
    built, _ = workloads.build(workload)
    tensors = workloads.make_tensors(torch, built, workload)
    backend = get_backend("python")
    engine = backend.load_engine(EngineSource(built.plan, name=f"{key}-steps"))
    outer = backend.load_engine(EngineSource(built.plan, name=f"{key}-steps-outer"))
    wrap = enable_cudagraphs(outer, outer="view")
    wrap.__enter__()
    # the default outer mode ("copy", outer=True): inputs copied in, outputs copied out
    copying = backend.load_engine(EngineSource(built.plan, name=f"{key}-steps-copy"))
    copy_wrap = enable_cudagraphs(copying, outer="copy")
    copy_wrap.__enter__()
    xs, ys = tensors.inputs, tensors.outputs
    statics = []
    for x in xs:
        (s,) = outer.static_inputs(tuple(x.shape), as_torch=True)
        s.copy_(x)
        statics.append(s)
    for x, y, s in zip(xs, ys, statics, strict=True):
        engine(x)
        engine.execute(x, outputs=[y], stream=engine.stream)
        outer(s)
        outer(s)
        copying(x)
        copying(x)
    torch.cuda.synchronize()
    ops = engine._lanes[0].ops
    ctx = ops._res.context
    slot = next(iter(outer._lanes[0].outer_graphs.shortcuts.values()))
    n = len(xs)
    ns: dict[str, Any] = {
        "e": engine, "o": outer, "ops": ops, "x": xs[0], "y": ys[0], "xs": xs, "ys": ys, "ss": statics,
        "s": engine.stream, "fp": ops._fast_paths, "tc": ctx.trt_context, "ours": ops._order.ours,
        "order": ops._order, "shape_key": fast_path.shape_key, "restore": fast_path.restore_shapes,
        "ctx": ctx, "shape_attr": operator.attrgetter("shape"), "outer_graphs": outer._lanes[0].outer_graphs,
        "graph": slot.graph, "orders": outer._lanes[0].ops._order,
        "rt": outer._lanes[0].ops.graphs.rt, "n": n,
        "it": iter(range(1 << 62)), "next": next, "ptr": ys[0].data_ptr(), "shape0": tuple(ys[0].shape),
    }
    import ctypes

    for lib, name in ((ctypes.PyDLL, "pylaunch"), (ctypes.CDLL, "claunch"), (ctypes.PyDLL, "pylaunch_int")):
        fn = lib("libcuda.so.1").cuGraphLaunch
        fn.restype = ctypes.c_int
        if name.endswith("_int"):
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        ns[name] = fn
    ours = engine._lanes[0].ops._order.ours
    ns.update(graph_p=ctypes.c_void_p(int(slot.graph)), ours_p=ctypes.c_void_p(ours),
              graph_i=int(slot.graph), ours_t=outer._lanes[0].ops.graphs.rt.cudaStream_t(ours))
    fast = engine._lanes[0].ops._fast_paths.prebound[(id(xs[0]), id(ys[0]))]
    ns["f"] = fast
    keep = _raw_side(ns, torch, built, workload, xs, ys, ctx)
    from trt_runtime_backends.python.graphs import torch_results

    cslot = copying._lanes[0].outer_graphs.shortcuts[(xs[0].shape,)]
    from cuda.bindings import driver

    cmemcpy = ctypes.CDLL("libcuda.so.1").cuMemcpyDtoDAsync_v2
    cmemcpy.restype = ctypes.c_int
    cmemcpy.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
    rt = copying._lanes[0].ops.graphs.rt
    (cstatic,) = copying.static_inputs(tuple(xs[0].shape), as_torch=True)
    cours = copying._lanes[0].ops._order.ours
    ns.update(c=copying, cslot=cslot, cours=cours, torch_results=torch_results, torch=torch,
              cdst=cslot.in_ptrs[0], cnb=cslot.in_nbytes[0], d2d=copying._lanes[0].ops.graphs.d2d, dr=driver,
              dflt=rt.cudaMemcpyKind.cudaMemcpyDefault, cstream=driver.CUstream(cours),
              cmemcpy=cmemcpy, cstatic=cstatic)
    stmts = {
        # pre-bound
        "pre: e.execute(x, outputs=[y], stream=s)": "e.execute(x, outputs=[y], stream=s)",
        "pre: fp.call_prebound": "fp.call_prebound(ops, (x,), [y], s)",
        "pre: plan": "f.plan((x,), s, [y])",
        "pre: key + dict get": "fp.prebound.get((*map(id, (x,)), *map(id, [y])))",
        "pre: ptr check": "tuple(map(f.ptr_of, f.arrays)) != f.ptrs",
        "pre: shape check": "tuple(map(shape_attr, f.arrays)) != f.shapes",
        "pre: follow(None)": "order.follow(None)",
        "pre: list(outputs)": "list([y])",
        "trt: execute_async_v3(ours)": "tc.execute_async_v3(ours)",
        # natural
        "nat: e(x)": "e(x)",
        "nat: fp.call_natural": "fp.call_natural(ops, (x,), None)",
        "nat: plan": "fp.natural[(tuple(x.shape),)].plan((x,), None, None)",
        "nat: shape_key + get": "fp.natural.get(shape_key((x,)))",
        "nat: x.new_empty": "x.new_empty(shape0)",
        "nat: set_tensor_address": "tc.set_tensor_address('y', ptr)",
        "nat: x.data_ptr()": "x.data_ptr()",
        "nat: x.shape": "x.shape",
        "nat: dtype+device+contig": "x.dtype; x.get_device(); x.is_contiguous()",
        # outer replay
        "outer: o(s)": "o(ss[0])",
        "outer: replay_torch": "o._lanes[0].ops.graphs.replay_torch((ss[0],), None, outer_graphs)",
        "outer: plan": "outer_graphs.shortcuts[(ss[0].shape,)].plan((ss[0],), None, None)",
        "outer: cudaGraphLaunch": "rt.cudaGraphLaunch(graph, ours)",
        "outer: cudaGraphLaunch(stream_t)": "rt.cudaGraphLaunch(graph, ours_t)",
        "outer: cudaGraphLaunch on the legacy stream": "rt.cudaGraphLaunch(graph, 0)",
        "outer: cudaGraphLaunch on the outer lane's stream": "rt.cudaGraphLaunch(graph, orders.ours)",
        "outer: ctypes PyDLL cuGraphLaunch": "pylaunch(graph_p, ours_p)",
        "outer: ctypes CDLL cuGraphLaunch": "claunch(graph_p, ours_p)",
        "outer: ctypes PyDLL cuGraphLaunch(int)": "pylaunch_int(graph_i, ours)",
        # the default outer mode, "copy"
        "copy: c(x)": "c(x)",
        "copy: plan": "cslot.plan((x,), None, None)",
        "copy: torch_results": "torch_results(c._lanes[0].ops, cslot, cours, False)",
        "copy: torch.empty(shape, dtype, device)": "torch.empty(shape0, dtype=y.dtype, device=x.device)",
        "copy: cudaMemcpyAsync d2d": "rt.cudaMemcpyAsync(cdst, x.data_ptr(), cnb, d2d, cours)",
        "copy: cudaMemcpyAsync default": "rt.cudaMemcpyAsync(cdst, x.data_ptr(), cnb, dflt, cours)",
        "copy: driver cuMemcpyDtoDAsync": "dr.cuMemcpyDtoDAsync(cdst, x.data_ptr(), cnb, cours)",
        "copy: driver cuMemcpyAsync": "dr.cuMemcpyAsync(cdst, x.data_ptr(), cnb, cours)",
        "copy: driver cuMemcpyDtoDAsync(CUstream)": "dr.cuMemcpyDtoDAsync(cdst, x.data_ptr(), cnb, cstream)",
        "copy: ctypes CDLL cuMemcpyDtoDAsync_v2": "cmemcpy(cdst, x.data_ptr(), cnb, cours)",
        "copy: torch copy_": "cstatic.copy_(x)",
        "copy: x.data_ptr()": "x.data_ptr()",
    }
    if n > 1:  # cycling shapes
        # the pre-bound call's shape switch taken apart: each (x, y) pair's plan, and the
        # state change its plan makes (prepare_state: restore_shapes, then addresses)
        fps = [engine._lanes[0].ops._fast_paths.prebound[(id(x), id(y))] for x, y in zip(xs, ys, strict=True)]
        prepare = fast_path.prepare_state
        ns.update(fps=fps, preps=[
            functools.partial(prepare, ops, f.shape_key, f.dynamic_dims, f.out_shapes, f.ptrs) for f in fps
        ])
        stmts.update({
            "dyn: pre-bound plan, shapes in turn": "i = next(it) % n; fps[i].plan((xs[i],), s, [ys[i]])",
            "dyn: prepare_state + execute_async_v3":
                "i = next(it) % n; preps[i](); tc.execute_async_v3(ours)",
            "dyn: prepare_state alone": "i = next(it) % n; preps[i]()",
            "dyn: e(xs[i % n])": "e(xs[next(it) % n])",
            "dyn: e.execute(xs[i], outputs=[ys[i]], stream=s)":
                "i = next(it) % n; e.execute(xs[i], outputs=[ys[i]], stream=s)",
            "dyn: o(ss[i % n])": "o(ss[next(it) % n])",
            "dyn: set_input_shape": "tc.set_input_shape('x', tuple(xs[next(it) % n].shape))",
            # the raw loop of bench_all's raw-prebound: on the engine's own context, and on a
            # context made as benchmarks/raw_rows.py makes it (another ICudaEngine)
            "dyn: raw cycle, engine's context": "i = next(it) % n; tc.set_input_shape('x', dims[i]); "
                                                "tc.execute_async_v3(ours)",
            "dyn: raw cycle, raw_rows context": "i = next(it) % n; rc.set_input_shape('x', dims[i]); "
                                                "rc.execute_async_v3(ours)",
        })
    else:
        stmts.update({
            "raw: execute_async_v3, raw_rows context": "rc.execute_async_v3(ours)",
            "outer: torch replay of a raw graph": "tg.replay()",
            "outer: cudaGraphLaunch of a raw graph": "rt.cudaGraphLaunch(tg_exec, ours)",
            "outer: cudaGraphLaunch of a raw graph, legacy stream": "rt.cudaGraphLaunch(tg_exec, 0)",
            "outer: o(s) then torch replay, in turn": "o(ss[0]); tg.replay()",
        })
    return timed_then(stmts, ns, torch, repeats, number, keep.clear, lambda: wrap.__exit__(None, None, None),
                      lambda: copy_wrap.__exit__(None, None, None), copying.close, outer.close, engine.close)


def raw_graph(torch: Any, context: Any, side: Any) -> Any:
    """A ``torch.cuda.CUDAGraph`` of one ``execute_async_v3`` of ``context`` on stream
    ``side``, after one eager run there (TensorRT-RTX compiles its kernels on a first run)."""
    handle = int(side.cuda_stream)
    with torch.cuda.stream(side):
        context.execute_async_v3(handle)
    side.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        context.execute_async_v3(handle)
    return graph


def _raw_side(ns: dict[str, Any], torch: Any, built: Any, workload: Any, xs: list[Any], ys: list[Any],
              ctx: Any) -> list[Any]:
    """A context made as ``benchmarks/raw_rows.py`` makes it (``rc``, bound to ``xs[0]`` and
    ``ys[0]``, whose views share one address), the shapes as tuples (``dims``) and, for a
    static engine, a ``torch.cuda.CUDAGraph`` of its enqueue (``tg``, its executable graph
    ``tg_exec``): what bench_all's raw rows call. Returns what must live while they run."""
    from benchmarks import raw_rows

    raw = raw_rows.open_engine(built.plan)
    rc, memory, _ = raw_rows.new_context(raw, torch, workload.shapes)
    rc.set_input_shape(raw.input_name, tuple(xs[0].shape))
    rc.set_tensor_address(raw.input_name, xs[0].data_ptr())
    rc.set_tensor_address(raw.output_name, ys[0].data_ptr())
    ns.update(rc=rc, dims=[tuple(x.shape) for x in xs])
    keep: list[Any] = [raw, rc, memory]
    if len(xs) == 1:
        graph = raw_graph(torch, rc, torch.cuda.Stream())
        keep.append(graph)
        rt = ns["rt"]
        ns.update(tg=graph, tg_exec=rt.cudaGraphExec_t(int(graph.raw_cuda_graph_exec())))
    return keep


def main(argv: list[str] | None = None) -> int:
    return _gpu_tool.statement_tool(__doc__, argv, "tiny,dynamic", "step_costs.json", workload_steps)


if __name__ == "__main__":
    raise SystemExit(main())
