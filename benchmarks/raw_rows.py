"""The raw TensorRT-RTX loops every runtime is compared with.

Both rows use one deserialized ``ICudaEngine`` per workload and a context each, created
as the python backend creates its own: ``cuda_graph_strategy`` disabled and
caller-provided scratch memory (``USER_MANAGED``, which engines built with
``REQUIRE_USER_ALLOCATION`` need), sized for every shape the workload cycles. Each runs
on a private torch stream.

* ``raw-prebound``: shapes and addresses bound once; a call is
  ``context.execute_async_v3(stream)`` (plus ``set_input_shape`` when the workload cycles
  shapes: the least any runtime must do per shape).
* ``raw-bind-alloc``: what a runtime must do per call without caching: ``set_input_shape``
  (dynamic inputs), ``set_tensor_address`` of the input, ``torch.empty`` of the output,
  ``set_tensor_address`` of the output, ``execute_async_v3``.
* ``raw-graph-replay``: the floor of any outer CUDA graph: per shape, a context of its
  own, bound to static tensors, ``execute_async_v3`` captured into a
  ``torch.cuda.CUDAGraph`` after one eager run; a call is ``graph.replay()`` on torch's
  current stream.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from .row_base import Bench, RowSkip, Workbench

__all__ = ["bind_alloc", "graph_replay", "new_context", "open_engine", "prebound"]


@dataclasses.dataclass
class _RawEngine:
    trt: Any
    runtime: Any
    engine: Any
    input_name: str
    output_name: str
    dynamic: bool


def open_engine(plan: bytes, logger: Any = None) -> _RawEngine:
    """Deserialize ``plan`` with a TensorRT runtime of its own (one input, one output)."""
    from trt_runtime import builders

    trt = builders.import_tensorrt()
    runtime = trt.Runtime(logger or trt.Logger(trt.Logger.ERROR))
    engine = runtime.deserialize_cuda_engine(plan)
    if engine is None:
        raise RuntimeError("TensorRT could not deserialize the plan")
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    outputs = [n for n in names if n not in inputs]
    if len(inputs) != 1 or len(outputs) != 1:
        raise RowSkip(f"the raw loops take one input and one output; the engine has {names}")
    dynamic = any(d < 0 for d in engine.get_tensor_shape(inputs[0]))
    return _RawEngine(trt, runtime, engine, inputs[0], outputs[0], dynamic)


def _raw_engine(wb: Workbench) -> _RawEngine:
    def make() -> tuple[_RawEngine, Callable[[], None]]:
        raw = open_engine(wb.built.plan, wb.logger)

        def close() -> None:
            raw.engine = raw.runtime = None

        return raw, close

    raw: _RawEngine = wb.shared("raw-engine", make)
    return raw


def _context(wb: Workbench, raw: _RawEngine) -> tuple[Any, Any, str]:
    """A new execution context with its scratch memory; ``(context, memory, how)``."""
    return new_context(raw, wb.torch, wb.workload.shapes)


def new_context(raw: _RawEngine, torch: Any, shapes: Sequence[Sequence[int]]) -> tuple[Any, Any, str]:
    """A new execution context as the python backend makes one (graphs disabled,
    ``USER_MANAGED`` memory sized for every shape of ``shapes``); ``(context, memory, how)``."""
    trt, engine = raw.trt, raw.engine
    how = "create_execution_context()"
    user_managed = None
    if hasattr(engine, "create_runtime_config"):
        config = engine.create_runtime_config()
        if hasattr(trt, "CudaGraphStrategy"):
            config.cuda_graph_strategy = trt.CudaGraphStrategy.DISABLED
        user_managed = getattr(getattr(trt, "ExecutionContextAllocationStrategy", None), "USER_MANAGED", None)
        if user_managed is not None:
            config.set_execution_context_allocation_strategy(user_managed)
        context = engine.create_execution_context(config)
        how = "runtime config: cuda_graph_strategy DISABLED"
        if user_managed is not None:
            how += ", USER_MANAGED memory"
    else:
        context = engine.create_execution_context()
    if context is None:
        raise RuntimeError("TensorRT could not create an execution context")
    memory = None
    if user_managed is not None:
        need = int(engine.device_memory_size_v2)
        if raw.dynamic:
            for shape in shapes:
                context.set_input_shape(raw.input_name, tuple(shape))
                need = max(need, int(context.update_device_memory_size_for_shapes()))
        memory = torch.empty(max(need, 1), dtype=torch.uint8, device="cuda")
        context.set_device_memory(memory.data_ptr(), memory.numel())
    return context, memory, how


def _checked(execute: Callable[[int], bool], handle: int) -> Callable[[], None]:
    def call() -> None:
        if not execute(handle):
            raise RuntimeError("execute_async_v3 returned False")

    return call


def prebound(wb: Workbench) -> Bench:
    """``raw-prebound``: addresses (and, for a static engine, shapes) bound once."""
    raw = _raw_engine(wb)
    context, memory, how = _context(wb, raw)
    tensors = wb.tensors
    x0, y0 = tensors.inputs[0], tensors.outputs[0]
    context.set_input_shape(raw.input_name, tuple(x0.shape))
    context.set_tensor_address(raw.input_name, x0.data_ptr())  # every shape's view shares it
    context.set_tensor_address(raw.output_name, y0.data_ptr())
    stream = wb.device.new_stream()
    handle = int(stream.cuda_stream)
    execute = context.execute_async_v3
    calls: list[Callable[[], Any]]
    if not raw.dynamic:
        calls = [_checked(execute, handle)]
    else:
        set_shape, name = context.set_input_shape, raw.input_name

        def shaped(shape: tuple[int, ...]) -> Callable[[], None]:
            def call() -> None:
                set_shape(name, shape)
                if not execute(handle):
                    raise RuntimeError("execute_async_v3 returned False")

            return call

        calls = [shaped(tuple(x.shape)) for x in tensors.inputs]

    def check() -> Any:
        calls[0]()
        wb.device.synchronize()
        return y0.clone()

    def close() -> None:
        nonlocal context, memory
        stream.synchronize()
        context = memory = None

    info = {"stream": "private torch stream", "context": how}
    return Bench(calls, handle, close, check, info)


def bind_alloc(wb: Workbench) -> Bench:
    """``raw-bind-alloc``: bind shapes and addresses and allocate the output on every call."""
    raw = _raw_engine(wb)
    context, memory, how = _context(wb, raw)
    torch = wb.torch
    tensors = wb.tensors
    stream = wb.device.new_stream()
    handle = int(stream.cuda_stream)
    execute = context.execute_async_v3
    set_shape, set_address = context.set_input_shape, context.set_tensor_address
    in_name, out_name = raw.input_name, raw.output_name
    dtype = tensors.outputs[0].dtype
    device = torch.device("cuda", torch.cuda.current_device())
    empty = torch.empty
    context.set_input_shape(in_name, tuple(tensors.inputs[0].shape))

    def make(x: Any, out_shape: tuple[int, ...]) -> Callable[[], Any]:
        shape = tuple(x.shape)
        if raw.dynamic:

            def call() -> Any:
                set_shape(in_name, shape)
                set_address(in_name, x.data_ptr())
                y = empty(out_shape, dtype=dtype, device=device)
                set_address(out_name, y.data_ptr())
                if not execute(handle):
                    raise RuntimeError("execute_async_v3 returned False")
                return y

        else:

            def call() -> Any:
                set_address(in_name, x.data_ptr())
                y = empty(out_shape, dtype=dtype, device=device)
                set_address(out_name, y.data_ptr())
                if not execute(handle):
                    raise RuntimeError("execute_async_v3 returned False")
                return y

        return call

    calls = [make(x, s) for x, s in zip(tensors.inputs, tensors.out_shapes, strict=True)]

    def check() -> Any:
        y = calls[0]()
        wb.device.synchronize()
        return y

    def close() -> None:
        nonlocal context, memory
        stream.synchronize()
        context = memory = None

    info = {"stream": "private torch stream", "context": how}
    return Bench(calls, handle, close, check, info)


def graph_replay(wb: Workbench) -> Bench:
    """``raw-graph-replay``: a bare ``torch.cuda.CUDAGraph`` replay of ``execute_async_v3``."""
    raw = _raw_engine(wb)
    torch = wb.torch
    tensors = wb.tensors
    side = wb.device.new_stream()
    handle = int(side.cuda_stream)
    keep: list[Any] = []  # contexts, their memory, the static tensors and graphs
    graphs = []
    for x, out_shape in zip(tensors.inputs, tensors.out_shapes, strict=True):
        context, memory, how = _context(wb, raw)
        y = torch.empty(out_shape, dtype=tensors.outputs[0].dtype, device=x.device)
        context.set_input_shape(raw.input_name, tuple(x.shape))
        context.set_tensor_address(raw.input_name, x.data_ptr())
        context.set_tensor_address(raw.output_name, y.data_ptr())
        execute = _checked(context.execute_async_v3, handle)
        with torch.cuda.stream(side):
            execute()  # TensorRT-RTX compiles its kernels on a first run: not capturable
        side.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            execute()
        keep.append((context, memory, y))
        graphs.append(graph)
    wb.device.synchronize()
    calls: list[Callable[[], Any]] = [g.replay for g in graphs]
    current = int(torch.cuda.current_stream().cuda_stream)

    def check() -> Any:
        calls[0]()
        wb.device.synchronize()
        return keep[0][2].clone()

    def close() -> None:
        wb.device.synchronize()
        graphs.clear()
        keep.clear()

    info = {"stream": "torch's current stream", "context": how, "graphs": "one per shape, own context each"}
    return Bench(calls, current, close, check, info)
