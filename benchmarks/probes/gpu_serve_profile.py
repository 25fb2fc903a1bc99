"""Where does the local server's engine process spend its time under load, function by function?

Run on a GPU host from the repository root::

    python benchmarks/probes/gpu_serve_profile.py --out bench-out/profile [--gpus 1] [--clients 64]
        [--seconds 6] [--serve-args "--pad-batches --outer-graph"] [--top 30]

``--smoke`` runs it on the CPU with the memory backend's engine (2 fronts, a few clients).
``--sampler py-spy`` samples the engine processes and one front from outside instead (``py-spy
record``, no slowdown of the Python code; the ``py-spy`` wheel travels in ``.whl/``): per process,
the share of wall time its main thread was busy, and the shares of its busy samples by function
(own and inclusive), so the per-pass work of an engine process's loop can be split without
cProfile's distortion. ``--native`` adds the C frames (inside TensorRT and CUDA calls); py-spy
then pauses the process for each sample, so use a lower ``--rate``.

Builds the mlp engine of ``bench_serve.py``, starts ``trt-runtime serve`` (16 fronts, batching on)
with every front and engine process under cProfile (``TRT_RUNTIME_SERVE_PROFILE_DIR``), drives it
with the benchmark's load generator (batch-1 ``.npy`` requests, every answer checked), stops it
(SIGINT), and prints, for the engine processes (their stats merged) and for one front, the top
functions by own time and by cumulative time, with the requests served. cProfile slows every
Python call, so the rate is lower than ``bench_serve.py``'s; the shares are what it is for. The
``.prof`` files stay under ``--out``.
"""

from __future__ import annotations

import argparse
import collections
import io
import os
import pstats
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _report(files: list[Path], label: str, top: int) -> str:
    if not files:
        return f"--- {label}: no stats written\n"
    stats = pstats.Stats(*map(str, files), stream=(text := io.StringIO()))
    total = stats.total_tt  # type: ignore[attr-defined]
    # (the whole life of each process: start, warm-up and idle waits in the loop's own time included)
    text.write(f"--- {label}: {len(files)} process(es), {total:.2f} s profiled\n")
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return text.getvalue()


def _py_spy() -> str:
    """The ``py-spy`` executable: on ``PATH``, else beside an installed package (``pip --target``)."""
    found = shutil.which("py-spy")
    if found:
        return found
    for folder in (Path(sys.executable).parent, *(Path(entry) / "bin" for entry in sys.path)):
        if (folder / "py-spy").is_file():
            return str(folder / "py-spy")
    raise RuntimeError("py-spy not found: pip install py-spy (or put its wheel in .whl/)")


def _sample(pids: dict[str, int], out: Path, seconds: float, rate: int, native: bool) -> dict[str, Path]:
    """``py-spy record`` of each process at once, for ``seconds``; the raw (collapsed) stack files."""
    exe, files, procs = _py_spy(), {}, []
    for label, pid in pids.items():
        files[label] = out / f"{label}.stacks"
        command = [exe, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))),
                   "--rate", str(rate), "--format", "raw", "--output", str(files[label])]
        # (C frames need the process paused for each sample; Python frames alone are read without)
        command.append("--native" if native else "--nonblocking")
        procs.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    for proc in procs:
        _, err = proc.communicate()
        if proc.returncode:
            print(f"py-spy exit {proc.returncode}: {err.strip()[-400:]}", flush=True)
    return files


def _frame_name(frame: str) -> str:
    """``function (file:line)`` as py-spy writes it, shortened to ``function (file)``."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rstrip(')').rsplit(':', 1)[0].rsplit('/', 1)[-1]})" if where else name


def _stack_report(path: Path, label: str, seconds: float, rate: int, top: int) -> str:
    """A process's busy share and its busy samples by function, own and inclusive (main thread)."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    main = 0
    for line in path.read_text().splitlines() if path.exists() else ():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        # (a thread's stack starts at Thread._bootstrap; the main thread's at the module)
        thread = "other threads" if frames[0].startswith("Thread._bootstrap") else "main"
        threads[thread] += count
        if thread != "main":
            continue
        main += count
        names = [_frame_name(f) for f in frames]
        if names:
            own[names[-1]] += count
        for name in set(names):
            inclusive[name] += count
    expected = seconds * rate
    text = io.StringIO()
    text.write(f"--- {label}: main thread busy in {main} of ~{expected:.0f} samples "
               f"({100 * main / max(expected, 1):.0f} % of wall time); threads: "
               + ", ".join(f"{t} {c}" for t, c in threads.most_common()) + "\n")
    for title, counter in (("own", own), ("inclusive", inclusive)):
        text.write(f"  by {title} share of busy samples:\n")
        for name, count in counter.most_common(top):
            if title == "inclusive" and count >= 0.95 * main:  # the process's entry, the loop's run
                continue
            text.write(f"    {100 * count / max(main, 1):5.1f} %  {name}\n")
    return text.getvalue()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--procs", type=int, default=10, help="load generator processes")
    p.add_argument("--serve-args", default="", help="more trt-runtime serve options, e.g. '--pad-batches'")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--port", type=int, default=8131)
    p.add_argument("--smoke", action="store_true", help="the memory backend on the CPU, briefly")
    p.add_argument("--sampler", choices=("cprofile", "py-spy"), default="cprofile")
    p.add_argument("--rate", type=int, default=1000, help="py-spy samples per second")
    p.add_argument("--native", action="store_true", help="py-spy: the C frames too")
    args = p.parse_args(argv)
    if args.smoke:
        args.gpus, args.workers, args.clients, args.seconds, args.procs = 0, 2, 4, 1.0, 2

    from benchmarks import serve_fronts
    from benchmarks.bench_serve import TYPES, mlp_workload, smoke_workload
    from benchmarks.serve_load import LoadGenerator
    from trt_runtime.serve.local.lifeline import PROFILE_ENV

    args.out.mkdir(parents=True, exist_ok=True)
    w = smoke_workload(args.out) if args.smoke else mlp_workload(args.out)
    spy = args.sampler == "py-spy"
    stats_dir = Path(tempfile.mkdtemp(prefix="profile-", dir=args.out))
    if not spy:
        os.environ[PROFILE_ENV] = str(stats_dir)
    gpus = ",".join(map(str, range(args.gpus))) or "all"
    load = LoadGenerator(args.procs)
    stacks: dict[str, Path] = {}
    try:
        with serve_fronts.local_server(w.path, w.backend, args.port, args.workers, gpus, 64, 500,
                                       None if args.smoke else args.out / "runtime.cache",
                                       extra=shlex.split(args.serve_args)) as doc:
            pids = doc.get("pids", {})
            sampled = {f"engine-{i}": pid for i, pid in enumerate(pids.get("engines", ())) if pid}
            fronts = [pid for pid in pids.get("fronts", ()) if pid]
            if fronts:
                sampled["front-0"] = fronts[0]
            if spy:  # the sampling starts a second into the load and ends a second before it
                window = max(1.0, args.seconds - 2.0)
                failed: list[BaseException] = []

                def sample() -> None:
                    try:
                        stacks.update(_sample(sampled, stats_dir, window, args.rate, args.native))
                    except BaseException as exc:  # (said after the load, not lost in the thread)
                        failed.append(exc)

                timer = threading.Timer(1.0, sample)
                timer.start()
            result = load.run(serve_fronts.HOST, args.port, "/", w.body("binary"), TYPES["binary"],
                              args.clients, args.seconds, 1.0, w.expect("binary"))
            summary = result.summary()
            if spy:
                timer.join(60)
                if failed:
                    raise failed[0]
    finally:
        load.close()
        os.environ.pop(PROFILE_ENV, None)
    how = "sampled" if spy else "profiled"
    print(f"served {summary['req_s']} req/s ({how}) at {args.clients} clients, {args.gpus} GPU(s), "
          f"p50 {summary['p50_ms']} ms, wrong {summary['wrong']}, errors {summary['errors']}; "
          f"serve args: {args.serve_args or '(defaults)'}", flush=True)
    if spy:
        window = max(1.0, args.seconds - 2.0)
        report = "".join(_stack_report(path, label, round(window), args.rate, args.top)
                         for label, path in sorted(stacks.items()))
    else:
        engines = sorted(stats_dir.glob("engine-*.prof"))
        fronts = sorted(stats_dir.glob("front-*.prof"))
        report = _report(engines, "engine processes", args.top) + _report(fronts[:1], "one front", args.top)
    (args.out / "profile.txt").write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
