"""Per-call latency and throughput of the python backend against a raw TensorRT-RTX loop.

One run, on one GPU: for each engine (the 8x256 fp16 MLP at batch 8, and a ResNet-18-
shaped fp16 conv net at batch 1) and each CUDA graph strategy (eager, whole_graph_capture):

* ``raw``: ``context.execute_async_v3(stream)``, addresses bound once;
* ``backend``: ``engine.execute(x, outputs=[y], stream=engine.stream)`` with device arrays
  (torch tensors when torch is installed, else the backend's ``DeviceArray``) preallocated;
* ``backend+events``: the same with a caller stream (event ordering on every call);
* ``backend+alloc``: the same without ``outputs=`` (a new output per call).

Every row is measured the same two ways:

* latency: one call then ``cudaStreamSynchronize`` of the stream the caller waits on,
  timed per call: median, p90, p99;
* throughput: N calls back to back, then one synchronize: mean time per call, and the
  GPU time per call from CUDA events around that loop.

Ratios are each row's latency median and throughput mean over the raw row's. Prints a
Markdown table and writes JSON to ``--json`` (default ``$OUT/bench_python.json`` or
``./bench_python.json``). Needs a GPU, tensorrt-rtx, cuda-python and numpy.

    python benchmarks/bench_python.py [--iters 2000] [--json path] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def _measure(call: Any, stream: int, iters: int, warmup: int) -> dict[str, float]:
    """Latency (call + sync, per call) and throughput (calls back to back) of ``call``,
    whose work ends on (or is waited for by) ``stream``."""
    from cuda.bindings import runtime as rt

    sync = rt.cudaStreamSynchronize
    for _ in range(warmup):
        call()
    sync(stream)
    clock = time.perf_counter
    latency = []
    for _ in range(iters):
        t0 = clock()
        call()
        sync(stream)
        latency.append((clock() - t0) * 1e6)
    _, start = rt.cudaEventCreate()
    _, stop = rt.cudaEventCreate()
    sync(stream)
    rt.cudaEventRecord(start, stream)
    t0 = clock()
    for _ in range(iters):
        call()
    rt.cudaEventRecord(stop, stream)
    sync(stream)
    total = clock() - t0
    _, ms = rt.cudaEventElapsedTime(start, stop)
    rt.cudaEventDestroy(start)
    rt.cudaEventDestroy(stop)
    return {
        "latency_median_us": statistics.median(latency),
        "latency_p90_us": _percentile(latency, 90),
        "latency_p99_us": _percentile(latency, 99),
        "throughput_us": total / iters * 1e6,
        "gpu_us": ms * 1e3 / iters,
    }


def _raw(plan: bytes, trt: Any, device: Any, wgc: bool, iters: int, warmup: int,
         logger: Any) -> dict[str, float]:
    from trt_runtime.dtypes import itemsize, normalize_dtype

    engine = trt.Runtime(logger).deserialize_cuda_engine(plan)
    config = engine.create_runtime_config()
    if wgc:
        config.cuda_graph_strategy = trt.CudaGraphStrategy.WHOLE_GRAPH_CAPTURE
    context = engine.create_execution_context(config)
    stream = device.create_stream()
    handle = int(stream.handle)
    buffers = []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        shape = tuple(engine.get_tensor_shape(name))
        size = itemsize(normalize_dtype(engine.get_tensor_dtype(name)))
        for d in shape:
            size *= d
        buf = device.allocate(size, stream=stream)
        buffers.append(buf)
        context.set_tensor_address(name, int(buf.handle))
    execute = context.execute_async_v3
    result = _measure(lambda: execute(handle), handle, iters, warmup)
    stream.sync()
    del context, engine
    return result


def _backend_runs(plan: bytes, name: str, wgc: bool, iters: int, warmup: int) -> dict[str, dict[str, Any]]:
    import numpy as np

    from trt_runtime import EngineSource, RuntimeSettings, get_backend

    backend: Any = get_backend("python")
    settings = RuntimeSettings.coerce({"cuda_graph_strategy": "whole_graph_capture" if wgc else "disabled"})
    engine: Any = backend.load_engine(EngineSource(plan, name=name), settings=settings)
    spec_in, spec_out = engine.inputs[0], engine.outputs[0]
    rng = np.random.default_rng(0)
    host = rng.standard_normal(spec_in.shape).astype(spec_in.dtype)
    try:
        import torch

        x = torch.from_numpy(host).cuda()
        y = torch.empty(spec_out.shape, dtype=getattr(torch, spec_out.dtype), device="cuda")
        caller: Any = torch.cuda.Stream()
        caller_handle = caller.cuda_stream
        torch.cuda.synchronize()
        kind = "torch"
    except ImportError:
        x = _device_copy(engine, host)
        y = _device_copy(engine, np.empty(spec_out.shape, dtype=spec_out.dtype))
        caller = engine._state.create_stream()
        caller_handle = int(caller.handle)
        kind = "DeviceArray"
    ours = engine.stream
    handle = int(ours.handle)
    execute = engine.execute
    outputs = [y]
    results: dict[str, dict[str, Any]] = {
        "backend": _measure(lambda: execute(x, outputs=outputs, stream=ours), handle, iters, warmup),
        "backend+events": _measure(
            lambda: execute(x, outputs=outputs, stream=caller), caller_handle, iters, warmup
        ),
        "backend+alloc": _measure(lambda: execute(x, stream=ours), handle, iters, warmup),
    }
    for row in results.values():
        row["arrays"] = kind
    engine.close()
    return results


def _device_copy(engine: Any, array: Any) -> Any:
    from cuda.bindings import runtime
    from trt_runtime_backends.python.arrays import DeviceArray

    buf = engine._state.allocate(array.nbytes, engine.stream)
    engine.synchronize()
    runtime.cudaMemcpy(int(buf.handle), array.ctypes.data, array.nbytes,
                       runtime.cudaMemcpyKind.cudaMemcpyHostToDevice)
    return DeviceArray(buf, array.shape, str(array.dtype), engine.device)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=2000, help="timed calls per row (MLP)")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--json", default=None, help="where to write the JSON results")
    parser.add_argument("--quick", action="store_true", help="a few hundred calls, MLP only")
    args = parser.parse_args(argv)

    import tensorrt_rtx as trt
    from cuda.bindings import runtime
    from cuda.core import Device

    from trt_runtime import builders, get_backend

    device = Device(0)
    device.set_current()
    backend: Any = get_backend("python")
    logger = backend.logger  # one logger per process (TensorRT keeps the first)
    _, driver = runtime.cudaDriverGetVersion()
    iters = 300 if args.quick else args.iters
    recipes = [(
        "mlp8x256_fp16_b8",
        lambda: builders.build_mlp(256, 8, batch=8, dtype="float16", logger=logger),
        iters,
    )]
    if not args.quick:
        recipes.append((
            "resnet18_fp16_b1",
            lambda: builders.build_convnet(
                1, "float16", image_size=224, base_channels=64, num_classes=1000, logger=logger
            ),
            max(200, iters // 4),
        ))
    report: dict[str, Any] = {
        "device": device.name,
        "compute_capability": "{}.{}".format(*device.compute_capability),
        "driver": driver,
        "tensorrt_rtx": trt.__version__,
        "python": platform.python_version(),
        "rows": [],
    }
    started = time.perf_counter()
    for name, build, n in recipes:
        plan = build().plan
        for wgc in (False, True):
            mode = "whole_graph_capture" if wgc else "eager"
            raw = _raw(plan, trt, device, wgc, n, args.warmup, logger)
            rows = {"raw": raw, **_backend_runs(plan, name, wgc, n, args.warmup)}
            for label, row in rows.items():
                row.update(
                    engine=name, mode=mode, path=label,
                    latency_ratio=row["latency_median_us"] / raw["latency_median_us"],
                    throughput_ratio=row["throughput_us"] / raw["throughput_us"],
                )
                report["rows"].append(row)
    report["wall_s"] = time.perf_counter() - started

    print(f"\n{report['device']} (sm {report['compute_capability']}), driver {driver}, "
          f"TensorRT-RTX {report['tensorrt_rtx']}\n")
    print("| engine | graphs | path | latency median us | p90 | p99 | x raw | throughput us/call "
          "| x raw | GPU us/call |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in report["rows"]:
        print(f"| {r['engine']} | {r['mode']} | {r['path']} | {r['latency_median_us']:.1f} | "
              f"{r['latency_p90_us']:.1f} | {r['latency_p99_us']:.1f} | {r['latency_ratio']:.3f} | "
              f"{r['throughput_us']:.1f} | {r['throughput_ratio']:.3f} | {r['gpu_us']:.1f} |")
    target = args.json or os.path.join(os.environ.get("OUT", "."), "bench_python.json")
    with open(target, "w") as f:
        json.dump(report, f, indent=1)
    print(f"\nJSON written to {target} ({report['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
