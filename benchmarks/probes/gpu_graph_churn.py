"""What does a capture cost when the outer graph churns, with and without cudaGraphExecUpdate?

The update (``cudaGraphExecUpdate``) puts the new capture into a released executable graph.

Run on the GPU host (tensorrt_rtx, cuda-python, torch with CUDA)::

    python3 benchmarks/probes/gpu_graph_churn.py [--out DIR] [--calls 60] [--rounds 5]

Two python-backend engines per workload, one of them without ``cudaGraphExecUpdate`` (its
CUDA runtime module seen through a proxy that lacks it: every capture instantiates):

* ``dynamic``: ``OuterGraph(max_graphs=2)`` over batches 1/8/64 in turn: every call evicts
  a graph and captures one (the eager warm-up run, the capture, then update or instantiate);
* ``convnet``: ``reset_graphs()`` before every call: the same shapes captured again.

Rounds alternate the two engines; each round times ``--calls`` calls, each call followed
by a device synchronize. Reports the median µs per call of each, their ratio, and the
updates counted in ``graph_stats()``. Writes ``graph_churn.json`` to ``--out``.
"""

from __future__ import annotations

import sys
from pathlib import Path
import json
import statistics
import time
from typing import Any

# _gpu_tool (the GPU tools' --out and JSON helpers) is shared with tools/.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import _gpu_tool  # noqa: E402


class NoUpdate:
    """The CUDA runtime module without ``cudaGraphExecUpdate``."""

    def __init__(self, rt: Any) -> None:
        self._rt = rt

    def __getattr__(self, name: str) -> Any:
        if name == "cudaGraphExecUpdate":
            raise AttributeError(name)
        return getattr(self._rt, name)


def churn(key: str, torch: Any, calls: int, rounds: int) -> dict[str, Any]:
    from benchmarks import workloads
    from trt_runtime import EngineSource, OuterGraph, get_backend

    workload = workloads.WORKLOADS_BY_KEY[key]
    built, _ = workloads.build(workload)
    tensors = workloads.make_tensors(torch, built, workload)
    xs = tensors.inputs
    backend = get_backend("python")
    engines = {}
    for label in ("update", "instantiate"):
        engine = backend.load_engine(EngineSource(built.plan, name=f"{key}-{label}"))
        if label == "instantiate":
            for lane in engine._pool.lanes:
                lane.ops._rt = lane.ops.graphs.rt = NoUpdate(lane.ops._rt)
        engine.outer_graph = OuterGraph(max_graphs=2) if len(xs) > 1 else True
        engines[label] = engine
    with backend.load_engine(EngineSource(built.plan, name=f"{key}-eager")) as eager:
        want = [eager(x).clone() for x in xs]
    reset = len(xs) == 1
    samples: dict[str, list[float]] = {label: [] for label in engines}
    wrong = {label: 0 for label in engines}
    for r in range(rounds + 1):  # round 0 warms up
        for label, engine in engines.items():
            times = []
            for i in range(calls):
                x = xs[i % len(xs)]
                if reset:
                    engine.reset_graphs()
                t0 = time.perf_counter_ns()
                y = engine(x)
                torch.cuda.synchronize()
                times.append((time.perf_counter_ns() - t0) / 1e3)
                if not torch.allclose(y.float(), want[i % len(xs)].float(), rtol=1e-2, atol=1e-2):
                    wrong[label] += 1
            if r:
                samples[label].extend(times)
    result: dict[str, Any] = {"workload": key, "calls": calls * rounds, "reset_graphs_each_call": reset}
    for label, engine in engines.items():
        stats = engine.graph_stats()
        result[label] = {"median_us": round(statistics.median(samples[label]), 1),
                         "p90_us": round(statistics.quantiles(samples[label], n=10)[-1], 1),
                         "captures": stats["captures"], "updates": stats["updates"], "wrong": wrong[label]}
        engine.close()
    ratio = result["instantiate"]["median_us"] / result["update"]["median_us"]
    result["instantiate_over_update"] = round(ratio, 3)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = _gpu_tool.parser(__doc__)
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workloads", default="dynamic,convnet")
    args = parser.parse_args(argv)
    import torch

    document = [churn(key, torch, args.calls, args.rounds) for key in args.workloads.split(",")]
    for row in document:
        print(json.dumps(row), flush=True)
    _gpu_tool.write_json(args.out, "graph_churn.json", document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
