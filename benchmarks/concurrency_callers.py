"""The callers of :mod:`benchmarks.bench_concurrency`: one object per thread, one request each call.

A caller's :meth:`~Caller.call` is one request/response: run the engine on the
caller's own input, then wait for that work on the caller's own stream. Its
:meth:`~Caller.check` says whether an output equals the caller's *serial* output: the
same engine run once on the same input, alone, before any thread starts (a concurrency
bug gives another caller's result, a torn one or garbage; the engine's precision is not
what this benchmark measures). :attr:`~Caller.error` is how far that serial output is
from the float64 reference, relative to the reference's largest magnitude (reported per
row, so a precision problem is still seen). :meth:`~Caller.prepare` runs in the caller's
thread before the first call (a torch thread makes its stream current there).

* :func:`raw_callers`: a bare TensorRT-RTX loop, one execution context per thread with
  pre-allocated buffers bound once (``eager``), or a bare ``torch.cuda.CUDAGraph`` of that
  enqueue replayed (``outer``); with ``alloc``, the same loops making a new output per
  call (the floor of a call that returns new tensors).
* :func:`backend_callers`: ``engine(x)`` of a trt-runtime engine shared by all threads.
* :func:`memory_callers`: the memory backend on numpy arrays, for the CPU smoke mode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .raw_rows import new_context

__all__ = ["Caller", "backend_callers", "memory_callers", "raw_callers", "thread_inputs"]


class Caller:
    """One thread's requests."""

    #: max |serial output - float64 reference| / max |reference| (None: not computed).
    error: float | None = None
    #: The largest max |output - serial output| / max |serial output| of a wrong output.
    wrong_diff: float | None = None

    def _wrong(self, diff: float) -> bool:
        """Record a wrong output that is off by ``diff`` (relative to the peak); False."""
        self.wrong_diff = diff if self.wrong_diff is None else max(self.wrong_diff, diff)
        return False

    def prepare(self) -> None:
        """Runs in the caller's thread before its first call."""

    def call(self) -> Any:
        raise NotImplementedError

    def check(self, output: Any) -> bool:
        raise NotImplementedError


def thread_inputs(built: Any, shape: tuple[int, ...], index: int) -> tuple[Any, Any]:
    """Thread ``index``'s own host input (float32) and its float64 reference output.

    Memoized on ``built`` (the reference of a conv net takes a while on the CPU)."""
    import numpy as np

    memo = built.__dict__.setdefault("_thread_inputs", {})
    key = (tuple(shape), index)
    if key not in memo:
        host = np.random.default_rng(1_000 + index).standard_normal(shape).astype(np.float32)
        memo[key] = host, np.asarray(built.reference(host.astype(np.float64))[0], dtype=np.float64)
    return memo[key]  # type: ignore[no-any-return]


class _TorchCaller(Caller):
    """A caller on its own torch stream; outputs are compared on the device with the
    caller's serial output (:meth:`settle`, run by the constructor of each kind)."""

    def __init__(self, torch: Any, expected: Any, tolerance: tuple[float, float]) -> None:
        self.torch = torch
        self.stream = torch.cuda.Stream()
        self.reference = expected
        self.expected: Any = None
        self.rtol, self.atol = tolerance

    def settle(self) -> None:
        """Run once alone (main thread, this caller's stream): the serial output every
        checked output must equal, and its error against the float64 reference."""
        import numpy as np

        torch = self.torch
        with torch.cuda.stream(self.stream):
            out = self.call()
        self.stream.synchronize()
        serial = out.float().clone()
        self.expected = serial
        ref = np.asarray(self.reference, dtype=np.float64).reshape(tuple(serial.shape))
        got = serial.double().cpu().numpy()
        peak = float(np.max(np.abs(ref))) or 1.0
        self.error = float(np.max(np.abs(got - ref))) / peak

    def prepare(self) -> None:
        self.torch.cuda.set_stream(self.stream)  # the current stream is per thread

    def check(self, output: Any) -> bool:
        got = output.float().reshape(self.expected.shape)
        if self.torch.allclose(got, self.expected, rtol=self.rtol, atol=self.atol):
            return True
        peak = float(self.expected.abs().max()) or 1.0
        return self._wrong(float((got - self.expected).abs().max()) / peak)


class _EngineCaller(_TorchCaller):
    def __init__(self, engine: Any, x: Any, *args: Any) -> None:
        super().__init__(*args)
        self.engine, self.x = engine, x
        self.sync = self.stream.synchronize
        self.settle()

    def call(self) -> Any:
        y = self.engine(self.x)
        self.sync()
        return y


def _device_input(torch: Any, host: Any, dtype: str) -> Any:
    from trt_runtime.dtypes import normalize_dtype

    return torch.from_numpy(host).to(device="cuda", dtype=getattr(torch, normalize_dtype(dtype)))


def backend_callers(engine: Any, torch: Any, built: Any, shape: tuple[int, ...], count: int) -> list[Caller]:
    """``count`` callers of one shared engine, each with an input of its own."""
    callers: list[Caller] = []
    for index in range(count):
        host, expected = thread_inputs(built, shape, index)
        x = _device_input(torch, host, built.inputs[0].dtype)
        callers.append(_EngineCaller(engine, x, torch, expected, built.tolerance))
    torch.cuda.synchronize()
    return callers


class _RawCaller(_TorchCaller):
    """One execution context, input and output bound once; eager or a replayed graph.

    ``alloc``: the caller makes a new output on every call, as ``engine(x)`` must. Eager:
    ``torch.empty`` of the output, both addresses set, the enqueue (bench_all's
    ``raw-bind-alloc``). Under a graph, torch's own recipe for a graph fed fresh tensors:
    the input copied into the static one (``copy_``), ``replay()``, a ``clone()`` of the
    static output. Each torch call releases the GIL once, so these rows are the floor of a
    call that returns new tensors when several threads call."""

    def __init__(self, raw: Any, x: Any, *args: Any, outer: bool, alloc: bool = False) -> None:
        super().__init__(*args)
        torch = self.torch
        engine = raw.engine
        self.context, self.memory, _ = new_context(raw, torch, [tuple(x.shape)])
        out_shape = tuple(x.shape[:1]) + tuple(engine.get_tensor_shape(raw.output_name))[1:]
        out_dtype = getattr(torch, _torch_dtype_name(engine.get_tensor_dtype(raw.output_name)))
        self.x = x
        # a graph fed fresh inputs reads them from a static input of its own
        self.static_x = torch.empty_like(x) if outer and alloc else x
        self.y = torch.empty(out_shape, dtype=out_dtype, device="cuda")
        self.context.set_input_shape(raw.input_name, tuple(x.shape))
        self.context.set_tensor_address(raw.input_name, self.static_x.data_ptr())
        self.context.set_tensor_address(raw.output_name, self.y.data_ptr())
        self.handle = int(self.stream.cuda_stream)
        self.execute = self.context.execute_async_v3
        self.sync = self.stream.synchronize
        self.graph: Any = None
        with torch.cuda.stream(self.stream):
            if self.static_x is not x:
                self.static_x.copy_(x)
            if not self.execute(self.handle):  # the first enqueue initializes; never captured
                raise RuntimeError("execute_async_v3 returned False")
            self.sync()
            if outer:
                self.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graph, stream=self.stream):
                    if not self.execute(self.handle):
                        raise RuntimeError("execute_async_v3 returned False during capture")
        self.sync()
        if outer:
            self.call = self._replay_fresh if alloc else self._replay  # type: ignore[method-assign]
        elif alloc:
            self.names = (raw.input_name, raw.output_name)
            self.out_args = (out_shape, out_dtype, self.y.device)
            self.call = self._bind_alloc  # type: ignore[method-assign]
        self.settle()

    def call(self) -> Any:
        if not self.execute(self.handle):
            raise RuntimeError("execute_async_v3 returned False")
        self.sync()
        return self.y

    def _replay(self) -> Any:
        self.graph.replay()
        self.sync()
        return self.y

    def _bind_alloc(self) -> Any:
        shape, dtype, device = self.out_args
        y = self.torch.empty(shape, dtype=dtype, device=device)
        set_address = self.context.set_tensor_address
        set_address(self.names[0], self.x.data_ptr())
        set_address(self.names[1], y.data_ptr())
        if not self.execute(self.handle):
            raise RuntimeError("execute_async_v3 returned False")
        self.sync()
        return y

    def _replay_fresh(self) -> Any:
        self.static_x.copy_(self.x)
        self.graph.replay()
        y = self.y.clone()
        self.sync()
        return y


def _torch_dtype_name(dtype: Any) -> str:
    from trt_runtime.dtypes import normalize_dtype

    return normalize_dtype(dtype)


def raw_callers(
    raw: Any, torch: Any, built: Any, shape: tuple[int, ...], count: int, *, outer: bool, alloc: bool = False
) -> list[Caller]:
    """``count`` bare loops, one execution context and stream each, on ``raw``
    (:func:`benchmarks.raw_rows.open_engine`); ``alloc``: each call makes a new output."""
    callers: list[Caller] = []
    for index in range(count):
        host, expected = thread_inputs(built, shape, index)
        x = _device_input(torch, host, built.inputs[0].dtype)
        callers.append(_RawCaller(raw, x, torch, expected, built.tolerance, outer=outer, alloc=alloc))
    torch.cuda.synchronize()
    return callers


class _MemoryCaller(Caller):
    def __init__(self, engine: Any, x: Any, expected: Any, tolerance: tuple[float, float]) -> None:
        self.engine, self.x, self.expected = engine, x, expected
        self.rtol, self.atol = tolerance

    def call(self) -> Any:
        return self.engine(self.x)

    def check(self, output: Any) -> bool:
        import numpy as np

        if np.allclose(output, self.expected, rtol=self.rtol, atol=self.atol):
            return True
        peak = float(np.max(np.abs(self.expected))) or 1.0
        return self._wrong(float(np.max(np.abs(np.asarray(output) - self.expected))) / peak)


def memory_callers(
    engine: Any, reference: Callable[[Any], Any], shape: tuple[int, ...], count: int
) -> list[Caller]:
    """``count`` callers of a memory-backend engine (numpy in, numpy out)."""
    import numpy as np

    callers: list[Caller] = []
    for index in range(count):
        x = np.random.default_rng(1_000 + index).standard_normal(shape).astype(np.float32)
        callers.append(_MemoryCaller(engine, x, reference(x), (1e-5, 1e-6)))
    return callers
