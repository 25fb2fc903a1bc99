"""Options ``run`` and ``bench`` share with trtexec and Polygraphy: input shapes and files,
TensorRT's log level; and what ``run`` adds: saving outputs and comparing them.

``--log-level`` sets the level of the ``trt_runtime`` Python logger, which backends
forward TensorRT's own messages to (the ``python`` backend's ``trt_runtime.python.tensorrt``:
errors and warnings as such, TensorRT's info and verbose messages as debug), and prints
them on stderr as ``[TensorRT] LEVEL: message``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from trt_runtime.cli.output import CliError, UsageError
from trt_runtime.onnx_build import LOG_LEVELS

__all__ = [
    "LOG_LEVELS",
    "add_compare_options",
    "add_input_options",
    "add_log_level",
    "input_arrays",
    "seed_value",
    "set_log_level",
]

_PY_LEVELS = {"error": logging.ERROR, "warning": logging.WARNING, "info": logging.DEBUG,
              "verbose": logging.DEBUG}


def seed_value(text: str) -> int:
    """A ``--seed`` value: an integer in ``[0, 2**32)``, the seeds numpy accepts."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, 2**32); got {text[:40]!r}") from None
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, 2**32); got {text[:40]}")
    return value


def add_input_options(parser: argparse.ArgumentParser) -> None:
    """``--shapes`` and ``--load-inputs``."""
    parser.add_argument("--shapes", metavar="NAME:AxB,...", action="append", default=[],
                        help="shape of random inputs, e.g. x:4x3x64x64 (repeatable or comma-separated); "
                             "checked against the engine's profiles (default: each profile's opt shape)")
    parser.add_argument("--load-inputs", metavar="FILE.npz", type=Path, default=None,
                        help="take inputs by name from an .npz (numpy.savez); others are random")


def add_log_level(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="warning",
                        help="TensorRT's messages shown on stderr (default: warning)")


def add_compare_options(parser: argparse.ArgumentParser) -> None:
    """``--save-inputs``, ``--save-outputs``, ``--compare``, ``--atol``, ``--rtol``."""
    parser.add_argument("--save-inputs", metavar="FILE.npz", type=Path, default=None,
                        help="write the inputs used to an .npz")
    parser.add_argument("--save-outputs", metavar="FILE.npz", type=Path, default=None,
                        help="write the outputs to an .npz")
    parser.add_argument("--compare", metavar="REF.npz", type=Path, default=None,
                        help="compare outputs with the arrays of the same name in REF.npz; "
                             "exit 1 if one differs by more than --atol + --rtol * |ref|")
    parser.add_argument("--atol", type=float, default=1e-5, help="absolute tolerance (default: 1e-5)")
    parser.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance (default: 1e-5)")


def _check_tolerances(args: argparse.Namespace) -> None:
    for flag in ("atol", "rtol"):
        value = getattr(args, flag, None)
        if value is not None and not value >= 0:
            raise UsageError(f"--{flag} must be a number >= 0; got {value}")


def input_arrays(args: argparse.Namespace, specs: Any, given: Any = None) -> list[Any]:
    """The inputs of a run: ``--input`` files, ``--load-inputs``, ``--shapes``, random otherwise."""
    from trt_runtime.cli.arrays import load_npz, make_inputs
    from trt_runtime.cli.engine_files import check_file
    from trt_runtime.shapes import parse_shapes

    _check_tolerances(args)
    if getattr(args, "compare", None) is not None:
        check_file(args.compare)  # before the engine runs, not after
    for flag in ("save_inputs", "save_outputs"):
        path = getattr(args, flag, None)
        if path is not None and (path.is_dir() or not path.absolute().parent.is_dir()):
            what = ("is a directory" if path.is_dir()
                    else f"is in a directory that does not exist ({path.parent})")
            raise CliError(f"--{flag.replace('_', '-')} {path} {what}; expected an .npz file to write")
    try:
        shapes = parse_shapes(args.shapes) if args.shapes else {}
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    loaded = None if args.load_inputs is None else load_npz(args.load_inputs, "--load-inputs", specs=specs)
    return make_inputs(specs, given, args.seed, shapes=shapes, loaded=loaded)


class _TensorRTHandler(logging.Handler):
    """Prints the records of ``trt_runtime.*.tensorrt`` loggers (TensorRT's own messages)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name.endswith(".tensorrt")

    def emit(self, record: logging.LogRecord) -> None:
        level = {logging.ERROR: "error", logging.WARNING: "warning"}.get(record.levelno, "info")
        line = " ".join(record.getMessage().split())
        print(f"[TensorRT] {level}: {line}", file=sys.stderr, flush=True)


_HANDLER = _TensorRTHandler()


def set_log_level(level: str) -> None:
    """Show the messages backends log under ``trt_runtime`` from ``level`` up, on stderr."""
    if level not in LOG_LEVELS:
        raise UsageError(f"--log-level must be one of {', '.join(LOG_LEVELS)}; got {level!r}")
    logger = logging.getLogger("trt_runtime")
    logger.setLevel(_PY_LEVELS[level])
    if _HANDLER not in logger.handlers:
        logger.addHandler(_HANDLER)
