"""``main()``: the console script ``trt-runtime``: parse, dispatch, map failures to exit codes.

Exit codes (the rule at the top of docs/cli.md): 0 success; 2 a usage error (a bad flag or
flag value, a shape that contradicts the engine whichever flag gave it), whose line ends
with ``(see 'trt-runtime CMD --help')``; 1 a bad file or failed work; 130 interrupted
(Ctrl-C). An error is one line on stderr (``trt-runtime: error: ...``); ``--debug`` adds the traceback. With
``--json`` the error is also printed on stdout as ``{"error": {...}}``, so a script
reading stdout always gets one JSON document. A closed stdout (``trt-runtime ... | head
-1``) ends the command quietly with exit code 0: the reader had what it wanted. A Python
warning raised while a command runs (a cache that was ignored or not saved) is one line
too, ``trt-runtime: warning: ...``, without the source path and line Python would print.
"""

from __future__ import annotations

import contextlib
import json
import os
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


def _json_error(message: str, code: int) -> None:
    document = {"error": {"message": " ".join(message.split()), "exit_code": code,
                          "kind": "usage" if code == 2 else "failure"}}
    sys.stdout.write(json.dumps(document, indent=2) + "\n")
    sys.stdout.flush()


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's last flush cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout has no descriptor (captured in tests)
        pass
    finally:
        os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script exits with it)."""
    with _warnings_as_lines():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args_list
    json_mode = "--json" in args_list
    out: Output | None = None
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(args_list)
        except SystemExit as exc:  # --help and --version
            return int(exc.code or 0) if not isinstance(exc.code, str) else 2
        debug = args.debug
        json_mode = args.json
        if args.command is None:
            raise UsageError(f"a command is required: one of {', '.join(COMMANDS)}")
        out = Output(quiet=args.quiet, json_mode=args.json)
        code = args.handler(args, out)
        return int(code or 0)
    except BrokenPipeError:
        _quiet_stdout()
        return 0
    except KeyboardInterrupt:
        print_error("interrupted", debug)
        return 130
    except CliError as exc:
        hint = ""
        if isinstance(exc, UsageError):
            command = f"{PROG} {exc.command}" if exc.command else _help_command(args_list)
            hint = f" (see '{command} --help')"
        return _fail(f"{exc}{hint}", exc.exit_code, debug, json_mode and not (out and out.emitted))
    except Exception as exc:
        return _fail(describe_exception(exc), 1, debug, json_mode and not (out and out.emitted))


def _help_command(args_list: Sequence[str]) -> str:
    """``trt-runtime CMD`` for the first command named on the line, else ``trt-runtime``."""
    command = next((a for a in args_list if a in COMMANDS), None)
    return f"{PROG} {command}" if command else PROG


def _fail(message: str, code: int, debug: bool, json_mode: bool) -> int:
    print_error(message, debug)
    if json_mode:
        try:
            _json_error(message, code)
        except BrokenPipeError:
            _quiet_stdout()
    return code
