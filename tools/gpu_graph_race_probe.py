"""Do CUDA graphs of several execution contexts of one TensorRT-RTX engine, replayed at the
same time, give their contexts' outputs?

Run on the GPU host: ``python3 tools/gpu_graph_race_probe.py [--out DIR] [--workload convnet]``.
``bench_concurrency`` has seen a few outputs of its bare baseline (``raw convnet outer``: a
``torch.cuda.CUDAGraph`` of ``execute_async_v3`` per context, one context per thread) differ
from their serial outputs, never in its eager rows. This probe takes the engine of a
benchmark workload, makes ``--contexts`` contexts as ``benchmarks/raw_rows.py`` makes them
(activation memory of their own), each with an input of its own and its output alone first
(the serial output), a graph of its enqueue captured on a stream of its own, and then runs
``--rounds`` rounds of one call per context in each mode:

* ``eager-streams``: ``execute_async_v3`` of every context on its own stream, one thread;
* ``graphs-streams``: every context's graph replayed on its own stream, one thread;
* ``graphs-one-stream``: the same replays one after the other on one stream;
* ``graphs-chained``: own streams, each replay waiting for the previous one (an event);
* ``graphs-threads``: a thread per context replaying on its own stream, as the benchmark.

After each round every output is compared with its serial output: ``wrong`` counts outputs
off by more than ``--tolerance`` of the serial output's peak, ``inexact`` those not equal bit
for bit; ``max_rel`` is the largest difference seen. Writes ``graph_race_probe.json``.
"""

from __future__ import annotations

import threading
from typing import Any

import _gpu_tool


def main(argv: list[str] | None = None) -> int:
    parser = _gpu_tool.parser(__doc__)
    parser.add_argument("--workload", default="convnet")
    parser.add_argument("--contexts", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--tolerance", type=float, default=1e-3)
    args = parser.parse_args(argv)
    import torch

    from benchmarks import workloads
    from benchmarks.raw_rows import new_context, open_engine

    workload = workloads.WORKLOADS_BY_KEY[args.workload]
    built, _ = workloads.build(workload)
    raw = open_engine(built.plan)
    shape = tuple(workload.shapes[0])
    out_shape = tuple(raw.engine.get_tensor_shape(raw.output_name))
    out_shape = shape[:1] + out_shape[1:]
    from trt_runtime.dtypes import normalize_dtype

    dtype = getattr(torch, normalize_dtype(raw.engine.get_tensor_dtype(raw.output_name)))
    in_dtype = getattr(torch, normalize_dtype(raw.engine.get_tensor_dtype(raw.input_name)))
    lanes: list[dict[str, Any]] = []
    for k in range(args.contexts):
        gen = torch.Generator(device="cuda").manual_seed(100 + k)
        x = torch.randn(shape, device="cuda", generator=gen).to(in_dtype)
        y = torch.empty(out_shape, device="cuda", dtype=dtype)
        ctx, memory, _ = new_context(raw, torch, [shape])
        ctx.set_input_shape(raw.input_name, shape)
        ctx.set_tensor_address(raw.input_name, x.data_ptr())
        ctx.set_tensor_address(raw.output_name, y.data_ptr())
        stream = torch.cuda.Stream()
        handle = int(stream.cuda_stream)
        with torch.cuda.stream(stream):
            assert ctx.execute_async_v3(handle)
        stream.synchronize()
        serial = y.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            assert ctx.execute_async_v3(handle)
        stream.synchronize()
        lanes.append({"x": x, "y": y, "ctx": ctx, "memory": memory, "stream": stream, "handle": handle,
                      "serial": serial, "peak": float(serial.float().abs().max()) or 1.0, "graph": graph})
    torch.cuda.synchronize()
    one = torch.cuda.Stream()
    chain = torch.cuda.Event()

    def check(lane: dict[str, Any], tally: dict[str, Any]) -> None:
        diff = float((lane["y"].float() - lane["serial"].float()).abs().max()) / lane["peak"]
        tally["checked"] += 1
        tally["inexact"] += diff > 0
        tally["wrong"] += diff > args.tolerance
        tally["max_rel"] = max(tally["max_rel"], diff)

    def round_robin(launch: Any) -> dict[str, Any]:
        tally = {"checked": 0, "inexact": 0, "wrong": 0, "max_rel": 0.0}
        for _ in range(args.rounds):
            for i, lane in enumerate(lanes):
                launch(i, lane)
            torch.cuda.synchronize()
            for lane in lanes:
                check(lane, tally)
        return tally

    def eager(i: int, lane: dict[str, Any]) -> None:
        assert lane["ctx"].execute_async_v3(lane["handle"])

    def replay(i: int, lane: dict[str, Any]) -> None:
        with torch.cuda.stream(lane["stream"]):
            lane["graph"].replay()

    def replay_one(i: int, lane: dict[str, Any]) -> None:
        with torch.cuda.stream(one):
            lane["graph"].replay()

    def replay_chained(i: int, lane: dict[str, Any]) -> None:
        stream = lane["stream"]
        if i:
            stream.wait_event(chain)
        with torch.cuda.stream(stream):
            lane["graph"].replay()
        chain.record(stream)

    def threads() -> dict[str, Any]:
        tallies = [{"checked": 0, "inexact": 0, "wrong": 0, "max_rel": 0.0} for _ in lanes]
        start = threading.Barrier(len(lanes))

        def body(i: int) -> None:
            lane = lanes[i]
            torch.cuda.set_stream(lane["stream"])
            start.wait()
            for _ in range(args.rounds):
                lane["graph"].replay()
                lane["stream"].synchronize()
                check(lane, tallies[i])

        workers = [threading.Thread(target=body, args=(i,)) for i in range(len(lanes))]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return {"checked": sum(t["checked"] for t in tallies), "inexact": sum(t["inexact"] for t in tallies),
                "wrong": sum(t["wrong"] for t in tallies), "max_rel": max(t["max_rel"] for t in tallies)}

    document: dict[str, Any] = {"workload": args.workload, "contexts": args.contexts, "rounds": args.rounds,
                                "tolerance": args.tolerance, "modes": {}}
    modes = {
        "eager-streams": lambda: round_robin(eager),
        "graphs-streams": lambda: round_robin(replay),
        "graphs-one-stream": lambda: round_robin(replay_one),
        "graphs-chained": lambda: round_robin(replay_chained),
        "graphs-threads": threads,
    }
    for name, run in modes.items():
        result = run()
        document["modes"][name] = result
        print(f"{name:18s} checked {result['checked']:6d}  wrong {result['wrong']:5d}  "
              f"inexact {result['inexact']:5d}  max_rel {result['max_rel']:.2e}", flush=True)
    _gpu_tool.write_json(args.out, "graph_race_probe.json", document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
