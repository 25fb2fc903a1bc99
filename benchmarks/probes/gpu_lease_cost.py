"""Where do a pre-bound call's µs over its plan go on the GPU host: the lease, the frames, the checks?

Run on the GPU host (tensorrt_rtx, cuda-python, torch with CUDA)::

    python3 benchmarks/probes/gpu_lease_cost.py [--out DIR] [--repeats 30] [--number 400]

For the ``tiny`` workload it loads a python-backend engine, makes one pre-bound call
(``engine.execute(x, outputs=[y], stream=engine.stream)``) and times, interleaved, that call;
the engine's lease (``_lease_call``) around the lane's plan; the plan alone; four copies of
the lease written out here (``lease: minimal``: thread-local slot, its token taken, plan,
token given back; ``lease: a lock for the token``: the same with a lock's non-blocking
acquire and release, as the lease was before; ``lease: as the engine``: with its ``try``
blocks and checks; ``lease: no token``: the slot's lane and the plan); and the same
statements' parts in isolation (the thread-local read, the token's take and give-back, a
lock's acquire and release, ``x.data_ptr()``, ``x.shape`` and its cheaper kin, the plan's four
checks together); the plan less those checks and TensorRT's bare ``execute_async_v3``, so
the plan's own cost shows in the call; beside them plain Python
(``pass``, an empty call, a method taking the same keywords) that says how fast this host
runs Python. Medians of interleaved samples in µs (:func:`gpu_step_costs.time_statements`).

Writes ``lease_cost.json`` to ``--out`` (default ``$OUT`` or ``.``).
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import _gpu_tool
from gpu_step_costs import timed_then


def _noop(*_args: Any, **_kwargs: Any) -> None:
    return None


class _Bare:
    """A method with the engine's keywords that does nothing: Python's own cost of the call."""

    def execute(self, *inputs: Any, stream: Any = None, outputs: Any = None, profile: Any = None) -> None:
        return _noop(inputs, stream, outputs, profile)


def lease_costs(key: str, torch: Any, repeats: int, number: int) -> dict[str, float]:
    from benchmarks import workloads
    from trt_runtime import EngineSource, get_backend

    workload = workloads.WORKLOADS_BY_KEY[key]
    built, _ = workloads.build(workload)
    tensors = workloads.make_tensors(torch, built, workload)
    x, y = tensors.inputs[0], tensors.outputs[0]
    engine: Any = get_backend("python").load_engine(EngineSource(built.plan, name=f"{key}-lease"))
    stream = engine.stream
    engine.execute(x, outputs=[y], stream=stream)
    torch.cuda.synchronize()
    pool = engine._pool
    slot = pool.local.slot

    lock = threading.Lock()

    def minimal(inputs: Any, stream: Any, outputs: Any) -> Any:
        slot = pool.local.slot
        slot.free.pop()
        result = slot.lane.fast_entry(inputs, stream, outputs)
        slot.free.append(True)
        return result

    def with_a_lock(inputs: Any, stream: Any, outputs: Any) -> Any:
        slot = pool.local.slot
        lock.acquire(False)
        result = slot.lane.fast_entry(inputs, stream, outputs)
        lock.release()
        return result

    def as_the_engine(inputs: Any, stream: Any, outputs: Any) -> Any:
        try:
            slot = pool.local.slot
            slot.free.pop()
        except (AttributeError, IndexError):
            raise SystemExit("the probe's slot was taken") from None
        lane = slot.lane
        try:
            if lane.device_guard is not None:
                raise SystemExit("the probe's engine runs in a device guard: use one visible GPU")
            result = lane.fast_entry(inputs, stream, outputs)
        finally:
            if pool.waiters:
                raise SystemExit("the probe's engine has callers waiting")
            slot.free.append(True)
        return result

    def no_token(inputs: Any, stream: Any, outputs: Any) -> Any:
        return pool.local.slot.lane.fast_entry(inputs, stream, outputs)

    lane = slot.lane
    ctx, order = lane.context, lane.ops._order
    enqueue, ours = ctx.enqueue, order.ours
    p0, p1, s0, s1 = x.data_ptr(), y.data_ptr(), x.shape, y.shape

    def checks(x: Any, y: Any) -> bool:  # the pre-bound plan's checks
        return x.data_ptr() != p0 or y.data_ptr() != p1 or x.shape != s0 or y.shape != s1

    def unchecked(inputs: Any, stream: Any, outputs: Any) -> Any:  # the plan less its four checks
        (_x,) = inputs
        (y,) = outputs
        if lane.context is not ctx or stream is not order.own:
            raise SystemExit("the probe's plan went stale")
        if order.tail != ours:
            order.follow(None)
        if not ctx.enqueue(ours):
            raise SystemExit("execute_async_v3 returned False")
        return [y]

    ns = {"e": engine, "x": x, "y": y, "s": stream, "pool": pool, "slot": slot, "plan": slot.lane.fast_entry,
          "minimal": minimal, "with_a_lock": with_a_lock, "as_the_engine": as_the_engine,
          "no_token": no_token, "lock": lock, "noop": _noop, "bare": _Bare(),
          "enqueue": enqueue, "ours": ours, "s0": s0, "checks": checks, "unchecked": unchecked}
    stmts = {
        "call: e.execute(x, outputs=[y], stream=s)": "e.execute(x, outputs=[y], stream=s)",
        "call: e._lease_call((x,), s, [y], None)": "e._lease_call((x,), s, [y], None)",
        "call: the lane's plan": "plan((x,), s, [y])",
        "call: the plan less its checks": "unchecked((x,), s, [y])",
        "call: raw execute_async_v3": "enqueue(ours)",
        "lease: minimal": "minimal((x,), s, [y])",
        "lease: a lock for the token": "with_a_lock((x,), s, [y])",
        "lease: as the engine": "as_the_engine((x,), s, [y])",
        "lease: no token": "no_token((x,), s, [y])",
        "alone: pool.local.slot": "pool.local.slot",
        "alone: token taken + given back": "slot.free.pop(); slot.free.append(True)",
        "alone: lock acquire + release": "lock.acquire(False); lock.release()",
        "alone: x.data_ptr()": "x.data_ptr()",
        "alone: x.shape": "x.shape",
        "alone: x.shape != x.shape": "x.shape != x.shape",
        "alone: x.shape != s0": "x.shape != s0",
        "alone: x.size()": "x.size()",
        "alone: x.numel()": "x.numel()",
        "alone: x.nbytes": "x.nbytes",
        "alone: the plan's checks (2 addresses, 2 shapes)": "checks(x, y)",
        "python: pass": "pass",
        "python: an empty call": "noop(x)",
        "python: a method with the engine's keywords": "bare.execute(x, outputs=[y], stream=s)",
        "python: sum(range(100))": "sum(range(100))",
    }
    return timed_then(stmts, ns, torch, repeats, number, engine.close)


def main(argv: list[str] | None = None) -> int:
    return _gpu_tool.statement_tool(__doc__, argv, "tiny", "lease_cost.json", lease_costs)


if __name__ == "__main__":
    raise SystemExit(main())
