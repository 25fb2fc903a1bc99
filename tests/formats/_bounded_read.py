"""Run one reader on one file in a fresh process; print its time, peak RSS and outcome as JSON.

``seconds`` is CPU time (what the reader costs, whatever else loads the machine);
``wall_seconds`` is beside it for the record.

``python _bounded_read.py READER PATH`` where READER is ``describe``, ``load`` (the
``memory`` backend), ``inspect`` or ``inspect-json`` (the CLI, in process). Used by
tests/formats/test_hostile_bounds.py: peak RSS must be measured in a process of its own.
"""

from __future__ import annotations

import contextlib
import io
import json
import resource
import sys
import time


def main(reader: str, path: str) -> None:
    import trt_runtime
    from trt_runtime.cli import main as cli_main
    from trt_runtime.formats import describe

    start, cpu_start = time.perf_counter(), time.process_time()
    outcome, message = "ok", ""
    try:
        if reader == "describe":
            describe(path)
        elif reader == "load":
            trt_runtime.load(path, backend="memory")
        else:
            argv = ["--json"] if reader == "inspect-json" else []
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
                code = cli_main([*argv, "inspect", path, "--no-load"])
            outcome, message = f"exit {code}", err.getvalue()[-300:]
    except Exception as exc:
        outcome, message = type(exc).__name__, str(exc)[:300]
    seconds, wall = time.process_time() - cpu_start, time.perf_counter() - start
    report = {"seconds": seconds, "wall_seconds": wall, "peak_rss": _peak_rss(), "outcome": outcome}
    print(json.dumps({**report, "message": message}))


def _peak_rss() -> int:
    """Peak RSS of this process in bytes: VmHWM, which, unlike ru_maxrss, exec resets.

    (ru_maxrss of a child of a large pytest process starts at the parent's RSS.)
    """
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
