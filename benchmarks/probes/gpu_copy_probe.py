"""Is a copy cheaper as a memcpy node of the outer graph than as a cudaMemcpyAsync of its own?

The graph's addresses are set per call with ``cudaGraphExecMemcpyNodeSetParams1D``.

Run on the GPU host: ``python3 benchmarks/probes/gpu_copy_probe.py [--out DIR]``. For a tiny fp16
tensor it times, with :mod:`timeit` (median of interleaved samples, µs): the two ways of
copying one buffer in, a kernel and one buffer out (three stream operations against one
graph launch after two parameter updates), each piece alone, and the same with a device
synchronize after each call (a request/response loop). It checks that both give the
right output for inputs and outputs at new addresses. Writes ``copy_probe.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path
import statistics
import timeit

# _gpu_tool (the GPU tools' --out and JSON helpers) is shared with tools/.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import _gpu_tool  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    args, torch, rt, d2d, dev = _gpu_tool.torch_cuda_probe(__doc__, argv)
    ok = _gpu_tool.ok
    xs = [torch.randn(8, 16, device=dev, dtype=torch.float16) for _ in range(4)]
    nb = xs[0].numel() * xs[0].element_size()
    static_in, static_out = torch.empty_like(xs[0]), torch.empty_like(xs[0])
    stream = torch.cuda.Stream()
    h = int(stream.cuda_stream)
    torch.cuda.synchronize()

    def body() -> None:
        torch.mul(static_in, 2.0, out=static_out)

    # graph A: the kernel alone (today's outer graph); graph B: memcpy in, kernel, memcpy out
    graphs = {}
    first_out = torch.empty_like(xs[0])
    for name, copies in (("kernel", False), ("memcpy nodes", True)):
        ok(rt.cudaStreamBeginCapture(h, rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal), "begin")
        with torch.cuda.stream(stream):
            if copies:
                ok(rt.cudaMemcpyAsync(static_in.data_ptr(), xs[0].data_ptr(), nb, d2d, h), "memcpy in")
            body()
            if copies:
                ok(rt.cudaMemcpyAsync(first_out.data_ptr(), static_out.data_ptr(), nb, d2d, h), "memcpy out")
        graph = ok(rt.cudaStreamEndCapture(h), "end")
        graphs[name] = (graph, ok(rt.cudaGraphInstantiate(graph, 0), "instantiate"))
    graph, exec_b = graphs["memcpy nodes"]
    nodes, count = ok(rt.cudaGraphGetNodes(graph, 0), "nodes")
    nodes, count = ok(rt.cudaGraphGetNodes(graph, count), "nodes")
    kinds = [ok(rt.cudaGraphNodeGetType(n), "type") for n in nodes]
    memcpy_kind = rt.cudaGraphNodeType.cudaGraphNodeTypeMemcpy
    copies = [n for n, k in zip(nodes, kinds, strict=True) if k == memcpy_kind]
    print("graph nodes:", [str(k).split(".")[-1] for k in kinds], flush=True)
    # the memcpy node that reads the input is a root of the graph (nothing before it)
    roots, n_roots = ok(rt.cudaGraphGetRootNodes(graph, 0), "roots")
    roots, n_roots = ok(rt.cudaGraphGetRootNodes(graph, n_roots), "roots")
    root_ids = {int(r) for r in roots}
    node_in = next(n for n in copies if int(n) in root_ids)
    node_out = next(n for n in copies if int(n) not in root_ids)
    exec_a = graphs["kernel"][1]
    # graph C: built, not captured: memcpy nodes around the kernel graph as a child graph
    # node, their first addresses the static buffers themselves (placeholders)
    kernel_graph = graphs["kernel"][0]
    built = ok(rt.cudaGraphCreate(0), "create")
    c_in = ok(rt.cudaGraphAddMemcpyNode1D(built, None, 0, si_ := static_in.data_ptr(), si_, nb, d2d),
              "memcpy node in (dst == src)")
    child = ok(rt.cudaGraphAddChildGraphNode(built, [c_in], 1, kernel_graph), "child graph node")
    so_ = static_out.data_ptr()
    c_out = ok(rt.cudaGraphAddMemcpyNode1D(built, [child], 1, so_, so_, nb, d2d), "memcpy node out")
    exec_c = ok(rt.cudaGraphInstantiate(built, 0), "instantiate built")
    print("built graph: memcpy nodes with dst == src accepted; child graph node accepted", flush=True)
    set1d = rt.cudaGraphExecMemcpyNodeSetParams1D
    launch, memcpy = rt.cudaGraphLaunch, rt.cudaMemcpyAsync
    si, so = static_in.data_ptr(), static_out.data_ptr()

    state = {"i": 0}
    outs = [torch.empty_like(xs[0]) for _ in range(4)]

    def today() -> None:  # memcpy, launch, memcpy
        i = state["i"] = (state["i"] + 1) % 4
        memcpy(si, xs[i].data_ptr(), nb, d2d, h)
        launch(exec_a, h)
        memcpy(outs[i].data_ptr(), so, nb, d2d, h)

    def nodes_call() -> None:  # two parameter updates, one launch
        i = state["i"] = (state["i"] + 1) % 4
        set1d(exec_b, node_in, si, xs[i].data_ptr(), nb, d2d)
        set1d(exec_b, node_out, outs[i].data_ptr(), so, nb, d2d)
        launch(exec_b, h)

    def built_call() -> None:  # the built graph: two parameter updates, one launch
        i = state["i"] = (state["i"] + 1) % 4
        set1d(exec_c, c_in, si, xs[i].data_ptr(), nb, d2d)
        set1d(exec_c, c_out, outs[i].data_ptr(), so, nb, d2d)
        launch(exec_c, h)

    # correctness: each input to a new output address
    for call in (today, nodes_call, built_call):
        for _ in range(4):
            call()
            stream.synchronize()
            i = state["i"]
            assert torch.equal(outs[i], xs[i] * 2), f"{call.__name__}: wrong output"
    print("both give the right outputs", flush=True)

    sync = stream.synchronize

    def today_sync() -> None:
        today()
        sync()

    def nodes_sync() -> None:
        nodes_call()
        sync()

    def set_in() -> None:
        set1d(exec_b, node_in, si, xs[1].data_ptr(), nb, d2d)

    def launch_a() -> None:
        launch(exec_a, h)

    def launch_b() -> None:
        launch(exec_b, h)

    def memcpy_in() -> None:
        memcpy(si, xs[1].data_ptr(), nb, d2d, h)

    stmts = {"today: memcpy + launch + memcpy": today, "nodes: 2 x SetParams1D + launch": nodes_call,
             "today + synchronize": today_sync, "nodes + synchronize": nodes_sync,
             "SetParams1D": set_in, "launch, kernel graph": launch_a,
             "launch, graph with memcpy nodes": launch_b, "cudaMemcpyAsync": memcpy_in,
             "built: 2 x SetParams1D + launch": built_call}
    samples: dict[str, list[float]] = {k: [] for k in stmts}
    for fn in stmts.values():
        timeit.timeit(fn, number=args.number)
    torch.cuda.synchronize()
    for _ in range(args.repeats):
        for label, fn in stmts.items():
            samples[label].append(timeit.timeit(fn, number=args.number) / args.number * 1e6)
            torch.cuda.synchronize()
    result = {k: round(statistics.median(v), 3) for k, v in samples.items()}
    for k, v in result.items():
        print(f"  {k:40s} {v:8.2f} us", flush=True)
    _gpu_tool.write_json(args.out, "copy_probe.json", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
