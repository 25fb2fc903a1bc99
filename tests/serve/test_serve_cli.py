"""``trt-runtime serve --ray``: a memory engine on Ray Serve on loopback, stopped by Ctrl-C."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _serve_support import HOST, PORT_CLI, load_npy, npy, post, reference, require_serve, single_engine

require_serve()
# One Ray at a time on this machine: under xdist these modules share one worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]


def _read_until(proc: subprocess.Popen[str], marker: str, deadline_s: float) -> str:
    assert proc.stdout is not None
    end = time.monotonic() + deadline_s
    seen = []
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        if marker in line:
            return line
    raise AssertionError(f"no {marker!r} line within {deadline_s} s; stdout: {''.join(seen)!r}; "
                         f"exit: {proc.poll()}")


def test_serve_cli_prints_the_url_serves_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    engine = tmp_path / "affine.mem"
    engine.write_bytes(single_engine())
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "trt_runtime.cli", "serve", str(engine), "--ray", "--backend", "memory",
               "--port", str(PORT_CLI), "--cpus-per-replica", "0", "--max-batch", "4",
               "--route-prefix", "/affine", "--runtime-cache", str(tmp_path / "cache.bin")]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = _read_until(proc, "serving", 120)
        url = f"http://{HOST}:{PORT_CLI}/affine"
        assert url in line
        x = np.full((3, 5), 1.25, np.float32)
        status, body, _ = post(url, npy(x), "application/x-npy")
        assert status == 200, body
        np.testing.assert_array_equal(load_npy(body), reference(x))
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-2000:]
    assert "stopped" in err
    for chatter in ("Started a local Ray instance", "Connecting to existing Serve app", "Deleting app"):
        assert chatter not in err, f"Ray's {chatter!r} reached the screen at the default --log-level"
    with socket.socket() as sock:
        assert sock.connect_ex((HOST, PORT_CLI)) != 0, "the HTTP proxy outlived the command"
    assert (tmp_path / "cache.bin").stat().st_size > 0  # the replica saved its runtime cache


def test_serve_cli_refuses_a_missing_file_and_bad_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trt_runtime.cli import main

    assert main(["serve", str(tmp_path / "nope.mem"), "--backend", "memory"]) == 1
    assert "no such file" in capsys.readouterr().err
    engine = tmp_path / "affine.mem"
    engine.write_bytes(single_engine())
    assert main(["serve", str(engine), "--backend", "memory", "--max-batch", "0"]) == 2
    assert "--max-batch must be >= 1; got 0 (see 'trt-runtime serve --help')" in capsys.readouterr().err
    assert main(["serve", str(engine), "--ray", "--backend", "memory", "--replicas", "0"]) == 2
    assert "--replicas must be >= 1; got 0" in capsys.readouterr().err
    assert main(["serve", str(engine), "--backend", "memory", "--replicas", "2"]) == 2
    assert "--replicas applies to --ray only" in capsys.readouterr().err
    assert main(["serve", str(engine), "--ray", "--workers", "2"]) == 2
    local_only = "--engine-poll-us, --front-poll-us and --overlap apply to the local server"
    assert local_only in capsys.readouterr().err
    assert main(["serve", str(engine), "--ray", "--no-overlap"]) == 2
    assert local_only in capsys.readouterr().err
