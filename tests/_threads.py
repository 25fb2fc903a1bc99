"""``all_at_once``: one function in several threads released together, for the tests of races."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def all_at_once(fn: Callable[[int], T], threads: int, timeout: float = 60.0
                ) -> tuple[list[T], list[BaseException]]:
    """``fn(i)`` in threads ``i = 0 .. threads - 1``, released together by a barrier: what they
    returned and what they raised (each in finishing order). Fails when a thread is still
    running ``timeout`` seconds after the last one started."""
    barrier = threading.Barrier(threads)
    results: list[T] = []
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            barrier.wait(timeout)
            results.append(fn(index))
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout)
    assert not any(w.is_alive() for w in workers), f"threads still running after {timeout} s"
    return results, errors
