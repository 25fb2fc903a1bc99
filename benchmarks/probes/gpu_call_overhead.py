"""How much CPU time per call do the python backend's call paths add over raw TensorRT-RTX loops?

Run on the GPU host (tensorrt_rtx, cuda-python, torch with CUDA):

    python3 benchmarks/probes/gpu_call_overhead.py [--out DIR] [--rounds 6] [--chunks 40] [--chunk 25]

For each engine (``tiny`` 8x16 fp16, ``mlp`` 8x256x8 fp16, ``dynamic`` 16-wide fp32 at
batch 8) it measures the CPU cost of one call without a synchronize: ``chunk`` calls are
timed back to back, then the device is synchronized (so the launch queue never fills);
rows are interleaved over ``rounds`` and the median over all chunks is reported.

Rows: ``raw_prebound`` (``execute_async_v3`` with addresses bound once),
``raw_bind_alloc`` (set_input_shape if dynamic + set_tensor_address x + ``torch.empty`` +
set_tensor_address y + ``execute_async_v3``), ``raw_graph`` (``cudaGraphLaunch`` of a
captured ``execute_async_v3``), and for the backend's stream-ordering modes (``events``,
``implicit``): ``natural`` (``engine(x)`` on torch's current stream, the legacy default
stream; outputs made with ``x.new_empty``, the default), ``natural_torch_empty`` (with
``torch.empty(shape, dtype=, device=)``), ``natural_side`` (inside
``torch.cuda.stream(side)``), ``prebound`` (``execute(x, outputs=[y], stream=engine.stream)``),
``outer_copy`` / ``outer_view`` (under ``enable_cudagraphs(engine, outer=...)``) and
``outer_static`` (view mode, the engine's static input buffers passed). Component costs
(``torch.empty`` variants, the four ordering operations through cuda-python and through
torch's C-level objects) are timed first. Every python row's output is checked against
the float64 reference; then ``is_stream_capturable`` is probed for engines built with and
without ``REQUIRE_USER_ALLOCATION``, and ``whole_graph_capture`` is run on a blocking
engine stream.

Writes ``call_overhead.json`` and ``call_overhead.md`` to ``--out`` (default ``$OUT`` or ``.``).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

MODES = ("events", "implicit")


def _env() -> dict[str, Any]:
    import tensorrt_rtx as trt
    import torch
    from cuda.bindings import runtime as rt

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "tensorrt_rtx": trt.__version__,
        "device": torch.cuda.get_device_name(0),
        "driver": int(rt.cudaDriverGetVersion()[1]),
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    for dist in ("cuda-bindings", "cuda-core"):
        try:
            from importlib.metadata import version

            info[dist] = version(dist)
        except Exception:
            info[dist] = None
    return info


def _builds(logger: Any) -> dict[str, Any]:
    """The three engines; the dynamic one without REQUIRE_USER_ALLOCATION, which TensorRT-RTX
    1.6.1 cannot run for dynamic shapes (see the probe)."""
    import functools

    from trt_runtime import builders

    built = {
        "tiny": builders.build_tiny(16, 8, "float16", logger=logger),
        "mlp": builders.build_mlp(256, 8, batch=8, dtype="float16", logger=logger),
    }
    original = builders._build
    builders._build = functools.partial(original, require_user_allocation=False)  # type: ignore[assignment]
    try:
        built["dynamic"] = builders.build_dynamic(16, "float32", logger=logger)
    finally:
        builders._build = original  # type: ignore[assignment]
    return built


def raw_context(trt: Any, engine: Any, torch: Any) -> tuple[Any, Any]:
    """An execution context with strategy disabled and caller-provided (USER_MANAGED) memory,
    which engines built with REQUIRE_USER_ALLOCATION need; ``(context, memory)``."""
    config = engine.create_runtime_config()
    config.cuda_graph_strategy = trt.CudaGraphStrategy.DISABLED
    config.set_execution_context_allocation_strategy(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
    ctx = engine.create_execution_context(config)
    size = int(engine.device_memory_size_v2)
    memory = torch.empty(max(size, 1), dtype=torch.uint8, device="cuda")
    ctx.set_device_memory(memory.data_ptr(), max(size, 1))
    return ctx, memory


class Raw:
    """A raw TensorRT-RTX context of ``plan`` on its own non-blocking stream."""

    def __init__(self, backend: Any, plan: bytes, x: Any, out_shape: tuple[int, ...], torch: Any) -> None:
        trt = backend.tensorrt
        self.torch = torch
        self.engine = backend.runtime(0).deserialize_cuda_engine(plan)
        self.ctx, self.memory = raw_context(trt, self.engine, torch)
        self.stream = torch.cuda.Stream()
        self.handle = int(self.stream.cuda_stream)
        self.dynamic = any(d < 0 for d in self.engine.get_tensor_shape("x"))
        self.x = x
        self.shape = tuple(x.shape)
        self.out_shape = out_shape
        self.dtype = x.dtype
        self.device = torch.device("cuda", 0)
        self.y = torch.empty(out_shape, dtype=x.dtype, device="cuda")
        if self.dynamic:
            self.ctx.set_optimization_profile_async(0, self.handle)
            self.stream.synchronize()
            self.ctx.set_input_shape("x", self.shape)
            need = int(self.ctx.update_device_memory_size_for_shapes())
            if need > self.memory.numel():
                self.memory = torch.empty(need, dtype=torch.uint8, device="cuda")
            self.ctx.set_device_memory(self.memory.data_ptr(), self.memory.numel())
        self.ctx.set_tensor_address("x", x.data_ptr())
        self.ctx.set_tensor_address("y", self.y.data_ptr())
        self.exec = None

    def prebound(self) -> None:
        self.ctx.execute_async_v3(self.handle)

    def bind_alloc(self) -> Any:
        ctx = self.ctx
        if self.dynamic:
            ctx.set_input_shape("x", self.shape)
        ctx.set_tensor_address("x", self.x.data_ptr())
        y = self.torch.empty(self.out_shape, dtype=self.dtype, device=self.device)
        ctx.set_tensor_address("y", y.data_ptr())
        ctx.execute_async_v3(self.handle)
        return y

    def capture(self) -> None:
        from cuda.bindings import runtime as rt

        self.ctx.set_tensor_address("y", self.y.data_ptr())
        self.ctx.execute_async_v3(self.handle)
        rt.cudaStreamSynchronize(self.handle)
        side = self.torch.cuda.Stream()
        h = int(side.cuda_stream)
        rt.cudaStreamBeginCapture(h, rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal)
        self.ctx.execute_async_v3(h)
        err, graph = rt.cudaStreamEndCapture(h)
        assert int(err) == 0, err
        err, self.exec = rt.cudaGraphInstantiate(graph, 0)
        assert int(err) == 0, err
        self._launch = rt.cudaGraphLaunch

    def graph(self) -> None:
        self._launch(self.exec, self.handle)

    def variants(self) -> dict[str, Callable[[], Any]]:
        """Where the raw call's cost goes: the same enqueue on a *blocking* stream (as the
        python backend's own stream is in "implicit" mode), the same graph launched through
        the driver API, on a blocking stream, and captured into a ``torch.cuda.CUDAGraph``
        replayed on torch's current stream (benchmarks' ``raw-graph-replay``)."""
        from cuda.bindings import driver as drv
        from cuda.bindings import runtime as rt

        err, blocking = rt.cudaStreamCreate()
        assert int(err) == 0, err
        self.blocking = int(blocking)
        execute, exec_, launch = self.ctx.execute_async_v3, self.exec, self._launch
        handle, bl = self.handle, self.blocking
        cu_launch = drv.cuGraphLaunch
        cu_exec = drv.CUgraphExec(int(exec_))
        torch = self.torch
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            g.capture_begin()
            execute(int(side.cuda_stream))
            g.capture_end()
        torch.cuda.synchronize()
        self.torch_graph = g
        replay = g.replay
        raw_launch = getattr(g, "raw_cuda_graph_exec", None)
        rows = {
            "raw_prebound_blocking": lambda: execute(bl),
            "raw_graph_blocking": lambda: launch(exec_, bl),
            "raw_graph_driver": lambda: cu_launch(cu_exec, handle),
            "raw_graph_torch_replay": replay,
        }
        if raw_launch is not None:
            rows["raw_graph_torch_exec_cudart"] = functools.partial(launch, raw_launch(), handle)
        return rows


def measure(rows: dict[str, Callable[[], Any]], sync: Callable[[], Any], rounds: int, chunks: int,
            chunk: int) -> dict[str, dict[str, float]]:
    """Median (and p10/p90) microseconds per call of each row, rows interleaved."""
    samples: dict[str, list[float]] = {name: [] for name in rows}
    clock = time.perf_counter
    for call in rows.values():
        for _ in range(30):
            call()
    sync()
    for _ in range(rounds):
        for name, call in rows.items():
            for _ in range(chunks):
                t0 = clock()
                for _ in range(chunk):
                    call()
                t1 = clock()
                sync()
                samples[name].append((t1 - t0) / chunk * 1e6)
    out = {}
    for name, values in samples.items():
        values.sort()
        out[name] = {
            "median_us": statistics.median(values),
            "p10_us": values[len(values) // 10],
            "p90_us": values[(len(values) * 9) // 10],
        }
    return out


def components(torch: Any, x: Any, rounds: int) -> dict[str, float]:
    """Microseconds per operation of the pieces a call is made of."""
    from cuda.bindings import runtime as rt

    dev = torch.device("cuda", 0)
    shape = tuple(x.shape)
    dtype = x.dtype
    s = torch.cuda.Stream()
    ours = int(s.cuda_stream)
    ev_in = rt.cudaEventCreateWithFlags(rt.cudaEventDisableTiming)[1]
    ev_out = rt.cudaEventCreateWithFlags(rt.cudaEventDisableTiming)[1]
    tev_in, tev_out = torch.cuda.Event(), torch.cuda.Event()
    ext = torch.cuda.ExternalStream(ours)
    default = torch.cuda.default_stream(0)
    record, wait = torch._C._CudaEventBase.record, torch._C._CudaEventBase.wait
    raw = torch._C._cuda_getCurrentRawStream

    def cudart_order() -> None:
        rt.cudaEventRecord(ev_in, 0)
        rt.cudaStreamWaitEvent(ours, ev_in, 0)
        rt.cudaEventRecord(ev_out, ours)
        rt.cudaStreamWaitEvent(0, ev_out, 0)

    def torch_order() -> None:
        record(tev_in, default)
        wait(tev_in, ext)
        record(tev_out, ext)
        wait(tev_out, default)

    ops: dict[str, Callable[[], Any]] = {
        "torch.empty(device=torch.device)": lambda: torch.empty(shape, dtype=dtype, device=dev),
        "torch.empty(device='cuda')": lambda: torch.empty(shape, dtype=dtype, device="cuda"),
        "x.new_empty(shape)": lambda: x.new_empty(shape),
        "torch.empty(torch.Size)": lambda: torch.empty(x.shape, dtype=dtype, device=dev),
        "order 4 ops cuda-python": cudart_order,
        "order 4 ops torch C-level": torch_order,
        "current raw stream": lambda: raw(0),
        "x.data_ptr()": x.data_ptr,
        "x.is_contiguous()": x.is_contiguous,
    }
    res = measure(ops, torch.cuda.synchronize, rounds, 20, 50)
    return {k: v["median_us"] for k, v in res.items()}


def replay_parts(engine: Any, torch: Any, rounds: int) -> dict[str, float]:
    """Microseconds of each step of the python backend's outer replay of ``engine`` (under
    ``outer="view"``, called with its static input): where the µs over a bare launch go."""
    outer = engine._lanes[0].outer_graphs
    ((key, slot),) = [(k, v) for k, v in outer.shortcuts.items()]
    (arg,) = engine.static_inputs(tuple(key[0]), as_torch=True)
    rt = engine._lanes[0].ops.graphs.rt
    ours = engine._lanes[0].ops._order.ours
    graph = slot.graph
    pool = engine._pool
    token = pool.local.slot.free

    def lease_pair() -> None:
        token.pop()
        token.append(True)

    ops: dict[str, Callable[[], Any]] = {
        "engine(s) whole": functools.partial(engine, arg),
        "replay_torch": functools.partial(engine._lanes[0].ops.graphs.replay_torch, (arg,), None, outer),
        "call_fast": functools.partial(engine._lanes[0].ops.call_fast, (arg,), None, None),
        "plan": functools.partial(slot.plan, (arg,), None, None),
        "cache.touch": functools.partial(outer.cache.touch, slot.key),
        "order.follow(None)": functools.partial(engine._lanes[0].ops._order.follow, None),
        "cudaGraphLaunch ours": functools.partial(rt.cudaGraphLaunch, graph, ours),
        "cudaGraphLaunch ours, cudaStream_t": functools.partial(
            rt.cudaGraphLaunch, graph, rt.cudaStream_t(ours)),
        "list(views)": functools.partial(list, slot.output_views or ()),
        "lease acquire+release": lease_pair,
        "raw stream": functools.partial(torch._C._cuda_getCurrentRawStream, 0),
    }
    res = measure(ops, torch.cuda.synchronize, rounds, 20, 50)
    return {k: v["median_us"] for k, v in res.items()}


def prebound_parts(engine: Any, raw: Raw, x: Any, y: Any, torch: Any, rounds: int) -> dict[str, float]:
    """Microseconds of each step of the python backend's pre-bound call of ``engine``, and
    its context's bare ``execute_async_v3`` beside the raw loop's."""
    ours = engine._lanes[0].ops._order.ours
    trt_context = engine._lanes[0].ops._res.context.trt_context
    s = engine.stream
    ys = [y]
    fast = engine._lanes[0].ops._fast_paths
    execute = engine.execute
    run = trt_context.execute_async_v3
    ops: dict[str, Callable[[], Any]] = {
        "partial(execute, x, outputs=, stream=)": functools.partial(execute, x, outputs=ys, stream=s),
        "execute(x, outputs=ys, stream=s)": lambda: execute(x, outputs=ys, stream=s),
        "call_fast": functools.partial(engine._lanes[0].ops.call_fast, (x,), s, ys),
        "call_prebound": functools.partial(fast.call_prebound, engine, (x,), ys, s),
        "our context execute_async_v3(ours)": functools.partial(run, ours),
        "our context execute_async_v3(raw stream)": functools.partial(run, raw.handle),
        "raw context execute_async_v3(raw stream)": functools.partial(raw.ctx.execute_async_v3, raw.handle),
        "raw context execute_async_v3(ours)": functools.partial(raw.ctx.execute_async_v3, ours),
    }
    res = measure(ops, torch.cuda.synchronize, rounds, 20, 50)
    return {k: v["median_us"] for k, v in res.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--chunks", type=int, default=40)
    parser.add_argument("--chunk", type=int, default=25)
    parser.add_argument("--engines", default="tiny,mlp,dynamic")
    parser.add_argument("--probe-dynamic", choices=PROBE_VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe_dynamic:
        return probe_dynamic(args.probe_dynamic, args.out)

    import numpy as np
    import torch
    from trt_runtime_backends.python import fast_path, stream_order

    from trt_runtime import EngineSource, enable_cudagraphs, get_backend

    backend = get_backend("python")
    env = _env()
    print("env:", json.dumps(env), flush=True)
    built = _builds(backend.logger)
    document: dict[str, Any] = {"env": env, "engines": {}, "checks": {}}
    sync = torch.cuda.synchronize
    side = torch.cuda.Stream()
    document["components"] = components(torch, torch.empty((8, 256), dtype=torch.float16, device="cuda"),
                                        args.rounds)
    print("components:", json.dumps(document["components"], indent=1), flush=True)
    os.makedirs(args.out, exist_ok=True)
    import tempfile

    document["dynamic_memory_probe"] = _probe_dynamic_all(backend, tempfile.mkdtemp())
    document["implicit_whole_graph"] = {"tiny": _implicit_whole_graph(backend, built["tiny"], torch)}
    print("implicit + whole_graph_capture (tiny):", json.dumps(document["implicit_whole_graph"]), flush=True)
    for name in args.engines.split(","):
        b = built[name]
        spec = b.inputs[0]
        shape = tuple(8 if d < 0 else d for d in spec.shape)
        dtype = getattr(torch, spec.dtype)
        host = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        x = torch.from_numpy(host).to(dtype).cuda()
        expected = b.reference(x.float().cpu().numpy().astype(np.float64))[0]
        out_shape = tuple(expected.shape)
        raw = Raw(backend, b.plan, x, out_shape, torch)
        raw.capture()
        rows: dict[str, Callable[[], Any]] = {
            "raw_prebound": raw.prebound,
            "raw_bind_alloc": raw.bind_alloc,
            "raw_graph": raw.graph,
            **raw.variants(),
        }
        engines = []
        checks: dict[str, Any] = {}
        for mode in MODES:
            stream_order.DEFAULT_MODE = mode
            variants = [("natural", True)] + ([("natural_torch_empty", False)] if mode == "implicit" else [])
            for label, new_empty in variants:
                eng = backend.load_engine(EngineSource(b.plan, name=f"{name}-{mode}-{label}"))
                engines.append(eng)
                fast_path.NEW_EMPTY = new_empty
                eng(x)
                eng(x)
                fast_path.NEW_EMPTY = True
                rows[f"{mode}:{label}"] = functools.partial(eng, x)
                if not new_empty:
                    continue
                y = torch.empty(out_shape, dtype=dtype, device="cuda")
                eng.execute(x, outputs=[y], stream=eng.stream)
                rows[f"{mode}:prebound"] = functools.partial(eng.execute, x, outputs=[y], stream=eng.stream)
                if mode == "implicit":
                    prebound_args = (eng, y)
                if mode == "implicit":

                    def natural_side(eng: Any = eng, x: Any = x) -> Any:
                        with torch.cuda.stream(side):
                            return eng(x)

                    rows[f"{mode}:natural_side"] = natural_side
            # Outer-graph rows use their own engines (the wrap is per engine).
            for outer in ("copy", "view", "static") if mode == "implicit" else ("static",):
                oeng = backend.load_engine(EngineSource(b.plan, name=f"{name}-{mode}-{outer}"))
                engines.append(oeng)
                cm = enable_cudagraphs(oeng, outer="copy" if outer == "copy" else "view")
                cm.__enter__()
                oeng._cm = cm
                arg = x
                if outer == "static":
                    (arg,) = oeng.static_inputs(shape, as_torch=True)
                    arg.copy_(x)
                oeng(arg)
                oeng(arg)
                rows[f"{mode}:outer_{outer}"] = functools.partial(oeng, arg)
        stream_order.DEFAULT_MODE = "implicit"
        res = measure(rows, sync, args.rounds, args.chunks, args.chunk)
        document.setdefault("prebound_parts", {})[name] = prebound_parts(
            prebound_args[0], raw, x, prebound_args[1], torch, args.rounds)
        print("prebound parts:", json.dumps(document["prebound_parts"][name], indent=1), flush=True)
        static = next(e for e in engines if e.name.endswith("-implicit-static"))
        document.setdefault("replay_parts", {})[name] = replay_parts(static, torch, args.rounds)
        print("replay parts:", json.dumps(document["replay_parts"][name], indent=1), flush=True)
        # correctness of every python row after the timing loops
        for row, call in rows.items():
            if row.startswith("raw"):
                continue
            out = call()
            sync()
            got = (out[0] if isinstance(out, list) else out).float().cpu().numpy().astype(np.float64)
            err = float(np.max(np.abs(got - expected) / (np.abs(expected) + 1.0)))
            checks[row] = {"max_rel_err": err, "ok": bool(err < 5e-2)}
        captures = {e.name: e.graph_captures for e in engines if e.outer_graph is not None}
        for e in engines:
            cm = getattr(e, "_cm", None)
            if cm is not None:
                cm.__exit__(None, None, None)
            e.close()
        document["engines"][name] = res
        document["checks"][name] = {"outputs": checks, "graph_captures": captures}
        print(f"== {name}", flush=True)
        for row, r in res.items():
            print(f"  {row:24s} {r['median_us']:8.2f} us  (p10 {r['p10_us']:.2f}, p90 {r['p90_us']:.2f})")
        bad = [k for k, v in checks.items() if not v["ok"]]
        print("  checks:", "all ok" if not bad else f"FAILED {bad}", "| captures:", captures, flush=True)
        _write(document, args.out)
    document["implicit_whole_graph"]["dynamic"] = _implicit_whole_graph(backend, built["dynamic"], torch)
    print("implicit + whole_graph_capture:", json.dumps(document["implicit_whole_graph"]), flush=True)
    _write(document, args.out)
    print(_markdown(document))
    return 0


def _write(document: dict[str, Any], out: str) -> None:
    """Write what was measured so far (a later crash keeps it)."""
    with open(os.path.join(out, "call_overhead.json"), "w") as f:
        json.dump(document, f, indent=1)
    with open(os.path.join(out, "call_overhead.md"), "w") as f:
        f.write(_markdown(document))


PROBE_VARIANTS = ("user_managed+profile", "user_managed", "static_noflag", "user_managed+profile_noflag",
                  "user_managed+profile+temp_allocator")


def _temporary_allocator(trt: Any, torch: Any) -> Any:
    class Allocator(trt.IGpuAllocator):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.IGpuAllocator.__init__(self)
            self.buffers: dict[int, Any] = {}
            self.calls = 0

        def allocate(self, size: int, alignment: int, flags: int) -> int:
            self.calls += 1
            t = torch.empty(max(int(size), 1), dtype=torch.uint8, device="cuda")
            self.buffers[t.data_ptr()] = t
            return t.data_ptr()

        def allocate_async(self, size: int, alignment: int, flags: int, stream: int) -> int:
            return self.allocate(size, alignment, flags)

        def reallocate(self, address: int, alignment: int, new_size: int) -> int:
            return 0

        def deallocate(self, memory: int) -> bool:
            self.buffers.pop(int(memory), None)
            return True

        def deallocate_async(self, memory: int, stream: int) -> bool:
            return self.deallocate(memory)

    return Allocator()


def probe_dynamic(variant: str, plan_dir: str) -> int:
    """One way of running the dynamic engine (batch 8, profile 0), in its own process:
    prints sizes and the output check; a crash shows as the process's return code."""
    import numpy as np
    import tensorrt_rtx as trt
    import torch

    from trt_runtime import get_backend

    backend = get_backend("python")
    flag = not variant.endswith("_noflag")
    plan = open(os.path.join(plan_dir, f"dynamic_{'flag' if flag else 'noflag'}.plan"), "rb").read()
    engine = backend.runtime(0).deserialize_cuda_engine(plan)
    stream = torch.cuda.Stream()
    handle = int(stream.cuda_stream)
    v2 = int(engine.device_memory_size_v2)
    need = None
    if variant.startswith("user_managed"):
        config = engine.create_runtime_config()
        config.set_execution_context_allocation_strategy(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
        ctx = engine.create_execution_context(config)
    else:
        ctx = engine.create_execution_context()
    allocator = None
    if "+temp_allocator" in variant:
        allocator = _temporary_allocator(trt, torch)
        ctx.temporary_allocator = allocator
    if "+profile" in variant:
        ctx.set_optimization_profile_async(0, handle)
        stream.synchronize()
    ctx.set_input_shape("x", (8, 16))
    memory = None
    if variant.startswith("user_managed"):
        need = int(ctx.update_device_memory_size_for_shapes())
        memory = torch.empty(max(need, v2, 1), dtype=torch.uint8, device="cuda")
        ctx.set_device_memory(memory.data_ptr(), memory.numel())
    x = torch.randn(8, 16, device="cuda")
    y = torch.empty(8, 16, device="cuda")
    ctx.set_tensor_address("x", x.data_ptr())
    ctx.set_tensor_address("y", y.data_ptr())
    ok = ctx.execute_async_v3(handle)
    stream.synchronize()
    print(json.dumps({"variant": variant, "device_memory_size_v2": v2, "update_for_shapes": need,
                      "execute": bool(ok), "finite": bool(np.isfinite(y.cpu().numpy()).all()),
                      "capturable": bool(ctx.is_stream_capturable(handle)),
                      "temporary_allocations": None if allocator is None else allocator.calls}), flush=True)
    return 0


def _probe_dynamic_all(backend: Any, out_dir: str) -> dict[str, Any]:
    import functools
    import subprocess

    from trt_runtime import builders

    original = builders._build
    for flag in (True, False):
        builders._build = functools.partial(original, require_user_allocation=flag)  # type: ignore[assignment]
        try:
            plan = builders.build_dynamic(16, "float32", logger=backend.logger).plan
        finally:
            builders._build = original  # type: ignore[assignment]
        with open(os.path.join(out_dir, f"dynamic_{'flag' if flag else 'noflag'}.plan"), "wb") as f:
            f.write(plan)
    results: dict[str, Any] = {}
    for variant in PROBE_VARIANTS:
        done = subprocess.run([sys.executable, __file__, "--probe-dynamic", variant, "--out", out_dir],
                              capture_output=True, text=True, timeout=60)
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
        results[variant] = {"rc": done.returncode, "result": json.loads(lines[-1]) if lines else None,
                            "stderr": done.stderr[-300:] if done.returncode else ""}
        print("probe", variant, json.dumps(results[variant]), flush=True)
    return results


def _implicit_whole_graph(backend: Any, built: Any, torch: Any) -> dict[str, Any]:
    """whole_graph_capture on a blocking engine stream, with torch work on the legacy stream
    around every call: correct results? (``built``: a 16-wide engine, dynamic or not.)"""
    import numpy as np
    from trt_runtime_backends.python import stream_order

    from trt_runtime import EngineSource, RuntimeSettings

    stream_order.DEFAULT_MODE = "implicit"
    eng = backend.load_engine(EngineSource(built.plan, name="implicit-wgc"),
                              settings=RuntimeSettings(cuda_graph_strategy="whole_graph_capture"))
    errors = []
    try:
        dynamic = built.inputs[0].shape[0] < 0
        dtype = getattr(torch, built.inputs[0].dtype)
        for i, batch in enumerate((8, 8, 3, 8, 20, 3, 8) * 3 if dynamic else (8,) * 21):
            base = torch.full((batch, 16), float(i % 5) - 2.0, device="cuda")
            x = (base * 0.5 + torch.arange(16, device="cuda", dtype=torch.float32)).to(dtype).contiguous()
            y = eng(x) * 1.0  # consumed on the legacy stream right away
            want = built.reference(x.float().cpu().numpy().astype(np.float64))[0]
            errors.append(float(np.max(np.abs(y.float().cpu().numpy() - want) / (np.abs(want) + 1))))
        return {"max_rel_err": max(errors), "ok": max(errors) < 1e-2, "calls": len(errors)}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        eng.close()
        stream_order.DEFAULT_MODE = "implicit"


def _markdown(document: dict[str, Any]) -> str:
    env = document["env"]
    lines = [
        f"# Call overhead ({env['date_utc']}, {env['device']}, TensorRT-RTX {env['tensorrt_rtx']}, "
        f"torch {env['torch']}, cuda-bindings {env.get('cuda-bindings')}, driver {env['driver']})",
        "",
        "CPU µs per call, no synchronize (median of chunks); ratios against the raw loops.",
        "",
        "| engine | row | µs | / raw_bind_alloc | / raw_prebound |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for name, res in document["engines"].items():
        ba = res["raw_bind_alloc"]["median_us"]
        pb = res["raw_prebound"]["median_us"]
        for row, r in res.items():
            m = r["median_us"]
            lines.append(f"| {name} | {row} | {m:.2f} | {m / ba:.2f}x | {m / pb:.2f}x |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
