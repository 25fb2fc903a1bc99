"""``trt-runtime check-contexts FILE``: may this engine run several execution contexts at once?

Several contexts (``trt_runtime.load(..., contexts=N)``) are there so that the work of
different calls can overlap on the GPU. TensorRT-RTX 1.6.1 on an H100 gives wrong outputs
for some engines when two executions overlap (``docs/concurrency.md``, "Contexts that
overlap on the GPU"), and which engines cannot be told from the file. This command tries:
it loads the engine with ``--contexts`` contexts and gives each of ``--contexts`` caller
threads an input of its own (random of ``--shapes``, seeds ``--seed`` + thread) and its
*serial* output (the call run alone). Then, ``--rounds`` times, every thread queues its
call on a stream of its own behind one event that a sleeping kernel holds back, so that
all calls start together on the GPU, and compares what it gets with its serial output.

Exit 0 when every output equals its serial output (within ``--tolerance`` of its peak),
1 when one does not: keep one context for that engine, or serve it from several
processes. It needs torch with CUDA (the callers' streams and the gate) and a backend with
``supports_multiple_contexts``. A pass is evidence, not proof: a defect that shows once in
a thousand overlapping calls needs a few thousand (``--rounds``).
"""

from __future__ import annotations

import argparse
import contextlib
import threading
from typing import Any

from trt_runtime.cli.engine_files import (
    FORCE_HELP,
    backend_reason,
    check_backend_name,
    check_engine_file,
    engine_backend,
)
from trt_runtime.cli.io_options import input_arrays, set_log_level
from trt_runtime.cli.output import CliError, Output, UsageError

__all__ = ["add_check_contexts_parser", "check_contexts_command"]

#: GPU clock cycles the gate holds the calls back (a few ms on a data-center GPU: longer
#: than the callers need to queue their calls).
GATE_CYCLES = 8_000_000


def add_check_contexts_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="a raw plan, a TR01/TR02 blob or a .pte program")
    parser.add_argument("--backend", metavar="NAME", default=None, help="backend (default: first available)")
    parser.add_argument("--contexts", type=int, default=8,
                        help="contexts, and caller threads (default: 8)")
    parser.add_argument("--rounds", type=int, default=300,
                        help="calls of each thread, all threads' calls started together (default: 300)")
    parser.add_argument("--outer", action="store_true",
                        help="call under the outer CUDA graph (enable_cudagraphs(engine, outer='copy'))")
    parser.add_argument("--tolerance", type=float, default=1e-3,
                        help="largest difference from a serial output, relative to its peak (default: 1e-3)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the first thread's random inputs; thread i takes seed + i (default: 0)")
    parser.add_argument("--device", type=int, default=None, help="CUDA device (default: the container's)")
    parser.add_argument("--force", action="store_true", help=FORCE_HELP)


def _torch_cuda() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise CliError(f"check-contexts needs torch with CUDA (the callers' streams): {exc}") from exc
    if not torch.cuda.is_available():
        raise CliError("check-contexts needs a CUDA GPU: torch.cuda.is_available() is False")
    return torch


def _check_args(args: argparse.Namespace) -> None:
    if args.contexts < 2:
        raise UsageError(f"--contexts must be >= 2 (the contexts whose work overlaps); got {args.contexts}")
    if args.rounds < 1:
        raise UsageError(f"--rounds must be >= 1; got {args.rounds}")
    if not args.tolerance >= 0:
        raise UsageError(f"--tolerance must be a number >= 0; got {args.tolerance}")


def check_contexts_command(args: argparse.Namespace, out: Output) -> int:
    """``trt-runtime check-contexts``."""
    _check_args(args)
    set_log_level(getattr(args, "log_level", "warning"))
    check_backend_name(args.backend)
    from pathlib import Path

    path = Path(args.file)
    check_engine_file(path, force=args.force, out=out)
    name = engine_backend(path, args.backend)
    reason = backend_reason(name)
    if reason:
        raise CliError(f"cannot run on {name or 'the default backend'}: {reason}")
    torch = _torch_cuda()
    import trt_runtime

    backend = trt_runtime.get_backend(name)
    if not backend.capabilities.supports_multiple_contexts:
        raise CliError(f"the {backend.name!r} backend lacks supports_multiple_contexts: "
                       "its engines run one context")
    engine = trt_runtime.load(path, backend=backend, device=args.device, contexts=args.contexts)
    with contextlib.ExitStack() as stack:
        stack.callback(engine.close)
        if args.outer:
            stack.enter_context(trt_runtime.enable_cudagraphs(engine, outer="copy"))
        callers = [_Caller(torch, engine, args, i) for i in range(args.contexts)]
        with out.status(f"{args.contexts} contexts x {args.rounds} rounds of calls started together..."):
            _run_rounds(torch, callers, args.rounds)
    checked = sum(c.checked for c in callers)
    wrong = sum(c.wrong for c in callers)
    worst = max(c.worst for c in callers)
    document = {"file": str(path), "backend": backend.name, "contexts": args.contexts, "rounds": args.rounds,
                "outer": args.outer, "checked": checked, "wrong": wrong, "max_relative_difference": worst,
                "tolerance": args.tolerance}
    out.emit(document)
    out.table(f"{path.name}: {args.contexts} contexts whose calls overlap on the GPU",
              ["backend", "outer graph", "outputs checked", "wrong", "largest difference / peak"],
              [[backend.name, "yes" if args.outer else "no", checked, wrong, f"{worst:.2e}"]])
    if wrong:
        raise CliError(f"{wrong} of {checked} outputs differed from their serial outputs by more than "
                       f"{args.tolerance:g} of the peak (up to {worst:.2e}) when {args.contexts} contexts "
                       "ran at once: keep contexts=1 for this engine, or serve it from several processes "
                       "(docs/concurrency.md)")
    out.info(f"every output equalled its serial output with {args.contexts} contexts running at once")
    return 0


class _Caller:
    """One thread: its inputs on the device, its stream, its serial outputs, its tally."""

    def __init__(self, torch: Any, engine: Any, args: argparse.Namespace, index: int) -> None:
        seeded = argparse.Namespace(**{**vars(args), "seed": args.seed + index})
        arrays = input_arrays(seeded, engine.inputs)
        device = torch.device("cuda", engine.device)
        self.torch, self.engine, self.tolerance = torch, engine, args.tolerance
        self.inputs = [torch.from_numpy(a).to(device) for a in arrays]
        self.stream = torch.cuda.Stream(device=device)
        with torch.cuda.stream(self.stream):
            serial = engine.execute(*self.inputs)  # alone: no other thread calls yet
        self.stream.synchronize()
        self.serial = [y.clone() for y in serial]
        self.peaks = [float(y.float().abs().max()) if y.numel() else 0.0 for y in self.serial]
        self.checked = self.wrong = 0
        self.worst = 0.0

    def call(self, gate: Any) -> None:
        torch = self.torch
        self.stream.wait_event(gate)
        with torch.cuda.stream(self.stream):
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


def _run_rounds(torch: Any, callers: list[_Caller], rounds: int) -> None:
    """Each round: a sleeping kernel on a gate stream, its event recorded; every caller queues
    its call behind it (its own thread and stream) and checks the result."""
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
        raise CliError(f"a caller failed: {type(errors[0]).__name__}: {errors[0]}") from errors[0]
