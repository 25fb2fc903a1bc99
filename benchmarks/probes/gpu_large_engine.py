"""Does an engine over 2 GiB pack as TR01, load and run, and what host memory does its load take?

Build an engine over 2 GiB, pack it as TR01, load it through trt_runtime and run it.

Usage (GPU host):  python3 benchmarks/probes/gpu_large_engine.py build DIR   # then
                   python3 benchmarks/probes/gpu_large_engine.py load DIR    # a fresh process
Each step prints one JSON line. ``load`` measures the host memory the load costs:
``extra_peak_rss`` is the rise of the process's peak RSS (VmHWM, reset first) over the
RSS just before ``trt_runtime.load``, with the split into anonymous and file-backed
pages (an mmap of the blob counts as file-backed RSS while TensorRT reads it).
"""

from __future__ import annotations

import json
import os
import sys
import time

WIDTH = int(os.environ.get("LARGE_WIDTH", 8192))
LAYERS = int(os.environ.get("LARGE_LAYERS", 9))  # 9 x 8192 x 8192 fp32 = 2.25 GiB of weights


def _status() -> dict[str, int]:
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                fields[key] = int(value.split()[0]) * 1024
    return fields


def build(directory: str) -> None:
    import numpy as np
    import tensorrt_rtx as trt

    from trt_runtime.formats import write_tr01
    from trt_runtime.protocols import TensorSpec

    os.makedirs(directory, exist_ok=True)
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    x = network.add_input("x", trt.float32, (1, WIDTH))
    rng = np.random.default_rng(7)
    keep = []
    t = x
    ref_x = rng.standard_normal((1, WIDTH))
    ref = ref_x.copy()
    for _ in range(LAYERS):
        w = (rng.standard_normal((WIDTH, WIDTH), dtype=np.float32) / np.sqrt(WIDTH)).astype(np.float32)
        keep.append(w)
        ref = ref @ w.astype(np.float64)
        const = network.add_constant((WIDTH, WIDTH), trt.Weights(w))
        t = network.add_matrix_multiply(t, trt.MatrixOperation.NONE, const.get_output(0), trt.MatrixOperation.NONE)
        t = t.get_output(0)
    t.name = "y"
    network.mark_output(t)
    started = time.perf_counter()
    plan = builder.build_serialized_network(network, builder.create_builder_config())
    build_s = time.perf_counter() - started
    if plan is None:
        raise SystemExit("the builder returned no plan")
    bindings = [
        TensorSpec("x", "float32", (1, WIDTH), True),
        TensorSpec("y", "float32", (1, WIDTH), False),
    ]
    path = os.path.join(directory, "large.tr01")
    started = time.perf_counter()
    size = write_tr01(path, memoryview(plan), bindings, device_id=0)
    write_s = time.perf_counter() - started
    np.save(os.path.join(directory, "x.npy"), ref_x.astype(np.float32))
    np.save(os.path.join(directory, "y_ref.npy"), ref)
    print(json.dumps({
        "step": "build", "engine_bytes": plan.nbytes, "blob_bytes": size,
        "over_2GiB": plan.nbytes > 2**31, "build_s": round(build_s, 1), "write_s": round(write_s, 1),
    }), flush=True)


def load(directory: str) -> None:
    import numpy as np

    import trt_runtime

    backend = trt_runtime.get_backend("python")
    x = np.load(os.path.join(directory, "x.npy"))
    y_ref = np.load(os.path.join(directory, "y_ref.npy"))
    # Initialize CUDA and TensorRT first, so the measurement is the load alone.
    from cuda.core import Device

    Device(0).set_current()
    import tensorrt_rtx  # noqa: F401

    with open("/proc/self/clear_refs", "w") as f:  # reset VmHWM to the current RSS
        f.write("5")
    before = _status()
    started = time.perf_counter()
    engine = trt_runtime.load(os.path.join(directory, "large.tr01"), backend=backend)
    load_s = time.perf_counter() - started
    after_load = _status()
    (y,) = engine.execute(x)
    after_run = _status()
    error = float(np.abs(y.astype(np.float64) - y_ref).max() / np.abs(y_ref).max())
    blob = os.path.getsize(os.path.join(directory, "large.tr01"))
    extra = after_load["VmHWM"] - before["VmRSS"]
    print(json.dumps({
        "step": "load", "blob_bytes": blob, "load_s": round(load_s, 2),
        "rss_before": before["VmRSS"], "peak_rss_after_load": after_load["VmHWM"],
        "extra_peak_rss": extra, "extra_over_engine": round(extra / blob, 3),
        "anon_after_load": after_load["RssAnon"], "file_after_load": after_load["RssFile"],
        "anon_rise": after_load["RssAnon"] - before["RssAnon"],
        "peak_after_run": after_run["VmHWM"], "max_rel_error": error,
        "output_ok": bool(error < 2e-2),
    }), flush=True)


if __name__ == "__main__":
    {"build": build, "load": load}[sys.argv[1]](sys.argv[2])
