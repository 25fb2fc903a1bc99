"""The argument parser of ``trt-runtime``: global options, and one subcommand per command module.

Global options (``--quiet``, ``--json``, ``--debug``) work before or after the command.
A usage error raises :class:`~trt_runtime.cli.output.UsageError` (exit code 2) instead of
argparse's exit. Each subcommand stores its handler as ``handler(args, out) -> int``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, NoReturn

from trt_runtime.cli.backends import backends_command
from trt_runtime.cli.bench import bench_command
from trt_runtime.cli.build import add_build_parser, build_command
from trt_runtime.cli.cache import CACHE_ACTIONS, LOCK_TIMEOUT, cache_command
from trt_runtime.cli.check_contexts import add_check_contexts_parser, check_contexts_command
from trt_runtime.cli.demo import demo_command
from trt_runtime.cli.engine_files import FORCE_HELP
from trt_runtime.cli.inspect import TABLE_ROWS, inspect_command
from trt_runtime.cli.io_options import add_compare_options, add_input_options, add_log_level, seed_value
from trt_runtime.cli.output import PROG, UsageError
from trt_runtime.cli.run import run_command
from trt_runtime.cli.serve import add_serve_parser
from trt_runtime.extras import install_hint

__all__ = ["COMMANDS", "build_parser"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        command = " ".join(self.prog.split()[1:])  # a subcommand's parser: "trt-runtime serve"
        raise UsageError(message, command=command or None)


#: The commands, in the order ``--help`` lists them.
COMMANDS = ("demo", "build", "inspect", "run", "bench", "serve", "check-contexts", "cache", "backends")
_CUDA_GRAPH_CHOICES = ("disabled", "whole_graph_capture")
_DYNAMIC_CHOICES = ("lazy", "eager", "none")


def _add_globals(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    default: Any = argparse.SUPPRESS if suppress else False
    group = parser.add_argument_group("global options")
    group.add_argument("-q", "--quiet", action="store_true", default=default,
                       help="print results only: no progress or informational lines")
    group.add_argument("--json", action="store_true", default=default,
                       help="print one machine-readable JSON document on stdout")
    group.add_argument("--debug", action="store_true", default=default,
                       help="show the traceback of an error")


class _DeprecatedAlias(argparse.Action):
    """An old spelling of an option: stores like the new one and warns on stderr."""

    def __init__(self, *args: Any, new: str, **kwargs: Any) -> None:
        self.new = new
        super().__init__(*args, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        import sys

        print(f"{PROG}: warning: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def _add_settings(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cuda-graph-strategy", choices=_CUDA_GRAPH_CHOICES, default=None,
                        help="CUDA graph strategy (default: the engine's default, disabled)")
    new = "--dynamic-shapes-kernel-specialization-strategy"
    parser.add_argument(new, choices=_DYNAMIC_CHOICES, default=None,
                        help="dynamic-shapes kernel specialization strategy (default: lazy)")
    parser.add_argument("--dynamic-shapes-kernel-strategy", choices=_DYNAMIC_CHOICES,
                        dest="dynamic_shapes_kernel_specialization_strategy", action=_DeprecatedAlias,
                        new=new, help=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``trt-runtime`` (global options work before or after the command)."""
    parser = _Parser(
        prog=PROG,
        description="Build, inspect, run and benchmark TensorRT / TensorRT-RTX engines.",
    )
    _add_globals(parser, suppress=False)
    from trt_runtime import __version__

    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        _add_globals(p, suppress=True)
        return p

    p = command("demo", "build a small engine, write it as plan / TR01 / .pte, inspect and run it")
    p.add_argument("--out", metavar="DIR", type=Path, default=None,
                   help="directory for the files, kept (default: a temporary directory, "
                        "removed at the end)")
    p.add_argument("--backend", metavar="NAME", default=None,
                   help="backend for the GPU part (default: the first available)")
    p.set_defaults(handler=demo_command)

    p = command("build", "build an engine from an ONNX model with the TensorRT-RTX builder; "
                         "write it as plan, TR01 or .pte")
    add_build_parser(p)
    p.set_defaults(handler=build_command)

    p = command("inspect", "show what an engine file is: format, bindings, device, version")
    p.add_argument("file", type=Path, help="a raw plan, a TR01/TR02 blob or a .pte program")
    p.add_argument("--backend", metavar="NAME", default=None,
                   help="backend used to deserialize a raw plan on a GPU (default: first available)")
    p.add_argument("--no-load", action="store_true",
                   help="never deserialize the engine; show only what the container records")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("--all", dest="all_rows", action="store_true",
                   help=f"list every binding (the text table stops after {TABLE_ROWS} rows)")
    p.set_defaults(handler=inspect_command)

    p = command("run", "run an engine once on random or given inputs; write outputs as .npy")
    p.add_argument("file", type=Path, help="a raw plan, a TR01/TR02 blob or a .pte program")
    p.add_argument("--backend", metavar="NAME", default=None, help="backend (default: first available)")
    p.add_argument("--input", metavar="NAME=FILE.npy", action="append", default=[],
                   help="take input NAME from a .npy file (repeatable); others are random")
    p.add_argument("--seed", type=seed_value, default=0, help="seed of the random inputs (default: 0)")
    add_input_options(p)
    add_compare_options(p)
    add_log_level(p)
    _add_settings(p)
    p.add_argument("--runtime-cache", metavar="PATH", type=Path, default=None,
                   help="load the runtime cache from PATH (if it exists) and save it back after the run")
    p.add_argument("--output-dir", metavar="DIR", type=Path, default=None,
                   help="write outputs (NAME.npy) and the inputs used (inputs/NAME.npy) there, "
                        "after a successful run (default: write nothing)")
    p.add_argument("--device", type=int, default=None, help="CUDA device (default: the container's)")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.set_defaults(handler=run_command)

    p = command("bench", "per-call latency and throughput of one engine on one or more backends")
    p.add_argument("file", type=Path, help="a raw plan, a TR01/TR02 blob or a .pte program")
    p.add_argument("--backend", metavar="NAME", action="append", default=[],
                   help="backend to measure (repeatable; 'all' = every available; default: first available)")
    p.add_argument("--iterations", type=int, default=200, help="timed calls per backend (default: 200)")
    p.add_argument("--duration", metavar="S", type=float, default=None,
                   help="time for at least S seconds (and at least --iterations calls)")
    p.add_argument("--warmup", type=int, default=20, help="untimed calls first (default: 20)")
    p.add_argument("--seed", type=seed_value, default=0, help="seed of the random inputs (default: 0)")
    add_input_options(p)
    add_log_level(p)
    _add_settings(p)
    p.add_argument("--json-out", dest="json_path", metavar="PATH", type=Path, default=None,
                   help="also write the results, with raw samples, as JSON to PATH")
    p.add_argument("--plot", metavar="PATH", type=Path, default=None,
                   help="write a latency box plot PNG to PATH "
                        f"(needs matplotlib: {install_hint('plot')})")
    p.add_argument("--device", type=int, default=None, help="CUDA device (default: the container's)")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.set_defaults(handler=bench_command)

    _add_settings(add_serve_parser(command))

    p = command("check-contexts", "check that an engine gives its serial outputs when several contexts "
                                  "run its calls at once on the GPU (needs torch with CUDA)")
    add_check_contexts_parser(p)
    add_input_options(p)
    add_log_level(p)
    p.set_defaults(handler=check_contexts_command)

    p = command("cache", "show or clear the per-user runtime cache directory")
    p.add_argument("action", nargs="?", choices=CACHE_ACTIONS, default=CACHE_ACTIONS[0],
                   help="what to do (default: info, the directory and its entries)")
    p.add_argument("--dir", metavar="DIR", type=Path, default=None,
                   help="cache directory (default: trt_runtime.cache.default_cache_dir())")
    p.add_argument("-y", "--yes", action="store_true", help="clear without asking")
    p.add_argument("--lock-timeout", metavar="SECONDS", type=float, default=LOCK_TIMEOUT,
                   help="clear: how long to wait for each cache's lock before skipping it "
                        f"(default: {LOCK_TIMEOUT:g}, as RuntimeCache waits)")
    p.set_defaults(handler=cache_command)

    p = command("backends", "list installed backends, whether they can run here, and their capabilities")
    p.set_defaults(handler=backends_command)
    return parser


