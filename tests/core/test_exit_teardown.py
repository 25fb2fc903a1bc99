"""What the backends do at interpreter exit, with the CPU doubles: nothing is released by the
atexit hooks (daemon threads may still be calling, the program's tensors outlive the hooks),
while an engine collected or closed before then still releases everything. Each case runs
``weakref.finalize``'s exit hook in a process of its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def _run(script: str) -> str:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=HERE, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_exit_teardown_python_engine_left_alone_at_exit() -> None:
    out = _run("""
        import gc, weakref
        import numpy as np
        from _python_doubles import _fake_engine
        engine = _fake_engine()
        engine.execute(np.ones((2, 4), np.float32))
        context, rt = engine._lanes[0].context, engine._rt
        weakref.finalize._exitfunc()  # what atexit runs
        del engine
        gc.collect()
        print([c[0] for c in rt.calls if c[0] == "destroy"], context.trt_context is not None)
    """)
    assert out == "[] True"


def test_exit_teardown_python_engine_collected_before_exit_still_releases() -> None:
    out = _run("""
        import gc, weakref
        import numpy as np
        from _python_doubles import _fake_engine
        engine = _fake_engine()
        engine.execute(np.ones((2, 4), np.float32))
        context, rt = engine._lanes[0].context, engine._rt
        del engine
        gc.collect()
        weakref.finalize._exitfunc()
        print(len([c for c in rt.calls if c[0] == "destroy"]) > 0, context.trt_context is None)
    """)
    assert out == "True True"


def test_exit_teardown_torchbind_copy_nodes_left_alone_at_exit() -> None:
    out = _run("""
        import gc, weakref
        from _torchbind_graphs import dyn, nodes_engine
        engine, bridge, rt = nodes_engine("copy")
        engine.execute(dyn(2, 2.0))  # builds the copy nodes
        weakref.finalize._exitfunc()
        print(len(rt.execs))
    """)
    assert out == "1"


# -- daemon threads still calling at exit (the core's exit hook, trt_runtime.lease) ----------------
_MEMORY_ENGINE = """
    import atexit, threading, time
    import numpy as np
    state = {"calls": 0, "in_call": 0, "seen": None}

    def late_check():  # registered first: runs after trt_runtime's exit hook
        before = state["calls"]
        time.sleep(0.2)
        state["seen"] = (before == state["calls"], state["in_call"])
        print("parked" if state["seen"] == (True, 0) else f"still calling {state}", flush=True)

    atexit.register(late_check)
    import trt_runtime as trt
    from trt_runtime import TensorSpec
    from trt_runtime.testing.memory import AffineOutput, MemoryBackend, MemoryLane

    spec = TensorSpec("x", "float32", (2, 4), is_input=True)
    data = MemoryBackend.build_engine([spec], [AffineOutput("y", "x", scale=2.0, bias=1.0)])
    original = MemoryLane.run

    def slow_run(self, *args):
        state["in_call"] += 1
        try:
            time.sleep(SLEEP)
            return original(self, *args)
        finally:
            state["in_call"] -= 1

    MemoryLane.run = slow_run
    engine = trt.load(data, "memory", contexts=CONTEXTS)
    x = np.ones((2, 4), np.float32)

    def loop():
        while True:
            engine(x)
            state["calls"] += 1

    for _ in range(THREADS):
        threading.Thread(target=loop, daemon=True).start()
    while state["calls"] < 10:
        time.sleep(0.01)
"""


def test_exit_teardown_daemon_threads_are_parked_at_exit() -> None:
    out = _run("SLEEP, CONTEXTS, THREADS = 0.0, 1, 1\n" + textwrap.dedent(_MEMORY_ENGINE))
    assert out == "parked"


def test_exit_teardown_calls_in_flight_finish_before_exit() -> None:
    # 4 threads on 2 contexts, each call 50 ms: at exit two calls are in flight, others wait
    out = _run("SLEEP, CONTEXTS, THREADS = 0.05, 2, 4\n" + textwrap.dedent(_MEMORY_ENGINE))
    assert out == "parked"


def test_exit_teardown_hook_holds_open_engines_and_skips_closed_ones() -> None:
    out = _run("""
        import time
        import trt_runtime as trt
        from trt_runtime import TensorSpec
        from trt_runtime.lease import hold_lanes_at_exit
        from trt_runtime.testing.memory import AffineOutput, MemoryBackend

        spec = TensorSpec("x", "float32", (2, 4), is_input=True)
        data = MemoryBackend.build_engine([spec], [AffineOutput("y", "x", scale=2.0, bias=1.0)])
        closed = trt.load(data, "memory", contexts=2)
        closed.close()
        kept = trt.load(data, "memory", contexts=3)
        t0 = time.monotonic()
        held = hold_lanes_at_exit(timeout=2.0)
        print(held >= 3, time.monotonic() - t0 < 1.0)
    """)
    assert out == "True True"


def test_exit_teardown_an_earlier_atexit_hook_of_the_program_neither_hangs_nor_fails() -> None:
    # registered before trt_runtime was imported: it runs after the exit hook held the lanes
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import atexit
        state = {}

        def program_cleanup():
            try:
                state["engine"](state["x"])
                print("called")
            except Exception as exc:
                print(type(exc).__name__, "exiting" in str(exc))
            state["engine"].close()
            print("closed", state["engine"].closed)

        atexit.register(program_cleanup)
        import numpy as np
        import trt_runtime as trt
        from trt_runtime import TensorSpec
        from trt_runtime.testing.memory import AffineOutput, MemoryBackend

        spec = TensorSpec("x", "float32", (2, 4), is_input=True)
        data = MemoryBackend.build_engine([spec], [AffineOutput("y", "x", scale=2.0, bias=1.0)])
        state["engine"], state["x"] = trt.load(data, "memory"), np.ones((2, 4), np.float32)
        state["engine"](state["x"])
    """)], cwd=HERE, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.split("\n")[:2] == ["EngineError True", "closed True"]
