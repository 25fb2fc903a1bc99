"""Do a TensorRT-RTX engine's execution contexts give right outputs when their work overlaps?

Run on the GPU host: ``python3 benchmarks/probes/gpu_graph_race_probe.py [--out DIR] [--workload convnet]``.
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
* ``graphs-threads``: a thread per context replaying on its own stream, as the benchmark;
* ``eager-gated`` and ``graphs-gated``: every context's call queued on its own stream
  behind one event that a long sleep kernel holds back, so that all of them start together
  on the GPU (eager enqueues take long on the CPU: without the gate they barely overlap);
* ``graphs-streams-own-engines``: ``graphs-streams`` with each context made on an
  ``ICudaEngine`` of its own (the plan deserialized once per context);
* ``graphs-streams-temporary-allocators``: ``graphs-streams`` with each context given a
  ``temporary_allocator`` of its own (counting what TensorRT-RTX asks it for);
* ``trt-graph-strategy-eager-streams``: ``eager-streams`` on contexts made with
  TensorRT-RTX's own ``WHOLE_GRAPH_CAPTURE`` strategy.

``--plan PATH`` runs it on your own engine (a TensorRT-RTX plan with one input and one
output; ``--shape`` gives the input shape where the plan's is dynamic): a check before
giving an engine several contexts (``docs/concurrency.md``, "Contexts that overlap on the
GPU"). ``--layer KIND`` runs the probe on a one-layer engine instead of a workload (fp16, batch 1,
the shapes of the ResNet-18-like ``convnet``; see :data:`LAYERS`), to find which layer's
kernels give the wrong outputs; ``--modes`` picks modes (comma-separated, default all).

After each round every output is compared with its serial output: ``wrong`` counts outputs
off by more than ``--tolerance`` of the serial output's peak, ``inexact`` those not equal bit
for bit; ``max_rel`` is the largest difference seen. Writes ``graph_race_probe.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path
import threading
from typing import Any

# _gpu_tool (the GPU tools' --out and JSON helpers) is shared with tools/.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import _gpu_tool  # noqa: E402

from trt_runtime.testing.overlap import GATE_CYCLES


def main(argv: list[str] | None = None) -> int:
    parser = _gpu_tool.parser(__doc__)
    parser.add_argument("--workload", default="convnet")
    parser.add_argument("--layer", default="", help=f"a one-layer engine instead: {', '.join(LAYERS)}")
    parser.add_argument("--modes", default="", help="comma-separated modes to run (default: all)")
    parser.add_argument("--plan", default="", help="a plan file of your own (one input, one output)")
    parser.add_argument("--shape", default="", help="its input shape where dynamic, e.g. 1,3,224,224")
    parser.add_argument("--contexts", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--tolerance", type=float, default=1e-3)
    parser.add_argument("--gate-cycles", type=int, default=GATE_CYCLES,
                        help="GPU clock cycles the gate's sleep kernel holds the calls back")
    args = parser.parse_args(argv)
    import torch

    from benchmarks import workloads
    from benchmarks.raw_rows import new_context, open_engine

    if args.plan:
        built = _plan_engine(args.plan, args.shape)
        shape = built.shape
    elif args.layer:
        built = _layer_engine(args.layer)
        shape = built.shape
    else:
        workload = workloads.WORKLOADS_BY_KEY[args.workload]
        built, _ = workloads.build(workload)
        shape = tuple(workload.shapes[0])
    raw = open_engine(built.plan)
    from trt_runtime.dtypes import normalize_dtype

    dtype = getattr(torch, normalize_dtype(raw.engine.get_tensor_dtype(raw.output_name)))
    in_dtype = getattr(torch, normalize_dtype(raw.engine.get_tensor_dtype(raw.input_name)))
    trt = raw.trt
    print(f"engine: num_aux_streams {raw.engine.num_aux_streams}, device_memory_size_v2 "
          f"{raw.engine.device_memory_size_v2}, weight streaming scratch "
          f"{getattr(raw.engine, 'weight_streaming_scratch_memory_size', '?')}", flush=True)

    def make_lanes(own_engines: bool = False, allocators: bool = False, strategy: bool = False,
                   capture: bool = True) -> list[dict[str, Any]]:
        made: list[dict[str, Any]] = []
        for k in range(args.contexts):
            gen = torch.Generator(device="cuda").manual_seed(100 + k)
            x = torch.randn(shape, device="cuda", generator=gen).to(in_dtype)
            owner = open_engine(built.plan) if own_engines else raw
            if strategy:
                config = owner.engine.create_runtime_config()
                config.cuda_graph_strategy = trt.CudaGraphStrategy.WHOLE_GRAPH_CAPTURE
                ctx, memory = owner.engine.create_execution_context(config), None
            else:
                ctx, memory, _ = new_context(owner, torch, [shape])
            allocator = _Allocator(trt, torch) if allocators else None
            if allocator is not None:
                ctx.temporary_allocator = allocator
            ctx.set_input_shape(raw.input_name, shape)
            y = torch.empty(tuple(ctx.get_tensor_shape(raw.output_name)), device="cuda", dtype=dtype)
            ctx.set_tensor_address(raw.input_name, x.data_ptr())
            ctx.set_tensor_address(raw.output_name, y.data_ptr())
            stream = torch.cuda.Stream()
            handle = int(stream.cuda_stream)
            with torch.cuda.stream(stream):
                assert ctx.execute_async_v3(handle)
                assert ctx.execute_async_v3(handle)  # a graph strategy captures on a later run
            stream.synchronize()
            serial = y.clone()
            graph = None
            if capture:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=stream):
                    assert ctx.execute_async_v3(handle)
            stream.synchronize()
            made.append({"x": x, "y": y, "ctx": ctx, "memory": memory, "stream": stream, "handle": handle,
                         "serial": serial, "peak": float(serial.float().abs().max()) or 1.0, "graph": graph,
                         "owner": owner, "allocator": allocator})
        torch.cuda.synchronize()
        return made

    lanes = make_lanes()
    one = torch.cuda.Stream()
    chain = torch.cuda.Event()

    def check(lane: dict[str, Any], tally: dict[str, Any]) -> None:
        diff = float((lane["y"].float() - lane["serial"].float()).abs().max()) / lane["peak"]
        tally["checked"] += 1
        tally["inexact"] += diff > 0
        tally["wrong"] += diff > args.tolerance
        tally["max_rel"] = max(tally["max_rel"], diff)

    def round_robin(launch: Any, group: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        group = lanes if group is None else group
        tally = {"checked": 0, "inexact": 0, "wrong": 0, "max_rel": 0.0}
        for _ in range(args.rounds):
            for i, lane in enumerate(group):
                launch(i, lane)
            torch.cuda.synchronize()
            for lane in group:
                check(lane, tally)
        return tally

    def other_lanes(**how: Any) -> Any:
        def run() -> dict[str, Any]:
            group = make_lanes(**how)
            result = round_robin(eager if how.get("strategy") else replay, group)
            allocators = [lane["allocator"] for lane in group if lane["allocator"] is not None]
            if allocators:
                result["temporary_allocations"] = sum(a.calls for a in allocators)
                result["temporary_bytes_max"] = max(a.largest for a in allocators)
            return result
        return run

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

    gate_stream, gate = torch.cuda.Stream(), torch.cuda.Event()

    def gated(launch: Any) -> Any:
        def run() -> dict[str, Any]:
            tally = {"checked": 0, "inexact": 0, "wrong": 0, "max_rel": 0.0}
            for _ in range(args.rounds):
                with torch.cuda.stream(gate_stream):
                    torch.cuda._sleep(args.gate_cycles)
                gate.record(gate_stream)
                for i, lane in enumerate(lanes):
                    lane["stream"].wait_event(gate)
                    launch(i, lane)
                torch.cuda.synchronize()
                for lane in lanes:
                    check(lane, tally)
            return tally
        return run

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

    document: dict[str, Any] = {"workload": args.plan or args.layer or args.workload,
                                "contexts": args.contexts, "rounds": args.rounds, "tolerance": args.tolerance,
                                "modes": {}}
    modes = {
        "eager-streams": lambda: round_robin(eager),
        "graphs-streams": lambda: round_robin(replay),
        "graphs-one-stream": lambda: round_robin(replay_one),
        "graphs-chained": lambda: round_robin(replay_chained),
        "graphs-threads": threads,
        "eager-gated": gated(eager),
        "graphs-gated": gated(replay),
        "graphs-streams-own-engines": other_lanes(own_engines=True),
        "graphs-streams-temporary-allocators": other_lanes(allocators=True),
        "trt-graph-strategy-eager-streams": other_lanes(strategy=True, capture=False),
    }
    chosen = [m.strip() for m in args.modes.split(",") if m.strip()] or list(modes)
    for name in chosen:
        result = modes[name]()
        document["modes"][name] = result
        extra = "".join(f"  {k} {v}" for k, v in result.items()
                        if k not in ("checked", "inexact", "wrong", "max_rel"))
        print(f"{name:38s} checked {result['checked']:6d}  wrong {result['wrong']:5d}  "
              f"inexact {result['inexact']:5d}  max_rel {result['max_rel']:.2e}{extra}", flush=True)
    _gpu_tool.write_json(args.out, "graph_race_probe.json", document)
    return 0


#: One-layer engines (``--layer``): (input shape, what the layer is), fp16, batch 1.
LAYERS = {
    "stem": ((1, 3, 224, 224), "convolution 7x7 stride 2, 3 -> 64 channels, + ReLU"),
    "conv3": ((1, 64, 56, 56), "convolution 3x3, 64 -> 64 channels"),
    "conv3s2": ((1, 128, 28, 28), "convolution 3x3 stride 2, 128 -> 256 channels"),
    "proj": ((1, 256, 14, 14), "convolution 1x1 stride 2, 256 -> 512 channels"),
    "conv3late": ((1, 512, 7, 7), "convolution 3x3, 512 -> 512 channels"),
    "maxpool": ((1, 64, 112, 112), "max pooling 3x3 stride 2"),
    "gap": ((1, 512, 7, 7), "average over H and W (reduce)"),
    "fc": ((1, 512), "matrix multiply 512 -> 10 + bias"),
}


def _plan_engine(path: str, shape_text: str) -> Any:
    """A plan file and the input shape to run it with (its own, or ``shape_text``)."""
    import types
    from pathlib import Path

    from benchmarks.raw_rows import open_engine

    plan = Path(path).read_bytes()
    raw = open_engine(plan)
    shape = tuple(int(d) for d in raw.engine.get_tensor_shape(raw.input_name))
    if shape_text:
        given = tuple(int(d) for d in shape_text.split(","))
        if len(given) != len(shape) or any(d >= 0 and d != g for d, g in zip(shape, given, strict=True)):
            raise SystemExit(f"--shape {shape_text} does not fit the plan's input shape {shape}")
        shape = given
    if any(d < 0 for d in shape):
        raise SystemExit(f"the plan's input shape {shape} is dynamic: give --shape")
    return types.SimpleNamespace(plan=plan, shape=shape)


def _layer_engine(kind: str) -> Any:
    import types

    import numpy as np

    from trt_runtime import builders

    if kind not in LAYERS:
        raise SystemExit(f"--layer must be one of {', '.join(LAYERS)}; got {kind!r}")
    shape, _ = LAYERS[kind]
    trt = builders.import_tensorrt()
    rng = np.random.default_rng(0)
    builder = trt.Builder(trt.Logger(trt.Logger.ERROR))
    net = builders._network(trt, builder)
    x = net.add_input("x", trt.DataType.HALF, shape)

    def conv(cout: int, k: int, stride: int) -> Any:
        cin = shape[1]
        w = (rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))).astype(np.float16)
        b = (rng.standard_normal(cout) * 0.05).astype(np.float16)
        layer = net.add_convolution_nd(x, cout, (k, k), trt.Weights(w), trt.Weights(b))
        layer.stride_nd = (stride, stride)
        layer.padding_nd = (k // 2, k // 2)
        return layer.get_output(0)

    if kind == "stem":
        out = net.add_activation(conv(64, 7, 2), trt.ActivationType.RELU).get_output(0)
    elif kind in ("conv3", "conv3late"):
        out = conv(shape[1], 3, 1)
    elif kind == "conv3s2":
        out = conv(256, 3, 2)
    elif kind == "proj":
        out = conv(512, 1, 2)
    elif kind == "maxpool":
        pool = net.add_pooling_nd(x, trt.PoolingType.MAX, (3, 3))
        pool.stride_nd, pool.padding_nd = (2, 2), (1, 1)
        out = pool.get_output(0)
    elif kind == "gap":
        out = net.add_reduce(x, trt.ReduceOperation.AVG, (1 << 2) | (1 << 3), False).get_output(0)
    else:
        w = (rng.standard_normal((512, 10)) / np.sqrt(512)).astype(np.float16)
        b = (rng.standard_normal((1, 10)) * 0.05).astype(np.float16)
        mm = net.add_matrix_multiply(x, trt.MatrixOperation.NONE, net.add_constant(w.shape, trt.Weights(w))
                                     .get_output(0), trt.MatrixOperation.NONE).get_output(0)
        out = net.add_elementwise(mm, net.add_constant(b.shape, trt.Weights(b)).get_output(0),
                                  trt.ElementWiseOperation.SUM).get_output(0)
    out.name = "y"
    net.mark_output(out)
    plan = builders._build(trt, builder, net, [], None, kind)
    return types.SimpleNamespace(plan=plan, shape=shape)


class _Allocator:
    """A context's own temporary allocator: blocks kept per size and handed out again, never
    shared with another context; counts the requests."""

    def __new__(cls, trt: Any, torch: Any) -> Any:
        class Allocator(trt.IGpuAsyncAllocator):  # type: ignore[misc, name-defined]
            def __init__(self) -> None:
                trt.IGpuAsyncAllocator.__init__(self)
                self.calls = 0
                self.largest = 0
                self.free: dict[int, list[Any]] = {}
                self.used: dict[int, Any] = {}

            def allocate_async(self, size: int, alignment: int, flags: int, stream: int) -> int:
                self.calls += 1
                self.largest = max(self.largest, int(size))
                spare = self.free.get(int(size))
                if spare:
                    block = spare.pop()
                else:
                    block = torch.empty(max(int(size), 1), dtype=torch.uint8, device="cuda")
                self.used[block.data_ptr()] = block
                return int(block.data_ptr())

            def deallocate_async(self, memory: int, stream: int) -> bool:
                block = self.used.pop(int(memory), None)
                if block is not None:
                    self.free.setdefault(block.numel(), []).append(block)
                return True

        return Allocator()


if __name__ == "__main__":
    raise SystemExit(main())
