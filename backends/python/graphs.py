"""The outer CUDA graphs of the python backend: capture a call once, replay it after.

Under ``engine.outer_graph`` (see :mod:`trt_runtime.graphs`) each (input shapes,
optimization profile) gets a :class:`GraphSlot`: static input and output buffers owned
by the engine (cuda.core device memory, shown as ``DeviceArray``s or zero-copy torch
views) and, from its first call on, an instantiated CUDA graph of
``execute_async_v3`` reading and writing those buffers.

The first call of a slot copies the inputs in, runs the engine once eagerly on the
engine's stream (TensorRT-RTX compiles kernels lazily on a first run, which cannot be
captured; that run is also this call's result), then captures ``execute_async_v3`` on a
private non-blocking capture stream (``cudaStreamCaptureModeThreadLocal``; never the
legacy default stream) and instantiates the graph. Later calls copy the inputs into the
static buffers (skipped for an input whose address *is* the static buffer, see
:meth:`OuterGraphExecution.static_inputs`), launch the graph on the engine's stream and
return the outputs as new arrays (``"copy"``) or as the static buffers themselves
(``"view"``: overwritten by the next replay of that slot). Ordering with the caller's
stream is the same as for eager calls.

A context that TensorRT says cannot be captured (``is_stream_capturable`` false) raises
:class:`~trt_runtime.CapabilityError`; so do outputs that go through an
``IOutputAllocator``. Graphs are dropped (``_drop_graphs``) when the execution context
is dropped (a settings change), when ``outer_graph`` changes, on ``reset_graphs()`` and
on close; the next call captures again, and when the context's scratch memory has to
grow for new shapes (the graphs hold its address).

TensorRT-RTX 1.6.1 reports a context capturable when its memory is provided by the
application: the engine creates its contexts ``USER_MANAGED`` (see ``engine.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trt_runtime_backends.python import cuda
from trt_runtime_backends.python.arrays import DeviceArray, torch_module
from trt_runtime_backends.python.contract import Inspection, TensorInfo
from trt_runtime_backends.python.lane import LaneState
from trt_runtime_backends.python.output_binding import host_memory

from trt_runtime.contract import KIND_HOST, KIND_TORCH, numel
from trt_runtime.errors import CapabilityError, EngineError

__all__ = ["GraphSlot", "OuterGraphExecution"]

#: How many input-shape signatures the replay shortcut remembers.
_SHORTCUTS = 16


class GraphSlot:
    """The static buffers and the CUDA graph of one (input shapes, profile)."""

    __slots__ = (
        "dynamic_dims", "exec", "in_nbytes", "in_ptrs", "inputs", "key", "out_nbytes", "out_ptrs",
        "out_shapes", "outputs", "torch_inputs", "torch_outputs",
    )

    def __init__(self, key: tuple[Any, int], ins: Sequence[TensorInfo], state: Any, stream: Any,
                 device: int) -> None:
        shapes, _ = key
        self.key = key
        self.dynamic_dims = tuple(
            (io.name, tuple(int(d) for d in shape)) for io, shape in zip(ins, shapes, strict=True)
            if io.spec.is_dynamic
        )
        self.inputs = [_static(state, stream, tuple(int(d) for d in shape), io, device)
                       for io, shape in zip(ins, shapes, strict=True)]
        self.in_ptrs = tuple(a.ptr for a in self.inputs)
        self.in_nbytes = tuple(a.nbytes for a in self.inputs)
        self.outputs: list[DeviceArray] = []
        self.out_ptrs: tuple[int, ...] = ()
        self.out_nbytes: tuple[int, ...] = ()
        self.out_shapes: list[tuple[int, ...]] = []
        self.exec: Any = None
        self.torch_inputs: list[Any] | None = None
        self.torch_outputs: list[Any] | None = None


def _static(state: Any, stream: Any, shape: tuple[int, ...], io: TensorInfo, device: int) -> DeviceArray:
    buf = state.allocate(numel(shape) * io.itemsize, stream)
    return DeviceArray(buf, shape, io.dtype, device)


def _torch_views(arrays: Sequence[DeviceArray]) -> list[Any]:
    """Zero-copy torch tensors of the static buffers (through DLPack)."""
    torch = torch_module()
    if torch is None:  # static_inputs(as_torch=True) before any torch tensor was passed
        import importlib

        torch = importlib.import_module("torch")
    return [torch.from_dlpack(a) for a in arrays]


class OuterGraphExecution(LaneState):
    """Runs calls under the outer CUDA-graph wrap (mixin of ``PythonEngine``)."""

    _capture_stream: Any  # assigned here too



    # -- hooks of the core pipeline ---------------------------------------------------------------

    def _static_inputs(self, shapes: tuple[tuple[int, ...], ...], profile: int, as_torch: bool | None
                       ) -> list[Any]:
        """The static buffers of the slot of (``shapes``, ``profile``): ``DeviceArray``s, or
        torch views (through DLPack) when ``as_torch``."""
        if not hasattr(self._threads, "ready"):
            self._activate_thread()
        slot = self._slot((shapes, profile))
        if not as_torch:
            return list(slot.inputs)
        if slot.torch_inputs is None:
            slot.torch_inputs = _torch_views(slot.inputs)
        return list(slot.torch_inputs)

    def _run_outer(self, ctx: Any, inspection: Inspection, stream: Any, outputs: Sequence[Any] | None
                   ) -> list[Any]:
        """One call under the outer graph: replay the slot of its (shapes, profile), or
        capture it (its eager warm-up run is then this call's result)."""
        if self._multi_device:
            self._set_device()
        key = (inspection.shapes, inspection.profile)
        slot = self._slots.get(key)
        if slot is None or slot.exec is None:
            # Shapes first: fitting the context's memory to them may drop graphs.
            if ctx.shape_key != key:
                ctx.shape_key = None
                self._apply_shapes(ctx, inspection.shapes, inspection.profile)
                ctx.shape_key = key
            self._refuse_allocators(ctx)
            slot = self._slot(key)
        kind = inspection.kind
        ours = self._stream_handle
        caller = self._caller_stream(stream, kind == KIND_TORCH)
        if caller is not None:
            self._order.before(caller)
        self._fill_inputs(slot, inspection, ours)
        if slot.exec is None:
            self._capture(ctx, slot, ours)  # its eager warm-up run is this call's result
        else:
            self._launch(ctx, slot, ours)
        results = self._graph_results(ctx, slot, inspection, outputs, caller, ours)
        if caller is not None:
            self._order.after(caller)
        if (outputs is None and inspection.remember and kind == KIND_TORCH and inspection.host is None
                and slot.exec is not None):
            if len(self._graph_shortcuts) >= _SHORTCUTS:
                self._graph_shortcuts.clear()
            self._graph_shortcuts[inspection.shapes] = slot
        return results

    def _replay_torch(self, inputs: tuple[Any, ...], stream: Any) -> list[Any] | None:
        """A replay for CUDA torch inputs of shapes already captured; ``None`` when the call
        does not qualify (the full path then checks and runs it). With the static inputs
        passed and ``"view"`` outputs this is one ``cudaGraphLaunch`` (plus events for a
        caller stream other than the legacy default one)."""
        found = self._torch_lookup(inputs, stream, self._graph_shortcuts)
        if found is None:
            return None
        slot, caller = found
        self._slots.touch(slot.key)
        if self._multi_device:
            self._set_device()
        ours = self._stream_handle
        order = self._order
        if caller is not None:
            order.before(caller)
        rt = self._rt
        for x, dst, nbytes in zip(inputs, slot.in_ptrs, slot.in_nbytes, strict=False):
            src = x.data_ptr()
            if src != dst and nbytes:
                d2d = rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
                (err,) = rt.cudaMemcpyAsync(dst, src, nbytes, d2d, ours)
                if err:
                    cuda.check((err,), "cudaMemcpyAsync")
        ctx = self._context
        if ctx.shape_key is not slot.key and ctx.shape_key != slot.key and not self._restore_shapes(
            ctx, slot.key, slot.dynamic_dims, slot.out_shapes
        ):
            self._shapes_refused(slot)
        (err,) = rt.cudaGraphLaunch(slot.exec, ours)
        if err:
            self._launch_failed(err)
        views = slot.torch_outputs
        if views is not None and self._outer_graph.outputs == "view":
            results = list(views)
        else:
            results = self._torch_results(slot, ours)
        if caller is not None:
            order.after(caller)
        return results

    def _torch_results(self, slot: GraphSlot, ours: int) -> list[Any]:
        """Torch outputs of a replay: views of the static buffers, or new tensors."""
        if self._outer_graph.outputs == "view":
            if slot.torch_outputs is None:
                slot.torch_outputs = _torch_views(slot.outputs)
            return list(slot.torch_outputs)
        rt = self._rt
        d2d = rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        empty = self._torch_empty
        torch_device = self._torch_device
        results = []
        for io, arr in zip(self._out, slot.outputs, strict=False):
            y = empty(arr.shape, dtype=io.torch_dtype, device=torch_device)
            nbytes = arr.nbytes
            if nbytes:
                (err,) = rt.cudaMemcpyAsync(y.data_ptr(), arr.ptr, nbytes, d2d, ours)
                if err:
                    cuda.check((err,), "cudaMemcpyAsync")
            results.append(y)
        return results

    # -- slots, capture and launch ----------------------------------------------------------------
    def _slot(self, key: tuple[Any, int]) -> GraphSlot:
        slot = self._slots.peek(key)
        if slot is None:
            slot = GraphSlot(key, self._in, self._state, self._stream, self._device)
            outer = self._outer_graph
            if outer is not None:
                self._slots.max_graphs = outer.max_graphs
            self._slots.add(key, slot, captured=False)
        return slot

    def _fill_inputs(self, slot: GraphSlot, inspection: Inspection, ours: int) -> None:
        """Copy the call's inputs into the static input buffers (not those already there)."""
        rt = self._rt
        host = dict(inspection.host) if inspection.host else None
        if host:
            self._log_staging(inspection.host)  # type: ignore[arg-type]
        copies = zip(inspection.ptrs, slot.in_ptrs, slot.in_nbytes, strict=True)
        for i, (src, dst, nbytes) in enumerate(copies):
            if src == -1 and host is not None:
                src, nbytes = host_memory(host[i])
                kind = rt.cudaMemcpyKind.cudaMemcpyHostToDevice
            elif src == dst:
                continue
            else:
                kind = rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
            if nbytes:
                cuda.check(rt.cudaMemcpyAsync(dst, src, nbytes, kind, ours), "cudaMemcpyAsync")

    def _capture_handle(self) -> int:
        if self._capture_stream is None:
            # A private non-blocking stream: never the legacy default stream, and free of
            # the implicit synchronization a blocking engine stream has with it.
            self._capture_stream = self._state.create_stream()
        return int(self._capture_stream.handle)

    def _capture(self, ctx: Any, slot: GraphSlot, ours: int) -> None:
        """Run the slot once eagerly on ``ours``, then capture and instantiate its graph.
        The context already has the slot's shapes."""
        trt_context = ctx.trt_context
        capture = self._capture_handle()
        capturable = getattr(trt_context, "is_stream_capturable", None)
        if capturable is not None and not capturable(capture):
            raise CapabilityError(
                f"engine {self.name!r}: TensorRT says its execution context cannot be captured into a "
                "CUDA graph (IExecutionContext.is_stream_capturable returned False). TensorRT-RTX captures "
                "only contexts whose memory the application provides (this backend creates them "
                "USER_MANAGED, which engines built with BuilderFlag.REQUIRE_USER_ALLOCATION need); "
                "data-dependent shapes and on-device control flow cannot be captured. Run it without the "
                "outer graph wrap, or with cuda_graph_strategy='whole_graph_capture'"
            )
        if not slot.outputs:
            slot.out_shapes = list(ctx.out_shapes)
            slot.outputs = [_static(self._state, self._stream, tuple(shape), io, self._device)
                            for io, shape in zip(self._out, slot.out_shapes, strict=True)]
            slot.out_ptrs = tuple(a.ptr for a in slot.outputs)
            slot.out_nbytes = tuple(a.nbytes for a in slot.outputs)
        bound = ctx.bound
        for name, ptr in zip(self._io_names, (*slot.in_ptrs, *slot.out_ptrs), strict=True):
            if bound.get(name) != ptr:
                trt_context.set_tensor_address(name, ptr)
                bound[name] = ptr
        ctx.bound_ptrs = ()
        if not trt_context.execute_async_v3(ours):
            self._execute_failed()
        rt = self._rt
        cuda.check(rt.cudaStreamSynchronize(ours), "cudaStreamSynchronize")
        mark = self._logger.mark()
        cuda.check(
            rt.cudaStreamBeginCapture(capture, rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal),
            "cudaStreamBeginCapture",
        )
        try:
            ok = trt_context.execute_async_v3(capture)
        finally:
            err, graph = rt.cudaStreamEndCapture(capture)
        if not ok or err:
            if not err and graph is not None:
                rt.cudaGraphDestroy(graph)
            detail = "; ".join(self._logger.errors_since(mark)[-3:]) or f"cudaStreamEndCapture: {err!s}"
            raise EngineError(
                f"engine {self.name!r}: capturing execute_async_v3 into a CUDA graph failed: {detail}"
            )
        try:
            slot.exec = cuda.check(rt.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")
        finally:
            rt.cudaGraphDestroy(graph)  # the executable graph does not need it
        self._res.graph_execs.append(slot.exec)
        self._graph_captures += 1
        self._slots.captures += 1

    def _refuse_allocators(self, ctx: Any) -> None:
        if ctx.allocators:
            names = sorted(ctx.allocators)
            raise CapabilityError(
                f"engine {self.name!r}: outputs {names} go through an IOutputAllocator (data-dependent "
                "shapes, or output_allocator='always'); a CUDA graph cannot capture them"
            )

    def _shapes_refused(self, slot: GraphSlot) -> None:
        raise EngineError(
            f"engine {self.name!r}: TensorRT rejected the shapes {slot.dynamic_dims} of a captured graph"
        )

    def _launch(self, ctx: Any, slot: GraphSlot, ours: int) -> None:
        if ctx.shape_key != slot.key and not self._restore_shapes(
            ctx, slot.key, slot.dynamic_dims, slot.out_shapes
        ):  # the same memory buffer: it fitted these shapes at capture
            self._shapes_refused(slot)
        (err,) = self._rt.cudaGraphLaunch(slot.exec, ours)
        if err:
            self._launch_failed(err)

    def _launch_failed(self, err: Any) -> None:
        try:
            cuda.check((err,), "cudaGraphLaunch")
        except Exception as exc:
            raise EngineError(f"engine {self.name!r}: replaying its CUDA graph failed: {exc}") from exc

    def _graph_results(self, ctx: Any, slot: GraphSlot, inspection: Inspection,
                       outputs: Sequence[Any] | None, caller: int | None, ours: int) -> list[Any]:
        """The call's outputs from the static output buffers, by output mode and input kind."""
        rt = self._rt
        kind = inspection.kind
        d2d = rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        if outputs is not None:
            given, ptrs = self._check_outputs(ctx, outputs)
            for dst, src, nbytes in zip(ptrs, slot.out_ptrs, slot.out_nbytes, strict=True):
                if nbytes and dst != src:
                    cuda.check(rt.cudaMemcpyAsync(dst, src, nbytes, d2d, ours), "cudaMemcpyAsync")
            if kind == KIND_HOST and caller is None:  # host inputs promise ready results
                cuda.check(rt.cudaStreamSynchronize(ours), "cudaStreamSynchronize")
            return given
        if kind == KIND_HOST:  # host in, host out: always new host arrays
            return self._to_host([(a.ptr, a.shape) for a in slot.outputs], ours, inspection.torch_host)
        if kind == KIND_TORCH:
            return self._torch_results(slot, ours)
        if self._outer_graph.outputs == "view":
            for a in slot.outputs:
                a.stream = ours if caller is None else 0
            return list(slot.outputs)
        results: list[Any] = []
        for io, arr in zip(self._out, slot.outputs, strict=True):
            buf = self._state.allocate(arr.nbytes, self._stream)
            y = DeviceArray(buf, arr.shape, io.dtype, self._device, stream=ours if caller is None else 0)
            if arr.nbytes:
                cuda.check(rt.cudaMemcpyAsync(y.ptr, arr.ptr, arr.nbytes, d2d, ours), "cudaMemcpyAsync")
            results.append(y)
        return results

    def _drop_graphs(self) -> None:
        """Destroy every graph and let go of the static buffers (arrays handed out as views
        keep their memory alive). Called after _sync, with the lane held."""
        self._graph_shortcuts.clear()
        self._slots.clear()
        self._res.graph_execs.clear()

    def _release_slot(self, slot: GraphSlot) -> None:
        """The core's graph cache let go of ``slot`` (evicted or dropped): destroy its graph."""
        self._graph_shortcuts.clear()  # may point at it
        if slot.exec is not None:
            destroy = getattr(self._rt, "cudaGraphExecDestroy", None)
            if destroy is not None:
                destroy(slot.exec)
            execs = self._res.graph_execs
            if slot.exec in execs:
                execs.remove(slot.exec)
            slot.exec = None
