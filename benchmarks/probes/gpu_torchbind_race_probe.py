"""Where do wrong outputs come from when threads share one torchbind engine? (GPU host)

tests/gpu/test_gpu_concurrency_stress.py saw wrong outputs with the torchbind backend
(16 threads, each on its own torch stream set with ``torch.cuda.set_stream``, cycling
batch sizes 1/3/8/17/64 of a dynamic float32 MLP): 35 of 8,000 in one run, 111 in
another, 7 with four contexts; the python backend had none. This probe runs that load
in variants and counts wrong outputs, with the batch sizes and errors of the first few:

* ``op``: torch-tensorrt's bare ``execute_engine`` op under one Python lock (no
  trt-runtime code on the call);
* ``op-1-thread``: the bare op from one thread;
* ``python-backend``: the python backend under the same load;
* ``backend``: the torchbind backend as the stress test calls it;
* ``backend-strategy-eager`` / ``-none``: dynamic-shapes kernel specialization eager / none
  (TensorRT-RTX's default, lazy, swaps in shape-specialized kernels while it runs);
* ``backend-device-sync``: ``torch.cuda.synchronize()`` after every call (no overlap of
  the threads' GPU work);
* ``backend-fixed-batch``: one batch size (no shape changes).

    python benchmarks/probes/gpu_torchbind_race_probe.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import threading
from pathlib import Path

THREADS, CALLS, BATCHES = 16, 500, (1, 3, 8, 17, 64)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--all", action="store_true", help="also the settings, sync and fixed-batch variants")
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    import numpy as np
    import torch

    import trt_runtime
    from trt_runtime import builders

    built = builders.build_mlp(64, 4, batch=None, dtype="float32")
    rtol, atol = (max(t * 10, 1e-3) for t in built.tolerance)
    results: dict[str, dict[str, object]] = {}

    def run(name: str, settings: dict[str, str] | None, *, bare: bool = False, device_sync: bool = False,
            batches: tuple[int, ...] = BATCHES, backend: str = "torchbind", threads: int = THREADS,
            lane_stream: bool = False, worker: bool = False, default_stream: bool = False) -> None:
        engine = trt_runtime.load(built.plan, backend, name="mlp_dynamic", settings=settings)
        engine(torch.zeros((1, 64), device="cuda"))
        lock = threading.Lock()
        native = engine.native if bare else None
        op = torch.ops.tensorrt.execute_engine if bare else None  # registered by the backend

        lane = torch.cuda.Stream()
        jobs: queue.Queue = queue.Queue()

        def serve_jobs() -> None:
            while (job := jobs.get()) is not None:
                x, done, box = job
                box.append(op([x], native)[0])
                done.set()

        if worker:
            server = threading.Thread(target=serve_jobs, daemon=True)
            server.start()

        def call(x):
            if not bare:
                return engine(x)
            if worker:  # one host thread makes every call, on its own current stream
                caller = torch.cuda.current_stream()
                torch.cuda.default_stream().wait_stream(caller)
                done, box = threading.Event(), []
                jobs.put((x, done, box))
                done.wait()
                y = box[0]
                caller.wait_stream(torch.cuda.default_stream())
                y.record_stream(caller)
                return y
            with lock:
                if not lane_stream:
                    return op([x], native)[0]
                caller = torch.cuda.current_stream()
                lane.wait_stream(caller)
                with torch.cuda.stream(lane):
                    y = op([x], native)[0]
                caller.wait_stream(lane)
                y.record_stream(caller)
                return y

        wrong = [0] * threads
        detail: list[str] = []
        errors: list[str] = []
        barrier = threading.Barrier(threads)

        def work(index: int) -> None:
            try:
                stream = torch.cuda.default_stream() if default_stream else torch.cuda.Stream()
                torch.cuda.set_stream(stream)
                cases = []
                for batch in batches:
                    host = np.random.default_rng(index * 100 + batch).standard_normal((batch, 64))
                    want = np.asarray(built.reference(host)[0], dtype=np.float32)
                    x = torch.from_numpy(host.astype(np.float32)).cuda()
                    cases.append((x, torch.from_numpy(want).cuda()))
                stream.synchronize()
                barrier.wait(timeout=120)
                for i in range(CALLS):
                    x, want = cases[(index + i) % len(cases)]
                    y = call(x)
                    if device_sync:
                        torch.cuda.synchronize()
                    if not torch.allclose(y.float(), want, rtol=rtol, atol=atol):
                        wrong[index] += 1
                        if len(detail) < 4:
                            err = float((y.float() - want).abs().max())
                            detail.append(f"thread {index} call {i} batch {x.shape[0]} max err {err:.3g}")
            except Exception as exc:  # reported, not raised: the other variants still run
                errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")

        workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join(600)
        if worker:
            jobs.put(None)
        engine.close()
        results[name] = {"wrong": sum(wrong), "calls": threads * CALLS, "errors": errors[:2],
                         "detail": detail}
        print(f"{name:26} wrong {sum(wrong):5} of {threads * CALLS}  errors {len(errors)} {errors[:1]} "
              f"{detail}", flush=True)

    run("op", None, bare=True)
    run("op-1-thread", None, bare=True, threads=1)
    run("op-default-stream", None, bare=True, default_stream=True)
    run("op-lane-stream", None, bare=True, lane_stream=True)
    run("op-worker-thread", None, bare=True, worker=True)
    run("python-backend", None, backend="python")
    run("backend", None)
    if "--all" in sys.argv:
        run("backend-strategy-eager", {"dynamic_shapes_kernel_specialization_strategy": "eager"})
        run("backend-strategy-none", {"dynamic_shapes_kernel_specialization_strategy": "none"})
        run("backend-device-sync", None, device_sync=True)
        run("backend-fixed-batch", None, batches=(8,))
    (out / "torchbind_race.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
