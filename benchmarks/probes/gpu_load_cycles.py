"""What does a load/call/close cycle cost per backend, and does memory stay flat over many, beside a bare TensorRT-RTX loop?

Run on the GPU host (tensorrt_rtx, cuda-python, torch with CUDA; torch-tensorrt for torchbind)::

    python3 benchmarks/probes/gpu_load_cycles.py [--out DIR] [--cycles 60] [--backends python,torchbind]

Builds the GPU soak's engine (``mlp_fp16``: 8 layers of 256x256 + ReLU, fp16, batch 8; the
``engines`` fixture of ``tests/gpu/conftest.py`` builds the same), then per backend runs
``--cycles`` cycles of ``trt_runtime.load`` / ``engine(x)`` / ``close()`` twice: without a
runtime cache (every load compiles its kernels on its first call) and with one
:class:`trt_runtime.RuntimeCache` shared by every load (filled by the first cycle). Each phase is
timed on its own (load, first call with a synchronize, close), medians in ms; device memory
in use (``cudaMemGetInfo``) and RSS at the first and last cycle after a warm-up of a tenth.
The 10,000-cycle soak (``tests/gpu/test_gpu_faults.py``) is sized from these figures.

``--trend N``: instead, N cycles of each of ``--backends`` with the shared cache, where ``raw`` is
a bare TensorRT-RTX loop (deserialize, a context with one runtime cache shared by every cycle,
bind, ``execute_async_v3``, synchronize, delete; no trt-runtime code) and ``raw-nocache`` the same
without a runtime cache, with a line every
``--every`` cycles after ``gc.collect()``: device memory in use, torch's reserved memory, RSS and
how many objects of the tracked types that hold CUDA resources are alive (``_HOLDERS``). Growth in the
``raw`` rows is TensorRT-RTX's own.

Writes ``load_cycles.json`` to ``--out`` (default ``$OUT`` or ``.``).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import _gpu_tool  # noqa: E402


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _device_used(runtime: Any) -> int:
    free, total = _gpu_tool.ok(runtime.cudaMemGetInfo(), "cudaMemGetInfo")
    return int(total) - int(free)


def _cycles(trt_runtime: Any, torch: Any, runtime: Any, plan: bytes, backend: str, x: Any, cycles: int,
            cache: Any) -> dict[str, Any]:
    settings = None if cache is None else trt_runtime.RuntimeSettings(runtime_cache=cache)
    phases: dict[str, list[float]] = {"load": [], "first call": [], "close": [], "cycle": []}
    marks = []
    warmup = max(1, cycles // 10)
    for cycle in range(1, cycles + 1):
        t0 = time.perf_counter()
        engine = trt_runtime.load(plan, backend, name="mlp_fp16", settings=settings)
        t1 = time.perf_counter()
        engine(x)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        engine.close()
        t3 = time.perf_counter()
        took = {"load": t1 - t0, "first call": t2 - t1, "close": t3 - t2, "cycle": t3 - t0}
        for name, seconds in took.items():
            phases[name].append(seconds * 1e3)
        if cycle in (warmup, cycles):
            marks.append((_device_used(runtime), _rss()))
    return {
        "cycles": cycles,
        "median_ms": {name: round(statistics.median(values), 3) for name, values in phases.items()},
        "first_cycle_ms": round(phases["cycle"][0], 3),
        "device_used_growth_bytes": marks[-1][0] - marks[0][0],
        "rss_growth_bytes": marks[-1][1] - marks[0][1],
    }


#: Object types counted by ``--trend`` (by class name): what holds CUDA resources, and the engines and
#: lanes. Only objects the garbage collector tracks can be counted: TensorRT's pybind11 objects
#: (``ICudaEngine``, ``IExecutionContext``) and torch's ``ScriptObject`` are not among them.
_HOLDERS = ("Buffer", "Stream", "Event", "PythonEngine", "TorchbindEngine", "Lane", "PythonLane",
            "TorchbindLane")


def _alive() -> dict[str, int]:
    import gc

    gc.collect()
    counts: dict[str, int] = {}
    for obj in gc.get_objects():
        name = type(obj).__name__
        if name in _HOLDERS:
            counts[name] = counts.get(name, 0) + 1
    return counts


def _raw_cycle(trt: Any, runtime: Any, plan: bytes, x: Any, y: Any, stream: int,
               shared: list[Any] | None) -> None:
    engine = runtime.deserialize_cuda_engine(plan)
    config = engine.create_runtime_config()
    if shared is not None:
        if not shared:
            shared.append(config.create_runtime_cache())
        config.set_runtime_cache(shared[0])
    context = engine.create_execution_context(config)
    context.set_tensor_address(engine.get_tensor_name(0), x.data_ptr())
    context.set_tensor_address(engine.get_tensor_name(1), y.data_ptr())
    assert context.execute_async_v3(stream)
    del context, config, engine


def _cycle_fn(backend: str, trt_runtime: Any, torch: Any, plan: bytes, x: Any) -> Any:
    """One cycle of ``backend`` (``raw``: the bare TensorRT-RTX loop), with its shared cache
    (``raw-nocache``: the bare loop without a runtime cache)."""
    if not backend.startswith("raw"):
        settings = trt_runtime.RuntimeSettings(runtime_cache=trt_runtime.RuntimeCache())

        def cycle() -> None:
            engine = trt_runtime.load(plan, backend, name="mlp_fp16", settings=settings)
            engine(x)
            engine.close()

        return cycle
    import tensorrt_rtx as trt

    runtime = trt.Runtime(trt.Logger(trt.Logger.ERROR))
    y = torch.empty_like(x)
    shared: list[Any] | None = None if backend == "raw-nocache" else []
    stream = torch.cuda.current_stream().cuda_stream

    def raw() -> None:
        _raw_cycle(trt, runtime, plan, x, y, stream, shared)
        torch.cuda.synchronize()

    return raw


def _trend(trt_runtime: Any, torch: Any, cuda_rt: Any, plan: bytes, backends: list[str], x: Any,
           cycles: int, every: int) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for backend in backends:
        lines = rows[backend] = []
        started = time.perf_counter()
        try:
            cycle = _cycle_fn(backend, trt_runtime, torch, plan, x)
            for n in range(1, cycles + 1):
                cycle()
                if n % every == 0 or n == 1:
                    torch.cuda.synchronize()
                    line = {"cycle": n, "s": round(time.perf_counter() - started, 1),
                            "device": _device_used(cuda_rt), "torch_reserved": torch.cuda.memory_reserved(),
                            "rss": _rss(), "alive": _alive()}
                    lines.append(line)
                    print(backend, json.dumps(line), flush=True)
        except Exception as exc:
            print(f"{backend}: {type(exc).__name__}: {exc}", file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> None:
    made = _gpu_tool.parser(__doc__)
    made.add_argument("--cycles", type=int, default=60)
    made.add_argument("--backends", default="python,torchbind",
                      help="--trend also takes raw and raw-nocache (the bare TensorRT-RTX loop)")
    made.add_argument("--trend", type=int, default=0, help="cycles per backend of the trend mode (0: off)")
    made.add_argument("--every", type=int, default=500)
    args = made.parse_args(argv)
    import torch
    from cuda.bindings import runtime

    import trt_runtime
    from trt_runtime import builders

    built = builders.build_mlp(256, 8, batch=8, dtype="float16")
    x = torch.from_numpy(built.random_inputs()[0]).cuda()
    if args.trend:
        backends = args.backends.split(",")
        trend = _trend(trt_runtime, torch, runtime, built.plan, backends, x, args.trend, args.every)
        _gpu_tool.write_json(args.out, "load_cycles_trend.json", trend)
        return
    rows: dict[str, Any] = {}
    for backend in args.backends.split(","):
        for label, cache in (("no cache", None), ("shared RuntimeCache", trt_runtime.RuntimeCache())):
            try:
                row = _cycles(trt_runtime, torch, runtime, built.plan, backend, x, args.cycles, cache)
            except Exception as exc:  # a backend this host lacks: reported, the others still run
                print(f"{backend}, {label}: {type(exc).__name__}: {exc}", file=sys.stderr)
                continue
            rows[f"{backend}, {label}"] = row
            med = row["median_ms"]
            print(f"{backend:9} {label:20} cycle {med['cycle']:8.2f} ms (load {med['load']:.2f}, "
                  f"first call {med['first call']:.2f}, close {med['close']:.2f}; "
                  f"first cycle {row['first_cycle_ms']:.1f}); "
                  f"growth after warm-up: device {row['device_used_growth_bytes']:+d} B, "
                  f"RSS {row['rss_growth_bytes']:+d} B", flush=True)
    _gpu_tool.write_json(args.out, "load_cycles.json", rows)


if __name__ == "__main__":
    main()
