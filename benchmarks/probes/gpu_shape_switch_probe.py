"""What does a change of input shapes cost a USER_MANAGED TensorRT-RTX context, call by call?

Run on the GPU host from the repository root::

    python benchmarks/probes/gpu_shape_switch_probe.py [--out $OUT/shape_switch.json]

Builds the dynamic engine of the benchmark (``relu(x @ W) + 1``, fp16, 256 wide, one
profile 1..64), cycles batches 1/8/64 and times, per call (µs, median of 2000, no
synchronize), the TensorRT calls a runtime can make when the shape changes:

* ``set_input_shape`` alone (what the raw pre-bound loop does);
* ``+ update_device_memory_size_for_shapes`` (what the python backend does, as
  TensorRT-RTX's sample does for USER_MANAGED memory);
* ``+ set_device_memory`` with the same buffer (what the python backend does too);
* ``execute_async_v3`` after each variant, with the outputs compared with the reference,
  so that a variant that skips a call is only taken if its results stay right;
* *a context per shape*: one context per batch, all given the same scratch buffer, each
  with its shape set once, fed in turn on one stream (no ``set_input_shape`` at all):
  what each extra context costs to create and in device memory, the call (µs) against
  ``set_input_shape`` + ``execute_async_v3`` on one context and a call that keeps its
  shape, and the results of rounds with fresh inputs compared with the reference.

It answers the question (why the dynamic workload loses ~26 µs per call) with
figures, and whether ``set_device_memory`` (or the size update) may be skipped when the
buffer already fits.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BATCHES = (1, 8, 64)
CALLS = 2000


def _timed(fn: Any, calls: int = CALLS) -> float:
    samples = []
    for i in range(calls):
        t0 = time.perf_counter_ns()
        fn(i)
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples) / 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    import numpy as np
    import torch

    from trt_runtime import builders

    trt = builders.import_tensorrt()
    built = builders.build_dynamic(256, "float16", profiles=((1, 8, 64),))
    runtime = trt.Runtime(trt.Logger(trt.Logger.ERROR))
    engine = runtime.deserialize_cuda_engine(built.plan)
    config = engine.create_runtime_config()
    config.cuda_graph_strategy = trt.CudaGraphStrategy.DISABLED
    config.set_execution_context_allocation_strategy(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
    context = engine.create_execution_context(config)
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    x_name, y_name = names[0], names[1]
    need = int(engine.device_memory_size_v2)
    for b in BATCHES:
        context.set_input_shape(x_name, (b, 256))
        need = max(need, int(context.update_device_memory_size_for_shapes()))
    memory = torch.empty(max(need, 1), dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    handle = int(stream.cuda_stream)
    context.set_optimization_profile_async(0, handle)
    stream.synchronize()
    context.set_device_memory(memory.data_ptr(), memory.numel())
    hosts = [built.random_inputs(batch=b, seed=b)[0] for b in BATCHES]
    xs = [torch.from_numpy(h).cuda() for h in hosts]
    ys = [torch.empty((b, 256), dtype=torch.float16, device="cuda") for b in BATCHES]
    wants = [built.reference(h)[0] for h in hosts]
    rtol, atol = built.tolerance

    def bind(i: int) -> int:
        k = i % len(BATCHES)
        context.set_tensor_address(x_name, xs[k].data_ptr())
        context.set_tensor_address(y_name, ys[k].data_ptr())
        return k

    # Safest first: a variant that skips a call TensorRT needs may crash the process.
    variants = {
        "+set_device_memory": lambda k: (
            context.set_input_shape(x_name, (BATCHES[k], 256)),
            context.update_device_memory_size_for_shapes(),
            context.set_device_memory(memory.data_ptr(), memory.numel()),
        ),
        "+update_device_memory_size_for_shapes": lambda k: (
            context.set_input_shape(x_name, (BATCHES[k], 256)),
            context.update_device_memory_size_for_shapes(),
        ),
        "set_input_shape": lambda k: context.set_input_shape(x_name, (BATCHES[k], 256)),
    }
    result: dict[str, Any] = {"batches": BATCHES, "calls": CALLS, "memory_bytes": int(memory.numel())}
    for name, switch in variants.items():
        result[f"{name} us"] = _timed(lambda i, s=switch: s(i % len(BATCHES)))
        wrong = 0
        for i in range(60):  # shapes switched by this variant only, then run and compared
            k = bind(i)
            switch(k)
            if not context.execute_async_v3(handle):
                raise RuntimeError("execute_async_v3 returned False")
            stream.synchronize()
            got = ys[k].float().cpu().numpy()
            wrong += not np.allclose(got, wants[k], rtol=rtol, atol=atol)
        result[f"{name} wrong of 60"] = wrong
        _write(result, args.out)  # kept even if the next (riskier) variant crashes
    result["execute_async_v3 us"] = _timed(lambda i: context.execute_async_v3(handle), 500)
    stream.synchronize()
    _write(result, args.out)
    _per_shape_contexts(result, torch, np, engine, config, built, memory, stream, (x_name, y_name), args.out)
    return 0


def _per_shape_contexts(result: dict[str, Any], torch: Any, np: Any, engine: Any, config: Any, built: Any,
                        memory: Any, stream: Any, names: tuple[str, str], out: Path | None) -> None:
    """A context per batch sharing one scratch buffer (see the module docstring)."""
    handle = int(stream.cuda_stream)
    x_name, y_name = names
    torch.cuda.synchronize()
    free0 = torch.cuda.mem_get_info()[0]
    contexts = []
    steps: dict[str, list[float]] = {"create_execution_context": [], "profile + synchronize": [],
                                     "set_device_memory + set_input_shape": []}

    def lap(step: str, t0: int) -> int:
        t1 = time.perf_counter_ns()
        steps[step].append(round((t1 - t0) / 1e3, 1))
        return t1

    for b in BATCHES:
        t = time.perf_counter_ns()
        c = engine.create_execution_context(config)
        t = lap("create_execution_context", t)
        c.set_optimization_profile_async(0, handle)
        stream.synchronize()
        t = lap("profile + synchronize", t)
        c.set_device_memory(memory.data_ptr(), memory.numel())
        c.set_input_shape(x_name, (b, 256))
        lap("set_device_memory + set_input_shape", t)
        contexts.append(c)
    torch.cuda.synchronize()
    for step, laps in steps.items():
        result[f"per-shape: {step}, us each"] = laps
    result["per-shape: device bytes for 3 contexts"] = int(free0 - torch.cuda.mem_get_info()[0])
    xs = [torch.empty((b, 256), dtype=torch.float16, device="cuda") for b in BATCHES]
    ys = [torch.empty((b, 256), dtype=torch.float16, device="cuda") for b in BATCHES]
    for c, x, y in zip(contexts, xs, ys, strict=True):
        c.set_tensor_address(x_name, x.data_ptr())
        c.set_tensor_address(y_name, y.data_ptr())
    firsts = []
    for c in contexts:  # first calls (kernels specialized for the shape) outside the timing
        t0 = time.perf_counter_ns()
        c.execute_async_v3(handle)
        stream.synchronize()
        firsts.append(round((time.perf_counter_ns() - t0) / 1e3, 1))
    result["per-shape: first execute_async_v3 + synchronize, us each"] = firsts
    n = len(BATCHES)
    result["per-shape: execute_async_v3, contexts in turn, us"] = _timed(
        lambda i: contexts[i % n].execute_async_v3(handle))
    one = contexts[0]
    result["per-shape: execute_async_v3, one context, shape kept, us"] = _timed(
        lambda i: one.execute_async_v3(handle))
    stream.synchronize()
    # the same engine, one context switching shapes (as the raw loop): set_input_shape + execute
    single = engine.create_execution_context(config)
    single.set_optimization_profile_async(0, handle)
    stream.synchronize()
    single.set_device_memory(memory.data_ptr(), memory.numel())

    def switched(i: int) -> None:
        k = i % n
        single.set_input_shape(x_name, (BATCHES[k], 256))
        single.set_tensor_address(x_name, xs[k].data_ptr())
        single.set_tensor_address(y_name, ys[k].data_ptr())
        single.execute_async_v3(handle)
    result["per-shape: one context, set_input_shape + execute_async_v3 in turn, us"] = _timed(switched)
    stream.synchronize()
    # rounds of fresh inputs: every context in turn on the one stream, no synchronize between
    wrong = checked = 0
    for r in range(100):
        hosts = [built.random_inputs(batch=b, seed=1000 + r * n + k)[0] for k, b in enumerate(BATCHES)]
        for x, h in zip(xs, hosts, strict=True):
            x.copy_(torch.from_numpy(h))
        for c in contexts:
            if not c.execute_async_v3(handle):
                raise RuntimeError("execute_async_v3 returned False")
        stream.synchronize()
        rtol, atol = built.tolerance
        for y, h in zip(ys, hosts, strict=True):
            want = built.reference(h)[0]
            checked += 1
            wrong += not np.allclose(y.float().cpu().numpy(), want, rtol=rtol, atol=atol)
    result["per-shape: rounds wrong / checked"] = [wrong, checked]
    _write(result, out)
    # creation again, with a runtime cache on the config (as trt-runtime's runtime_cache
    # gives it): the first context fills the cache, later ones should find their kernels
    cached = engine.create_runtime_config()
    cached.set_execution_context_allocation_strategy(config.get_execution_context_allocation_strategy())
    runtime_cache = cached.create_runtime_cache()  # kept referenced: the config does not own it
    cached.set_runtime_cache(runtime_cache)
    made, kept = [], []
    for _ in range(4):
        t0 = time.perf_counter_ns()
        kept.append(engine.create_execution_context(cached))
        made.append(round((time.perf_counter_ns() - t0) / 1e3, 1))
    result["per-shape: create_execution_context with a runtime cache, us each"] = made
    kept.clear()
    _write(result, out)


def _write(result: dict[str, Any], out: Path | None) -> None:
    text = json.dumps(result, indent=1)
    print(text, flush=True)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
