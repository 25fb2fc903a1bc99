"""``PythonEngine``: one deserialized engine, its own CUDA stream and a lazy execution context."""

from __future__ import annotations

import logging
import operator
import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trt_runtime_backends.python import cuda
from trt_runtime_backends.python.arrays import (
    KIND_DEVICE,
    KIND_HOST,
    KIND_TORCH,
    DeviceArray,
    describe_device_array,
    torch_module,
)

from trt_runtime.dtypes import itemsize, normalize_dtype
from trt_runtime.engine import EngineBase
from trt_runtime.errors import DataDependentShapeError, EngineError, InputError
from trt_runtime.protocols import EngineSource, TensorSpec
from trt_runtime.settings import RuntimeSettings

if TYPE_CHECKING:
    from trt_runtime.cache import RuntimeCache

__all__ = ["PythonEngine"]

_log = logging.getLogger("trt_runtime.python")

_KIND_NAMES = {KIND_TORCH: "torch", KIND_DEVICE: "device", KIND_HOST: "host"}


class _IO:
    """What the hot path needs to know about one tensor, computed once."""

    __slots__ = ("dtype", "index", "itemsize", "name", "np_dtype", "rank", "shape", "spec", "torch_dtype")

    def __init__(self, spec: TensorSpec, index: int) -> None:
        self.spec = spec
        self.name = spec.name
        self.index = index
        self.dtype = spec.dtype
        self.itemsize = itemsize(spec.dtype)
        self.shape = spec.shape
        self.rank = len(spec.shape)
        self.np_dtype: Any = None
        self.torch_dtype: Any = None


class _Context:
    """An execution context and the bindings it currently holds."""

    __slots__ = (
        "allocators",
        "bound",
        "bound_ptrs",
        "config",
        "native_cache",
        "out_shape_cache",
        "out_shapes",
        "profile",
        "shape_key",
        "trt_context",
    )

    def __init__(self, trt_context: Any, config: Any, native_cache: Any) -> None:
        self.trt_context = trt_context
        self.config = config
        self.native_cache = native_cache
        self.bound: dict[str, int] = {}
        #: The addresses bound, inputs then outputs (compared whole by the fast path).
        self.bound_ptrs: tuple[int, ...] = ()
        self.shape_key: tuple[Any, ...] | None = None
        self.out_shapes: list[tuple[int, ...]] = []
        self.out_shape_cache: dict[Any, list[tuple[int, ...]]] = {}
        self.profile = 0
        self.allocators: dict[str, Any] = {}


def _enum(enum_type: Any, member: Any) -> Any:
    value = getattr(enum_type, member.name, None)
    return value if value is not None else enum_type(member.code)


class PythonEngine(EngineBase):
    """A TensorRT(-RTX) engine run by the python backend. Made by ``PythonBackend.load_engine``.

    Work is queued on the engine's own stream (:attr:`stream`); a caller's stream is
    ordered with events. See docs/device-contract.md for what goes in and comes out.
    Thread-safety: calls on one engine are serialized (an execution context is not
    re-entrant).
    """

    @classmethod
    def _create(
        cls,
        backend: Any,
        trt_engine: Any,
        state: cuda.DeviceState,
        source: EngineSource,
        settings: RuntimeSettings | None,
    ) -> PythonEngine:
        self = cls.__new__(cls)
        self._init(backend, trt_engine, state, source, settings)
        return self

    def _init(
        self,
        backend: Any,
        trt_engine: Any,
        state: cuda.DeviceState,
        source: EngineSource,
        settings: RuntimeSettings | None,
        runtime: Any = None,
    ) -> None:
        # ``runtime`` replaces cuda.bindings.runtime (tests run the engine with a double).
        self._trt = backend.tensorrt
        self._flavour = backend.flavour
        self._logger = backend.logger
        self._trt_engine = trt_engine
        self._state = state
        self._device = state.index
        self._multi_device = cuda.device_count() > 1 if runtime is None else False
        inputs, outputs = self._read_specs(trt_engine)
        self._in = [_IO(s, i) for i, s in enumerate(inputs)]
        self._out = [_IO(s, i) for i, s in enumerate(outputs)]
        self._n_in = len(self._in)
        self._io_names = tuple(io.name for io in (*self._in, *self._out))
        self._n_out = len(self._out)
        self._num_profiles = max(1, int(trt_engine.num_optimization_profiles))
        self._profile: int | None = None
        self._rt = _cudart() if runtime is None else runtime
        self._stream = state.create_stream()
        self._stream_handle = int(self._stream.handle)
        self._event_in = cuda.create_event(self._rt)
        self._event_out = cuda.create_event(self._rt)
        self._res = _Resources(self._rt, self._stream_handle, (self._event_in, self._event_out))
        # An engine that is never closed still drops its context before its ICudaEngine.
        self._finalizer = weakref.finalize(self, _finalize, self._res)
        self._last_stream_obj: Any = None
        self._last_stream_handle = 0
        self._staged_logged = False
        self._stage_in: list[Any] = [None] * self._n_in
        self._stage_out: list[Any] = [None] * self._n_out
        self._torch_device: Any = None
        self._torch_tensor: Any = None
        #: Validated calls by the identities of their arrays (see execute).
        self._fast: dict[tuple[tuple[int, ...], tuple[int, ...]], _FastPath] = {}
        self._output_allocator = "auto"
        self._cache_key: Any = None
        self._context_timings: dict[str, float] = {}
        #: Validated (input shapes, requested profile) -> the profile they run in.
        self._checked: dict[tuple[Any, int | None], int] = {}
        super().__init__(backend, name=source.name, inputs=inputs, outputs=outputs, settings=settings)

    # -- metadata ------------------------------------------------------------------------
    def _read_specs(self, trt_engine: Any) -> tuple[list[TensorSpec], list[TensorSpec]]:
        trt = self._trt
        inputs: list[TensorSpec] = []
        outputs: list[TensorSpec] = []
        profiles = int(trt_engine.num_optimization_profiles)
        for i in range(trt_engine.num_io_tensors):
            name = trt_engine.get_tensor_name(i)
            dtype = normalize_dtype(trt_engine.get_tensor_dtype(name))
            shape = tuple(int(d) for d in trt_engine.get_tensor_shape(name))
            if trt_engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
                ranges = []
                if any(d < 0 for d in shape):
                    for p in range(profiles):
                        lo, opt, hi = trt_engine.get_tensor_profile_shape(name, p)
                        ranges.append((tuple(lo), tuple(opt), tuple(hi)))
                inputs.append(TensorSpec(name, dtype, shape, True, profiles=tuple(ranges)))
            else:
                outputs.append(TensorSpec(name, dtype, shape, False))
        static_inputs = all(not s.is_dynamic for s in inputs)
        # With static inputs, a -1 left in an output shape can only come from the data.
        outputs = [
            TensorSpec(o.name, o.dtype, o.shape, False, data_dependent=static_inputs and o.is_dynamic)
            for o in outputs
        ]
        return inputs, outputs

    @property
    def device(self) -> int:
        """The CUDA device id the engine runs on."""
        return self._device

    @property
    def stream(self) -> Any:
        """The engine's own cuda.core ``Stream``; passing it as ``stream=`` skips event ordering."""
        return self._stream

    @property
    def trt_engine(self) -> Any:
        """The ``ICudaEngine``."""
        return self._trt_engine

    @property
    def runtime_config(self) -> Any:
        """The live ``IRuntimeConfig`` of the current execution context (``None`` before
        the first call, after a settings change, or with full TensorRT)."""
        ctx = self._context
        return None if ctx is None else ctx.config

    @property
    def native_runtime_cache(self) -> Any:
        """The ``IRuntimeCache`` attached to the current context, if any."""
        ctx = self._context
        return None if ctx is None else ctx.native_cache

    @property
    def context_timings(self) -> dict[str, float]:
        """Seconds the last execution context creation spent creating the runtime config
        (``runtime_config_s``), materializing and loading the runtime cache
        (``runtime_cache_s``) and in ``create_execution_context`` (``execution_context_s``)."""
        return dict(self._context_timings)

    @property
    def output_allocator(self) -> str:
        """``"auto"`` (default): only data-dependent outputs go through an
        ``IOutputAllocator``; ``"always"``: every output does (TensorRT asks the allocator
        for memory and reports each shape). Changing it drops the execution context."""
        return self._output_allocator

    @output_allocator.setter
    def output_allocator(self, value: str) -> None:
        if value not in ("auto", "always"):
            raise ValueError(f"output_allocator must be one of 'auto', 'always'; got {value!r}")
        with self._lock:
            if value != self._output_allocator:
                self._output_allocator = value
                self._drop_context()

    @property
    def output_allocators(self) -> dict[str, Any]:
        """The ``IOutputAllocator`` of each output that has one, in the current context."""
        ctx = self._context
        return {} if ctx is None else dict(ctx.allocators)

    @property
    def num_profiles(self) -> int:
        return self._num_profiles

    @property
    def profile(self) -> int | None:
        """The optimization profile used by :meth:`execute`; ``None`` picks the first whose
        ranges contain every input shape."""
        return self._profile

    @profile.setter
    def profile(self, value: int | None) -> None:
        if value is not None:
            self._check_profile_index(value)
        with self._lock:
            self._profile = value
            self._fast.clear()

    def _check_profile_index(self, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < self._num_profiles:
            raise InputError(
                f"engine {self.name!r}: profile must be an int in 0..{self._num_profiles - 1}; got {value!r}"
            )

    # -- context lifecycle -------------------------------------------------------------------
    def _create_context(self, settings: RuntimeSettings, cache: RuntimeCache | None) -> Any:
        trt = self._trt
        clock = time.perf_counter
        t0 = clock()
        self._state.activate()
        config = None
        native = None
        mark = self._logger.mark()
        t_config = t_cache = t0
        if self._flavour == "tensorrt_rtx":
            config = self._trt_engine.create_runtime_config()
            config.cuda_graph_strategy = _enum(trt.CudaGraphStrategy, settings.cuda_graph_strategy)
            config.dynamic_shapes_kernel_specialization_strategy = _enum(
                trt.DynamicShapesKernelSpecializationStrategy,
                settings.dynamic_shapes_kernel_specialization_strategy,
            )
            t_config = t_cache = clock()
            if cache is not None:
                if self._cache_key is None:
                    self._cache_key = self._backend.cache_key(self._device)
                native = cache.ensure_materialized(config, backend=self._backend, key=self._cache_key)
                config.set_runtime_cache(native)
                t_cache = clock()
            trt_context = self._trt_engine.create_execution_context(config)
        else:
            trt_context = self._trt_engine.create_execution_context()
        t_context = clock()
        self._context_timings = {
            "runtime_config_s": t_config - t0,
            "runtime_cache_s": t_cache - t_config,
            "execution_context_s": t_context - t_cache,
        }
        if trt_context is None:
            raise EngineError(
                f"engine {self.name!r}: TensorRT could not create an execution context"
                + _detail(self._logger.errors_since(mark))
            )
        ctx = _Context(trt_context, config, native)
        for spec in self._outputs:
            if spec.data_dependent or self._output_allocator == "always":
                self._attach_allocator(ctx, spec.name)
        self._res.context = ctx
        return ctx

    def _attach_allocator(self, ctx: _Context, name: str) -> None:
        allocator = _make_output_allocator(self._trt, self._state, self._stream)
        ctx.trt_context.set_output_allocator(name, allocator)
        ctx.allocators[name] = allocator

    def _destroy_context(self, context: Any) -> None:
        self._fast.clear()
        if self._res.context is context:
            self._res.context = None
        _drop(context)

    def synchronize(self) -> None:
        """Wait for all work queued on the engine's stream."""
        if getattr(self, "_stream", None) is not None:
            cuda.check(self._rt.cudaStreamSynchronize(self._stream_handle), "cudaStreamSynchronize")

    def _release(self) -> None:
        self._fast.clear()
        self._finalizer()
        self._trt_engine = None
        self._stage_in = [None] * self._n_in
        self._stage_out = [None] * self._n_out
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.close()
            except Exception:
                pass

    # -- execution -----------------------------------------------------------------------------
    def execute(  # type: ignore[override]
        self,
        *inputs: Any,
        stream: Any = None,
        outputs: Sequence[Any] | None = None,
        profile: int | None = None,
    ) -> list[Any]:
        """Run the engine; one array per output, in :attr:`outputs` order.

        ``stream``: the caller's stream (cuda.core ``Stream``, int handle,
        ``torch.cuda.Stream`` or ``__cuda_stream__`` object) the work is ordered after and
        before. ``outputs``: preallocated device arrays to write into (returned as given).
        ``profile``: an optimization profile index for this call.
        """
        with self._lock:
            # A call with arrays validated by an earlier call (the same objects: the
            # low-latency loop, or a few preallocated views cycled): only their pointers and
            # shapes can have changed, and those are compared in two C-level passes.
            fast = (
                self._fast.get((tuple(map(id, inputs)), tuple(map(id, outputs))))
                if outputs is not None and profile is None
                else None
            )
            if (
                fast is not None
                and tuple(map(fast.ptr_of, fast.arrays)) == fast.ptrs
                and tuple(map(_shape_of, fast.arrays)) == fast.shapes
                and self._prepare_fast(fast)
            ):
                ours = self._stream_handle
                caller = self._caller_stream(stream, fast.torch)
                if caller is not None:
                    self._wait(ours, caller, self._event_in)
                if not fast.execute(ours):
                    self._fast.clear()
                    raise EngineError(
                        f"engine {self.name!r}: execute_async_v3 failed"
                        + _detail(self._logger.errors_since(None)[-3:])
                    )
                if caller is not None:
                    self._wait(caller, ours, self._event_out)
                return list(outputs)  # type: ignore[arg-type]
            self._check_open()
            inspection = self._inspect(inputs, self._profile if profile is None else profile)
            ctx = self._context
            if ctx is None:
                ctx = self.ensure_context()
            return self._run_inspected(ctx, inputs, inspection, stream, outputs)

    def __call__(self, *inputs: Any, stream: Any = None, outputs: Sequence[Any] | None = None,
                 profile: int | None = None) -> Any:
        result = self.execute(*inputs, stream=stream, outputs=outputs, profile=profile)
        return result[0] if len(result) == 1 else tuple(result)

    def _prepare_fast(self, fast: _FastPath) -> bool:
        """Put the context in the state ``fast`` was recorded in: its shapes (the same
        profile only) and its addresses. False sends the call down the full path."""
        ctx = self._context
        if ctx is None:
            return False
        if ctx.shape_key != fast.shape_key:
            if ctx.profile != fast.shape_key[1]:
                return False
            trt_context = ctx.trt_context
            ctx.shape_key = None
            for name, dims in fast.dynamic_dims:
                if not trt_context.set_input_shape(name, dims):
                    return False
            ctx.shape_key = fast.shape_key
            ctx.out_shapes = fast.out_shapes
        if ctx.bound_ptrs != fast.ptrs:
            trt_context = ctx.trt_context
            bound = ctx.bound
            for name, ptr in zip(self._io_names, fast.ptrs, strict=True):
                if bound.get(name) != ptr:
                    trt_context.set_tensor_address(name, ptr)
                    bound[name] = ptr
            ctx.bound_ptrs = fast.ptrs
        return True

    def _validate_inputs(self, inputs: Sequence[Any]) -> None:
        self._inspect(inputs, self._profile)

    def _run(self, context: Any, inputs: Sequence[Any], stream: Any) -> list[Any]:
        return self._run_inspected(context, inputs, self._inspect(inputs, self._profile), stream, None)

    def _inspect(self, inputs: Sequence[Any], profile: int | None) -> _Inspection:
        """Every check that needs no execution context: count, dtype, device, contiguity,
        shape and optimization profile. Raises InputError; TensorRT is not called."""
        if len(inputs) != self._n_in:
            raise InputError(
                f"engine {self.name!r} takes {self._n_in} input(s) "
                f"({', '.join(io.name for io in self._in)}); got {len(inputs)}"
            )
        kind = KIND_HOST
        ptrs: list[int] = []
        shapes: list[Any] = []
        host: list[tuple[int, Any]] | None = None
        torch_tensor = self._torch_tensor
        torch_host = False
        device = self._device
        for io, x in zip(self._in, inputs, strict=False):
            tp = type(x)
            # Fast paths: exact types with every check passing; anything else falls through
            # to the general path, which raises the precise error.
            if tp is torch_tensor:
                if x.get_device() == device and x.dtype is io.torch_dtype and x.is_contiguous():
                    kind = KIND_TORCH
                    ptrs.append(x.data_ptr())
                    shapes.append(x.shape)
                    continue
            elif tp is DeviceArray:
                if x.dtype == io.dtype and x.device_id == device:
                    if kind == KIND_HOST:
                        kind = KIND_DEVICE
                    ptrs.append(x.ptr)
                    shapes.append(x.shape)
                    continue
            if self._is_torch(x):
                if x.is_cuda:
                    self._check_torch(io, x)
                    kind = KIND_TORCH
                    ptrs.append(x.data_ptr())
                    shapes.append(x.shape)
                    continue
                x = self._torch_host(io, x)
                torch_host = True
            elif hasattr(x, "__cuda_array_interface__") or (
                hasattr(x, "__dlpack_device__") and _dl_is_cuda(x)
            ):
                ptr, shape = self._check_device_array(io, x)
                if kind == KIND_HOST:
                    kind = KIND_DEVICE
                ptrs.append(ptr)
                shapes.append(shape)
                continue
            arr = self._check_host(io, x)
            if host is None:
                host = []
            host.append((io.index, arr))
            ptrs.append(-1)
            shapes.append(arr.shape)
        key = tuple(shapes)
        chosen = self._checked.get((key, profile))
        if chosen is None:
            chosen = self._check_shapes(key, profile)
            if len(self._checked) >= 64:
                self._checked.clear()
            self._checked[(key, profile)] = chosen
        return _Inspection(kind, ptrs, key, host, torch_host, chosen)

    def _check_shapes(self, shapes: tuple[Any, ...], profile: int | None) -> int:
        """Validate ranks, static dimensions and profile ranges; return the profile to use."""
        tuples = [tuple(int(d) for d in s) for s in shapes]
        for io, shape in zip(self._in, tuples, strict=False):
            if len(shape) != io.rank:
                raise InputError(
                    f"engine {self.name!r}: input {io.name!r} must have {io.rank} dimension(s) "
                    f"{_fmt(io.shape)}; got shape {_fmt(shape)}"
                )
            for want, got in zip(io.shape, shape, strict=False):
                if want >= 0 and want != got:
                    raise InputError(
                        f"engine {self.name!r}: input {io.name!r} must have shape {_fmt(io.shape)}; "
                        f"got {_fmt(shape)}"
                    )
        dynamic = [(io, s) for io, s in zip(self._in, tuples, strict=False) if io.spec.is_dynamic]
        if profile is not None:
            self._check_profile_index(profile)
        if not dynamic:
            return profile or 0
        if profile is None:
            chosen = next(
                (p for p in range(self._num_profiles) if all(_in_range(io, s, p) for io, s in dynamic)),
                None,
            )
            if chosen is None:
                nowhere = [(io, s) for io, s in dynamic
                           if not any(_in_range(io, s, p) for p in range(self._num_profiles))]
                io, s = nowhere[0] if nowhere else dynamic[0]
                raise InputError(
                    f"engine {self.name!r}: input {io.name!r} has shape {_fmt(s)}, outside every "
                    f"optimization profile (or no profile fits all inputs): {_ranges(io)}"
                )
            return chosen
        for io, s in dynamic:
            if not _in_range(io, s, profile):
                lo, _, hi = io.spec.profiles[profile]
                raise InputError(
                    f"engine {self.name!r}: input {io.name!r} has shape {_fmt(s)}, outside "
                    f"optimization profile {profile} (min {_fmt(lo)}, max {_fmt(hi)})"
                )
        return profile

    def _caller_stream(self, stream: Any, torch_inputs: bool) -> int | None:
        """The caller's stream handle to order our work against; ``None`` when there is none
        (no stream given and no torch inputs) or it is our own stream."""
        if stream is None:
            caller = _torch_current_stream(self._device) if torch_inputs else None
        elif stream is self._last_stream_obj:
            caller = self._last_stream_handle
        else:
            caller = cuda.stream_handle(stream)
            self._last_stream_obj, self._last_stream_handle = stream, caller
        return None if caller == self._stream_handle else caller

    def _wait(self, waiter: int, producer: int, event: Any) -> None:
        """Make stream ``waiter`` wait for the work queued so far on stream ``producer``."""
        rt = self._rt
        cuda.check(rt.cudaEventRecord(event, producer), "cudaEventRecord")
        cuda.check(rt.cudaStreamWaitEvent(waiter, event, 0), "cudaStreamWaitEvent")

    def _run_inspected(
        self,
        ctx: _Context,
        inputs: Sequence[Any],
        inspection: _Inspection,
        stream: Any,
        outputs: Sequence[Any] | None,
    ) -> list[Any]:
        rt = self._rt
        kind = inspection.kind
        ptrs = inspection.ptrs
        host = inspection.host
        if self._multi_device:
            cuda.check(rt.cudaSetDevice(self._device), "cudaSetDevice")
        trt_context = ctx.trt_context
        key = (inspection.shapes, inspection.profile)
        if key != ctx.shape_key:
            ctx.shape_key = None  # if applying fails halfway, the next call applies again
            self._apply_shapes(ctx, inspection.shapes, inspection.profile)
            ctx.shape_key = key
        ours = self._stream_handle
        caller = self._caller_stream(stream, kind == KIND_TORCH)
        if caller is not None:
            self._wait(ours, caller, self._event_in)
        if host is not None:
            self._stage_inputs(host, ptrs, ours)
        bound = ctx.bound
        for io, ptr in zip(self._in, ptrs, strict=False):
            if bound.get(io.name) != ptr:
                trt_context.set_tensor_address(io.name, ptr)
                bound[io.name] = ptr
        results, out_ptrs = self._bind_outputs(ctx, kind, outputs)
        for io, ptr in zip(self._out, out_ptrs, strict=False):
            if ptr and bound.get(io.name) != ptr:
                trt_context.set_tensor_address(io.name, ptr)
                bound[io.name] = ptr
        ctx.bound_ptrs = (*ptrs, *out_ptrs)
        for allocator in ctx.allocators.values():
            allocator.shapes.clear()
        if not trt_context.execute_async_v3(ours):
            raise EngineError(
                f"engine {self.name!r}: execute_async_v3 failed"
                + _detail(self._logger.errors_since(None)[-3:])
            )
        if ctx.allocators:
            results = self._collect_data_dependent(ctx, kind, results, ours)
        if kind == KIND_HOST and outputs is not None:
            if caller is None:  # host inputs promise ready results
                cuda.check(rt.cudaStreamSynchronize(ours), "cudaStreamSynchronize")
        elif kind == KIND_HOST:
            results = self._to_host(results, ours)
            if inspection.torch_host:
                torch = torch_module()
                results = [torch.from_numpy(r) for r in results]
        if caller is not None:
            self._wait(caller, ours, self._event_out)
        elif kind == KIND_DEVICE and outputs is None:
            for r in results:
                if isinstance(r, DeviceArray):
                    r.stream = ours
        if outputs is not None and host is None and not ctx.allocators:
            fast = _FastPath.make(self, ctx, inputs, outputs, ptrs, out_ptrs, kind)
            if fast is not None:
                if len(self._fast) >= _FAST_ENTRIES:
                    self._fast.clear()
                self._fast[(fast.in_ids, fast.out_ids)] = fast
        return results

    # -- input checks ------------------------------------------------------------------------
    def _is_torch(self, x: Any) -> bool:
        torch = torch_module()
        if torch is None or not isinstance(x, torch.Tensor):
            return False
        if self._torch_tensor is None:
            self._torch_tensor = torch.Tensor
            self._torch_device = torch.device("cuda", self._device)
            for io in (*self._in, *self._out):
                io.torch_dtype = _torch_dtype(torch, io.dtype)
        return True

    def _check_torch(self, io: _IO, x: Any) -> None:
        if x.dtype != io.torch_dtype:
            raise InputError(
                f"engine {self.name!r}: input {io.name!r} must have dtype {io.dtype}; got {x.dtype}"
            )
        dev = x.get_device()
        if dev != self._device:
            raise InputError(
                f"engine {self.name!r}: input {io.name!r} is on cuda:{dev}; the engine runs on "
                f"cuda:{self._device}"
            )
        if not x.is_contiguous():
            raise InputError(
                f"engine {self.name!r}: input {io.name!r} is not contiguous (strides {tuple(x.stride())}); "
                "call .contiguous() first"
            )

    def _torch_host(self, io: _IO, x: Any) -> Any:
        if x.dtype != io.torch_dtype:
            raise InputError(
                f"engine {self.name!r}: input {io.name!r} must have dtype {io.dtype}; got {x.dtype}"
            )
        if not x.is_contiguous():
            raise InputError(f"engine {self.name!r}: input {io.name!r} is not contiguous")
        if io.dtype == "bfloat16":
            raise InputError(f"engine {self.name!r}: bfloat16 host tensors cannot be staged; move "
                             f"input {io.name!r} to cuda:{self._device}")
        return x.numpy()

    def _check_device_array(self, io: _IO, x: Any) -> tuple[int, tuple[int, ...]]:
        try:
            ptr, shape, dtype, device, contiguous = describe_device_array(x)
        except Exception as exc:
            raise InputError(
                f"engine {self.name!r}: input {io.name!r} ({type(x).__name__}) is not a readable device "
                f"array: {exc}"
            ) from exc
        if dtype != io.dtype:
            raise InputError(
                f"engine {self.name!r}: input {io.name!r} must have dtype {io.dtype}; got {dtype}"
            )
        if device is None and self._multi_device:
            device = _pointer_device(ptr)
        if device is not None and device != self._device:
            where = "the host" if device < 0 else f"cuda:{device}"
            raise InputError(
                f"engine {self.name!r}: input {io.name!r} is on {where}; "
                f"the engine runs on cuda:{self._device}"
            )
        if not contiguous:
            raise InputError(f"engine {self.name!r}: input {io.name!r} is not C-contiguous")
        return ptr, shape

    def _check_host(self, io: _IO, x: Any) -> Any:
        import numpy as np

        if io.np_dtype is None:
            from trt_runtime.dtypes import to_numpy

            try:
                io.np_dtype = to_numpy(io.dtype)
            except TypeError as exc:
                raise InputError(f"engine {self.name!r}: input {io.name!r}: {exc}") from exc
        if not isinstance(x, np.ndarray):
            if isinstance(x, (list, tuple, int, float)):
                x = np.asarray(x, dtype=io.np_dtype)
            else:
                try:
                    x = np.asarray(x)
                except Exception as exc:
                    raise InputError(
                        f"engine {self.name!r}: input {io.name!r} must be a torch tensor, a CUDA array "
                        f"or a host array; got {type(x).__name__}"
                    ) from exc
        if x.dtype != io.np_dtype:
            raise InputError(
                f"engine {self.name!r}: input {io.name!r} must have dtype {io.dtype}; got {x.dtype}"
            )
        if not x.flags.c_contiguous:
            raise InputError(
                f"engine {self.name!r}: input {io.name!r} is not C-contiguous; use numpy.ascontiguousarray"
            )
        return x

    def _apply_shapes(self, ctx: _Context, shapes: tuple[Any, ...], profile: int) -> None:
        """Select ``profile`` and set the input shapes on the context; read the output shapes."""
        trt_context = ctx.trt_context
        if profile != ctx.profile:
            if not trt_context.set_optimization_profile_async(profile, self._stream_handle):
                raise EngineError(f"engine {self.name!r}: could not select optimization profile {profile}")
            ctx.profile = profile
            ctx.bound.clear()
            ctx.bound_ptrs = ()
        for io, shape in zip(self._in, shapes, strict=False):
            if io.spec.is_dynamic:
                dims = tuple(int(d) for d in shape)
                if not trt_context.set_input_shape(io.name, dims):
                    raise InputError(
                        f"engine {self.name!r}: TensorRT rejected shape {_fmt(dims)} for input {io.name!r}"
                        + _detail(self._logger.errors_since(None)[-1:])
                    )
        key = (shapes, profile)
        known = ctx.out_shape_cache.get(key)
        if known is not None:  # TensorRT's shape inference already ran for these shapes
            ctx.out_shapes = known
            return
        out_shapes = []
        for io in self._out:
            shape = tuple(int(d) for d in trt_context.get_tensor_shape(io.name))
            if any(d < 0 for d in shape) and io.name not in ctx.allocators:
                # Only known after the engine ran: switch this output to an allocator.
                self._mark_data_dependent(io)
                self._attach_allocator(ctx, io.name)
            out_shapes.append(shape)
        ctx.out_shapes = out_shapes
        if not ctx.allocators:
            if len(ctx.out_shape_cache) >= 64:
                ctx.out_shape_cache.clear()
            ctx.out_shape_cache[key] = out_shapes

    def _mark_data_dependent(self, io: _IO) -> None:
        spec = io.spec
        io.spec = TensorSpec(spec.name, spec.dtype, spec.shape, False, data_dependent=True)
        self._outputs = tuple(o.spec for o in self._out)

    # -- staging and outputs ---------------------------------------------------------------------
    def _stage_inputs(self, host: list[tuple[int, Any]], ptrs: list[int], ours: int) -> None:
        rt = self._rt
        if not self._staged_logged:
            self._staged_logged = True
            names = ", ".join(repr(self._in[i].name) for i, _ in host)
            _log.info(
                "engine %r: staging host input(s) %s through device memory; pass CUDA arrays "
                "(torch, cupy, ...) to bind them zero-copy", self.name, names,
            )
        for index, arr in host:
            nbytes = arr.nbytes
            buf = self._stage_in[index]
            if buf is None or buf.size < nbytes:
                buf = self._stage_in[index] = self._state.allocate(nbytes, self._stream)
            ptr = int(buf.handle)
            ptrs[index] = ptr
            if nbytes:
                cuda.check(
                    rt.cudaMemcpyAsync(ptr, arr.ctypes.data, nbytes,
                                       rt.cudaMemcpyKind.cudaMemcpyHostToDevice, ours),
                    "cudaMemcpyAsync",
                )

    def _bind_outputs(
        self, ctx: _Context, kind: int, outputs: Sequence[Any] | None
    ) -> tuple[list[Any], list[int]]:
        shapes = ctx.out_shapes
        if outputs is not None:
            return self._check_outputs(ctx, outputs)
        results: list[Any] = []
        ptrs: list[int] = []
        for io, shape in zip(self._out, shapes, strict=False):
            if io.name in ctx.allocators:
                results.append(None)
                ptrs.append(0)
                continue
            if kind == KIND_TORCH:
                torch = torch_module()
                t = torch.empty(shape, dtype=io.torch_dtype, device=self._torch_device)
                results.append(t)
                ptrs.append(t.data_ptr())
            elif kind == KIND_DEVICE:
                nbytes = _numel(shape) * io.itemsize
                buf = self._state.allocate(nbytes, self._stream)
                results.append(DeviceArray(buf, shape, io.dtype, self._device))
                ptrs.append(int(buf.handle))
            else:
                nbytes = _numel(shape) * io.itemsize
                buf = self._stage_out[io.index]
                if buf is None or buf.size < nbytes:
                    buf = self._stage_out[io.index] = self._state.allocate(nbytes, self._stream)
                results.append((buf, shape))
                ptrs.append(int(buf.handle))
        return results, ptrs

    def _check_outputs(self, ctx: _Context, outputs: Sequence[Any]) -> tuple[list[Any], list[int]]:
        if len(outputs) != self._n_out:
            raise InputError(
                f"engine {self.name!r} has {self._n_out} output(s); outputs= has {len(outputs)}"
            )
        ptrs = []
        torch_tensor = self._torch_tensor
        device = self._device
        for io, shape, out in zip(self._out, ctx.out_shapes, outputs, strict=False):
            if io.name in ctx.allocators:
                raise InputError(
                    f"engine {self.name!r}: output {io.name!r} is produced through an output "
                    "allocator (data-dependent shape, or output_allocator='always'); it cannot be "
                    "preallocated"
                )
            tp = type(out)
            if (
                tp is torch_tensor
                and out.get_device() == device
                and out.dtype is io.torch_dtype
                and out.is_contiguous()
            ):
                got = out.shape
                ptr = out.data_ptr()
            elif tp is DeviceArray and out.dtype == io.dtype and out.device_id == device:
                got = out.shape
                ptr = out.ptr
            elif self._is_torch(out) and out.is_cuda:
                self._check_torch(io, out)
                got = tuple(out.shape)
                ptr = out.data_ptr()
            elif hasattr(out, "__cuda_array_interface__") or hasattr(out, "__dlpack_device__"):
                ptr, got = self._check_device_array(io, out)
            else:
                raise InputError(
                    f"engine {self.name!r}: outputs= must hold CUDA arrays; output {io.name!r} is "
                    f"{type(out).__name__}"
                )
            if got != shape:
                raise InputError(
                    f"engine {self.name!r}: output {io.name!r} must have shape {_fmt(shape)}; "
                    f"got {_fmt(tuple(got))}"
                )
            ptrs.append(ptr)
        return list(outputs), ptrs

    def _collect_data_dependent(self, ctx: _Context, kind: int, results: list[Any], ours: int) -> list[Any]:
        rt = self._rt
        cuda.check(rt.cudaStreamSynchronize(ours), "cudaStreamSynchronize")
        for i, io in enumerate(self._out):
            allocator = ctx.allocators.get(io.name)
            if allocator is None:
                continue
            shape = allocator.shapes.get(io.name)
            if shape is None and all(d >= 0 for d in ctx.out_shapes[i]):
                shape = ctx.out_shapes[i]  # a shape-inferable output run through the allocator
            if shape is None:
                raise DataDependentShapeError(
                    f"engine {self.name!r}: TensorRT reported no shape for data-dependent output {io.name!r}"
                )
            src = allocator.pointer(io.name)
            nbytes = _numel(shape) * io.itemsize
            if kind == KIND_TORCH:
                torch = torch_module()
                t = torch.empty(shape, dtype=io.torch_dtype, device=self._torch_device)
                dst = t.data_ptr()
                results[i] = t
            elif kind == KIND_DEVICE:
                buf = self._state.allocate(nbytes, self._stream)
                dst = int(buf.handle)
                results[i] = DeviceArray(buf, shape, io.dtype, self._device)
            else:
                results[i] = (allocator.buffers[io.name], shape)
                continue
            if nbytes:
                cuda.check(
                    rt.cudaMemcpyAsync(dst, src, nbytes, rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice, ours),
                    "cudaMemcpyAsync",
                )
        return results

    def _to_host(self, results: list[Any], ours: int) -> list[Any]:
        import numpy as np

        rt = self._rt
        host = []
        for io, (buf, shape) in zip(self._out, results, strict=False):
            if io.np_dtype is None:
                from trt_runtime.dtypes import to_numpy

                io.np_dtype = to_numpy(io.dtype)
            arr = np.empty(shape, dtype=io.np_dtype)
            if arr.nbytes:
                cuda.check(
                    rt.cudaMemcpyAsync(arr.ctypes.data, int(buf.handle), arr.nbytes,
                                       rt.cudaMemcpyKind.cudaMemcpyDeviceToHost, ours),
                    "cudaMemcpyAsync",
                )
            host.append(arr)
        cuda.check(rt.cudaStreamSynchronize(ours), "cudaStreamSynchronize")
        return host


# -- helpers -------------------------------------------------------------------------------------


class _Inspection:
    """What :meth:`PythonEngine._inspect` learned about one call's inputs."""

    __slots__ = ("host", "kind", "profile", "ptrs", "shapes", "torch_host")

    def __init__(self, kind: int, ptrs: list[int], shapes: tuple[Any, ...],
                 host: list[tuple[int, Any]] | None, torch_host: bool, profile: int) -> None:
        self.kind = kind
        self.ptrs = ptrs
        self.shapes = shapes
        self.host = host
        self.torch_host = torch_host
        self.profile = profile


def _shape_of(array: Any) -> Any:
    return array.shape


_ptr_attr = operator.attrgetter("ptr")


#: How many validated calls an engine remembers (a few cycled shapes or buffers).
_FAST_ENTRIES = 16


class _FastPath:
    """The last call's arrays, once validated and bound: a repeat call with the same
    objects, pointers and shapes goes straight to ``execute_async_v3``."""

    __slots__ = (
        "arrays", "dynamic_dims", "execute", "in_ids", "out_ids", "out_shapes", "ptr_of", "ptrs",
        "shape_key", "shapes", "torch",
    )

    arrays: tuple[Any, ...]
    dynamic_dims: tuple[tuple[str, tuple[int, ...]], ...]
    out_shapes: list[tuple[int, ...]]
    shape_key: tuple[Any, ...]
    execute: Any
    in_ids: tuple[int, ...]
    out_ids: tuple[int, ...]
    ptr_of: Any
    ptrs: tuple[int, ...]
    shapes: tuple[Any, ...]
    torch: bool

    @classmethod
    def make(cls, engine: PythonEngine, ctx: _Context, inputs: Sequence[Any], outputs: Sequence[Any],
             in_ptrs: list[int], out_ptrs: list[int], kind: int) -> _FastPath | None:
        arrays = (*inputs, *outputs)
        kinds = {type(a) for a in arrays}
        if len(kinds) != 1:
            return None
        (tp,) = kinds
        if tp is engine._torch_tensor and tp is not None:
            ptr_of = tp.data_ptr
        elif tp is DeviceArray:
            ptr_of = _ptr_attr
        else:
            return None
        self = cls()
        self.arrays = arrays
        self.in_ids = tuple(map(id, inputs))
        self.out_ids = tuple(map(id, outputs))
        self.ptr_of = ptr_of
        self.ptrs = (*in_ptrs, *out_ptrs)
        self.shapes = tuple(map(_shape_of, arrays))
        self.torch = kind == KIND_TORCH
        self.execute = ctx.trt_context.execute_async_v3
        shape_key = ctx.shape_key
        if shape_key is None:
            return None
        self.shape_key = shape_key
        self.out_shapes = ctx.out_shapes
        self.dynamic_dims = tuple(
            (io.name, tuple(int(d) for d in shape))
            for io, shape in zip(engine._in, shape_key[0], strict=True)
            if io.spec.is_dynamic
        )
        return self


class _Resources:
    """What the finalizer of an engine releases (it must not reference the engine)."""

    __slots__ = ("context", "events", "rt", "stream_handle")

    def __init__(self, rt: Any, stream_handle: int, events: tuple[Any, ...]) -> None:
        self.rt = rt
        self.stream_handle = stream_handle
        self.events = events
        self.context: _Context | None = None


def _drop(context: _Context) -> None:
    context.allocators.clear()
    context.trt_context = None
    context.config = None
    context.native_cache = None


def _finalize(res: _Resources) -> None:
    try:
        res.rt.cudaStreamSynchronize(res.stream_handle)
    except Exception:  # a dying process; nothing to report to
        pass
    if res.context is not None:
        _drop(res.context)
        res.context = None
    for event in res.events:
        cuda.destroy_event(event, res.rt)
    res.events = ()


def _cudart() -> Any:
    from cuda.bindings import runtime

    return runtime


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _fmt(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _ranges(io: _IO) -> str:
    return "; ".join(
        f"profile {p}: min {_fmt(lo)}, max {_fmt(hi)}" for p, (lo, _, hi) in enumerate(io.spec.profiles)
    ) or "the engine has no profile for it"


def _in_range(io: _IO, shape: tuple[int, ...], profile: int) -> bool:
    profiles = io.spec.profiles
    if profile >= len(profiles):
        return False
    lo, _, hi = profiles[profile]
    return all(a <= d <= b for a, d, b in zip(lo, shape, hi, strict=False))


def _detail(messages: list[str]) -> str:
    return f": {'; '.join(messages)}" if messages else ""


def _dl_is_cuda(x: Any) -> bool:
    try:
        device_type, _ = x.__dlpack_device__()
    except Exception:
        return False
    return int(device_type) in (2, 13)  # kDLCUDA, kDLCUDAManaged


def _pointer_device(ptr: int) -> int:
    rt = _cudart()
    err, attrs = rt.cudaPointerGetAttributes(ptr)
    if int(err) != 0:
        return -1
    memory_type = int(attrs.type)
    if memory_type in (2, 3):  # cudaMemoryTypeDevice, cudaMemoryTypeManaged
        return int(attrs.device)
    return -1


def _torch_dtype(torch: Any, name: str) -> Any:
    return {
        "float32": torch.float32,
        "float16": torch.float16,
        "bfloat16": torch.bfloat16,
        "int64": torch.int64,
        "int32": torch.int32,
        "int8": torch.int8,
        "uint8": torch.uint8,
        "bool": torch.bool,
        "float8_e4m3fn": getattr(torch, "float8_e4m3fn", None),
    }[name]


def _torch_current_stream(device: int) -> int:
    torch = torch_module()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return int(raw(device))
    return int(torch.cuda.current_stream(device).cuda_stream)


def _make_output_allocator(trt: Any, state: cuda.DeviceState, stream: Any) -> Any:
    class _OutputAllocator(trt.IOutputAllocator):  # type: ignore[misc, name-defined]
        """Grows one device buffer per output; records the shapes TensorRT reports."""

        def __init__(self) -> None:
            trt.IOutputAllocator.__init__(self)
            self.buffers: dict[str, Any] = {}
            self.shapes: dict[str, tuple[int, ...]] = {}
            #: Calls of reallocate_output(_async), buffers allocated, shapes notified.
            self.reallocate_calls = 0
            self.allocations = 0
            self.notified: list[tuple[str, tuple[int, ...]]] = []

        def reallocate_output_async(self, name: str, memory: int, size: int, alignment: int,
                                    strm: int) -> int:
            self.reallocate_calls += 1
            buf = self.buffers.get(name)
            if buf is None or buf.size < size:
                try:
                    buf = state.allocate(size, stream)
                except Exception:  # TensorRT expects 0 on failure, not an exception
                    return 0
                self.buffers[name] = buf
                self.allocations += 1
            return int(buf.handle)

        def reallocate_output(self, name: str, memory: int, size: int, alignment: int) -> int:
            return self.reallocate_output_async(name, memory, size, alignment, 0)

        def notify_shape(self, name: str, shape: Any) -> None:
            dims = tuple(int(d) for d in shape)
            self.shapes[name] = dims
            self.notified.append((name, dims))

        def pointer(self, name: str) -> int:
            return int(self.buffers[name].handle)

    return _OutputAllocator()

