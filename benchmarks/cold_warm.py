"""Cold vs warm runtime cache: the conv net's first inference in fresh processes.

One pair is two fresh processes on one cache path: the first starts with no cache file
and saves the runtime cache on exit (``trt_runtime.runtime_cache(engine, path)``), the
second loads it. In one process TensorRT-RTX's in-memory JIT state would hide the cache.
The first ``execute`` (context creation, kernel compilation or cache load, the run and
its synchronize) is timed in each; a pair's ratio is cold / warm, and the target is the
median ratio over the pairs.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .environment import one_line

__all__ = ["first_inference", "run_pairs", "spawn_first_inference", "summarize_pairs"]

#: ``launch(plan_path, cache_path, timeout_s) -> first_inference's dict`` (a fresh process).
Launcher = Callable[[Path, Path, float], dict[str, Any]]


def first_inference(plan_path: str, cache_path: str) -> dict[str, Any]:
    """In this (fresh) process: load the plan with the python backend and time its first
    call with the runtime cache at ``cache_path`` (saved on leaving). Device tensors from
    torch when it imports (prepared before timing), host numpy arrays otherwise."""
    import trt_runtime
    from trt_runtime import EngineSource, get_backend

    backend: Any = get_backend("python")
    engine: Any = backend.load_engine(EngineSource(Path(plan_path).read_bytes(), name="convnet"))
    spec_in, spec_out = engine.inputs[0], engine.outputs[0]
    inputs = "numpy (host)"
    try:
        import torch

        x = torch.randn(spec_in.shape, device="cuda").to(getattr(torch, spec_in.dtype))
        y = torch.empty(spec_out.shape, device="cuda", dtype=getattr(torch, spec_out.dtype))
        torch.cuda.synchronize()
        inputs = "torch CUDA tensors, outputs= on engine.stream"

        def call() -> None:
            engine.execute(x, outputs=[y], stream=engine.stream)
            engine.synchronize()
    except ImportError:
        import numpy as np

        host = np.random.default_rng(0).standard_normal(spec_in.shape).astype(spec_in.dtype)

        def call() -> None:
            engine.execute(host)

    with trt_runtime.runtime_cache(engine, cache_path) as cache:
        t0 = time.perf_counter()
        call()
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        call()
        second = time.perf_counter() - t0
        drained = cache.drain_count
    engine.close()
    return {"first_ms": first * 1e3, "second_ms": second * 1e3, "drained": drained, "inputs": inputs}


def spawn_first_inference(script: Path) -> Launcher:
    """A launcher running ``script --first-inference PLAN CACHE`` in a fresh interpreter."""

    def launch(plan_path: Path, cache_path: Path, timeout_s: float) -> dict[str, Any]:
        proc = subprocess.run(
            [sys.executable, str(script), "--first-inference", str(plan_path), str(cache_path)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"exited {proc.returncode}: {' | '.join(tail)}")
        result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        return result

    return launch


def run_pairs(
    plan: bytes,
    pairs: int,
    workdir: Path,
    launch: Launcher,
    *,
    deadline: float,
    timeout_s: float = 120.0,
    clock: Callable[[], float] = time.monotonic,
    echo: Callable[[str], None] = lambda text: None,
) -> dict[str, Any]:
    """Run up to ``pairs`` cold/warm pairs (fewer if ``deadline`` passes after the first);
    the record :func:`summarize_pairs` makes. A failing process ends the pairs with the error."""
    plan_path = workdir / "convnet.plan"
    plan_path.write_bytes(plan)
    done: list[dict[str, Any]] = []
    error = ""
    for index in range(pairs):
        if index and clock() > deadline:
            error = f"time budget: ran {index} of {pairs} pairs"
            break
        cache_path = workdir / f"convnet-{index}.trtcache"
        cache_path.unlink(missing_ok=True)
        try:
            cold = launch(plan_path, cache_path, timeout_s)
            size = cache_path.stat().st_size if cache_path.exists() else 0
            warm = launch(plan_path, cache_path, timeout_s)
        except Exception as exc:
            error = f"pair {index + 1}: {type(exc).__name__}: {one_line(exc)}"
            break
        pair = {"cold_ms": float(cold["first_ms"]), "warm_ms": float(warm["first_ms"]), "cache_bytes": size,
                "inputs": cold.get("inputs", "")}
        pair["ratio"] = pair["cold_ms"] / pair["warm_ms"] if pair["warm_ms"] > 0 else float("inf")
        done.append(pair)
        echo(f"  cold/warm pair {index + 1}: cold {pair['cold_ms']:.1f} ms, warm {pair['warm_ms']:.1f} ms, "
             f"{pair['ratio']:.1f}x")
    return summarize_pairs(done, pairs, error)


def summarize_pairs(done: list[dict[str, Any]], wanted: int, error: str = "") -> dict[str, Any]:
    """The cold/warm record: every pair, the medians, and why fewer than ``wanted`` ran."""
    record: dict[str, Any] = {"workload": "convnet", "backend": "python", "pairs_wanted": wanted,
                              "pairs": done}
    if error:
        record["error"] = error
    if not done:
        record["skipped"] = error or "no pair ran"
        return record
    record["median_ratio"] = statistics.median(p["ratio"] for p in done)
    record["median_cold_ms"] = statistics.median(p["cold_ms"] for p in done)
    record["median_warm_ms"] = statistics.median(p["warm_ms"] for p in done)
    return record
