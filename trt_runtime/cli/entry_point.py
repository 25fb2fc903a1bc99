"""``main()``: the console script ``trt-runtime``: parse, dispatch, map failures to exit codes.

Exit codes: 0 success, 1 runtime error, 2 usage error, 130 interrupted. An error is one
line on stderr (``trt-runtime: error: ...``); ``--debug`` adds the traceback. A Python
warning raised while a command runs (a cache that was ignored or not saved) is one line
too, ``trt-runtime: warning: ...``, without the source path and line Python would print.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from trt_runtime.cli.output import PROG, CliError, Output, UsageError, describe_exception, print_error
from trt_runtime.cli.parser import COMMANDS, build_parser

__all__ = ["main"]


def _show_warning(message: Any, category: type[Warning], *_args: Any, **_kwargs: Any) -> None:
    Output().warn(str(message))


@contextlib.contextmanager
def _warnings_as_lines() -> Iterator[None]:
    """Print warnings as ``trt-runtime: warning: ...`` lines while a command runs."""
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        yield


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script exits with it)."""
    with _warnings_as_lines():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args_list
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(args_list)
        except SystemExit as exc:  # --help and --version
            return int(exc.code or 0) if not isinstance(exc.code, str) else 2
        debug = args.debug
        if args.command is None:
            raise UsageError(f"a command is required: one of {', '.join(COMMANDS)}")
        out = Output(quiet=args.quiet, json_mode=args.json)
        code = args.handler(args, out)
        return int(code or 0)
    except KeyboardInterrupt:
        print_error("interrupted", debug)
        return 130
    except CliError as exc:
        hint = f" (see '{PROG} --help')" if isinstance(exc, UsageError) else ""
        print_error(f"{exc}{hint}", debug)
        return exc.exit_code
    except Exception as exc:
        print_error(describe_exception(exc), debug)
        return 1
