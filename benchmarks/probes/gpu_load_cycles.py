"""What does one load/call/close cycle cost per backend, and how much of it is the JIT a runtime cache saves?

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

Writes ``load_cycles.json`` to ``--out`` (default ``$OUT`` or ``.``).
"""

from __future__ import annotations

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


def main(argv: list[str] | None = None) -> None:
    made = _gpu_tool.parser(__doc__)
    made.add_argument("--cycles", type=int, default=60)
    made.add_argument("--backends", default="python,torchbind")
    args = made.parse_args(argv)
    import torch
    from cuda.bindings import runtime

    import trt_runtime
    from trt_runtime import builders

    built = builders.build_mlp(256, 8, batch=8, dtype="float16")
    x = torch.from_numpy(built.random_inputs()[0]).cuda()
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
