"""What does each step of the torchbind backend's `engine(x)` cost on the CPU, beside the bare op?

Run on the GPU host (torch-tensorrt-rtx, tensorrt_rtx, cuda-python, torch with CUDA)::

    python3 benchmarks/probes/gpu_torchbind_steps.py [--out DIR] [--repeats 60] [--number 40] \\
        [--workloads tiny,mlp,convnet,dynamic]

For each workload of ``benchmarks/`` it loads an engine with the torchbind backend, makes a
few calls, and times single statements with ``gpu_step_costs.time_statements`` (interleaved
samples of ``number`` runs, a device synchronize between samples, the median of
``repeats`` in µs), all on torch's default stream (the legacy default stream, as bench_all's
``torchbind`` and ``execute_engine_op`` rows run): the whole call ``e(x)``, the lane's hot
path ``_fast``, ``_call_op``, ``TorchBridge.execute_on``, the bare
``torch.ops.tensorrt.execute_engine`` on the default stream and with the lane's stream made
current, and the torch calls the stream ordering is made of (current stream, raw current
stream, ``_cuda_setStream``, ``Event.record``, ``Stream.wait_event``,
``Tensor.record_stream``). ``execute_on`` is also timed from a side stream, the path with
events. Each statement runs once first inside ``try``: one that fails (a name this torch or
this commit lacks) is reported on stderr and left out, never fatal.

Writes ``torchbind_steps.json`` to ``--out`` (default ``$OUT`` or ``.``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# _gpu_tool (the GPU tools' --out and JSON helpers) is shared with tools/; time_statements
# with gpu_step_costs beside this file; the workloads with benchmarks/.
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
import _gpu_tool  # noqa: E402
from gpu_step_costs import time_statements  # noqa: E402

#: The statements timed, by label (names from :func:`_namespace`).
STATEMENTS = {
    "e(x)": "e(x)",
    "lane._fast((x,))": "lane._fast(xt)",
    "lane._call_op((x,))": "lane._call_op(xt)",
    "bridge.execute_on(...)": "bridge.execute_on(ls, op, xt, native, dev)",
    "lane.torch_key((x,))": "lane.torch_key(xt)",
    "bare op, default stream": "packet([x], native)",
    "bare op (C++ _op), default stream": "raw_op([x], native)",
    "bare op, lane stream current (+2 _cuda_setStream)":
        "set_stream(*ls.switch); raw_op([x], native); set_stream(0, dev, dt)",
    "torch.cuda.current_stream(0)": "current_stream(dev)",
    "torch._C._cuda_getCurrentRawStream(0)": "raw_stream(dev)",
    "one _cuda_setStream": "set_stream(0, dev, dt)",
    "Event.record(caller)": "event.record(caller)",
    "Stream.wait_event(event)": "lane_stream.wait_event(event)",
    "y.record_stream(caller)": "y.record_stream(caller)",
    "execute_on from a side stream (+2 _cuda_setStream)":
        "set_stream(*side_ids); bridge.execute_on(ls, op, xt, native, dev); set_stream(0, dev, dt)",
}

#: Added for a workload with several input shapes (cycled per call).
CYCLING = {
    "e(xs[i % n])": "e(xs[next(it) % n])",
    "bare op, xs[i % n], default stream": "raw_op([xs[next(it) % n]], native)",
}


def _namespace(torch: Any, engine: Any, xs: list[Any]) -> dict[str, Any]:
    """The names the statements use: the engine, its first lane and bridge, the lane's
    stream, the op, torch's stream calls, an event, an output and a side stream (``dt``:
    torch's device type of CUDA, as ``_cuda_setStream`` takes it)."""
    lane = engine._lanes[0].ops
    ls = lane._lane_stream
    x = xs[0]
    y = engine(x)
    side = torch.cuda.Stream()
    packet = torch.ops.tensorrt.execute_engine
    return {  # (what this commit's lane may lack is read by the statements alone)
        "e": engine, "lane": lane, "bridge": lane._bridge, "ls": ls,
        "lane_stream": getattr(ls, "stream", None), "op": getattr(lane, "_op", None),
        "native": engine.native, "dev": torch.cuda.current_device(), "dt": 1,
        "x": x, "xt": (x,), "xs": xs, "n": len(xs), "it": iter(range(1 << 62)), "next": next,
        "packet": packet, "raw_op": getattr(packet, "_op", packet),
        "set_stream": torch._C._cuda_setStream, "raw_stream": torch._C._cuda_getCurrentRawStream,
        "current_stream": torch.cuda.current_stream, "caller": torch.cuda.current_stream(),
        "event": torch.cuda.Event(), "y": y[0] if isinstance(y, (list, tuple)) else y,
        "side_ids": (side.stream_id, side.device_index, side.device_type), "side": side,
    }


def _working(statements: dict[str, str], ns: dict[str, Any], torch: Any) -> dict[str, str]:
    """The statements that run once without an error; the others reported on stderr."""
    kept = {}
    for label, stmt in statements.items():
        try:
            exec(compile(stmt, label, "exec"), ns)  # the probe's own statements
            torch.cuda.synchronize()
        except Exception as exc:
            print(f"skipped {label!r}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            torch.cuda.set_stream(torch.cuda.default_stream())  # whatever a failed switch left
            continue
        kept[label] = stmt
    return kept


def workload_steps(key: str, torch: Any, repeats: int, number: int) -> dict[str, float]:
    from benchmarks import workloads
    from trt_runtime import EngineSource, get_backend

    workload = workloads.WORKLOADS_BY_KEY[key]
    built, _ = workloads.build(workload)
    xs = workloads.make_tensors(torch, built, workload).inputs
    engine = get_backend("torchbind").load_engine(EngineSource(built.plan, name=f"{key}-torchbind-steps"))
    try:
        torch.cuda.set_stream(torch.cuda.default_stream())
        for x in xs:  # the context, the shapes validated, the lane's stream made
            engine(x)
            engine(x)
        torch.cuda.synchronize()
        ns = _namespace(torch, engine, xs)
        print(f"== {key}: lane stream blocking={getattr(ns['ls'], 'blocking', None)}, caller raw stream "
              f"{ns['raw_stream'](ns['dev'])}", flush=True)
        statements = dict(STATEMENTS)
        if len(xs) > 1:
            statements.update(CYCLING)
        return time_statements(_working(statements, ns, torch), ns, torch.cuda.synchronize, repeats, number)
    finally:
        torch.cuda.synchronize()
        engine.close()


def main(argv: list[str] | None = None) -> int:
    return _gpu_tool.statement_tool(__doc__, argv, "tiny,mlp,convnet,dynamic", "torchbind_steps.json",
                                    workload_steps)


if __name__ == "__main__":
    raise SystemExit(main())
