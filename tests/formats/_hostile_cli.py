"""Run one ``trt-runtime`` command in a fresh process; print its outcome, cost and opens as JSON.

``python _hostile_cli.py ARG...`` runs ``trt_runtime.cli.main(ARGS)`` in process with an
audit hook recording every path opened (Python's ``open`` event: ``open``, ``os.open``,
``io.open``), and prints ``exit``, ``stderr``, ``opened``, ``seconds`` (CPU time),
``wall_seconds`` and ``peak_rss`` (VmHWM, which exec resets: a fresh process's own peak).
Used by the hostile-model and hostile-archive tests, which need peak RSS per command.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time


def main(argv: list[str]) -> None:
    opened: list[str] = []

    def hook(event: str, args: tuple[object, ...]) -> None:
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            opened.append(os.fsdecode(args[0]))

    from trt_runtime.cli import main as cli_main

    sys.addaudithook(hook)
    start, cpu_start = time.perf_counter(), time.process_time()
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli_main(argv)
    seconds, wall = time.process_time() - cpu_start, time.perf_counter() - start
    print(json.dumps({"exit": code, "stderr": err.getvalue(), "opened": opened, "seconds": seconds,
                      "wall_seconds": wall, "peak_rss": _peak_rss()}))


def _peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


if __name__ == "__main__":
    main(sys.argv[1:])
