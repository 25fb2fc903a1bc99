"""What the command-line tests share: the runner, the --force flag and the one-line error check."""

from __future__ import annotations

from _cli_runner import run_cli

from trt_runtime.cli.engine_files import backend_reason

#: Engines of the numpy ``memory`` backend start with b"TRTMEM1\0", no TensorRT magic:
#: the commands take them only with --force.
FORCE = "--force"


_run = run_cli


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines()
             if ln.strip() and not ln.startswith(("usage:", "trt-runtime: warning: "))]
    assert len(lines) == 1, err
    assert lines[0].startswith("trt-runtime: error: "), err
    assert "Traceback" not in err
    return lines[0]


def _gpu_reason() -> str:
    return backend_reason(None)
