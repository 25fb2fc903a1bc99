"""Where do 8 caller threads lose to 1: the GIL, or how the CUDA launches are made?

Run on the GPU host (tensorrt_rtx, cuda-python, torch with CUDA)::

    python3 benchmarks/probes/gpu_gil_probe.py [--out DIR] [--workloads tiny,mlp] [--duration 0.6]

Each row is a request/response loop of ``benchmarks/bench_concurrency`` (a call, then the
caller's own stream synchronized; every caller on a thread and stream of its own) at 1 and
8 callers, calls per second. The rows differ in one thing each:

* ``raw eager``: TensorRT-RTX's ``execute_async_v3`` on a context per thread; ``+pyN``
  adds N µs of pure Python per call (as much time holding the GIL as a runtime's own work);
* ``raw graph <launch>``: one captured graph per thread, launched by torch's
  ``CUDAGraph.replay()``, cuda-python's ``cudaGraphLaunch``, or the driver's
  ``cuGraphLaunch`` through ctypes, either releasing the GIL (``CDLL``) or keeping it
  (``PyDLL``);
* ``python eager`` / ``python outer`` (and ``torchbind``): ``engine(x)`` of one engine
  with 8 contexts (``outer``: under ``enable_cudagraphs(engine, outer="copy")``).

Writes ``gil_probe.json`` to ``--out``.
"""

from __future__ import annotations

import sys
from pathlib import Path
import ctypes
import time
from typing import Any

# _gpu_tool (the GPU tools' --out and JSON helpers) is shared with tools/.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import _gpu_tool  # noqa: E402


def _driver(keep_gil: bool) -> Any:
    """``cuGraphLaunch(exec, stream)`` of libcuda through ctypes; ``keep_gil``: PyDLL."""
    lib = (ctypes.PyDLL if keep_gil else ctypes.CDLL)("libcuda.so.1")
    fn = lib.cuGraphLaunch
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


def _busy(us: float) -> Any:
    end_ns = int(us * 1000)
    clock = time.perf_counter_ns

    def spin() -> None:
        t = clock() + end_ns
        while clock() < t:
            pass

    return spin


def probe(key: str, torch: Any, args: Any, counts: list[int]) -> dict[str, Any]:
    """The rows of one workload: calls/s by callers, and 8 over 1."""
    import trt_runtime
    from benchmarks import concurrency_callers as cc
    from benchmarks.concurrency_grid import Row, measure
    from benchmarks.raw_rows import open_engine
    from benchmarks.workloads import WORKLOADS_BY_KEY, build

    workload = WORKLOADS_BY_KEY[key]
    built, _ = build(workload)
    shape = tuple(workload.shapes[0])
    raw = open_engine(built.plan)
    results: dict[str, dict[int, float]] = {}

    def run(label: str, make: Any, results: dict[str, dict[int, float]] = results) -> None:
        for n in counts:
            callers = make(n)
            row = Row("probe", key, label, n, n)
            measure(row, callers, args.duration, args.warmup, batch=shape[0])
            per = (f" | per call: {row.switches_per_call} switches, {row.cpu_us_per_call} us CPU"
                   if row.switches_per_call is not None else "")
            results.setdefault(label, {})[n] = row.calls_per_s or 0.0
            extra = f" wrong {row.wrong}" if row.wrong else ""
            extra += f" {row.note}" if row.note else ""
            print(f"{key:6s} {label:34s} {n:2d} callers {row.calls_per_s or 0:10.1f} calls/s{per}{extra}",
                  flush=True)
            del callers

    def raw_eager(py_us: float) -> Any:
        def make(n: int) -> list[Any]:
            made = cc.raw_callers(raw, torch, built, shape, n, outer=False)
            if py_us:
                spin = _busy(py_us)
                for c in made:
                    execute = c.execute

                    def slow(handle: int, execute: Any = execute) -> bool:
                        spin()
                        return execute(handle)  # type: ignore[no-any-return]

                    c.execute = slow
            return made
        return make

    def raw_graph(how: str) -> Any:
        from cuda.bindings import runtime as rt

        def make(n: int) -> list[Any]:
            made = cc.raw_callers(raw, torch, built, shape, n, outer=True)
            for c in made:
                exec_ptr = int(c.graph.raw_cuda_graph_exec())
                handle, sync, y = c.handle, c.sync, c.y
                if how == "torch":
                    continue
                if how == "cuda-python":
                    g = rt.cudaGraphExec_t(exec_ptr)
                    launch = rt.cudaGraphLaunch

                    def call(g: Any = g, launch: Any = launch, h: int = handle, sync: Any = sync,
                             y: Any = y) -> Any:
                        (err,) = launch(g, h)
                        if err:
                            raise RuntimeError(err)
                        sync()
                        return y
                else:
                    fn = _driver(keep_gil=how == "pydll")
                    gp, sp = ctypes.c_void_p(exec_ptr), ctypes.c_void_p(handle)

                    def call(fn: Any = fn, gp: Any = gp, sp: Any = sp, sync: Any = sync,
                             y: Any = y) -> Any:
                        err = fn(gp, sp)
                        if err:
                            raise RuntimeError(f"cuGraphLaunch: {err}")
                        sync()
                        return y
                c.call = call
            return made
        return make

    def backend(outer: bool, name: str = "python") -> Any:
        def make(n: int) -> list[Any]:
            engine = trt_runtime.load(built.plan, name, name=f"{key}-gil", contexts=8)
            if outer:
                wrap = trt_runtime.enable_cudagraphs(engine, outer="copy")
                wrap.__enter__()
                engines_open.append((engine, wrap))
            else:
                engines_open.append((engine, None))
            return cc.backend_callers(engine, torch, built, shape, n)
        return make

    empty = torch.empty
    in_name, out_name = raw.input_name, raw.output_name

    def raw_bound(kind: str) -> Any:
        """Raw eager with a runtime's per-call steps added: ``alloc`` (torch.empty of the output,
        unused), ``setaddr`` (set_tensor_address of the output, same pointer), ``bind-alloc``
        (both addresses set, a new output each call, returned)."""
        def make(n: int) -> list[Any]:
            made = cc.raw_callers(raw, torch, built, shape, n, outer=False)
            for c in made:
                execute, handle, sync, y0 = c.execute, c.handle, c.sync, c.y
                set_address = c.context.set_tensor_address
                out_shape, dtype, x = tuple(y0.shape), y0.dtype, c.x

                if kind == "torchpy":
                    s0, p0 = x.shape, x.data_ptr()

                    def call(execute: Any = execute, handle: int = handle, sync: Any = sync, y0: Any = y0,
                             x: Any = x, s0: Any = s0, p0: int = p0) -> Any:
                        for _ in range(12):  # about a plan's torch reads, a few times over
                            if x.data_ptr() != p0 or x.shape != s0 or y0.data_ptr() == 0:
                                raise RuntimeError("moved")
                        if not execute(handle):
                            raise RuntimeError("execute_async_v3 returned False")
                        sync()
                        return y0
                elif kind == "alloc":
                    def call(execute: Any = execute, handle: int = handle, sync: Any = sync, y0: Any = y0,
                             out_shape: Any = out_shape, dtype: Any = dtype) -> Any:
                        empty(out_shape, dtype=dtype, device="cuda")
                        if not execute(handle):
                            raise RuntimeError("execute_async_v3 returned False")
                        sync()
                        return y0
                elif kind == "setaddr":
                    p0 = y0.data_ptr()

                    def call(execute: Any = execute, handle: int = handle, sync: Any = sync, y0: Any = y0,
                             p0: int = p0, set_address: Any = set_address) -> Any:
                        set_address(out_name, p0)
                        if not execute(handle):
                            raise RuntimeError("execute_async_v3 returned False")
                        sync()
                        return y0
                else:
                    def call(execute: Any = execute, handle: int = handle, sync: Any = sync, x: Any = x,
                             out_shape: Any = out_shape, dtype: Any = dtype, set_address: Any = set_address
                             ) -> Any:
                        set_address(in_name, x.data_ptr())
                        y = empty(out_shape, dtype=dtype, device="cuda")
                        set_address(out_name, y.data_ptr())
                        if not execute(handle):
                            raise RuntimeError("execute_async_v3 returned False")
                        sync()
                        return y
                c.call = call
            return made
        return make

    def with_outputs(n: int) -> tuple[Any, list[tuple[Any, Any]]]:
        """A python engine with 8 contexts and ``n`` callers, each with an output of its own."""
        engine = trt_runtime.load(built.plan, "python", name=f"{key}-gil", contexts=8)
        engines_open.append((engine, None))
        made = cc.backend_callers(engine, torch, built, shape, n)
        return engine, [(c, c.expected.to(dtype=engine_out_dtype(engine)).clone()) for c in made]

    def prebound() -> Any:
        def make(n: int) -> list[Any]:
            engine, pairs = with_outputs(n)
            for c, y in pairs:
                execute, x, stream, sync = engine.execute, c.x, c.stream, c.sync

                def call(execute: Any = execute, x: Any = x, y: Any = y, stream: Any = stream,
                         sync: Any = sync) -> Any:
                    execute(x, outputs=[y], stream=stream)
                    sync()
                    return y
                c.call = call
            return [c for c, _ in pairs]
        return make

    def lane_direct(kind: str) -> Any:
        """Each thread's own lane of one engine, called past the core's entry: its current
        plan (``plan``), or TensorRT's enqueue on that lane's context (``trt``)."""
        def make(n: int) -> list[Any]:
            engine, pairs = with_outputs(n)
            for c, y in pairs:
                x, stream, sync = c.x, c.stream, c.sync
                handle = int(stream.cuda_stream)
                box: dict[str, Any] = {}

                def prepare(c: Any = c, x: Any = x, y: Any = y, stream: Any = stream, box: Any = box) -> None:
                    torch.cuda.set_stream(stream)
                    engine.execute(x, outputs=[y], stream=stream)
                    engine.execute(x, outputs=[y], stream=stream)
                    lane = engine._pool.local.slot.lane
                    box["plan"] = lane.fast_entry
                    box["trt"] = lane.context.trt_context.execute_async_v3

                if kind == "plan":
                    def call(box: Any = box, x: Any = x, y: Any = y, stream: Any = stream, sync: Any = sync
                             ) -> Any:
                        box["plan"]((x,), stream, [y])
                        sync()
                        return y
                else:
                    def call(box: Any = box, y: Any = y, handle: int = handle, sync: Any = sync) -> Any:
                        box["trt"](handle)
                        sync()
                        return y
                c.prepare, c.call = prepare, call
            return [c for c, _ in pairs]
        return make

    def engine_out_dtype(engine: Any) -> Any:
        from trt_runtime.dtypes import normalize_dtype

        return getattr(torch, normalize_dtype(engine.outputs[0].dtype))

    def with_setting(make: Any, *, gc_off: bool = False, switch_s: float | None = None) -> Any:
        def wrapped(n: int) -> list[Any]:
            import gc
            import sys

            made = make(n)
            if gc_off:
                gc.disable()
                restore.append(gc.enable)
            if switch_s is not None:
                old = sys.getswitchinterval()
                sys.setswitchinterval(switch_s)
                restore.append(lambda: sys.setswitchinterval(old))
            return made
        return wrapped

    engines_open: list[Any] = []
    restore: list[Any] = []
    rows: dict[str, Any] = {}
    for py_us in (0.0, 4.0, 8.0):
        rows[f"raw eager+py{py_us:g}"] = raw_eager(py_us)
    for kind in ("torchpy", "alloc", "setaddr", "bind-alloc"):
        rows[f"raw eager {kind}"] = raw_bound(kind)
    for how in ("torch", "cuda-python", "cdll", "pydll"):
        rows[f"raw graph {how}"] = raw_graph(how)
    rows["python eager"] = backend(False)
    rows["python eager gc-off"] = with_setting(backend(False), gc_off=True)
    rows["python eager switch=0.2ms"] = with_setting(backend(False), switch_s=0.0002)
    rows["python prebound"] = prebound()
    rows["python lane plan"] = lane_direct("plan")
    rows["python lane trt"] = lane_direct("trt")
    rows["python outer"] = backend(True)
    rows["python outer gc-off"] = with_setting(backend(True), gc_off=True)
    rows["torchbind eager"] = backend(False, name="torchbind")
    rows["torchbind outer"] = backend(True, name="torchbind")
    wanted = [w.replace("_", " ") for w in args.rows.split(",") if w]
    for label, make in rows.items():
        if wanted and not any(label.startswith(w) for w in wanted):
            continue
        run(label, make)
        while restore:
            restore.pop()()
    for engine, wrap in engines_open:
        if wrap is not None:
            wrap.__exit__(None, None, None)
        engine.close()
    return {label: {"calls_per_s": v, "8_over_1": round(v.get(8, 0) / v[1], 3) if v.get(1) else None}
            for label, v in results.items()}


def main(argv: list[str] | None = None) -> int:
    parser = _gpu_tool.parser(__doc__)
    parser.add_argument("--workloads", default="tiny,mlp")
    parser.add_argument("--duration", type=float, default=0.6)
    parser.add_argument("--warmup", type=float, default=0.15)
    parser.add_argument("--callers", default="1,8")
    parser.add_argument("--rows", default="", help="comma-separated label prefixes, '_' for a space "
                        "(default: all)")
    args = parser.parse_args(argv)
    import torch

    counts = [int(c) for c in args.callers.split(",")]
    document: dict[str, Any] = {}

    for key in args.workloads.split(","):
        document[key] = probe(key, torch, args, counts)
        for label, v in document[key].items():
            print(f"  {key} {label:34s} 8/1 = {v['8_over_1']}")
    _gpu_tool.write_json(args.out, "gil_probe.json", document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
