"""What the backends do at interpreter exit, with the CPU doubles: nothing is released by the
atexit hooks (daemon threads may still be calling, the program's tensors outlive the hooks),
while an engine collected or closed before then still releases everything. Each case runs
``weakref.finalize``'s exit hook in a process of its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).parent


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
        context, rt = engine._context, engine._rt
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
        context, rt = engine._context, engine._rt
        del engine
        gc.collect()
        weakref.finalize._exitfunc()
        print(len([c for c in rt.calls if c[0] == "destroy"]) > 0, context.trt_context is None)
    """)
    assert out == "True True"


def test_exit_teardown_torchbind_copy_nodes_left_alone_at_exit() -> None:
    out = _run("""
        import gc, weakref
        from test_torchbind_outer_graph import dyn, nodes_engine
        engine, bridge, rt = nodes_engine("copy")
        engine.execute(dyn(2, 2.0))  # builds the copy nodes
        weakref.finalize._exitfunc()
        print(len(rt.execs))
    """)
    assert out == "1"
