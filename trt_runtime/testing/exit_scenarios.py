"""The exit matrix: scripts that use engines the way users do and must then end cleanly.

Each :class:`Scenario` runs in a process of its own (:func:`run_scenario`) with
``PYTHONFAULTHANDLER=1``; it passes when the process exits 0, printed
:data:`~trt_runtime.testing.exit_child.DONE` (all its work done and checked against the
float64 reference) and wrote no error line to stderr (:func:`error_lines`). Interpreter
teardown is part of what is tested: scenarios leave engines open, outputs and static input
buffers referenced by module globals, threads behind them.

``tools/gpu_exit_matrix.py`` runs the table and writes a JSON summary;
``tests/gpu/test_gpu_exit.py`` runs it as one test per scenario. Both build the engines
with :func:`prepare` on the GPU host.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from trt_runtime.testing.exit_child import DONE, WORK_ENV

#: The batches of the dynamic engine the scenarios call (both profiles of ``build_dynamic``).
DYNAMIC_BATCHES = (2, 5, 8, 20)


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One script of the matrix and what its process needs."""

    name: str
    #: The script body; ``w`` is a :class:`~trt_runtime.testing.exit_child.Work`.
    body: str
    backends: tuple[str, ...]
    #: GPUs the scenario needs (2: the caller-device checks and two-device placement).
    gpus: int = 1
    #: ``import torch`` before anything of ``trt_runtime`` is imported.
    torch_first: bool = False

    def source(self) -> str:
        head = "import torch\n" if self.torch_first else ""
        head += "from trt_runtime.testing.exit_child import Work\nw = Work()\n"
        return head + textwrap.dedent(self.body) + "\nw.done()\n"


# -- per-backend scenarios (``B`` is the backend's name) -----------------------------------------
_PER_BACKEND: dict[str, str] = {
    "eager-closed": """
        e = w.load(B)
        x = w.cuda()
        for _ in range(20):
            w.check(e(x))
        e.close()
    """,
    "never-closed-outputs-kept": """
        e = w.load(B)
        x = w.cuda()
        KEEP = [e(x) for _ in range(10)]
        for y in KEEP:
            w.check(y)
    """,
    "closed-twice": """
        e = w.load(B)
        w.check(e(w.cuda()))
        e.close()
        e.close()
        with w.load(B) as f:
            w.check(f(w.cuda()))
        f.close()
    """,
    "outer-copy": """
        from trt_runtime import enable_cudagraphs
        e = w.load(B)
        x = w.cuda()
        with enable_cudagraphs(e, outer="copy"):
            KEEP = [e(x) for _ in range(10)]
        for y in KEEP:
            w.check(y)
    """,
    "outer-view": """
        from trt_runtime import enable_cudagraphs
        e = w.load(B)
        x = w.cuda()
        with enable_cudagraphs(e, outer="view"):
            KEEP = [e(x) for _ in range(10)]
            w.check(KEEP[-1])
    """,
    "outer-closed-outputs-kept": """
        from trt_runtime import enable_cudagraphs
        e = w.load(B)
        x = w.cuda()
        KEEP = []
        for mode in ("copy", "view"):
            with enable_cudagraphs(e, outer=mode):
                KEEP.append(e(x))
                w.check(KEEP[-1])
        e.close()
    """,
    "static-inputs-kept": """
        from trt_runtime import enable_cudagraphs
        e = w.load(B)
        x = w.cuda()
        with enable_cudagraphs(e, outer="view"):
            (STATIC,) = e.static_inputs(tuple(x.shape), as_torch=True)
            STATIC.copy_(x)
            KEEP = [e(STATIC) for _ in range(5)]
            w.check(KEEP[-1])
    """,
    "contexts4-threads8": """
        e = w.load(B, contexts=4)
        x = w.cuda()
        def body(i):
            for _ in range(50):
                w.check(e(x))
        w.threads(8, body)
    """,
    "runtime-cache": """
        import trt_runtime
        folder = w.dir / ("cache-" + B)
        folder.mkdir(exist_ok=True)
        e = w.load(B)
        for _ in range(2):  # cold, then warm from the file
            with trt_runtime.runtime_cache(e, folder):
                w.check(e(w.cuda()))
        assert list(folder.glob("runtime-cache-*.bin")), "no runtime cache file written"
    """,
    "tr01-and-pte": """
        KEEP = []
        for fmt in ("tr01", "pte"):
            e = w.load(B, fmt=fmt)
            KEEP.append(e(w.cuda()))
            w.check(KEEP[-1])
        e.close()
    """,
    "dynamic-shapes": """
        e = w.load(B, model="dynamic")
        for b in DYNAMIC_BATCHES:
            w.check(e(w.cuda("dynamic", b)), "dynamic", b)
    """,
    "keyboard-interrupt-in-loop": """
        import _thread, contextlib, threading, time
        from trt_runtime import enable_cudagraphs
        e = w.load(B)
        x = w.cuda()
        for mode in (False, "copy"):
            with enable_cudagraphs(e, outer=mode) if mode else contextlib.nullcontext():
                threading.Timer(0.3, _thread.interrupt_main).start()
                calls = 0
                try:
                    deadline = time.monotonic() + 60
                    while time.monotonic() < deadline:
                        e(x)
                        calls += 1
                    raise AssertionError("no KeyboardInterrupt arrived in 60 s")
                except KeyboardInterrupt:
                    pass
                print("outer", mode, "calls before the interrupt:", calls)
                for _ in range(3):
                    w.check(e(x))  # the engine still serves
    """,
    "sys-exit-in-worker": """
        import sys, threading
        e = w.load(B)
        x = w.cuda()
        def body():
            for _ in range(20):
                w.check(e(x))
            sys.exit(3)  # ends the thread, not the process
        t = threading.Thread(target=body)
        t.start()
        t.join()
        KEEP = e(x)
        w.check(KEEP)
    """,
    "daemon-thread-calling-at-exit": """
        import threading
        e = w.load(B)
        x = w.cuda()
        running = threading.Event()
        def body():
            while True:
                e(x)
                running.set()
        threading.Thread(target=body, daemon=True).start()
        assert running.wait(60), "the daemon thread made no call in 60 s"
        w.check(e(x))
    """,
}

_BOTH_BACKENDS = """
    import torch
    from trt_runtime import enable_cudagraphs
    x = w.cuda()
    KEEP = []
    for i, b in enumerate(("python", "torchbind")):
        e = w.load(b)
        KEEP.append(e(x))
        with enable_cudagraphs(e, outer=("copy", "view")[i]):
            KEEP.extend(e(x) for _ in range(5))
        for y in KEEP:
            w.check(y)
"""

# The combined script of a user: every call style on both backends in one process.
_BIG = """
    import time
    import torch
    from trt_runtime import enable_cudagraphs
    KEEP = []
    x = w.cuda()
    opened = {}
    for b in ("python", "torchbind"):
        e = opened[b] = w.load(b)
        for _ in range(20):
            w.check(e(x))
        y = torch.empty(tuple(e.outputs[0].shape), dtype=x.dtype, device="cuda")
        for _ in range(20):
            e.execute(x, outputs=[y], stream=torch.cuda.current_stream())
        w.check(y)
        KEEP.append(y)
        for mode in ("copy", "view"):
            with enable_cudagraphs(e, outer=mode):
                KEEP.extend(e(x) for _ in range(20))
                w.check(KEEP[-1])
                (st,) = e.static_inputs(tuple(x.shape), as_torch=True)
                st.copy_(x)
                KEEP.append(st)
                w.check(e(st))
        bound = lambda: e.execute(x, outputs=[y], stream=torch.cuda.current_stream())
        for label, run in (("eager", lambda: e(x)), ("pre-bound", bound)):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(300):
                run()
            torch.cuda.synchronize()
            print(b, label, "%.1f us/call" % ((time.perf_counter() - t0) / 300 * 1e6))
        e4 = opened[b + "-4"] = w.load(b, contexts=4)
        w.threads(8, lambda i: [w.check(e4(x)) for _ in range(25)])
        for fmt in ("pte", "tr01"):
            p = w.load(b, fmt=fmt)
            KEEP.append(p(x))
            w.check(KEEP[-1])
        d = opened[b + "-dynamic"] = w.load(b, model="dynamic")
        for n in DYNAMIC_BATCHES:
            w.check(d(w.cuda("dynamic", n)), "dynamic", n)
        with enable_cudagraphs(d, outer="copy"):
            for n in DYNAMIC_BATCHES:
                KEEP.append(d(w.cuda("dynamic", n)))
                w.check(KEEP[-1], "dynamic", n)
    if NATIVE_OP:  # the bare torch-tensorrt op on the torchbind engine, as benchmarks call it
        op = torch.ops.tensorrt.execute_engine
        for _ in range(50):
            out = op([x], opened["torchbind"].native)
        w.check(out[0])
        KEEP.append(out)
"""

_TORCH_AFTER = """
    import sys
    e = w.load("python")
    w.check(e(w.host()))  # host I/O before torch is imported
    import torch
    x = w.cuda()
    KEEP = [e(x), e(w.host())]
    for y in KEEP:
        w.check(y)
"""

_TORCH_FIRST = """
    KEEP = []
    for b in BACKENDS:
        e = w.load(b)
        KEEP.append(e(w.cuda()))
        w.check(KEEP[-1])
"""

_HOST_ONLY = """
    e = w.load("python")
    KEEP = [e(w.host()) for _ in range(10)]
    for y in KEEP:
        w.check(y)
"""

_TWO_DEVICES = """
    import torch
    from trt_runtime import enable_cudagraphs
    KEEP = []
    for b in BACKENDS:
        for device in (0, 1):
            e = w.load(b, device=device)
            x = w.cuda(device=device)
            KEEP.append(e(x))
            with enable_cudagraphs(e, outer="copy"):
                KEEP.extend(e(x) for _ in range(3))
    for y in KEEP:
        w.check(y)
"""

_CALLER_DEVICE = """
    from trt_runtime.testing.exit_child import caller_device_paths
    changed = caller_device_paths(w, B)
    for line in changed:
        print("caller device changed:", line)
    assert not changed, f"{len(changed)} path(s) changed the caller's device or context"
"""


def _make_table() -> tuple[Scenario, ...]:
    table: list[Scenario] = []
    for backend in ("python", "torchbind"):
        for name, body in _PER_BACKEND.items():
            prologue = f"B = {backend!r}\nDYNAMIC_BATCHES = {DYNAMIC_BATCHES!r}\n"
            table.append(Scenario(f"{backend}-{name}", prologue + textwrap.dedent(body), (backend,)))
    both = ("python", "torchbind")
    prologue = f"BACKENDS = {both!r}\nDYNAMIC_BATCHES = {DYNAMIC_BATCHES!r}\n"
    table += [
        Scenario("both-backends", _BOTH_BACKENDS, both),
        Scenario("big", prologue + "NATIVE_OP = True\n" + textwrap.dedent(_BIG), both),
        Scenario("big-without-native-op", prologue + "NATIVE_OP = False\n" + textwrap.dedent(_BIG), both),
        Scenario("torch-first-both-backends", prologue + textwrap.dedent(_TORCH_FIRST), both,
                 torch_first=True),
        Scenario("torch-after-python", _TORCH_AFTER, ("python",)),
        Scenario("host-io-python", _HOST_ONLY, ("python",)),
        Scenario("two-devices-both-backends", prologue + textwrap.dedent(_TWO_DEVICES), both, gpus=2),
    ]
    for backend in both:
        body = f"B = {backend!r}\n" + textwrap.dedent(_CALLER_DEVICE)
        table.append(Scenario(f"caller-device-{backend}", body, (backend,), gpus=2))
    return tuple(table)


#: Every scenario of the matrix, in the order the tool runs them.
SCENARIOS: tuple[Scenario, ...] = _make_table()

#: A line of stderr that means something went wrong, whatever the exit code said.
_ERROR_LINE = re.compile(
    r"error|traceback|fatal python|segmentation fault|terminate called|aborted|core dumped|"
    r"exception ignored|invalid resource handle|context is destroyed",
    re.IGNORECASE,
)

#: A line of stderr from the exit hook (its report, or the lanes it could not hold).
_HOOK_LINE = re.compile(r"trt_runtime( exit hook|: at interpreter exit)")


def error_lines(stderr: str) -> list[str]:
    """The lines of ``stderr`` that report an error, an exception or a crash."""
    return [line for line in stderr.splitlines() if _ERROR_LINE.search(line)]


def skip_reason(scenario: Scenario, gpus: int, backends: Collection[str]) -> str | None:
    """Why ``scenario`` cannot run on a host with ``gpus`` GPUs and these usable backends."""
    if gpus < scenario.gpus:
        return f"needs {scenario.gpus} GPUs; this host has {gpus}"
    missing = [b for b in scenario.backends if b not in backends]
    if missing:
        return f"backend(s) {', '.join(missing)} cannot run here"
    return None


def run_scenario(scenario: Scenario, work: str | os.PathLike[str], timeout: float = 300.0,
                 env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run ``scenario`` in a fresh ``python -c`` process over the engines in ``work``
    (``env``: variables set for that process on top of this one's).

    Returns a JSON-able record: ``name``, ``passed``, ``exit_code`` (None on timeout),
    ``wall_s``, ``done`` (the scenario printed :data:`DONE`), ``error_lines``, ``hook_lines``
    (what the exit hook of :mod:`trt_runtime.lease` wrote), the first lines of stderr
    (``stderr_head``) and the last of ``stderr_tail`` and ``stdout_tail``.
    """
    child_env = dict(os.environ, PYTHONFAULTHANDLER="1", PYTHONUNBUFFERED="1", **(env or {}))
    child_env[WORK_ENV] = str(work)
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", scenario.source()], env=child_env, capture_output=True,
                              text=True, timeout=timeout)
        code: int | None = proc.returncode
        out, err = proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        code = None
        out = _text(exc.stdout)
        err = _text(exc.stderr) + f"\n(timed out after {timeout:.0f} s)"
    wall = time.perf_counter() - start
    done = DONE in out.splitlines()
    errors = error_lines(err)
    return {
        "name": scenario.name,
        "passed": code == 0 and done and not errors,
        "exit_code": code,
        "wall_s": round(wall, 2),
        "done": done,
        "error_lines": errors[-20:],
        "hook_lines": [line for line in err.splitlines() if _HOOK_LINE.match(line)],
        "stderr_head": err.splitlines()[:8],
        "stderr_tail": err.splitlines()[-15:],
        "stdout_tail": out.splitlines()[-15:],
    }


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def prepare(work: str | os.PathLike[str], logger: Any = None) -> Path:
    """Build the scenarios' engines on this GPU host into ``work``: ``mlp`` (float16, batch 8)
    and ``dynamic`` (float32, two profiles) as plans, the MLP also as a TR01 blob and a
    ``.pte`` written by :func:`trt_runtime.executorch.to_pte` (device_id 0), with inputs and
    float64 reference outputs as ``.npy``. ``logger``: TensorRT's logger for the builds
    (pass the python backend's, as TensorRT keeps a process's first)."""
    import numpy as np

    from trt_runtime import builders
    from trt_runtime.executorch import to_pte
    from trt_runtime.formats import pack_tr01

    folder = Path(work)
    folder.mkdir(parents=True, exist_ok=True)
    mlp = builders.build_mlp(256, 4, batch=8, dtype="float16", logger=logger)
    dynamic = builders.build_dynamic(16, "float32", logger=logger)
    bindings = (*mlp.inputs, *mlp.outputs)
    (folder / "mlp.plan").write_bytes(mlp.plan)
    (folder / "mlp.tr01").write_bytes(pack_tr01(mlp.plan, bindings, device_id=0))
    to_pte(mlp.plan, bindings, folder / "mlp.pte", device_id=0)
    (folder / "dynamic.plan").write_bytes(dynamic.plan)
    # one tolerance for both: the float16 MLP's, the looser
    (folder / "tolerance.txt").write_text(" ".join(str(v) for v in mlp.tolerance))
    for name, built, batches in (("mlp", mlp, (8,)), ("dynamic", dynamic, DYNAMIC_BATCHES)):
        for batch in batches:
            (x,) = built.random_inputs(batch=batch, seed=batch)
            np.save(folder / f"{name}_x{batch}.npy", x)
            np.save(folder / f"{name}_y{batch}.npy", built.reference(x)[0])
    return folder


def prepare_memory(work: str | os.PathLike[str]) -> Path:
    """A work folder as :func:`prepare` leaves it, on a CPU: the test backend ``memory``'s
    ``y = 2x + 1`` as the MLP (``mlp.plan``, batch 8, width 4), its input and reference."""
    import numpy as np

    from trt_runtime import TensorSpec
    from trt_runtime.testing.memory import AffineOutput, MemoryBackend

    folder = Path(work)
    folder.mkdir(parents=True, exist_ok=True)
    spec = TensorSpec("x", "float32", (8, 4), is_input=True)
    (folder / "mlp.plan").write_bytes(
        MemoryBackend.build_engine([spec], [AffineOutput("y", "x", scale=2.0, bias=1.0)], name="mlp"))
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(8, 4)
    np.save(folder / "mlp_x8.npy", x)
    np.save(folder / "mlp_y8.npy", x.astype(np.float64) * 2 + 1)
    (folder / "tolerance.txt").write_text("1e-6 1e-6")
    return folder
