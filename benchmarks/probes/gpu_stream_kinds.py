"""Does an enqueue cost more CPU on a blocking stream than on a non-blocking one or the legacy stream?

Run on the GPU host (tensorrt_rtx, cuda-python, torch with CUDA)::

    python3 benchmarks/probes/gpu_stream_kinds.py [--out DIR] [--repeats 40] [--number 200]

The python backend's engines run on a *blocking* stream by default (CUDA orders it with
the legacy default stream, so a caller there needs no events), while ``bench_all``'s raw
loops run on a torch stream, which is non-blocking. This probe times, for the ``tiny``
workload, the same enqueues on each kind of stream: ``execute_async_v3`` of a context made
as ``benchmarks/raw_rows.py`` makes it, ``cudaGraphLaunch`` of a graph of that enqueue
captured with torch, and the python backend's pre-bound call on its own stream. Medians
of interleaved samples in µs (:func:`gpu_step_costs.time_statements`).

Writes ``stream_kinds.json`` to ``--out`` (default ``$OUT`` or ``.``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import _gpu_tool
from gpu_step_costs import raw_graph, timed_then


def stream_kinds(key: str, torch: Any, repeats: int, number: int) -> dict[str, float]:
    from cuda.bindings import runtime as rt

    from benchmarks import raw_rows, workloads
    from trt_runtime import EngineSource, get_backend

    workload = workloads.WORKLOADS_BY_KEY[key]
    built, _ = workloads.build(workload)
    tensors = workloads.make_tensors(torch, built, workload)
    x, y = tensors.inputs[0], tensors.outputs[0]
    raw = raw_rows.open_engine(built.plan)
    rc, _memory, _ = raw_rows.new_context(raw, torch, workload.shapes)
    rc.set_input_shape(raw.input_name, tuple(x.shape))
    rc.set_tensor_address(raw.input_name, x.data_ptr())
    rc.set_tensor_address(raw.output_name, y.data_ptr())
    side = torch.cuda.Stream()  # non-blocking, as bench_all's raw rows' streams
    err, blocking = rt.cudaStreamCreateWithFlags(rt.cudaStreamDefault)
    if err:
        raise SystemExit(f"cudaStreamCreateWithFlags: {err}")
    graph = raw_graph(torch, rc, side)
    graph_exec = rt.cudaGraphExec_t(int(graph.raw_cuda_graph_exec()))
    engine: Any = get_backend("python").load_engine(EngineSource(built.plan, name=f"{key}-streams"))
    own = engine.stream
    engine.execute(x, outputs=[y], stream=own)
    torch.cuda.synchronize()
    ns = {"rc": rc, "nb": int(side.cuda_stream), "bl": int(blocking), "g": graph_exec, "rt": rt,
          "e": engine, "x": x, "y": y, "own": own, "ours": int(own.handle)}
    stmts = {
        "execute_async_v3, non-blocking stream": "rc.execute_async_v3(nb)",
        "execute_async_v3, blocking stream": "rc.execute_async_v3(bl)",
        "execute_async_v3, the engine's stream": "rc.execute_async_v3(ours)",
        "execute_async_v3, legacy stream": "rc.execute_async_v3(0)",
        "cudaGraphLaunch, non-blocking stream": "rt.cudaGraphLaunch(g, nb)",
        "cudaGraphLaunch, blocking stream": "rt.cudaGraphLaunch(g, bl)",
        "cudaGraphLaunch, legacy stream": "rt.cudaGraphLaunch(g, 0)",
        "pre-bound execute on the engine's stream": "e.execute(x, outputs=[y], stream=own)",
    }

    def close() -> None:
        torch.cuda.synchronize()
        engine.close()
        rt.cudaStreamDestroy(blocking)

    return timed_then(stmts, ns, torch, repeats, number, close)  # (rc, _memory and graph live until then)


def main(argv: list[str] | None = None) -> int:
    return _gpu_tool.statement_tool(__doc__, argv, "tiny", "stream_kinds.json", stream_kinds)


if __name__ == "__main__":
    raise SystemExit(main())
