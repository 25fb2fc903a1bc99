"""Several contexts under TensorRT-RTX's own CUDA-graph capture, from many threads: does a
process crash, with and without ``trt_runtime.outer.NATIVE_CAPTURE_LOCK``?

Run on the GPU host (tensorrt_rtx, torch with CUDA; torch-tensorrt for the torchbind rows)::

    python3 tools/gpu_strategy_probe.py [--out DIR] [--trials 6] [--seconds 4]

What the conformance test ``test_settings_change_while_calls_in_flight[many-contexts-eager]``
does, in a fresh process per trial (a crash is a result, not the end of the probe): the
dynamic engine of the GPU suite (fp32, 16 wide, profiles 1..8 and 9..32) loaded with
``contexts=4``; 8 threads call ``engine(x)`` with random batches, each output checked
against the float64 reference; the main thread switches ``cuda_graph_strategy`` between
``whole_graph_capture`` and ``disabled`` every 0.25 s (``--mode toggle``) or leaves it on
(``--mode on``). ``--lock off`` replaces the lock with one that does nothing.

Writes ``strategy_probe.json`` (per backend, mode and lock: exit codes, calls, wrong
outputs, the last lines of a crashed trial's stderr) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


class NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def child(backend_name: str, mode: str, lock: str, seconds: float) -> int:
    import faulthandler

    import numpy as np
    import torch

    from trt_runtime import EngineSource, RuntimeSettings, builders, get_backend, outer

    faulthandler.enable()
    if lock == "off":
        outer.NATIVE_CAPTURE_LOCK = NoLock()  # type: ignore[assignment]
    built = builders.build_dynamic(16, "float32")
    backend = get_backend(backend_name)
    on = RuntimeSettings(cuda_graph_strategy="whole_graph_capture")
    off = RuntimeSettings()
    engine = backend.load_engine(EngineSource(built.plan, name="dynamic"), settings=on)
    engine.contexts = 4
    stop = threading.Event()
    counts = {"calls": 0, "wrong": 0, "errors": 0}
    first_error: list[str] = []
    guard = threading.Lock()

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        calls = wrong = errors = 0
        while not stop.is_set():
            batch = int(rng.integers(1, 33))
            host = rng.standard_normal((batch, 16)).astype(np.float32)
            try:
                y = engine(torch.from_numpy(host).cuda())
                got = y.cpu().numpy()
            except Exception as exc:  # counted, the first one kept
                errors += 1
                with guard:
                    if not first_error:
                        first_error.append(f"{type(exc).__name__}: {exc}"[:400])
                continue
            want = built.reference(host)[0]
            calls += 1
            if not np.allclose(got, want, rtol=1e-3, atol=1e-3):
                wrong += 1
        with guard:
            counts["calls"] += calls
            counts["wrong"] += wrong
            counts["errors"] += errors

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    end = time.monotonic() + seconds
    flips = 0
    while time.monotonic() < end:
        time.sleep(0.25)
        if mode == "toggle":
            engine.runtime_settings = off if flips % 2 == 0 else on
            flips += 1
    stop.set()
    for t in threads:
        t.join()
    engine.close()
    print(json.dumps({**counts, "flips": flips, "first_error": first_error[:1]}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--backends", default="torchbind,python")
    parser.add_argument("--modes", default="toggle")
    parser.add_argument("--locks", default="off,on")
    parser.add_argument("--child", nargs=3, metavar=("BACKEND", "MODE", "LOCK"))
    args = parser.parse_args(argv)
    if args.child:
        return child(*args.child, args.seconds)
    results: list[dict[str, Any]] = []
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    for backend in args.backends.split(","):
        for mode in args.modes.split(","):
            for lock in args.locks.split(","):
                row: dict[str, Any] = {"backend": backend, "mode": mode, "lock": lock, "trials": []}
                for _ in range(args.trials):
                    command = [sys.executable, __file__, "--child", backend, mode, lock,
                               "--seconds", str(args.seconds)]
                    proc = subprocess.run(
                        command,
                        capture_output=True, text=True, env=env, timeout=args.seconds + 120,
                    )
                    trial: dict[str, Any] = {"rc": proc.returncode}
                    lines = proc.stdout.strip().splitlines()
                    if proc.returncode == 0 and lines:
                        trial.update(json.loads(lines[-1]))
                    else:
                        trial["stderr_tail"] = proc.stderr.strip().splitlines()[-12:]
                    row["trials"].append(trial)
                    print(backend, mode, lock, json.dumps(trial)[:300], flush=True)
                row["crashes"] = sum(1 for t in row["trials"] if t["rc"] != 0)
                results.append(row)
                crashed = f"{row['crashes']} of {args.trials} trials crashed"
                print(f"== {backend} {mode} lock {lock}: {crashed}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    Path(args.out, "strategy_probe.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
