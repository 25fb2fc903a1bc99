"""The ``trt-runtime`` command line: demo, build, inspect, run, bench, serve, cache, backends.

Exit codes: 0 success, 1 runtime error, 2 usage error, 130 interrupted. Errors are
one line on stderr (``trt-runtime: error: ...``); ``--debug`` adds the traceback.
``--json`` prints one JSON document on stdout for scripts. rich is used for tables
and progress when installed (``trt-runtime[cli]``); plain text otherwise.

One module per command (:mod:`~trt_runtime.cli.demo`, :mod:`~trt_runtime.cli.build`,
:mod:`~trt_runtime.cli.inspect`,
:mod:`~trt_runtime.cli.run`, :mod:`~trt_runtime.cli.bench`, :mod:`~trt_runtime.cli.serve`,
:mod:`~trt_runtime.cli.cache`,
:mod:`~trt_runtime.cli.backends`); what they share: :mod:`~trt_runtime.cli.output`
(console, errors, JSON), :mod:`~trt_runtime.cli.engine_files` (which files are engines),
:mod:`~trt_runtime.cli.arrays` (inputs and outputs), :mod:`~trt_runtime.cli.io_options`
(shapes, input files, log level), :mod:`~trt_runtime.cli.compare` (summaries, comparison),
:mod:`~trt_runtime.cli.parser` and
:mod:`~trt_runtime.cli.entry_point` (``main``, the console script).
"""

from __future__ import annotations

from trt_runtime.cli.arrays import make_inputs
from trt_runtime.cli.backends import backend_report
from trt_runtime.cli.entry_point import main
from trt_runtime.cli.inspect import inspect_file
from trt_runtime.cli.output import CliError, UsageError
from trt_runtime.cli.parser import build_parser

__all__ = ["CliError", "UsageError", "backend_report", "build_parser", "inspect_file", "main", "make_inputs"]
