"""Both backends side by side in one run, against the raw TensorRT-RTX loop.

Workload: the 8-layer, 256-wide fp16 MLP at batch 8 (launch-bound), one engine plan
shared by every row. Rows, each in ``disabled`` (eager) and ``whole_graph_capture``:

* ``raw``: the TensorRT-RTX Python loop with pre-bound addresses: one execution
  context, ``execute_async_v3`` on a private stream, then a stream sync;
* ``python``: ``engine.execute(x)`` + ``engine.synchronize()`` on the python backend;
* ``torchbind``: the same on the torchbind backend (torch-tensorrt's C++ runtime);
* ``torchbind-op``: ``torch.ops.tensorrt.execute_engine([x], native)`` called directly,
  showing what this project's layer adds on top of torch-tensorrt's op.

Every call is timed from before the call to after the synchronize, so a row is what a
caller waits for. Inputs are torch CUDA tensors (zero-copy on both backends). Prints a
Markdown table with ratios to the raw loop and writes JSON (``--json``).

Anchors measured earlier on the H200 host: torch-tensorrt-rtx 2.11 ``execute_engine``
101.6 us/call where the raw loop took 47.9 us; 2.14 with ``whole_graph_capture`` 22.1 us.

Usage: ``python benchmarks/bench_backends.py [--iterations N] [--warmup N] [--json PATH]
[--markdown PATH]``
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

STRATEGIES = ("disabled", "whole_graph_capture")
ANCHORS_US = {
    ("torchbind-op", "disabled", "2.11"): 101.6,
    ("raw", "disabled", "2.11"): 47.9,
    ("torchbind", "whole_graph_capture", "2.14"): 22.1,
}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _host(value: Any) -> Any:
    import numpy as np

    return value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)


def raw_loop(
    plan: bytes, x: Any, strategy: str
) -> tuple[Callable[[], None], Callable[[], None], Callable[[], None]]:
    """``(call, synchronize, close)`` of the raw TensorRT-RTX loop with pre-bound addresses."""
    import tensorrt_rtx as trt
    import torch

    runtime = trt.Runtime(trt.Logger(trt.Logger.ERROR))
    engine = runtime.deserialize_cuda_engine(plan)
    config = engine.create_runtime_config()
    config.cuda_graph_strategy = (
        trt.CudaGraphStrategy.WHOLE_GRAPH_CAPTURE
        if strategy == "whole_graph_capture"
        else trt.CudaGraphStrategy.DISABLED
    )
    context = engine.create_execution_context(config)
    out = torch.empty_like(x)
    stream = torch.cuda.Stream()
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    context.set_input_shape(inputs[0], tuple(x.shape))
    for name in names:
        context.set_tensor_address(name, x.data_ptr() if name in inputs else out.data_ptr())
    handle = stream.cuda_stream

    def call() -> None:
        if not context.execute_async_v3(handle):
            raise RuntimeError("execute_async_v3 returned False")

    def close() -> None:
        nonlocal context, engine
        stream.synchronize()
        del context, engine

    return call, stream.synchronize, close


def _trimmed_mean(values: list[float], cut: float = 0.05) -> float:
    """Mean of the middle 90%: the pairs alternate who pays a shape change, so the
    per-pair differences are two-sided and their median would land on one side."""
    ordered = sorted(values)
    k = int(len(ordered) * cut)
    middle = ordered[k : len(ordered) - k] or ordered
    return sum(middle) / len(middle)


def paired_overhead(args: Any, torch: Any, status: Any, notes: list[str]) -> list[dict[str, Any]]:
    """The torchbind backend's own per-call cost: its ``execute`` and torch-tensorrt's op,
    alternated call by call on one native engine, so JIT state and clocks drift alike."""
    import time

    import trt_runtime
    from trt_runtime import EngineSource, RuntimeSettings, builders
    from trt_runtime.bench import percentile

    if not status.get("torchbind"):
        return []
    backend = trt_runtime.get_backend("torchbind")
    workloads = {
        "mlp_b8": (builders.build_mlp(256, 8, batch=8, dtype="float16"), [(8, 256)]),
        "dynamic_3": (
            builders.build_dynamic(256, "float16", profiles=((1, 8, 64),)),
            [(1, 256), (8, 256), (64, 256)],
        ),
    }
    op = torch.ops.tensorrt.execute_engine
    rows = []
    for workload, (built, shapes) in workloads.items():
        xs = [torch.randn(*shape, dtype=torch.float16, device="cuda") for shape in shapes]
        for strategy in STRATEGIES:
            if strategy != "disabled" and not backend.capabilities.supports_cuda_graph_strategy:
                continue
            engine = backend.load_engine(
                EngineSource(built.plan, name=workload),
                settings=RuntimeSettings(cuda_graph_strategy=strategy),
            )
            native, sync = engine.native, torch.cuda.current_stream().synchronize
            ours: list[float] = []
            theirs: list[float] = []
            clock = time.perf_counter_ns
            for i in range(args.warmup + args.iterations):
                x = xs[i % len(xs)]
                # Who goes first alternates: the first call of a pair sees the shape change
                # (and its cost in torch-tensorrt), the second does not.
                t0 = clock()
                if i % 2 == 0:
                    engine.execute(x)
                    engine.synchronize()
                else:
                    op([x], native)
                    sync()
                t1 = clock()
                if i % 2 == 0:
                    op([x], native)
                    sync()
                else:
                    engine.execute(x)
                    engine.synchronize()
                t2 = clock()
                if i >= args.warmup:
                    first, second = (t1 - t0) / 1000.0, (t2 - t1) / 1000.0
                    ours.append(first if i % 2 == 0 else second)
                    theirs.append(second if i % 2 == 0 else first)
            engine.close()
            rows.append(
                {
                    "workload": workload,
                    "strategy": strategy,
                    "backend_us": percentile(ours, 50),
                    "op_us": percentile(theirs, 50),
                    "overhead_us": _trimmed_mean([a - b for a, b in zip(ours, theirs, strict=True)]),
                }
            )
            print(f"  paired {workload} [{strategy}]: {rows[-1]}", file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--json", type=Path, default=Path("bench_backends.json"))
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table to PATH")
    args = parser.parse_args(argv)

    import torch

    import trt_runtime
    from trt_runtime import EngineSource, RuntimeSettings, builders
    from trt_runtime.bench import BenchResult, benchmark, write_json

    if not torch.cuda.is_available():
        print("no CUDA GPU: torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    built = builders.build_mlp(256, 8, batch=8, dtype="float16")
    rng = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(8, 256, generator=rng, dtype=torch.float32).to(torch.float16).cuda()
    status = trt_runtime.backend_status()
    results: list[BenchResult] = []
    notes: list[str] = []

    def run(label: str, strategy: str, call: Callable[[], Any], sync: Callable[[], Any], **meta: Any) -> None:
        result = benchmark(
            call,
            iterations=args.iterations,
            warmup=args.warmup,
            label=f"{label} [{strategy}]",
            synchronize=sync,
            metadata={"row": label, "strategy": strategy, **meta},
        )
        results.append(result)
        print(f"  {result.label:<40} median {result.median_us:8.1f} us", file=sys.stderr)

    for strategy in STRATEGIES:
        try:
            call, sync, close = raw_loop(built.plan, x, strategy)
        except Exception as exc:  # e.g. an older TensorRT-RTX without this strategy
            notes.append(f"raw [{strategy}]: not run ({exc})")
        else:
            run("raw", strategy, call, sync)
            close()
        for name in ("python", "torchbind"):
            availability = status.get(name)
            if not availability:
                notes.append(f"{name}: not run ({availability.reason if availability else 'not installed'})")
                continue
            backend = trt_runtime.get_backend(name)
            caps = backend.capabilities
            if strategy != "disabled" and not caps.supports_cuda_graph_strategy:
                why = caps.notes.get("supports_cuda_graph_strategy", "unsupported")
                notes.append(f"{name} [{strategy}]: not run ({why})")
                continue
            engine = backend.load_engine(
                EngineSource(built.plan, name="mlp8x256"),
                settings=RuntimeSettings(cuda_graph_strategy=strategy),
            )
            first = engine.execute(x)[0]
            engine.synchronize()
            run(name, strategy, lambda e=engine: e.execute(x), engine.synchronize)
            native = getattr(engine, "native", None)
            if native is not None:
                op = torch.ops.tensorrt.execute_engine
                current = torch.cuda.current_stream()
                run("torchbind-op", strategy, lambda n=native, f=op: f([x], n), current.synchronize)
            again = engine.execute(x)[0]
            engine.synchronize()
            ok = bool((_host(first) == _host(again)).all())
            if not ok:
                notes.append(f"{name} [{strategy}]: two calls on the same input differ")
            engine.close()

    try:
        paired = paired_overhead(args, torch, status, notes)
    except Exception as exc:  # never lose the main table to the extra one
        paired = []
        notes.append(f"paired overhead: not measured ({type(exc).__name__}: {exc})")

    raw = {r.metadata["strategy"]: r.median_us for r in results if r.metadata["row"] == "raw"}
    versions = {
        "torch": torch.__version__,
        "torch-tensorrt-rtx": _version("torch-tensorrt-rtx"),
        "tensorrt_rtx": __import__("tensorrt_rtx").__version__,
        "device": torch.cuda.get_device_name(0),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "workload": "MLP 8 layers x 256, fp16, batch 8",
        "iterations": args.iterations,
        "warmup": args.warmup,
    }
    lines = [
        f"Device: {versions['device']}; torch {versions['torch']}; torch-tensorrt-rtx "
        f"{versions['torch-tensorrt-rtx']}; TensorRT-RTX {versions['tensorrt_rtx']}; {versions['date']}",
        "",
        "| row | strategy | median (us) | p90 (us) | p99 (us) | / raw loop |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        strategy = r.metadata["strategy"]
        ratio = r.median_us / raw[strategy] if raw.get(strategy) else float("nan")
        cells = (r.metadata["row"], strategy, f"{r.median_us:.1f}", f"{r.p90_us:.1f}", f"{r.p99_us:.1f}")
        lines.append(f"| {' | '.join(cells)} | {ratio:.2f}x |")
    major_minor = ".".join((versions["torch-tensorrt-rtx"] or "?").split(".")[:2])
    anchors = [
        f"- anchor {row} [{strategy}] on torch-tensorrt-rtx {ver}: {value} us"
        for (row, strategy, ver), value in ANCHORS_US.items()
        if ver == major_minor or row == "raw"
    ]
    if paired:
        lines += [
            "",
            "Wrapper overhead, paired: `engine.execute(x)` and `execute_engine([x], engine.native)`",
            "alternate on one engine (same state, same JIT; who goes first alternates), each call",
            "followed by a synchronize. Medians of each, and the mean of the per-pair differences",
            "(middle 90%), in us.",
            "",
            "| workload | strategy | torchbind backend | execute_engine op | backend - op (trimmed mean) |",
            "| --- | --- | ---: | ---: | ---: |",
        ]
        for p in paired:
            lines.append(
                f"| {p['workload']} | {p['strategy']} | {p['backend_us']:.1f} | {p['op_us']:.1f} "
                f"| {p['overhead_us']:.1f} |"
            )
    table = "\n".join([*lines, "", *anchors, *(f"- {n}" for n in notes)])
    print(table)
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(table + "\n")
    write_json(
        results,
        args.json,
        metadata={
            **versions,
            "notes": notes,
            "paired_overhead": paired,
            "ratios_to_raw": {
                r.label: (r.median_us / raw[r.metadata["strategy"]])
                for r in results
                if raw.get(r.metadata["strategy"])
            },
        },
    )
    print(f"\nJSON: {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
