"""Every number issue 6 asks for, in one run on one GPU, as ratios.

Rows (each in ``eager`` = ``cuda_graph_strategy="disabled"`` and ``whole_graph_capture``):

* ``raw``: the TensorRT-RTX Python loop: one execution context, addresses bound once,
  ``execute_async_v3`` on a private stream (``set_input_shape`` per call only when the
  workload cycles shapes);
* ``python``: this project's python backend, ``engine.execute(x, outputs=[y],
  stream=engine.stream)`` (preallocated output, the engine's own stream);
* ``torchbind``: this project's torchbind backend, ``engine.execute(x)``;
* ``torchbind-op``: ``torch.ops.tensorrt.execute_engine([x], native)`` called directly:
  torch-tensorrt's C++ runtime per call, without this project's layer;
* ``torch-tensorrt-python``: torch-tensorrt's own Python runtime
  (``PythonTorchTensorRTModule`` up to 2.12, the Python ``TRTEngine`` from 2.13), where
  ``torch_tensorrt`` imports.

Workloads: the 8x256 fp16 MLP at batch 8 (launch-bound), a ResNet-18-like fp16 conv net
(224x224) at batch 1 and 32, and a dynamic-batch engine cycling 3 shapes per call.

Every row is measured the same way, with device-resident torch tensors preallocated:

* latency: one call, then a synchronize of the stream the work runs on; median, p90,
  p99 over N calls after warmup;
* back to back: N calls, then one synchronize; mean µs per call;
* GPU: CUDA events recorded on that stream around N calls; µs per call.

N is chosen per row from a time budget (``--budget-s``), so a run stays within a few
minutes. Cold vs warm runtime cache: the conv net's first inference through the python
backend in two fresh processes (empty cache, then the cache the first one saved).

Rows that cannot run here (no GPU, a backend or torch_tensorrt missing, a strategy the
installed version lacks, an error) are kept as ``skipped: <reason>`` rows.

    python3 benchmarks/bench_all.py --json bench.json --markdown bench.md --plot docs/img/bench.png
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import importlib.metadata
import importlib.util
import inspect
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trt_runtime.bench import percentile

# -- what is measured ---------------------------------------------------------------

RUNNERS = ("raw", "python", "python-call", "torchbind", "torchbind-op", "torch-tensorrt-python")
#: Table label -> ``RuntimeSettings.cuda_graph_strategy``.
STRATEGIES = {"eager": "disabled", "whole_graph_capture": "whole_graph_capture"}
RUNNER_TITLES = {
    "raw": "raw TensorRT-RTX loop",
    "python": "python backend",
    "python-call": "python backend, engine(x) on the caller's stream",
    "torchbind": "torchbind backend",
    "torchbind-op": "execute_engine op (torch-tensorrt C++)",
    "torch-tensorrt-python": "torch-tensorrt Python runtime",
}
#: Where the cold vs warm cache comparison runs.
COLD_WARM_WORKLOAD = "conv_b1"


@dataclasses.dataclass(frozen=True)
class Workload:
    """An engine and the input shapes each call cycles through (one shape: static)."""

    key: str
    title: str
    shapes: tuple[tuple[int, ...], ...]


WORKLOADS = (
    Workload("mlp_b8", "MLP 8x256 fp16, batch 8", ((8, 256),)),
    Workload("conv_b1", "ResNet-18-like fp16 224x224, batch 1", ((1, 3, 224, 224),)),
    Workload("conv_b32", "ResNet-18-like fp16 224x224, batch 32", ((32, 3, 224, 224),)),
    Workload(
        "dynamic_3", "dynamic batch 256-wide fp16, batches 1/8/64 cycled", ((1, 256), (8, 256), (64, 256))
    ),
)
WORKLOADS_BY_KEY = {w.key: w for w in WORKLOADS}


def build_workload(key: str, logger: Any = None) -> Any:
    """Build ``key``'s engine with :mod:`trt_runtime.builders` (no GPU needed)."""
    from trt_runtime import builders

    if key == "mlp_b8":
        return builders.build_mlp(256, 8, batch=8, dtype="float16", logger=logger)
    if key in ("conv_b1", "conv_b32"):
        batch = 1 if key == "conv_b1" else 32
        return builders.build_convnet(
            batch, "float16", image_size=224, base_channels=64, num_classes=1000, logger=logger
        )
    if key == "dynamic_3":
        return builders.build_dynamic(256, "float16", profiles=((1, 8, 64),), logger=logger)
    raise ValueError(f"workload must be one of {sorted(WORKLOADS_BY_KEY)}; got {key!r}")


# -- statistics -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Stats:
    """Summary of per-call samples, in microseconds."""

    n: int
    median: float
    p90: float
    p99: float
    mean: float
    min: float
    max: float

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def summarize(samples_us: Sequence[float]) -> Stats:
    """Median, p90, p99 (linear interpolation, as numpy), mean, min and max of ``samples_us``."""
    if not samples_us:
        raise ValueError("cannot summarize an empty list of samples")
    values = [float(v) for v in samples_us]
    return Stats(
        n=len(values),
        median=percentile(values, 50),
        p90=percentile(values, 90),
        p99=percentile(values, 99),
        mean=math.fsum(values) / len(values),
        min=min(values),
        max=max(values),
    )


class Budget:
    """Wall-clock budget of a run; ``clock`` is injectable for tests."""

    def __init__(self, total_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not total_s > 0:
            raise ValueError(f"budget must be > 0 seconds; got {total_s!r}")
        self.total_s = float(total_s)
        self._clock = clock
        self._start = clock()

    def elapsed(self) -> float:
        return self._clock() - self._start

    def remaining(self) -> float:
        return max(0.0, self.total_s - self.elapsed())

    def share(self, rows_left: int) -> float:
        """Seconds the next row may take if the rest is split evenly among ``rows_left`` rows."""
        return self.remaining() / max(1, rows_left)


def plan_iterations(
    per_call_s: float, share_s: float, *, min_iterations: int, max_iterations: int, loops: int = 3
) -> int:
    """Calls per timed loop so that ``loops`` loops of calls fit in ``share_s`` seconds,
    clamped to ``[min_iterations, max_iterations]``."""
    if min_iterations < 1 or max_iterations < min_iterations:
        raise ValueError(
            f"need 1 <= min_iterations <= max_iterations; got {min_iterations}, {max_iterations}"
        )
    if per_call_s <= 0:
        return max_iterations
    fitting = int(share_s / (loops * per_call_s))
    return max(min_iterations, min(max_iterations, fitting))


# -- measuring one row ---------------------------------------------------------------

#: ``timer(run, n) -> (µs per call, note)``: time ``run()`` (which makes ``n`` calls) on the
#: GPU, or return ``(None, why not)``.
GpuTimer = Callable[[Callable[[], None], int], tuple[float | None, str]]


@dataclasses.dataclass
class Measurement:
    latency: Stats
    samples_us: list[float]
    back_to_back_us: float
    gpu_us: float | None
    gpu_note: str


def calibrate(calls: Sequence[Callable[[], Any]], sync: Callable[[], Any], warmup: int) -> float:
    """Run ``warmup`` (at least one) calls, each followed by ``sync``; seconds per call."""
    count = max(1, warmup)
    k = len(calls)
    clock = time.perf_counter
    start = clock()
    for i in range(count):
        calls[i % k]()
        sync()
    return (clock() - start) / count


def measure(
    calls: Sequence[Callable[[], Any]],
    sync: Callable[[], Any],
    *,
    iterations: int,
    gpu_timer: GpuTimer | None = None,
) -> Measurement:
    """Time ``calls`` (call ``i`` is ``calls[i % len(calls)]``) three ways; see the module docstring."""
    if not calls:
        raise ValueError("nothing to measure: no calls")
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1; got {iterations!r}")
    k = len(calls)
    clock = time.perf_counter_ns
    samples: list[float] = []
    for i in range(iterations):
        call = calls[i % k]
        t0 = clock()
        call()
        sync()
        samples.append((clock() - t0) / 1000.0)

    def run() -> None:
        for i in range(iterations):
            calls[i % k]()

    sync()
    t0 = clock()
    run()
    sync()
    back_to_back = (clock() - t0) / 1000.0 / iterations
    gpu_us: float | None = None
    note = "no GPU timer"
    if gpu_timer is not None:
        gpu_us, note = gpu_timer(run, iterations)
    return Measurement(summarize(samples), samples, back_to_back, gpu_us, note)


# -- rows -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Row:
    """One (workload, strategy, runner) cell of the table."""

    workload: str
    strategy: str
    runner: str
    status: str = "skipped"  # "ok" or "skipped"
    reason: str = ""
    iterations: int = 0
    warmup: int = 0
    latency: Stats | None = None
    back_to_back_us: float | None = None
    gpu_us: float | None = None
    gpu_note: str = ""
    samples_us: list[float] = dataclasses.field(default_factory=list)
    ratios: dict[str, float] = dataclasses.field(default_factory=dict)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def note(self) -> str:
        return "" if self.ok else f"skipped: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "strategy": self.strategy,
            "runner": self.runner,
            "status": self.status,
            "note": self.note,
            "iterations": self.iterations,
            "warmup": self.warmup,
            "latency_us": None if self.latency is None else self.latency.to_dict(),
            "back_to_back_us_per_call": self.back_to_back_us,
            "gpu_us_per_call": self.gpu_us,
            "gpu_note": self.gpu_note,
            "ratios": dict(self.ratios),
            "info": dict(self.info),
            "samples_us": list(self.samples_us),
        }

    def record(self, m: Measurement, iterations: int, warmup: int) -> None:
        self.status, self.reason = "ok", ""
        self.iterations, self.warmup = iterations, warmup
        self.latency, self.samples_us = m.latency, list(m.samples_us)
        self.back_to_back_us, self.gpu_us, self.gpu_note = m.back_to_back_us, m.gpu_us, m.gpu_note

    def skip(self, reason: str) -> None:
        self.status, self.reason = "skipped", reason


def plan_rows(workloads: Iterable[str], strategies: Iterable[str], runners: Iterable[str]) -> list[Row]:
    """Rows in run order: per workload and strategy, the raw loop first (its ratios anchor
    the rest). torch-tensorrt's Python runtime runs last of all: importing ``torch_tensorrt``
    may load a second copy of its runtime library, which must not disturb the other rows."""
    runners = list(runners)
    strategies = list(strategies)
    for name in runners:
        if name not in RUNNERS:
            raise ValueError(f"runner must be one of {list(RUNNERS)}; got {name!r}")
    for name in strategies:
        if name not in STRATEGIES:
            raise ValueError(f"strategy must be one of {list(STRATEGIES)}; got {name!r}")
    ordered = sorted(runners, key=RUNNERS.index)
    early = [r for r in ordered if r != "torch-tensorrt-python"]
    late = [r for r in ordered if r == "torch-tensorrt-python"]
    keys = list(workloads)
    for key in keys:
        if key not in WORKLOADS_BY_KEY:
            raise ValueError(f"workload must be one of {sorted(WORKLOADS_BY_KEY)}; got {key!r}")
    rows = [Row(w, s, r) for w in keys for s in strategies for r in early]
    rows += [Row(w, s, r) for w in keys for s in strategies for r in late]
    return rows


# -- what can run here ------------------------------------------------------------------------


@dataclasses.dataclass
class Environment:
    """What this machine can run; every ``*_reason`` is empty where the thing is usable."""

    gpu_reason: str = ""
    raw_reason: str = ""
    raw_cuda_graph_reason: str = ""
    #: backend name -> (why it cannot run, why it has no cuda_graph_strategy)
    backends: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    tt_python_reason: str = ""
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


def skip_reason(row: Row, env: Environment) -> str:
    """Why ``row`` cannot run in ``env`` (empty if it can, as far as can be known up front)."""
    if env.gpu_reason:
        return env.gpu_reason
    graphs = STRATEGIES[row.strategy] != "disabled"
    if row.runner == "raw":
        return env.raw_reason or (env.raw_cuda_graph_reason if graphs else "")
    if row.runner in ("python", "python-call", "torchbind", "torchbind-op"):
        name = {"torchbind-op": "torchbind", "python-call": "python"}.get(row.runner, row.runner)
        if name not in env.backends:
            return f"the {name!r} backend is not installed"
        reason, graph_reason = env.backends[name]
        if reason:
            return reason
        if graphs and graph_reason:
            return f"the {name!r} backend has no cuda_graph_strategy here: {graph_reason}"
        return ""
    if row.runner == "torch-tensorrt-python":
        return env.tt_python_reason
    return f"unknown runner {row.runner!r}"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def probe_environment() -> Environment:
    """Look at the GPU, torch, TensorRT and the backends without running anything."""
    env = Environment()
    env.info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": {
            dist: _version(dist)
            for dist in (
                "trt-runtime",
                "tensorrt-rtx",
                "tensorrt",
                "torch",
                "torch-tensorrt-rtx",
                "torch-tensorrt",
                "cuda-core",
                "cuda-bindings",
            )
        },
    }
    env.gpu_reason = _probe_gpu(env.info)
    try:
        from trt_runtime import builders

        trt = builders.import_tensorrt()
        env.info["tensorrt_module"] = f"{trt.__name__} {trt.__version__}"
        if not hasattr(trt, "CudaGraphStrategy"):
            env.raw_cuda_graph_reason = f"{trt.__name__} {trt.__version__} has no CudaGraphStrategy"
    except ImportError as exc:
        env.raw_reason = str(exc)
    import trt_runtime

    try:
        status = trt_runtime.backend_status()
    except Exception as exc:  # a broken plugin must not stop the benchmark
        status = {}
        env.info["backend_status_error"] = str(exc)
    for name in ("python", "torchbind"):
        if name not in status:
            continue
        availability = status[name]
        graph_reason = ""
        if availability:
            caps = trt_runtime.load_backend(name).capabilities
            if not caps.supports_cuda_graph_strategy:
                graph_reason = caps.notes.get("supports_cuda_graph_strategy", "unsupported")
        env.backends[name] = (availability.reason if not availability else "", graph_reason)
    if importlib.util.find_spec("torch_tensorrt") is None:
        env.tt_python_reason = "torch_tensorrt is not installed (pip install torch-tensorrt-rtx)"
    return env


def _probe_gpu(info: dict[str, Any]) -> str:
    try:
        from cuda.bindings import runtime as cudart

        err, count = cudart.cudaGetDeviceCount()
        if err != cudart.cudaError_t.cudaSuccess:
            return f"no CUDA GPU: cudaGetDeviceCount failed with {getattr(err, 'name', err)}"
        if count == 0:
            return "no CUDA GPU: cudaGetDeviceCount found 0 devices"
        err, driver = cudart.cudaDriverGetVersion()
        info["driver"] = driver
    except ImportError:
        pass  # torch below decides
    except Exception as exc:
        return f"no CUDA GPU: {exc}"
    try:
        import torch
    except Exception as exc:  # ImportError, or OSError from its CUDA libraries
        return f"torch is not importable ({exc}): device-resident inputs need torch CUDA tensors"
    try:
        if not torch.cuda.is_available():
            return "no CUDA GPU: torch.cuda.is_available() is False"
        info["device"] = torch.cuda.get_device_name(0)
        info["compute_capability"] = "{}.{}".format(*torch.cuda.get_device_capability(0))
        info["torch_cuda"] = torch.version.cuda
        info["torch_module"] = torch.__version__
    except Exception as exc:
        return f"no CUDA GPU usable by torch: {exc}"
    return ""


# -- runners (GPU) ---------------------------------------------------------------------------


@dataclasses.dataclass
class Bench:
    """A runner set up for one row: ``calls[i % len(calls)]()`` queues one inference on the
    stream ``stream_handle`` (``None``: ``sync`` is the only way to wait for it)."""

    calls: list[Callable[[], Any]]
    stream_handle: int | None
    close: Callable[[], None]
    sync: Callable[[], Any] | None = None
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Tensors:
    """Preallocated device inputs and outputs of a workload: one view per shape of one
    max-size buffer each, so every shape shares one address."""

    inputs: list[Any]
    outputs: list[Any]


def make_tensors(torch: Any, built: Any, workload: Workload, seed: int = 0) -> Tensors:
    from trt_runtime.dtypes import normalize_dtype

    spec_in, spec_out = built.inputs[0], built.outputs[0]
    largest = max(s[0] for s in workload.shapes)
    rest_in = workload.shapes[0][1:]
    rest_out = tuple(spec_out.shape[1:])
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dtype_in = getattr(torch, normalize_dtype(spec_in.dtype))
    dtype_out = getattr(torch, normalize_dtype(spec_out.dtype))
    x = torch.randn((largest, *rest_in), generator=gen, device="cuda", dtype=torch.float32).to(dtype_in)
    y = torch.empty((largest, *rest_out), device="cuda", dtype=dtype_out)
    torch.cuda.synchronize()
    return Tensors([x[: s[0]] for s in workload.shapes], [y[: s[0]] for s in workload.shapes])


def raw_bench(plan: bytes, strategy: str, tensors: Tensors, logger: Any = None) -> Bench:
    """The raw TensorRT-RTX loop: addresses bound once, ``execute_async_v3`` on a private stream."""
    import torch

    from trt_runtime import builders

    trt = builders.import_tensorrt()
    runtime = trt.Runtime(logger or trt.Logger(trt.Logger.ERROR))
    engine = runtime.deserialize_cuda_engine(plan)
    if engine is None:
        raise RuntimeError("TensorRT could not deserialize the plan")
    config = engine.create_runtime_config()
    config.cuda_graph_strategy = getattr(trt.CudaGraphStrategy, STRATEGIES[strategy].upper())
    context = engine.create_execution_context(config)
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    in_name = next(n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT)
    out_name = next(n for n in names if engine.get_tensor_mode(n) != trt.TensorIOMode.INPUT)
    x0, y0 = tensors.inputs[0], tensors.outputs[0]
    context.set_input_shape(in_name, tuple(x0.shape))
    context.set_tensor_address(in_name, x0.data_ptr())  # every view shares this address
    context.set_tensor_address(out_name, y0.data_ptr())
    stream = torch.cuda.Stream()
    handle = stream.cuda_stream
    execute = context.execute_async_v3
    set_shape = context.set_input_shape

    def checked() -> None:
        if not execute(handle):
            raise RuntimeError("execute_async_v3 returned False")

    calls: list[Callable[[], Any]]
    if len(tensors.inputs) == 1:
        calls = [checked]
    else:

        def shaped(shape: tuple[int, ...]) -> Callable[[], None]:
            def call() -> None:
                set_shape(in_name, shape)
                if not execute(handle):
                    raise RuntimeError("execute_async_v3 returned False")

            return call

        calls = [shaped(tuple(x.shape)) for x in tensors.inputs]

    def close() -> None:
        nonlocal context, engine
        stream.synchronize()
        del context, engine

    return Bench(calls, handle, close, info={"stream": "torch.cuda.Stream (private)"})


def stream_handle(stream: Any) -> int:
    """The ``cudaStream_t`` of a cuda.core, torch or ``__cuda_stream__`` stream."""
    if hasattr(stream, "cuda_stream"):
        return int(stream.cuda_stream)
    if hasattr(stream, "handle"):
        return int(stream.handle)
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    return int(stream)


def backend_bench(
    backend_name: str,
    plan: bytes,
    name: str,
    strategy: str,
    inputs: Sequence[Any],
    outputs: Sequence[Any] | None = None,
    *,
    current_stream: Callable[[], int | None] = lambda: None,
) -> Bench:
    """``engine.execute`` of a trt-runtime backend, the way a careful caller uses it.

    An engine with its own ``stream`` and an ``outputs=`` parameter (the python backend)
    is called with the preallocated outputs on that stream; any other engine as
    ``engine.execute(x)`` on the caller's current stream (``current_stream()``).
    """
    from trt_runtime import EngineSource, RuntimeSettings, get_backend

    backend = get_backend(backend_name)
    settings = RuntimeSettings.coerce({"cuda_graph_strategy": STRATEGIES[strategy]})
    engine: Any = backend.load_engine(EngineSource(plan, name=name), settings=settings)
    execute = engine.execute
    own = getattr(engine, "stream", None)
    takes_outputs = "outputs" in inspect.signature(execute).parameters
    if own is not None and takes_outputs and outputs is not None:
        calls: list[Callable[[], Any]] = [
            functools.partial(execute, x, outputs=[y], stream=own)
            for x, y in zip(inputs, outputs, strict=True)
        ]
        handle: int | None = stream_handle(own)
        how = "execute(x, outputs=[y], stream=engine.stream)"
    else:
        calls = [functools.partial(execute, x) for x in inputs]
        handle = current_stream()
        how = "execute(x)"
    return Bench(calls, handle, engine.close, sync=engine.synchronize, info={"call": how, "engine": engine})


def torchbind_op_bench(plan: bytes, name: str, strategy: str, tensors: Tensors) -> Bench:
    """``torch.ops.tensorrt.execute_engine`` on the torchbind backend's native engine."""
    import torch

    bench = backend_bench("torchbind", plan, name, strategy, tensors.inputs)
    engine = bench.info.pop("engine")
    native = getattr(engine, "native", None)
    if native is None:
        engine.close()
        raise RuntimeError("the torchbind engine exposes no native torch.classes.tensorrt.Engine")
    engine.execute(tensors.inputs[0])  # applies the runtime settings to the native engine
    engine.synchronize()
    op = torch.ops.tensorrt.execute_engine
    calls: list[Callable[[], Any]] = [functools.partial(op, [x], native) for x in tensors.inputs]
    handle = torch.cuda.current_stream().cuda_stream
    return Bench(calls, handle, engine.close, info={"call": "torch.ops.tensorrt.execute_engine([x], native)"})


def tt_python_bench(built: Any, name: str, strategy: str, tensors: Tensors) -> Bench:
    """torch-tensorrt's own Python runtime on the same plan (raises where it cannot)."""
    import torch

    try:
        import torch_tensorrt
        from torch_tensorrt.dynamo import CompilationSettings
    except Exception as exc:  # also a clash with an already loaded runtime library
        raise ImportError(f"{type(exc).__name__}: {_one_line(exc)}") from exc

    in_names = [s.name for s in built.inputs]
    out_names = [s.name for s in built.outputs]
    graphs = STRATEGIES[strategy]
    runtime = torch_tensorrt.dynamo.runtime
    version = getattr(torch_tensorrt, "__version__", "?")
    handle = torch.cuda.current_stream().cuda_stream
    legacy = getattr(runtime, "PythonTorchTensorRTModule", None)
    if legacy is not None:  # torch-tensorrt <= 2.12
        if graphs != "disabled":
            raise _Skip(
                f"torch-tensorrt {version}'s PythonTorchTensorRTModule has no cuda_graph_strategy "
                "(torch-tensorrt 2.13 adds runtime settings)"
            )
        module = legacy(built.plan, in_names, out_names, name=name, settings=CompilationSettings())
        calls: list[Callable[[], Any]] = [functools.partial(module, x) for x in tensors.inputs]
        return Bench(
            calls, handle, lambda: None, info={"call": "PythonTorchTensorRTModule(x)", "version": version}
        )
    from torch_tensorrt.dynamo.runtime._TorchTensorRTModule import TorchTensorRTModule
    from torch_tensorrt.dynamo.runtime._TRTEngine import TRTEngine

    # The module only packs the engine description; TRTEngine is the Python runtime.
    packer = TorchTensorRTModule(
        built.plan, in_names, out_names, name=name, settings=CompilationSettings(lazy_engine_init=True)
    )
    engine = TRTEngine(packer._pack_engine_info())
    if graphs != "disabled":
        from torch_tensorrt.runtime import RuntimeSettings as TTRuntimeSettings

        # Its default runtime_cache is a path that only TorchTensorRTModule resolves;
        # the bare TRTEngine needs None (or a RuntimeCache object).
        engine.update_runtime_settings(TTRuntimeSettings(cuda_graph_strategy=graphs, runtime_cache=None))
    calls = [functools.partial(engine.execute, [x]) for x in tensors.inputs]
    return Bench(calls, handle, lambda: None, info={"call": "TRTEngine.execute([x])", "version": version})


class _Skip(Exception):
    """A row that cannot run for a reason known only once it is set up."""


def make_sync(handle: int | None, fallback: Callable[[], Any] | None) -> Callable[[], Any]:
    """``cudaStreamSynchronize(handle)`` for every row alike (cuda.bindings, else torch)."""
    if handle is None:
        if fallback is None:
            raise ValueError("a bench without a stream needs a synchronize function")
        return fallback
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        import torch

        return torch.cuda.ExternalStream(handle).synchronize
    fn = cudart.cudaStreamSynchronize
    success = cudart.cudaError_t.cudaSuccess

    def sync() -> None:
        err = fn(handle)[0]
        if err != success:
            raise RuntimeError(f"cudaStreamSynchronize failed: {err!r}")

    return sync


def torch_event_timer(handle: int) -> GpuTimer:
    """CUDA events (torch) recorded on stream ``handle`` around a batch of calls."""
    import torch

    stream = torch.cuda.ExternalStream(handle)

    def timer(run: Callable[[], None], n: int) -> tuple[float | None, str]:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record(stream)
        run()
        end.record(stream)
        end.synchronize()
        return start.elapsed_time(end) * 1000.0 / n, ""

    return timer


# -- cold vs warm runtime cache ----------------------------------------------------------


def first_inference(plan_path: str, cache_path: str) -> dict[str, Any]:
    """In this (fresh) process: load the plan with the python backend, run it once with the
    runtime cache at ``cache_path`` (saved on exit) and time that first call."""
    import trt_runtime
    from trt_runtime import EngineSource, get_backend

    backend: Any = get_backend("python")
    engine: Any = backend.load_engine(EngineSource(Path(plan_path).read_bytes(), name="convnet"))
    spec_in, spec_out = engine.inputs[0], engine.outputs[0]
    try:
        import torch

        x = torch.randn(spec_in.shape, device="cuda").to(getattr(torch, spec_in.dtype))
        y = torch.empty(spec_out.shape, device="cuda", dtype=getattr(torch, spec_out.dtype))
        torch.cuda.synchronize()

        def call() -> None:
            engine.execute(x, outputs=[y], stream=engine.stream)
            engine.synchronize()
    except ImportError:
        import numpy as np

        host = np.random.default_rng(0).standard_normal(spec_in.shape).astype(spec_in.dtype)

        def call() -> None:
            engine.execute(host)

    with trt_runtime.runtime_cache(engine, cache_path) as cache:
        t0 = time.perf_counter()
        call()
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        call()
        second = time.perf_counter() - t0
        drained = cache.drain_count
    engine.close()
    return {"first_ms": first * 1e3, "second_ms": second * 1e3, "drained": drained}


def cold_warm(plan: bytes, timeout_s: float, workdir: Path) -> dict[str, Any]:
    """Cold (empty cache) then warm (the saved cache) first inference, in fresh processes."""
    plan_path = workdir / "convnet.plan"
    cache_path = workdir / "convnet.trtcache"
    plan_path.write_bytes(plan)
    if cache_path.exists():
        cache_path.unlink()
    result: dict[str, Any] = {"workload": COLD_WARM_WORKLOAD, "backend": "python"}
    for phase in ("cold", "warm"):
        proc = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--first-inference", str(plan_path), str(cache_path)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"the {phase} process exited {proc.returncode}: {' | '.join(tail)}")
        result[phase] = json.loads(proc.stdout.strip().splitlines()[-1])
        if phase == "cold":
            result["cache_bytes"] = cache_path.stat().st_size if cache_path.exists() else 0
    result["ratio"] = result["cold"]["first_ms"] / result["warm"]["first_ms"]
    return result


# -- ratios and goals ----------------------------------------------------------------------


def compute_ratios(rows: Sequence[Row]) -> None:
    """Fill each measured row's ``ratios``: against the raw loop of the same workload and
    strategy, and (python rows) against the ``torchbind-op`` row."""
    anchors: dict[str, dict[tuple[str, str], Row]] = {"raw": {}, "torchbind-op": {}}
    for row in rows:
        if row.ok and row.runner in anchors:
            anchors[row.runner][(row.workload, row.strategy)] = row
    for row in rows:
        row.ratios.clear()
        if not row.ok:
            continue
        key = (row.workload, row.strategy)
        for anchor_name, suffix in (("raw", "raw"), ("torchbind-op", "torchbind_op")):
            if anchor_name == "torchbind-op" and row.runner not in ("python", "python-call"):
                continue
            anchor = anchors[anchor_name].get(key)
            if anchor is None:
                continue
            row.ratios.update(_ratios(row, anchor, suffix))


def _ratios(row: Row, anchor: Row, suffix: str) -> dict[str, float]:
    out: dict[str, float] = {}
    assert row.latency is not None and anchor.latency is not None
    if anchor.latency.median > 0:
        out[f"latency_vs_{suffix}"] = row.latency.median / anchor.latency.median
    if row.back_to_back_us is not None and anchor.back_to_back_us:
        out[f"back_to_back_vs_{suffix}"] = row.back_to_back_us / anchor.back_to_back_us
    if row.gpu_us is not None and anchor.gpu_us:
        out[f"gpu_vs_{suffix}"] = row.gpu_us / anchor.gpu_us
    return out


@dataclasses.dataclass(frozen=True)
class Goal:
    name: str
    target: str
    value: float | None
    passed: bool | None  # None: could not be evaluated (see detail)
    detail: str

    @property
    def verdict(self) -> str:
        return "n/a" if self.passed is None else ("PASS" if self.passed else "FAIL")

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "verdict": self.verdict}


def _find(rows: Sequence[Row], workload: str, strategy: str, runner: str) -> Row | None:
    for row in rows:
        if (row.workload, row.strategy, row.runner) == (workload, strategy, runner):
            return row
    return None


def _missing(rows: Sequence[Row], python: Row | None, other: str) -> str:
    """Why a goal's ratio is missing: the python row's or the anchor row's reason."""
    if python is None:
        return "the python / mlp_b8 / eager row was not planned"
    if not python.ok:
        return f"python row {python.note}"
    anchor = _find(rows, "mlp_b8", "eager", other)
    if anchor is None:
        return f"the {other} / mlp_b8 / eager row was not planned"
    return f"{other} row {anchor.note}" if anchor.note else "no ratio"


def check_goals(rows: Sequence[Row], cache: Mapping[str, Any] | None) -> list[Goal]:
    """Issue 6's three goals, from rows that :func:`compute_ratios` has filled."""
    goals = []
    python = _find(rows, "mlp_b8", "eager", "python")
    for name, target, key, limit, other in (
        (
            "python backend eager vs raw loop (MLP b8, median latency)",
            "<= 1.10x",
            "latency_vs_raw",
            1.10,
            "raw",
        ),
        (
            "python backend vs torch-tensorrt C++ runtime per call (MLP b8 eager, median latency)",
            "<= 0.60x",
            "latency_vs_torchbind_op",
            0.60,
            "torchbind-op",
        ),
    ):
        value = None if python is None else python.ratios.get(key)
        if value is None:
            goals.append(Goal(name, target, None, None, f"not measured: {_missing(rows, python, other)}"))
        else:
            goals.append(Goal(name, target, value, value <= limit, f"{value:.2f}x"))
    name, target = "warm runtime cache first inference vs cold (conv net b1)", ">= 20x"
    if cache and "ratio" in cache:
        ratio = float(cache["ratio"])
        cold, warm = cache["cold"]["first_ms"], cache["warm"]["first_ms"]
        detail = f"cold {cold:.1f} ms / warm {warm:.1f} ms = {ratio:.1f}x"
        goals.append(Goal(name, target, ratio, ratio >= 20.0, detail))
    else:
        why = (cache or {}).get("skipped", "not run")
        goals.append(Goal(name, target, None, None, f"not measured: {why}"))
    return goals


# -- output ----------------------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def environment_line(info: Mapping[str, Any]) -> str:
    versions = info.get("versions", {})
    parts = [
        f"{info.get('device', 'no GPU')}"
        + (f" (sm {info['compute_capability']})" if info.get("compute_capability") else ""),
        f"driver {info.get('driver', '?')}",
    ]
    # Module versions stand in where a stack is on sys.path without its dist-info.
    fallback = {"tensorrt-rtx": info.get("tensorrt_module"), "torch": info.get("torch_module")}
    for dist in ("tensorrt-rtx", "torch", "torch-tensorrt-rtx", "torch-tensorrt", "cuda-core", "trt-runtime"):
        if versions.get(dist):
            parts.append(f"{dist} {versions[dist]}")
        elif fallback.get(dist):
            parts.append(f"{dist} (module {fallback[dist]})")
    parts.append(f"Python {info.get('python', '?')}")
    parts.append(str(info.get("date", "")))
    return "; ".join(parts)


def render_markdown(document: Mapping[str, Any]) -> str:
    """The results as Markdown: environment, the main table, python/op ratios, cache, goals."""
    rows = document["rows"]
    lines = [
        f"Environment: {environment_line(document['environment'])}.",
        f"Run: `{document['config'].get('command', 'bench_all.py')}` in {document.get('wall_s', 0):.0f} s.",
        "",
        "Latency: one call + stream synchronize (µs, over N calls). Back to back: N calls, one "
        "synchronize (mean µs/call). GPU: CUDA events around N calls on the work's stream (µs/call). "
        "Ratios are to the raw TensorRT-RTX loop of the same workload and strategy.",
        "",
        "| workload | graphs | row | N | median | p90 | p99 | back to back | GPU | latency / raw "
        "| back to back / raw | note |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        lat = r.get("latency_us") or {}
        ratios = r.get("ratios", {})
        cells = [
            r["workload"],
            r["strategy"],
            r["runner"],
            str(r["iterations"]) if r["status"] == "ok" else "",
            _fmt(lat.get("median")),
            _fmt(lat.get("p90")),
            _fmt(lat.get("p99")),
            _fmt(r.get("back_to_back_us_per_call")),
            _fmt(r.get("gpu_us_per_call")),
            _ratio(ratios.get("latency_vs_raw")),
            _ratio(ratios.get("back_to_back_vs_raw")),
            r["note"].replace("|", "\\|"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    versus = [r for r in rows if "latency_vs_torchbind_op" in r.get("ratios", {})]
    if versus:
        lines += [
            "",
            "python backend / `execute_engine` op (torch-tensorrt's C++ runtime per call):",
            "",
            "| workload | graphs | row | latency | back to back | GPU |",
            "| --- | --- | --- | ---: | ---: | ---: |",
        ]
        for r in versus:
            ratios = r["ratios"]
            lines.append(
                f"| {r['workload']} | {r['strategy']} | {r['runner']} "
                f"| {_ratio(ratios.get('latency_vs_torchbind_op'))} "
                f"| {_ratio(ratios.get('back_to_back_vs_torchbind_op'))} "
                f"| {_ratio(ratios.get('gpu_vs_torchbind_op'))} |"
            )
    cache = document.get("cold_warm") or {}
    lines += [
        "",
        "Cold vs warm runtime cache, first inference in a fresh process (python backend, conv net b1):",
        "",
    ]
    if "ratio" in cache:
        lines.append(
            f"cold {cache['cold']['first_ms']:.1f} ms, warm {cache['warm']['first_ms']:.1f} ms: "
            f"**{cache['ratio']:.1f}x** (cache {cache.get('cache_bytes', 0)} bytes)"
        )
    else:
        lines.append(f"skipped: {cache.get('skipped', 'not run')}")
    lines += ["", "| goal | target | measured | result |", "| --- | --- | --- | --- |"]
    for g in document["goals"]:
        lines.append(f"| {g['name']} | {g['target']} | {g['detail']} | {g['verdict']} |")
    return "\n".join(lines) + "\n"


def make_document(
    env: Environment,
    rows: Sequence[Row],
    cache: Mapping[str, Any] | None,
    config: Mapping[str, Any],
    wall_s: float,
) -> dict[str, Any]:
    compute_ratios(rows)
    goals = check_goals(rows, cache)
    return {
        "schema": 1,
        "environment": dict(env.info),
        "availability": {
            "gpu": env.gpu_reason or "ok",
            "raw": env.raw_reason or "ok",
            "raw_cuda_graphs": env.raw_cuda_graph_reason or "ok",
            **{f"backend:{name}": reason or "ok" for name, (reason, _) in env.backends.items()},
            **{f"backend:{name}:cuda_graphs": why or "ok" for name, (_, why) in env.backends.items()},
            "torch-tensorrt-python": env.tt_python_reason or "ok (if it imports)",
        },
        "config": dict(config),
        "wall_s": wall_s,
        "rows": [r.to_dict() for r in rows],
        "cold_warm": dict(cache or {}),
        "goals": [g.to_dict() for g in goals],
    }


def write_json(document: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(document, indent=1, default=str) + "\n")
    return target


def write_plot(document: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Grouped bars of median latency per workload/strategy, one bar per row (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("plotting needs matplotlib: pip install 'trt-runtime[plot]'") from exc
    rows = [r for r in document["rows"] if r["status"] == "ok"]
    groups: list[tuple[str, str]] = []
    for r in rows:
        if (r["workload"], r["strategy"]) not in groups:
            groups.append((r["workload"], r["strategy"]))
    runners = [name for name in RUNNERS if any(r["runner"] == name for r in rows)]
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(groups) + 2), 4.8))
    try:
        if not rows:
            ax.text(0.5, 0.5, "no rows were measured (see the skipped reasons)", ha="center", va="center")
            ax.set_axis_off()
        else:
            width = 0.8 / len(runners)
            values = [r["latency_us"]["median"] for r in rows]
            for j, runner in enumerate(runners):
                xs: list[float] = []
                ys: list[float] = []
                labels: list[str] = []
                for i, group in enumerate(groups):
                    row = next(
                        (
                            r
                            for r in rows
                            if (r["workload"], r["strategy"]) == group and r["runner"] == runner
                        ),
                        None,
                    )
                    if row is not None:
                        xs.append(i - 0.4 + width * (j + 0.5))
                        ys.append(row["latency_us"]["median"])
                        labels.append(_ratio(row["ratios"].get("latency_vs_raw")))
                bars = ax.bar(xs, ys, width, label=RUNNER_TITLES.get(runner, runner))
                ax.bar_label(bars, labels=labels, fontsize=6)  # x raw loop, on top of each bar
            ax.set_xticks(range(len(groups)), [f"{w}\n{s}" for w, s in groups], fontsize=8)
            if max(values) / max(min(values), 1e-9) > 20:
                ax.set_yscale("log")
            ax.set_ylabel("median latency per call, µs (call + sync); labels: x raw loop")
            ax.grid(axis="y", alpha=0.3)
            ax.legend(fontsize=7)
        info = document.get("environment", {})
        ax.set_title(
            f"trt-runtime bench_all: {info.get('device', 'no GPU')}, {info.get('date', '')}", fontsize=9
        )
        fig.tight_layout()
        fig.savefig(target, dpi=120)
    finally:
        plt.close(fig)
    return target


# -- the run --------------------------------------------------------------------------------


@dataclasses.dataclass
class Config:
    workloads: list[str]
    strategies: list[str]
    runners: list[str]
    budget_s: float
    max_iterations: int
    min_iterations: int
    warmup: int
    cold_warm: bool
    command: str = ""


class TorchDevice:
    """The GPU side of :func:`run_rows`: builds each workload once, allocates its tensors,
    and runs each row on a private torch stream."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.logger = _python_logger()
        self.built: dict[str, Any] = {}
        self.tensors: dict[str, Tensors] = {}

    def scope(self) -> Any:
        """Make a private stream torch's current one (rows that run on it need no default stream)."""
        return self.torch.cuda.stream(self.torch.cuda.Stream())

    def bench(self, row: Row) -> Bench:
        if row.workload not in self.built:
            built = build_workload(row.workload, self.logger)
            self.tensors[row.workload] = make_tensors(self.torch, built, WORKLOADS_BY_KEY[row.workload])
            self.built[row.workload] = built
        return _make_bench(row, self.built[row.workload], self.tensors[row.workload], self.logger)

    def timer(self, handle: int) -> GpuTimer:
        return torch_event_timer(handle)

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()


def run_rows(rows: list[Row], env: Environment, config: Config, budget: Budget, device: Any = None) -> None:
    """Measure every row that can run; the others get their reason. Never raises.

    ``device`` (default: a :class:`TorchDevice`, made only if some row can run) provides
    ``scope()``, ``bench(row)``, ``timer(handle)`` and ``synchronize()``.
    """
    for row in rows:
        reason = skip_reason(row, env)
        if reason:
            row.skip(reason)
    runnable = [r for r in rows if not r.reason]
    if not runnable:
        return
    if device is None:
        try:
            device = TorchDevice()
        except Exception as exc:
            for row in runnable:
                row.skip(f"error: {type(exc).__name__}: {_one_line(exc)}")
            return
    tt_failure = ""
    for index, row in enumerate(runnable):
        if budget.remaining() < 1.0:
            row.skip(f"time budget of {budget.total_s:.0f} s exhausted")
            continue
        if row.runner == "torch-tensorrt-python" and tt_failure:
            row.skip(tt_failure)
            continue
        share = budget.share(len(runnable) - index)
        started = time.monotonic()
        bench: Bench | None = None
        try:
            with device.scope():
                bench = device.bench(row)
                sync = make_sync(bench.stream_handle, bench.sync)
                per_call = calibrate(bench.calls, sync, config.warmup)
                n = plan_iterations(
                    per_call,
                    share - (time.monotonic() - started),
                    min_iterations=config.min_iterations,
                    max_iterations=config.max_iterations,
                )
                timer = None if bench.stream_handle is None else device.timer(bench.stream_handle)
                m = measure(bench.calls, sync, iterations=n, gpu_timer=timer)
            row.record(m, n, max(1, config.warmup))
            row.info = {k: v for k, v in bench.info.items() if isinstance(v, (str, int, float))}
        except _Skip as exc:
            row.skip(str(exc))
        except Exception as exc:
            reason = f"error: {type(exc).__name__}: {_one_line(exc)}"
            if row.runner == "torch-tensorrt-python" and isinstance(exc, ImportError):
                tt_failure = f"torch_tensorrt does not import: {_one_line(exc)}"
                reason = tt_failure
            row.skip(reason)
        finally:
            for cleanup in (None if bench is None else bench.close, device.synchronize):
                if cleanup is not None:
                    try:
                        cleanup()
                    except Exception:
                        pass
        done = f"median {row.latency.median:9.1f} us  N={row.iterations}" if row.latency else row.note
        print(f"  {row.workload:<10} {row.strategy:<20} {row.runner:<22} {done}", file=sys.stderr)


def _make_bench(row: Row, built: Any, tensors: Tensors, logger: Any) -> Bench:
    import torch

    name = built.name
    if row.runner == "raw":
        return raw_bench(built.plan, row.strategy, tensors, logger)
    if row.runner in ("python", "torchbind"):
        bench = backend_bench(
            row.runner,
            built.plan,
            name,
            row.strategy,
            tensors.inputs,
            tensors.outputs,
            current_stream=lambda: torch.cuda.current_stream().cuda_stream,
        )
        engine = bench.info.pop("engine")
        if row.runner == "torchbind" and len(tensors.inputs) > 1:
            bench.info["profiles"] = str([s.profiles for s in engine.inputs])
        return bench
    if row.runner == "python-call":
        # The convenience call most users write: no preallocated outputs, ordered
        # against torch's current stream with events.
        bench = backend_bench(
            "python",
            built.plan,
            name,
            row.strategy,
            tensors.inputs,
            None,
            current_stream=lambda: torch.cuda.current_stream().cuda_stream,
        )
        bench.info.pop("engine")
        return bench
    if row.runner == "torchbind-op":
        return torchbind_op_bench(built.plan, name, row.strategy, tensors)
    if row.runner == "torch-tensorrt-python":
        return tt_python_bench(built, name, row.strategy, tensors)
    raise ValueError(f"unknown runner {row.runner!r}")


def _python_logger() -> Any:
    # TensorRT keeps the first logger of a process: use the python backend's for builds too.
    try:
        from trt_runtime import get_backend

        backend: Any = get_backend("python")
        return backend.logger
    except Exception:
        return None


def _import_torch_tensorrt_first() -> None:
    """Import ``torch_tensorrt`` before anything loads torch-tensorrt's runtime library.

    ``import torch_tensorrt`` registers the torchbind classes unconditionally, and torch
    aborts the process if they are already registered (by the torchbind backend's probe).
    The torchbind backend itself checks for registered classes before loading the
    library, so the other order is safe.
    """
    if importlib.util.find_spec("torch_tensorrt") is None:
        return
    try:
        import torch_tensorrt  # noqa: F401
    except Exception as exc:  # reported as the rows' skip reason later
        print(f"bench_all: torch_tensorrt does not import: {_one_line(exc)}", file=sys.stderr)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + ("..." if len(text) > 300 else "")


def run_cold_warm(env: Environment, budget: Budget, timeout_cap_s: float = 120.0) -> dict[str, Any]:
    if env.gpu_reason:
        return {"skipped": env.gpu_reason}
    reason = env.backends.get("python", ("the 'python' backend is not installed", ""))[0]
    if reason:
        return {"skipped": reason}
    try:
        plan = build_workload(COLD_WARM_WORKLOAD, _python_logger()).plan
        timeout = max(10.0, min(timeout_cap_s, budget.remaining() / 3))
        with tempfile.TemporaryDirectory(prefix="bench_all_") as tmp:
            return cold_warm(plan, timeout, Path(tmp))
    except Exception as exc:
        return {"skipped": f"error: {type(exc).__name__}: {_one_line(exc)}"}


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", type=Path, default=None, help="write every statistic and sample here")
    parser.add_argument(
        "--markdown", type=Path, default=None, help="write the tables here (they are printed too)"
    )
    parser.add_argument(
        "--plot", type=Path, default=None, help="write a PNG bar chart here (needs matplotlib)"
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: every row, few calls, ~1.5 minutes")
    parser.add_argument(
        "--budget-s", type=float, default=None, help="wall-clock budget (default 210, quick 90)"
    )
    parser.add_argument("--max-iterations", type=int, default=None, help="cap on N per row (default 3000)")
    parser.add_argument("--warmup", type=int, default=None, help="warmup calls per row (default 50)")
    parser.add_argument("--workloads", default=",".join(w.key for w in WORKLOADS))
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--runners", default=",".join(RUNNERS))
    parser.add_argument("--no-cold-warm", action="store_true", help="skip the cold vs warm cache processes")
    parser.add_argument("--first-inference", nargs=2, metavar=("PLAN", "CACHE"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.first_inference:
        print(json.dumps(first_inference(*args.first_inference)))
        return 0
    config = Config(
        workloads=_split(args.workloads),
        strategies=_split(args.strategies),
        runners=_split(args.runners),
        budget_s=args.budget_s or (90.0 if args.quick else 210.0),
        max_iterations=args.max_iterations or (200 if args.quick else 3000),
        min_iterations=10 if args.quick else 50,
        warmup=args.warmup if args.warmup is not None else (10 if args.quick else 50),
        cold_warm=not args.no_cold_warm,
        command=" ".join(["bench_all.py", *(sys.argv[1:] if argv is None else argv)]),
    )
    try:
        rows = plan_rows(config.workloads, config.strategies, config.runners)
    except ValueError as exc:
        print(f"bench_all.py: {exc}", file=sys.stderr)
        return 2
    budget = Budget(config.budget_s)
    if "torch-tensorrt-python" in config.runners:
        _import_torch_tensorrt_first()
    env = probe_environment()
    print(f"bench_all: {environment_line(env.info)}", file=sys.stderr)
    cache: dict[str, Any] = {"skipped": "--no-cold-warm"}
    if config.cold_warm:
        cache = run_cold_warm(env, budget)
    run_rows(rows, env, config, budget)
    document = make_document(env, rows, cache, dataclasses.asdict(config), budget.elapsed())
    text = render_markdown(document)
    print(text)
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)
    if args.plot is not None:
        try:
            write_plot(document, args.plot)
        except ImportError as exc:
            document["plot"] = f"skipped: {exc}"
            print(f"bench_all: plot skipped: {exc}", file=sys.stderr)
    if args.json is not None:
        write_json(document, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
