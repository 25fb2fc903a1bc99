"""What every command shares about output: the console, errors and JSON.

:class:`Output` sends a command's text to rich when it is installed (``trt-runtime[cli]``)
and to plain ``print`` otherwise. Text that comes from users or data (file names,
backend reasons, install hints such as ``pip install -c constraints.txt -e '.[torchbind]'``) is never
read as rich markup: lines are printed with markup off, and table cells, titles and
spinner text are escaped with :func:`rich.markup.escape`.

Errors are :class:`CliError` (exit code 1) and :class:`UsageError` (exit code 2), printed
as one line on stderr by :func:`print_error`; :func:`describe_exception` turns any other
exception into that line. :func:`jsonable` turns results into what ``--json`` prints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

__all__ = [
    "PROG",
    "CliError",
    "Output",
    "UsageError",
    "cell",
    "compact",
    "describe_exception",
    "human_size",
    "jsonable",
    "print_error",
]

PROG = "trt-runtime"
#: Longest JSON document (in characters) printed indented; longer ones are one line.
INDENT_LIMIT = 1 << 20
#: Longest table drawn with rich; longer ones are printed as aligned plain text.
RICH_TABLE_ROWS = 500


class CliError(Exception):
    """A runtime failure reported as one line; exit code 1."""

    exit_code = 1


class UsageError(CliError):
    """Bad command-line usage; exit code 2. ``command``: the subcommand whose ``--help`` to point at."""

    exit_code = 2

    def __init__(self, message: str, *, command: str | None = None) -> None:
        super().__init__(message)
        self.command = command


def _escape(text: str) -> str:
    """``text`` made safe to put into rich markup (``[torchbind]`` stays ``[torchbind]``)."""
    from rich.markup import escape

    return escape(text)


class Output:
    """Where a command's text goes: rich when installed, plain print otherwise.

    ``quiet`` drops progress and informational lines; results and notices stay.
    ``json_mode`` drops everything but the one JSON document printed by :meth:`emit`.
    Warnings go to stderr whatever the mode.
    """

    def __init__(self, *, quiet: bool = False, json_mode: bool = False, plain: bool = False) -> None:
        self.quiet = quiet
        self.json_mode = json_mode
        self._plain = plain
        self._console: Any = None
        #: A JSON document was printed: an error after it must not print a second one.
        self.emitted = False

    @property
    def console(self) -> Any:
        """A rich Console on the *current* ``sys.stdout`` or ``None`` without rich."""
        if self._plain:
            return None
        if self._console is None or self._console.file is not sys.stdout:
            try:
                from rich.console import Console
            except ImportError:
                self._plain = True
                return None
            # Piped output is read by people too: wider than rich's 80-column default.
            width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 120
            # emoji=False: a ':name:' in a file name or message must print as written.
            self._console = Console(
                file=sys.stdout, highlight=False, soft_wrap=True, width=width, emoji=False
            )
            # rich exits 1 on a closed pipe; main() ends such a command quietly with 0.
            self._console.on_broken_pipe = _broken_pipe
        return self._console

    def _print(self, text: str) -> None:
        console = self.console
        if console is None:
            print(text, flush=True)
        else:
            console.print(text, markup=False)

    def info(self, text: str) -> None:
        """Narrative line; hidden by ``--quiet`` and ``--json``."""
        if not (self.quiet or self.json_mode):
            self._print(text)

    def notice(self, text: str) -> None:
        """A line the user must see (e.g. what was skipped and why); hidden by ``--json`` only."""
        if not self.json_mode:
            self._print(text)

    def warn(self, text: str) -> None:
        """``trt-runtime: warning: TEXT`` on stderr, one line, in every mode."""
        line = " ".join(str(text).split())
        print(f"{PROG}: warning: {line}", file=sys.stderr, flush=True)

    def emit(self, document: Any) -> None:
        """Print the JSON document of the command (``--json`` only).

        Indented, unless it exceeds :data:`INDENT_LIMIT` characters: then it is one line,
        since only the compact form has a C encoder (indenting 16K bindings takes seconds).
        """
        if self.json_mode:
            data = jsonable(document)
            text = json.dumps(data)
            if len(text) <= INDENT_LIMIT:
                text = json.dumps(data, indent=2)
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
            self.emitted = True

    def table(self, title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """A table (rich, or aligned plain text); every cell is text, never markup."""
        if self.json_mode:
            return
        cells = [[cell(v) for v in row] for row in rows]
        console = self.console
        # rich lays out a table in time that grows fast with its rows; long ones print plain.
        if console is not None and len(cells) <= RICH_TABLE_ROWS:
            from rich.table import Table

            table = Table(title=_escape(title) or None, title_justify="left")
            for column in columns:
                table.add_column(_escape(column), overflow="fold")
            for row in cells:
                table.add_row(*(_escape(c) for c in row))
            console.print(table)
            return
        if title:
            print(title)
        sys.stdout.flush()
        widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
        print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
        print("  ".join("-" * w for w in widths))
        for row in cells:
            print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())

    def fields(self, pairs: Sequence[tuple[str, Any]]) -> None:
        """Aligned ``key  value`` lines."""
        if self.json_mode:
            return
        width = max((len(k) for k, _ in pairs), default=0)
        for key, value in pairs:
            self._print(f"  {key.ljust(width)}  {cell(value)}")

    @contextlib.contextmanager
    def status(self, text: str) -> Iterator[Callable[[str], None]]:
        """A spinner while a slow step runs (build, JIT); a plain line when not a terminal.

        Yields ``update(text)``, which changes the spinner's text (a no-op without one).
        """
        if self.quiet or self.json_mode:
            yield lambda _text: None
            return
        console = self.console
        if console is not None and console.is_terminal:
            with console.status(_escape(text)) as spinner:
                yield lambda new: spinner.update(_escape(new))
            return
        self._print(text)
        yield lambda _text: None


def _broken_pipe() -> None:
    raise BrokenPipeError("stdout was closed")


def cell(value: Any) -> str:
    """One value as table or field text: ``-`` for None, ``yes``/``no``, floats to 0.1."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return str(value)


def compact(value: Any) -> str:
    """One line for a nested value: ``k=v, k=v`` for mappings, comma lists for sequences."""
    value = jsonable(value)
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={compact(v)}" for k, v in value.items()) or "-"
    if isinstance(value, list):
        return "[" + ", ".join(compact(v) for v in value) + "]"
    return cell(value)


_PLAIN = frozenset({str, int, float, bool, type(None)})


def jsonable(value: Any) -> Any:
    """``value`` as JSON types: dataclasses and mappings to dicts, bytes to ``<N bytes>``."""
    kind = type(value)
    if kind in _PLAIN:  # the common case first: reports hold tens of thousands of these
        return value
    if kind is dict:
        return {str(k): jsonable(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [jsonable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<{len(value)} bytes>"
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def human_size(n: int) -> str:
    """``123 B`` or ``1.5 MiB (1,572,864 bytes)``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit} ({n:,} bytes)"
        size /= 1024
    return f"{n} B"  # pragma: no cover - loop always returns


def print_error(message: str, debug: bool) -> None:
    """``trt-runtime: error: MESSAGE`` as one line on stderr; the traceback first with ``debug``."""
    if debug:
        traceback.print_exc()
    line = " ".join(str(message).split())  # one line, whatever the message held
    print(f"{PROG}: error: {line}", file=sys.stderr, flush=True)


def describe_exception(exc: BaseException) -> str:
    """The one-line message of an error that is not a :class:`CliError`."""
    from trt_runtime.errors import TrtRuntimeError

    if isinstance(exc, TrtRuntimeError):
        return str(exc) or type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        return f"no such file: {exc.filename}"
    if isinstance(exc, IsADirectoryError):
        return f"is a directory, not a file: {exc.filename}"
    if isinstance(exc, PermissionError):
        return f"permission denied: {exc.filename}"
    if isinstance(exc, (OSError, ValueError, TypeError, ImportError)):
        return f"{exc}" if str(exc) else type(exc).__name__
    return f"{type(exc).__name__}: {exc} (run with --debug for the traceback)"
