"""Where do wrong outputs come from when threads share one torchbind engine? (GPU host)

The stress test (tests/gpu/test_gpu_concurrency_stress.py) saw a few wrong outputs with the
torchbind backend, one context, 16 threads each on its own torch stream, cycling batch
sizes of a dynamic MLP. This probe runs the same load in variants, counting wrong outputs:

* ``op-own-streams``: torch-tensorrt's bare ``execute_engine`` op under one Python lock,
  each thread on its own stream (no trt-runtime code at all);
* ``op-one-stream``: the same, every thread on the default stream;
* ``op-own-streams-fixed-batch``: own streams, one batch size (no shape changes);
* ``backend-own-streams``: the torchbind backend, as the stress test calls it;
* ``backend-own-streams-synced``: the same with a stream synchronize after each call.

    python tools/gpu_torchbind_race_probe.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from pathlib import Path

THREADS, CALLS, BATCHES = 16, 300, (1, 3, 8, 17, 64)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    import numpy as np
    import torch

    import trt_runtime
    from trt_runtime import builders

    built = builders.build_mlp(64, 4, batch=None, dtype="float32")
    engine = trt_runtime.load(built.plan, "torchbind", name="mlp_dynamic")
    engine(torch.zeros((1, 64), device="cuda"))  # the native engine exists after a call
    native = engine.native
    op = torch.ops.tensorrt.execute_engine
    lock = threading.Lock()
    results: dict[str, dict[str, int]] = {}

    def run(name: str, call, own_stream: bool, batches: tuple[int, ...], sync: bool = False) -> None:
        wrong = [0] * THREADS
        errors: list[str] = []
        barrier = threading.Barrier(THREADS)

        def work(index: int) -> None:
            try:
                stream = torch.cuda.Stream() if own_stream else torch.cuda.default_stream()
                with torch.cuda.stream(stream):
                    cases = []
                    for batch in batches:
                        host = np.random.default_rng(index * 100 + batch).standard_normal((batch, 64))
                        want = np.asarray(built.reference(host)[0], dtype=np.float32)
                        cases.append((torch.from_numpy(host.astype(np.float32)).cuda(),
                                      torch.from_numpy(want).cuda()))
                    stream.synchronize()
                    barrier.wait(timeout=120)
                    for i in range(CALLS):
                        x, want = cases[(index + i) % len(cases)]
                        y = call(x)
                        if sync:
                            stream.synchronize()
                        if not torch.allclose(y.float(), want, rtol=1e-2, atol=1e-2):
                            wrong[index] += 1
            except Exception as exc:  # reported, not raised: the other variants still run
                errors.append(f"{type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        results[name] = {"wrong": sum(wrong), "calls": THREADS * CALLS, "errors": len(errors)}
        print(f"{name:32} wrong {sum(wrong):5} of {THREADS * CALLS}  errors {len(errors)} {errors[:1]}",
              flush=True)

    def bare(x):
        with lock:
            return op([x], native)[0]

    run("op-own-streams", bare, True, BATCHES)
    run("op-one-stream", bare, False, BATCHES)
    run("op-own-streams-fixed-batch", bare, True, (8,))
    run("backend-own-streams", engine, True, BATCHES)
    run("backend-own-streams-synced", engine, True, BATCHES, sync=True)
    (out / "torchbind_race.json").write_text(json.dumps(results, indent=2))
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
