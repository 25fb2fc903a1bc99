"""Run the exit matrix on this GPU host: every scenario of trt_runtime.testing.exit_scenarios in
a process of its own, each checked for exit 0, its work done and no error line on stderr.

    python3 tools/gpu_exit_matrix.py --out $OUT/exit [--only NAME,...] [--jobs 4] [--timeout 300]

Prints per scenario the exit code, wall time and the last lines of stderr; writes
``exit_matrix.json`` (host, scenarios, skips with their reasons) to ``--out``. Engines are
built here first (``prepare``). The caller-device scenarios need two GPUs and are skipped
with the reason on one. Exits 1 when a scenario that ran did not pass.
"""

from __future__ import annotations

import concurrent.futures
import sys
import tempfile
import time
from typing import Any

from _gpu_tool import parser, write_json


def _host() -> tuple[int, list[str], dict[str, str]]:
    """(GPU count, usable backends, why each other backend is not usable)."""
    from cuda.bindings import runtime

    import trt_runtime

    err, count = runtime.cudaGetDeviceCount()
    gpus = int(count) if int(err) == 0 else 0
    usable, unusable = [], {}
    for name in ("python", "torchbind"):
        status = trt_runtime.backend_status().get(name)
        if status:
            usable.append(name)
        else:
            unusable[name] = getattr(status, "reason", "not installed")
    return gpus, usable, unusable


def main(argv: list[str] | None = None) -> int:
    made = parser(__doc__)
    made.add_argument("--only", default="", help="comma-separated scenario names (default: all)")
    made.add_argument("--jobs", type=int, default=4, help="scenario processes at a time")
    made.add_argument("--timeout", type=float, default=300.0, help="seconds per scenario")
    made.add_argument("--work", default=None, help="folder for the built engines (default: a temp dir)")
    args = made.parse_args(argv)

    import trt_runtime
    from trt_runtime.testing.exit_scenarios import SCENARIOS, prepare, run_scenario, skip_reason

    chosen = [s for s in SCENARIOS if not args.only or s.name in args.only.split(",")]
    gpus, usable, unusable = _host()
    print(f"exit matrix: {len(chosen)} scenarios, {gpus} GPU(s), backends {usable}, unusable {unusable}")
    work = args.work or tempfile.mkdtemp(prefix="exit-matrix-")
    t0 = time.perf_counter()
    prepare(work, logger=trt_runtime.get_backend("python").logger)
    print(f"engines built in {work} in {time.perf_counter() - t0:.1f} s", flush=True)

    results: list[dict[str, Any]] = []
    skipped = {}
    runnable = []
    for scenario in chosen:
        reason = skip_reason(scenario, gpus, usable)
        if reason:
            skipped[scenario.name] = reason
        else:
            runnable.append(scenario)
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = {pool.submit(run_scenario, s, work, args.timeout): s for s in runnable}
        for future in concurrent.futures.as_completed(futures):
            result = future.result()
            results.append(result)
            verdict = "PASS" if result["passed"] else "FAIL"
            print(f"== {verdict} {result['name']}: exit {result['exit_code']}, {result['wall_s']:.1f} s, "
                  f"done={result['done']}, {len(result['error_lines'])} error line(s)", flush=True)
            for line in result["stderr_tail"][-6 if result["passed"] else -15:]:
                print(f"   stderr| {line}")
    for name, reason in skipped.items():
        print(f"== SKIP {name}: {reason}")
    order = {s.name: i for i, s in enumerate(SCENARIOS)}
    results.sort(key=lambda r: order[r["name"]])
    failed = [r["name"] for r in results if not r["passed"]]
    print(f"exit matrix: {len(results) - len(failed)} passed, {len(failed)} failed, {len(skipped)} skipped"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    path = write_json(args.out, "exit_matrix.json", {
        "gpus": gpus, "backends": usable, "unusable_backends": unusable, "python": sys.version.split()[0],
        "passed": len(results) - len(failed), "failed": failed, "skipped": skipped, "scenarios": results,
    })
    print(f"summary: {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
