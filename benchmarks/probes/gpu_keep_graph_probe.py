"""Can a torch.cuda.CUDAGraph carry its copies as memcpy nodes, as the outer graph does?

The python backend's outer graph carries them so (``trt_runtime.graphs.CopyNodes``).

Run on the GPU host: ``python3 benchmarks/probes/gpu_keep_graph_probe.py [--out DIR]``. It captures a
small kernel with ``torch.cuda.CUDAGraph(keep_graph=True)``, takes the graph with
``raw_cuda_graph()``, builds a second graph around it (memcpy node in, the captured graph as
a child node, memcpy node out; the side that changes per call built on a torch tensor),
then replays it with inputs and outputs at new addresses and checks the results. It times,
with :mod:`timeit` (median of interleaved samples, µs): ``copy_`` in + ``replay()`` +
``clone()`` (what the torchbind backend's copy mode does), the same through cuda-python
calls, and the node form (two address updates, one launch). Writes ``keep_graph_probe.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path
import statistics
import timeit
from typing import Any

# _gpu_tool (the GPU tools' --out and JSON helpers) is shared with tools/.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import _gpu_tool  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    args, torch, rt, d2d, dev = _gpu_tool.torch_cuda_probe(__doc__, argv)
    ok = _gpu_tool.ok
    xs = [torch.randn(8, 64, device=dev, dtype=torch.float16) for _ in range(4)]
    nb_in = xs[0].numel() * xs[0].element_size()
    static_in = torch.zeros_like(xs[0])
    side = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        (static_in * 2.0 + 1.0)  # warm-up outside the capture
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
        static_out = static_in * 2.0 + 1.0
    graph.instantiate()
    raw = graph.raw_cuda_graph()
    raw_exec = graph.raw_cuda_graph_exec()
    print("raw_cuda_graph", raw, "raw_cuda_graph_exec", raw_exec, flush=True)
    nb_out = static_out.numel() * static_out.element_size()
    placeholder = torch.empty(max(nb_in, nb_out), dtype=torch.uint8, device=dev)
    other = placeholder.data_ptr()
    built = ok(rt.cudaGraphCreate(0), "create")
    node_in = ok(rt.cudaGraphAddMemcpyNode1D(built, None, 0, static_in.data_ptr(), other, nb_in, d2d), "in")
    child = ok(rt.cudaGraphAddChildGraphNode(built, [node_in], 1, rt.cudaGraph_t(int(raw))), "child")
    node_out = ok(rt.cudaGraphAddMemcpyNode1D(built, [child], 1, other, static_out.data_ptr(), nb_out, d2d),
                  "out")
    cexec = ok(rt.cudaGraphInstantiate(built, 0), "instantiate")
    del placeholder
    stream = torch.cuda.current_stream()
    h = int(stream.cuda_stream)
    set1d = rt.cudaGraphExecMemcpyNodeSetParams1D
    launch, memcpy = rt.cudaGraphLaunch, rt.cudaMemcpyAsync
    handle = rt.cudaGraphExec_t(int(raw_exec))
    static_ptr, out_ptr = static_in.data_ptr(), static_out.data_ptr()
    right = 0
    for x in xs:
        y = torch.empty_like(static_out)
        ok(set1d(cexec, node_in, static_ptr, x.data_ptr(), nb_in, d2d), "set in")
        ok(set1d(cexec, node_out, y.data_ptr(), out_ptr, nb_out, d2d), "set out")
        ok(launch(cexec, h), "launch")
        torch.cuda.synchronize()
        right += bool(torch.equal(y, x * 2.0 + 1.0))
    print(f"node form: {right} of {len(xs)} outputs right", flush=True)
    # after torch's graph is reset, the built graph still runs (its child is a copy)?
    x = xs[1]

    def torch_way() -> Any:
        static_in.copy_(x)
        graph.replay()
        return static_out.clone()

    def cuda_python_way() -> Any:
        memcpy(static_ptr, x.data_ptr(), nb_in, d2d, h)
        launch(handle, h)
        y = torch.empty_like(static_out)
        memcpy(y.data_ptr(), out_ptr, nb_out, d2d, h)
        return y

    def node_way() -> Any:
        set1d(cexec, node_in, static_ptr, x.data_ptr(), nb_in, d2d)
        y = torch.empty_like(static_out)
        set1d(cexec, node_out, y.data_ptr(), out_ptr, nb_out, d2d)
        launch(cexec, h)
        return y

    ways = {"torch copy_+replay+clone": torch_way, "cuda-python memcpy+launch+memcpy": cuda_python_way,
            "nodes set+set+launch": node_way}
    samples: dict[str, list[float]] = {k: [] for k in ways}
    synced: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(args.repeats):
        for name, fn in ways.items():
            samples[name].append(timeit.timeit(fn, number=args.number) / args.number * 1e6)
            torch.cuda.synchronize()

            def with_sync(fn: Any = fn) -> None:
                fn()
                stream.synchronize()

            synced[name].append(timeit.timeit(with_sync, number=args.number) / args.number * 1e6)
    result = {"right": right, "of": len(xs),
              "us": {k: statistics.median(v) for k, v in samples.items()},
              "us_with_sync": {k: statistics.median(v) for k, v in synced.items()}}
    for k in ways:
        print(f"{k:36s} {result['us'][k]:7.2f} µs   with sync {result['us_with_sync'][k]:7.2f} µs")
    graph.reset()
    y = torch.empty_like(x)
    ok(set1d(cexec, node_in, static_ptr, x.data_ptr(), nb_in, d2d), "set in")
    ok(set1d(cexec, node_out, y.data_ptr(), out_ptr, nb_out, d2d), "set out")
    ok(launch(cexec, h), "launch after reset")
    torch.cuda.synchronize()
    result["after_reset_right"] = bool(torch.equal(y, x * 2.0 + 1.0))
    print("after torch's reset():", result["after_reset_right"])
    rt.cudaGraphExecDestroy(cexec)
    rt.cudaGraphDestroy(built)
    print(_gpu_tool.write_json(args.out, "keep_graph_probe.json", result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
