"""What the GPU stress and fault tests share: a usable backend or a skip with its reason,
and threads calling one engine with mixed batches, every output against the reference."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

import trt_runtime


def usable_backend(name: str) -> Any:
    """The backend ``name``, or a skip saying why it cannot run here."""
    status = trt_runtime.backend_status().get(name)
    if status is None:
        pytest.skip(f"the {name!r} backend is not installed")
    if not status:
        pytest.skip(f"the {name!r} backend cannot run here: {status.reason}")
    return trt_runtime.get_backend(name)


def stress(torch: Any, engine: Any, built: Any, *, threads: int, calls: int, batches: Sequence[int],
           width: int) -> tuple[list[int], list[str], float]:
    """``threads`` threads, each on a torch stream of its own, call ``engine`` ``calls`` times
    cycling ``batches`` (inputs ``(batch, width)`` of their own); returns the wrong outputs
    per thread (against ``built.reference``, tolerances x10), the errors and the seconds."""
    rtol, atol = (max(t * 10, 1e-3) for t in built.tolerance)
    wrong = [0] * threads
    errors: list[str] = []
    barrier = threading.Barrier(threads)

    def work(index: int) -> None:
        try:
            stream = torch.cuda.Stream()
            torch.cuda.set_stream(stream)
            cases = []
            for batch in batches:
                rng = np.random.default_rng(index * 100 + batch)
                host = rng.standard_normal((batch, width)).astype(np.float32)
                want = np.asarray(built.reference(host.astype(np.float64))[0], dtype=np.float32)
                cases.append((torch.from_numpy(host).cuda(), torch.from_numpy(want).cuda()))
            stream.synchronize()
            barrier.wait(timeout=120)
            for call in range(calls):
                x, want = cases[(index + call) % len(cases)]
                if not torch.allclose(engine(x).float(), want, rtol=rtol, atol=atol):  # syncs
                    wrong[index] += 1
        except Exception as exc:
            errors.append(f"thread {index}: {type(exc).__name__}: {exc}")

    started = time.perf_counter()
    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(timeout=600)
    seconds = time.perf_counter() - started
    assert not any(t.is_alive() for t in workers), "stress threads did not finish in 600 s"
    return wrong, errors, seconds


def report_and_check(report: Any, label: str, result: tuple[list[int], list[str], float], *, threads: int,
                     calls: int, batches: Sequence[int], extra: str = "") -> None:
    """Report a :func:`stress` run as a measurement, then assert no error and no wrong output."""
    wrong, errors, seconds = result
    report(label, f"{threads}x{calls} calls, batches {tuple(batches)}: {sum(wrong)} wrong, "
                  f"{len(errors)} errors, {threads * calls / seconds:,.0f} calls/s{extra}")
    assert not errors, errors[:3]
    assert sum(wrong) == 0, f"{sum(wrong)} wrong outputs of {threads * calls} (per thread {wrong})"
