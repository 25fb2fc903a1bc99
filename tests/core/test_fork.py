"""An engine in a process forked after it was loaded: CUDA does not cross fork(), so in the
child the engine reads as closed and a call or a change raises an EngineError saying to load
it again, while nothing native is released there; the parent's engine goes on serving."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")


def _run(script: str) -> str:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=HERE, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip()


def test_fork_child_gets_a_clear_engine_error_and_the_parent_serves_on() -> None:
    out = _run("""
        import os, threading
        import numpy as np
        import trt_runtime as trt
        from trt_runtime import EngineError, TensorSpec
        from trt_runtime.testing.memory import AffineOutput, MemoryBackend

        spec = TensorSpec("x", "float32", (2, 4), is_input=True)
        data = MemoryBackend.build_engine([spec], [AffineOutput("y", "x", scale=2.0, bias=1.0)])
        engine = trt.load(data, "memory", contexts=2)
        x = np.ones((2, 4), np.float32)
        engine(x)
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                assert engine.closed
                for attempt in (lambda: engine(x), lambda: engine.execute(x),
                                lambda: setattr(engine, "contexts", 3), engine.ensure_context):
                    try:
                        attempt()
                        code = 3
                    except EngineError as exc:
                        msg = str(exc)
                        if f"loaded in process {parent}" not in msg or "load the engine again" not in msg:
                            code = 4
                engine.close()  # nothing to do, no error
                fresh = trt.load(data, "memory")  # a new load in the child works
                assert (fresh(x) == 3.0).all()
                fresh.close()
            except BaseException as exc:
                print("child:", type(exc).__name__, exc, flush=True)
                code = 5
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), (engine(x) == 3.0).all(), engine.closed)
        engine.close()
    """)
    assert out == "0 True False"


def test_fork_python_engine_releases_nothing_in_the_child() -> None:
    out = _run("""
        import os
        import numpy as np
        from _python_doubles import _fake_engine
        engine = _fake_engine()
        engine.execute(np.ones((2, 4), np.float32))
        rt = engine._rt
        pid = os.fork()
        if pid == 0:
            import gc
            before = len(rt.calls)
            alive = engine._lanes[0].ops._finalizer.alive
            del engine
            gc.collect()
            os._exit(0 if not alive and len(rt.calls) == before else 1)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), engine._lanes[0].ops._finalizer.alive)
    """)
    assert out == "0 True"
