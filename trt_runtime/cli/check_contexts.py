"""``trt-runtime check-contexts FILE``: may this engine run several execution contexts at once?

The command line of :func:`trt_runtime.testing.overlap.check_overlap` (the hazard, and how
the check works, are told there and in docs/concurrency.md): it loads the engine with
``--contexts`` contexts, gives each of as many caller threads an input set of its own
(random of ``--shapes``, seeds ``--seed`` + thread, or ``--load-inputs``) and starts their
calls together on the GPU ``--rounds`` times. Exit 0 when every output equals its serial
output (within ``--tolerance`` of its peak), 1 when one does not: keep one context for
that engine, or serve it from several processes.
"""

from __future__ import annotations

import argparse
import contextlib
import warnings
from pathlib import Path
from typing import Any

from trt_runtime.cli.engine_files import FORCE_HELP, engine_file_backend
from trt_runtime.cli.io_options import input_arrays, seed_value, set_log_level
from trt_runtime.cli.output import CliError, Output, UsageError

__all__ = ["add_check_contexts_parser", "check_contexts_command"]


def add_check_contexts_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, help="a raw plan, a TR01/TR02 blob or a .pte program")
    parser.add_argument("--backend", metavar="NAME", default=None, help="backend (default: first available)")
    parser.add_argument("--contexts", type=int, default=8,
                        help="contexts, and caller threads (default: 8)")
    parser.add_argument("--rounds", type=int, default=300,
                        help="calls of each thread, all threads' calls started together (default: 300)")
    parser.add_argument("--outer", action="store_true",
                        help="call under the outer CUDA graph (enable_cudagraphs(engine, outer='copy'))")
    parser.add_argument("--tolerance", type=float, default=1e-3,
                        help="largest difference from a serial output, relative to its peak (default: 1e-3)")
    parser.add_argument("--seed", type=seed_value, default=0,
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
    set_log_level(args.log_level)
    name = engine_file_backend(args.file, args.backend, force=args.force, out=out, action="check")
    torch = _torch_cuda()
    import trt_runtime
    from trt_runtime.testing.overlap import check_overlap

    backend = trt_runtime.get_backend(name)
    if not backend.capabilities.supports_multiple_contexts:
        raise CliError(f"the {backend.name!r} backend lacks supports_multiple_contexts: "
                       "its engines run one context")
    with contextlib.ExitStack() as stack:
        with warnings.catch_warnings():  # the warning asks for this very check
            warnings.simplefilter("ignore", trt_runtime.ContextOverlapWarning)
            engine = trt_runtime.load(args.file, backend=backend, device=args.device, contexts=args.contexts)
        stack.callback(engine.close)
        if args.outer:
            stack.enter_context(trt_runtime.enable_cudagraphs(engine, outer="copy"))
        inputs = [input_arrays(argparse.Namespace(**{**vars(args), "seed": args.seed + i}), engine.inputs)
                  for i in range(args.contexts)]
        with out.status(f"{args.contexts} contexts x {args.rounds} rounds of calls started together..."):
            try:
                result = check_overlap(engine, inputs, args.rounds, tolerance=args.tolerance, torch=torch)
            except RuntimeError as exc:
                raise CliError(str(exc)) from exc
    checked, wrong, worst = result.checked, result.wrong, result.max_relative_difference
    out.emit({"file": str(args.file), "backend": backend.name, "contexts": args.contexts,
              "rounds": args.rounds, "outer": args.outer, "checked": checked, "wrong": wrong,
              "max_relative_difference": worst, "tolerance": args.tolerance})
    out.table(f"{args.file.name}: {args.contexts} contexts whose calls overlap on the GPU",
              ["backend", "outer graph", "outputs checked", "wrong", "largest difference / peak"],
              [[backend.name, "yes" if args.outer else "no", checked, wrong, f"{worst:.2e}"]])
    if wrong:
        raise CliError(f"{wrong} of {checked} outputs differed from their serial outputs by more than "
                       f"{args.tolerance:g} of the peak (up to {worst:.2e}) when {args.contexts} contexts "
                       "ran at once: keep contexts=1 for this engine, or serve it from several processes "
                       "(docs/concurrency.md)")
    out.info(f"every output equalled its serial output with {args.contexts} contexts running at once")
    return 0
