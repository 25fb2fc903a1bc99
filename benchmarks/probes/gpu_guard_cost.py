"""What does the python backend's device guard cost per call on a host with several GPUs, and would a cheaper check help?

Run on a GPU host from the repository root (``source tools/gpu_setup.sh`` first)::

    python benchmarks/probes/gpu_guard_cost.py [--n 200000]

With one GPU visible an engine has no guard; with several, every call asks the driver which
context is current (``CallerDevice.enter``/``exit``). This times, in ns per call (best of five
rounds), with GPU 0's primary context current: the guard's enter and exit, the
``cuCtxGetCurrent`` of cuda.bindings it makes, the same driver function through ctypes (the
GIL kept, one pointer per thread), the runtime's ``cudaGetDevice``, and torch's
``current_device`` when torch is there.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _time(fn: Callable[[], object], n: int) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=200_000)
    args = p.parse_args(argv)
    n = args.n

    from cuda.bindings import driver, runtime
    from trt_runtime_backends.python import cuda

    state = cuda.get_device(0)
    state.activate()
    guard = cuda.CallerDevice(state)
    ours = int(state.primary_context())

    def enter_exit() -> None:
        guard.exit(guard.enter())

    get = driver.cuCtxGetCurrent

    def bindings_get() -> bool:
        err, ctx = get()
        return int(err) == 0 and int(ctx) == ours

    lib = ctypes.PyDLL("libcuda.so.1")  # PyDLL: the GIL is kept across the call
    fn = lib.cuCtxGetCurrent
    fn.restype = ctypes.c_int
    local = threading.local()
    slot = ctypes.c_void_p()
    pointer = ctypes.pointer(slot)
    local.slot, local.pointer = slot, pointer

    def ctypes_get() -> bool:
        return fn(pointer) == 0 and slot.value == ours

    def ctypes_local_get() -> bool:
        here = local
        return fn(here.pointer) == 0 and here.slot.value == ours

    rt_get = runtime.cudaGetDevice

    def runtime_device() -> bool:
        err, dev = rt_get()
        return int(err) == 0 and dev == 0

    rows: list[tuple[str, Callable[[], object]]] = [
        ("empty call (the loop's floor)", lambda: None),
        ("CallerDevice.enter + exit (today)", enter_exit),
        ("cuda.bindings cuCtxGetCurrent + ints", bindings_get),
        ("ctypes cuCtxGetCurrent, one pointer", ctypes_get),
        ("ctypes cuCtxGetCurrent, thread-local pointer", ctypes_local_get),
        ("cuda.bindings cudaGetDevice", runtime_device),
    ]
    try:
        import torch

        torch.cuda.init()
        rows.append(("torch.cuda.current_device()", torch.cuda.current_device))
        rows.append(("torch._C._cuda_getDevice()", torch._C._cuda_getDevice))
    except Exception as exc:  # torch absent or without CUDA
        print(f"(no torch rows: {exc})")
    assert bindings_get() and ctypes_get() and ctypes_local_get(), "GPU 0's primary context is not current"
    for label, fn_ in rows:
        print(f"{label:48s} {_time(fn_, n):8.1f} ns", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
