"""Whether an engine's contexts give their serial outputs when their calls overlap on the GPU.

Several contexts (``trt_runtime.load(..., contexts=N)``) let the work of different calls
run at the same time on the GPU. TensorRT-RTX 1.6.1 on an H100 gives wrong outputs for
some engines then (docs/concurrency.md, "Contexts that overlap on the GPU"), and which
engines cannot be told from the file. :func:`check_overlap` tries an engine: one caller
thread per input set, each with its own stream and its *serial* output (the call run
alone); then ``rounds`` times every thread queues its call behind one event that a
sleeping kernel holds back, so that all calls start together on the GPU, and compares
what it gets with its serial output. ``trt-runtime check-contexts`` is its command line.

Needs torch with CUDA (the callers' streams and the gate). A clean result is evidence,
not proof: a defect seen once in a thousand overlapping calls needs thousands of them.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["GATE_CYCLES", "OverlapResult", "check_overlap"]

#: GPU clock cycles the gate holds the calls back (a few ms on a data-center GPU: longer
#: than the callers need to queue their calls).
GATE_CYCLES = 8_000_000


@dataclasses.dataclass(frozen=True)
class OverlapResult:
    """What :func:`check_overlap` saw: outputs compared, how many were off by more than
    the tolerance, and the largest difference relative to the serial output's peak."""

    checked: int
    wrong: int
    max_relative_difference: float


def check_overlap(engine: Any, inputs: Sequence[Sequence[Any]], rounds: int, *, tolerance: float = 1e-3,
                  torch: Any = None) -> OverlapResult:
    """Run ``engine`` from ``len(inputs)`` threads at once, ``rounds`` times, each thread
    calling it on its own input set (host arrays, moved to the engine's device) with every
    round's calls started together on the GPU; compare each output with the thread's serial
    output. ``engine`` should have at least ``len(inputs)`` contexts; ``torch``: the torch
    module (imported when not given). A caller that raises ends the check with a
    ``RuntimeError`` naming it."""
    if len(inputs) < 2:
        raise ValueError(f"check_overlap needs at least 2 input sets (callers); got {len(inputs)}")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1; got {rounds}")
    if torch is None:
        import torch as torch_module

        torch = torch_module
    callers = [_Caller(torch, engine, arrays, tolerance) for arrays in inputs]
    _run_rounds(torch, callers, rounds)
    return OverlapResult(sum(c.checked for c in callers), sum(c.wrong for c in callers),
                         max(c.worst for c in callers))


class _Caller:
    """One thread: its inputs on the device, its stream, its serial outputs, its tally."""

    def __init__(self, torch: Any, engine: Any, arrays: Sequence[Any], tolerance: float) -> None:
        device = torch.device("cuda", engine.device)
        self.torch, self.engine, self.tolerance = torch, engine, tolerance
        self.inputs = [torch.as_tensor(a).to(device) for a in arrays]
        self.stream = torch.cuda.Stream(device=device)
        with torch.cuda.stream(self.stream):
            serial = engine.execute(*self.inputs)  # alone: no other thread calls yet
        self.stream.synchronize()
        self.serial = [y.clone() for y in serial]
        self.peaks = [float(y.float().abs().max()) if y.numel() else 0.0 for y in self.serial]
        self.checked = self.wrong = 0
        self.worst = 0.0

    def call(self, gate: Any) -> None:
        self.stream.wait_event(gate)
        with self.torch.cuda.stream(self.stream):
            got = self.engine.execute(*self.inputs)
        self.stream.synchronize()
        diff = 0.0
        for y, want, peak in zip(got, self.serial, self.peaks, strict=True):
            if y.shape != want.shape:
                diff = float("inf")
                break
            if y.numel():
                diff = max(diff, float((y.float() - want.float()).abs().max()) / (peak or 1.0))
        self.checked += 1
        self.wrong += diff > self.tolerance
        self.worst = max(self.worst, diff)


def _run_rounds(torch: Any, callers: Sequence[_Caller], rounds: int) -> None:
    """Each round: a sleeping kernel on a gate stream, its event recorded; every caller
    queues its call behind it (its own thread and stream) and checks the result."""
    gate_stream = torch.cuda.Stream(device=callers[0].stream.device)
    gate = torch.cuda.Event()
    sleep = getattr(torch.cuda, "_sleep", None)
    queued = threading.Barrier(len(callers) + 1)
    done = threading.Barrier(len(callers) + 1)
    errors: list[BaseException] = []

    def body(caller: _Caller) -> None:
        try:
            for _ in range(rounds):
                queued.wait()
                caller.call(gate)
                done.wait()
        except threading.BrokenBarrierError:
            pass
        except BaseException as exc:
            errors.append(exc)
            queued.abort()
            done.abort()

    threads = [threading.Thread(target=body, args=(c,), daemon=True) for c in callers]
    for thread in threads:
        thread.start()
    try:
        for _ in range(rounds):
            with torch.cuda.stream(gate_stream):
                if sleep is not None:
                    sleep(GATE_CYCLES)
                gate.record(gate_stream)
            queued.wait()
            done.wait()
    except threading.BrokenBarrierError:
        pass
    finally:  # whatever stopped the rounds, no thread is left waiting at a barrier
        queued.abort()
        done.abort()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"a caller failed: {type(errors[0]).__name__}: {errors[0]}") from errors[0]
