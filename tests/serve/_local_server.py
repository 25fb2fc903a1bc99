"""Running ``trt-runtime serve`` (the local server) in a subprocess for the tests, on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from _serve_support import HOST


class ServerProcess:
    """``trt-runtime --json serve ENGINE ARGS...`` (or ``command``); :attr:`doc` is the JSON
    document it printed once every process was up (``url``, ``pids``). Its stderr is
    collected on a thread."""

    def __init__(self, engine: Path, port: int, *args: str, ready_s: float = 90.0,
                 command: list[str] | None = None) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if command is None:
            command = [sys.executable, "-m", "trt_runtime.cli", "--json", "serve", str(engine),
                       "--port", str(port), *args]
        self.port = port
        self.url = f"http://{HOST}:{port}"
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env)
        self.stderr: list[str] = []
        self._reader = threading.Thread(target=self._drain_stderr, daemon=True)
        self._reader.start()
        self.doc = self._read_document(ready_s)

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def _read_document(self, deadline_s: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        timer = threading.Timer(deadline_s, self.proc.kill)
        timer.start()
        text = ""
        try:
            for line in self.proc.stdout:
                text += line
                try:
                    return dict(json.loads(text))
                except json.JSONDecodeError:
                    continue
        finally:
            timer.cancel()
        raise AssertionError(f"no JSON document from the server; exit {self.proc.poll()}; stdout {text!r}; "
                             f"stderr {''.join(self.stderr)[-3000:]!r}")

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            return 0, str(exc).encode()

    def wait_ready(self, want: bool, deadline_s: float, poll_s: float = 0.02) -> float:
        """Seconds until ``/v2/health/ready`` says ``want``; ``AssertionError`` after ``deadline_s``."""
        start = time.monotonic()
        while time.monotonic() - start < deadline_s:
            status, _ = self.get("/v2/health/ready", timeout=2.0)
            if (status == 200) == want:
                return time.monotonic() - start
            time.sleep(poll_s)
        raise AssertionError(f"ready did not become {want} within {deadline_s} s; stderr "
                             f"{''.join(self.stderr)[-2000:]!r}")

    def stop(self, sig: int = signal.SIGINT, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        return self.proc.returncode
