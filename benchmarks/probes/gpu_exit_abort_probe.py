"""Why does a process whose daemon thread still calls an engine at exit abort sometimes? (GPU host)

Run on the GPU host (both backends installed), from the repository root::

    python3 benchmarks/probes/gpu_exit_abort_probe.py --out $OUT/exitprobe [--n 8] [--jobs 16]

Each *variant* is the exit matrix's ``daemon-thread-calling-at-exit`` scenario (the table's
own script, or the same loop over other engines and settings) run ``--n`` times, each in a
process of its own (:func:`trt_runtime.testing.exit_scenarios.run_scenario`), ``--jobs`` at
a time. Every process runs with ``TRT_RUNTIME_EXIT_REPORT=1``: the exit hook prints how many
lanes it held and how long it waited. The variants differ in one thing each:

* ``<backend>-scenario``: the matrix's script, all GPUs visible; ``torchbind-scenario-1gpu``:
  only GPU 0 (``CUDA_VISIBLE_DEVICES=0``: no device guard, no torch-tensorrt multi-device path);
* ``<backend>-dynamic-<strategy>``: the loop over the dynamic engine's batches
  (``DYNAMIC_BATCHES``) with ``dynamic_shapes_kernel_specialization_strategy`` lazy (the
  default: specialized kernels compiled on TensorRT-RTX's background threads), eager or none;
* ``torchbind-sync``: the loop calls ``torch.cuda.synchronize()`` after each call, a native
  call that releases the GIL outside any lane (the exit hook cannot wait for it);
* ``torchbind-no-hook``: the exit hook unregistered (what a call in flight at
  finalization does without it);
* ``torchbind-blocking-hook``: the exit hook as it was before a call's lane was handed to
  it (a blocking acquire of each lane's lock, which a thread calling in a loop may win
  back every time until ``EXIT_WAIT`` runs out);
* ``torchbind-last-hook``: the exit hook registered again after torch and torch-tensorrt
  were imported, so it runs before their atexit hooks instead of after them.

Prints per variant the exit codes, the exit hook's reports and the first distinct error
lines of stderr; writes ``exit_abort_probe.json`` to ``--out``. ``--smoke`` runs three
variants with the test backend ``memory`` (no GPU, no torch).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import os
import re
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

# _gpu_tool (the GPU tools' --out and JSON helpers) is shared with tools/.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import _gpu_tool

from trt_runtime.lease import EXIT_REPORT_ENV
from trt_runtime.testing.exit_scenarios import (
    DYNAMIC_BATCHES,
    SCENARIOS,
    Scenario,
    prepare,
    prepare_memory,
    run_scenario,
)

#: The daemon thread's loop over ``MODEL``'s ``BATCHES`` (prologue: B, MODEL, BATCHES,
#: STRATEGY, SYNC, HOOK); the variants that are not the matrix's own script. HOOK: the
#: runtime's exit hook (``hand-over``; ``last``: registered again after the backend's
#: imports), none, or a ``blocking`` one as it was before the hand-over (registered where
#: the runtime's is, before torch is imported).
_LOOP = """
    import atexit, sys, threading, time
    from trt_runtime import lease
    if HOOK != "hand-over":
        atexit.unregister(lease.hold_lanes_at_exit)
    if HOOK == "blocking":  # the hook before the hand-over: each lane's token, raced by its callers
        def take(slot, deadline):
            while not slot.take():
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.0005)
            return True
        def blocking_hook(timeout=lease.EXIT_WAIT):
            start = time.monotonic()
            lease._EXITING.set()
            pools = [p for p in list(lease._POOLS) if not p.closed]
            slots = [s for p in pools for s in p._slots]
            held = sum(take(s, start + timeout) for s in slots)
            print(f"trt_runtime exit hook: held {held} of {len(slots)} lane(s) of {len(pools)} engine(s) "
                  f"in {time.monotonic() - start:.3f} s", file=sys.stderr, flush=True)
        atexit.register(blocking_hook)
    from trt_runtime import RuntimeSettings
    settings = RuntimeSettings(dynamic_shapes_kernel_specialization_strategy=STRATEGY) if STRATEGY else None
    e = w.load(B, model=MODEL, settings=settings)
    if HOOK == "last":  # after the backend's imports: it runs before their atexit hooks
        atexit.register(lease.hold_lanes_at_exit)
    xs = [w.host(MODEL, b) if B == "memory" else w.cuda(MODEL, b) for b in BATCHES]
    if SYNC:
        import torch
    running = threading.Event()
    def body():
        while True:
            for x in xs:
                e(x)
                if SYNC:
                    torch.cuda.synchronize()
            running.set()
    threading.Thread(target=body, daemon=True).start()
    assert running.wait(60), "the daemon thread made no call in 60 s"
    for b, x in zip(BATCHES, xs):
        w.check(e(x), MODEL, b)
"""

#: What the exit hook prints with ``TRT_RUNTIME_EXIT_REPORT`` set (trt_runtime.lease).
_HOOK = re.compile(r"trt_runtime exit hook: held (\d+) of (\d+) lane\(s\) .* in ([\d.]+) s")


@dataclasses.dataclass(frozen=True)
class Variant:
    """One scenario process and the environment it runs in."""

    name: str
    scenario: Scenario
    env: tuple[tuple[str, str], ...] = ()


def _loop(name: str, backend: str, model: str = "mlp", batches: tuple[int, ...] = (8,), strategy: str = "",
          sync: bool = False, hook: str = "hand-over") -> Scenario:
    prologue = (f"B, MODEL, BATCHES = {backend!r}, {model!r}, {batches!r}\n"
                f"STRATEGY, SYNC, HOOK = {strategy!r}, {sync!r}, {hook!r}\n")
    return Scenario(name, prologue + textwrap.dedent(_LOOP), (backend,))


def gpu_variants() -> list[Variant]:
    """The variants of the GPU host, in the order they are printed."""
    table = {s.name: s for s in SCENARIOS}
    one_gpu = (("CUDA_VISIBLE_DEVICES", "0"),)
    variants: list[Variant] = []
    scenario = table["torchbind-daemon-thread-calling-at-exit"]
    variants.append(Variant("torchbind-scenario", scenario))
    variants.append(Variant("torchbind-scenario-1gpu", scenario, one_gpu))
    variants.append(Variant("python-scenario", table["python-daemon-thread-calling-at-exit"]))
    for backend, strategies in (("torchbind", ("lazy", "eager", "none")), ("python", ("lazy",))):
        for strategy in strategies:
            name = f"{backend}-dynamic-{strategy}"
            variants.append(Variant(name, _loop(name, backend, "dynamic", DYNAMIC_BATCHES, strategy)))
    variants.append(Variant("torchbind-sync", _loop("torchbind-sync", "torchbind", sync=True)))
    for hook in ("none", "blocking", "last"):
        name = f"torchbind-{hook.replace('none', 'no')}-hook"
        variants.append(Variant(name, _loop(name, "torchbind", hook=hook)))
    return variants


def smoke_variants() -> list[Variant]:
    """Three variants over the test backend ``memory`` (a CPU, no torch)."""
    return [Variant("memory-loop", _loop("memory-loop", "memory")),
            Variant("memory-no-hook", _loop("memory-no-hook", "memory", hook="none")),
            Variant("memory-blocking-hook", _loop("memory-blocking-hook", "memory", hook="blocking"))]


def summarize(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One variant's row: exit codes, runs passed, the exit hook's reports, first error lines."""
    held = [m.groups() for r in runs for line in r["hook_lines"] if (m := _HOOK.search(line))]
    errors: list[str] = []
    for run in runs:
        for line in run["error_lines"]:
            if line not in errors and len(errors) < 6:
                errors.append(line)
    return {
        "variant": name,
        "runs": len(runs),
        "passed": sum(r["passed"] for r in runs),
        "exit_codes": dict(collections.Counter(str(r["exit_code"]) for r in runs)),
        "hook_reports": len(held),
        "hook_held_all": sum(h == t for h, t, _ in held),
        "hook_wait_max_s": max((float(w) for *_, w in held), default=None),
        "hook_gave_up": sum(any("lanes still in a call" in line for line in r["hook_lines"]) for r in runs),
        "wall_max_s": max((r["wall_s"] for r in runs), default=None),
        "first_error_lines": errors,
        "stderr_head_of_a_failure": next((r["stderr_head"] for r in runs if not r["passed"]), []),
    }


def run(variants: list[Variant], work: Path, n: int, jobs: int, timeout: float) -> list[dict[str, Any]]:
    """Each variant ``n`` times, ``jobs`` processes at a time; one row per variant."""
    runs: dict[str, list[dict[str, Any]]] = {v.name: [] for v in variants}
    with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
        futures = {
            pool.submit(run_scenario, v.scenario, work, timeout, {EXIT_REPORT_ENV: "1", **dict(v.env)}):
            v.name
            for _ in range(n) for v in variants
        }
        for future in concurrent.futures.as_completed(futures):
            runs[futures[future]].append(future.result())
    return [summarize(v.name, runs[v.name]) for v in variants]


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'variant':26} {'pass':>6} {'exit codes':22} {'hook held all':>13} {'max wait s':>10} "
          f"{'gave up':>7}")
    for row in rows:
        codes = " ".join(f"{code}x{count}" for code, count in sorted(row["exit_codes"].items()))
        wait = "-" if row["hook_wait_max_s"] is None else f"{row['hook_wait_max_s']:.3f}"
        print(f"{row['variant']:26} {row['passed']:>2}/{row['runs']:<3} {codes:22} "
              f"{row['hook_held_all']:>6}/{row['hook_reports']:<6} {wait:>10} {row['hook_gave_up']:>7}")
        for line in row["first_error_lines"]:
            print(f"    stderr| {line}")


def main(argv: list[str] | None = None) -> int:
    made = _gpu_tool.parser(__doc__)
    made.add_argument("--n", type=int, default=8, help="processes per variant")
    made.add_argument("--jobs", type=int, default=16, help="processes at a time")
    made.add_argument("--timeout", type=float, default=60.0, help="seconds per process")
    made.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    made.add_argument("--work", default=None, help="folder of prepared engines (default: a temp dir)")
    made.add_argument("--smoke", action="store_true", help="the memory backend's variants (a CPU)")
    args = made.parse_args(argv)

    variants = smoke_variants() if args.smoke else gpu_variants()
    if args.only:
        variants = [v for v in variants if v.name in args.only.split(",")]
    t0 = time.perf_counter()
    work = Path(args.work or tempfile.mkdtemp(prefix="exit-abort-probe-"))
    if not (work / "mlp.plan").exists():
        if args.smoke:
            prepare_memory(work)
        else:
            import trt_runtime

            prepare(work, logger=getattr(trt_runtime.get_backend("python"), "logger", None))
    prepared = time.perf_counter() - t0
    print(f"{len(variants)} variants x {args.n} processes, {args.jobs} at a time; engines in {work} "
          f"({prepared:.1f} s); CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}",
          flush=True)
    rows = run(variants, work, args.n, args.jobs, args.timeout)
    wall = time.perf_counter() - t0
    print_table(rows)
    print(f"wall {wall:.1f} s")
    path = _gpu_tool.write_json(args.out, "exit_abort_probe.json", {
        "python": sys.version.split()[0], "n": args.n, "jobs": args.jobs, "smoke": args.smoke,
        "prepare_s": round(prepared, 1), "wall_s": round(wall, 1), "variants": rows,
    })
    print(f"summary: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
