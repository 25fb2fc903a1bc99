"""Which threads TensorRT(-RTX) logs from, through the python backend's ILogger.

Run on the GPU host from the repository root::

    python tools/gpu_logger_threads.py [pytest args...]

Wraps the backend's logger to count calls per thread (main or other) and severity, then runs
pytest in this process (default: the python backend's conformance state machines). A
TensorRT thread other than the caller's that logs through a Python ILogger must take the
GIL; if a TensorRT call made with the GIL held waits for that thread, the process hangs.
"""

from __future__ import annotations

import collections
import sys
import threading

import pytest

from trt_runtime import get_backend


def main(argv: list[str]) -> int:
    backend = get_backend("python")
    logger = backend.logger
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    samples: dict[tuple[str, str], str] = {}
    main_ident = threading.main_thread().ident
    cls = type(logger)
    original = cls.log

    def log(self: object, level: object, msg: str) -> None:
        where = "main" if threading.get_ident() == main_ident else "other"
        key = (where, str(level).rsplit(".", 1)[-1])
        counts[key] += 1
        samples.setdefault(key, msg[:160])
        original(self, level, msg)

    cls.log = log
    code = pytest.main(argv or ["tests/gpu/test_gpu_conformance_python.py", "-k", "state_machine", "-q",
                                "-p", "no:cacheprovider"])
    print("logger calls by thread and severity:")
    for (where, level), n in sorted(counts.items()):
        print(f"  {where:5} {level:15} {n:6}  e.g. {samples[(where, level)]!r}")
    return int(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
