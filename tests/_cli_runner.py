"""Running ``trt-runtime`` in-process for tests: exit code, stdout, stderr."""

from __future__ import annotations

import os
from typing import Any

import pytest

from trt_runtime import cli


def run_cli(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    """``cli.main(argv)`` (paths as strings); returns the exit code and what it printed."""
    code = cli.main([os.fspath(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def error_lines(err: str) -> list[str]:
    """The ``trt-runtime: error:`` lines of stderr (never a traceback)."""
    assert "Traceback" not in err, err
    return [ln for ln in err.splitlines() if ln.startswith("trt-runtime: error: ")]
