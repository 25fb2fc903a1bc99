"""Cores of their own for the local server's processes (``bench_serve.py --variants …+pin``).

Does an engine process serve less beside a second one because the scheduler puts it beside busy
fronts and load-generator processes? With ``+pin`` the benchmark answers that: each engine
process gets a core of its own, each front a core of its own, and the load generator (and
whatever else runs) the cores left, for the cells of that server; afterwards the load
generator's processes get every core back. Every thread of a process is pinned (the CUDA driver's
and the batcher's too), through ``/proc/<pid>/task``. Linux only.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence

__all__ = ["Cores", "pin", "pinned", "plan_cores"]

#: ``{"engine": [[core], ...], "front": [[core], ...], "rest": [[cores...]]}``.
Cores = dict[str, list[list[int]]]


def plan_cores(cpus: Sequence[int], engines: int, fronts: int) -> Cores | None:
    """One core per engine process, then one per front, the rest shared by everything else;
    ``None`` when ``cpus`` cannot give every process its own core and leave one over."""
    cpus = sorted(cpus)
    need = engines + fronts
    if need + 1 > len(cpus):
        return None
    return {"engine": [[c] for c in cpus[:engines]], "front": [[c] for c in cpus[engines:need]],
            "rest": [list(cpus[need:])]}


def _tasks(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def pin(pid: int, cores: Sequence[int]) -> int:
    """Pin every thread of process ``pid`` to ``cores``; how many threads were pinned (0: the
    process is gone)."""
    done = 0
    for tid in _tasks(pid):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, cores)
            done += 1
    return done


@contextlib.contextmanager
def pinned(roles: dict[str, list[int]], load_pids: Sequence[int]) -> Iterator[Cores | None]:
    """Pin the server's ``roles`` (``engine`` and ``front`` process ids) and the load generator's
    processes as :func:`plan_cores` says, for the ``with`` block; yields the plan (``None``: too few
    cores, nothing pinned). The load generator's processes get every allowed core back after."""
    allowed = sorted(os.sched_getaffinity(0))
    engines, fronts = roles.get("engine", []), roles.get("front", [])
    cores = plan_cores(allowed, len(engines), len(fronts))
    if cores is None:
        yield None
        return
    for pid, mine in zip(engines, cores["engine"], strict=True):
        pin(pid, mine)
    for pid, mine in zip(fronts, cores["front"], strict=True):
        pin(pid, mine)
    for pid in (*load_pids, *roles.get("supervisor", [])):
        pin(pid, cores["rest"][0])
    try:
        yield cores
    finally:
        for pid in load_pids:
            pin(pid, allowed)
