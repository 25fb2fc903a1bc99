"""What the command-line tests share: the --force flag, the one-line error check and the GPU reason."""

from __future__ import annotations

from trt_runtime.cli.engine_files import backend_reason

#: Engines of the numpy ``memory`` backend start with b"TRTMEM1\0", no TensorRT magic:
#: the commands take them only with --force.
FORCE = "--force"


def one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines()
             if ln.strip() and not ln.startswith(("usage:", "trt-runtime: warning: "))]
    assert len(lines) == 1, err
    assert lines[0].startswith("trt-runtime: error: "), err
    assert "Traceback" not in err
    return lines[0]


def gpu_reason() -> str:
    return backend_reason(None)
