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
:meth:`OuterGraphs.static_inputs`), launch the graph on the engine's stream and
return the outputs as new arrays (``"copy"``) or as the static buffers themselves
(``"view"``: overwritten by the next replay of that slot). Ordering with the caller's
stream is the same as for eager calls.

A context that TensorRT says cannot be captured (``is_stream_capturable`` false) raises
:class:`~trt_runtime.CapabilityError`; so do outputs that go through an
``IOutputAllocator``. Graphs are dropped (:meth:`OuterGraphs.drop`) when the execution context
is dropped (a settings change), when ``outer_graph`` changes, on ``reset_graphs()`` and
on close; the next call captures again, and when the context's scratch memory has to
grow for new shapes (the graphs hold its address).

TensorRT-RTX 1.6.1 reports a context capturable when its memory is provided by the
application: the engine creates its contexts ``USER_MANAGED`` (see ``engine.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from trt_runtime_backends.python import cuda
from trt_runtime_backends.python.arrays import DeviceArray, torch_module
from trt_runtime_backends.python.contract import Inspection, TensorInfo
from trt_runtime_backends.python.fast_path import torch_lookup
from trt_runtime_backends.python.output_binding import host_memory

from trt_runtime.contract import KIND_HOST, KIND_TORCH, numel
from trt_runtime.errors import CapabilityError, EngineError
from trt_runtime.graphs import GraphCache

__all__ = ["GraphSlot", "OuterGraphs"]

#: How many input-shape signatures the replay shortcut remembers.
_SHORTCUTS = 16


#: Serializes captures (see OuterGraphs.capture).
_CAPTURE_LOCK = threading.Lock()


class GraphSlot:
    """The static buffers and the CUDA graph of one (input shapes, profile)."""

    __slots__ = (
        "exec", "in_nbytes", "in_ptrs", "inputs", "key", "out_nbytes", "out_ptrs",
        "out_shapes", "outputs", "torch_inputs", "torch_outputs",
    )

    def __init__(self, key: tuple[Any, int], ins: Sequence[TensorInfo], state: Any, stream: Any,
                 device: int) -> None:
        shapes, _ = key
        self.key = key
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


class OuterGraphs:
    """The outer CUDA graphs of one lane (a part of each ``PythonEngine`` lane, as
    torchbind's ``OuterGraphs``): owns the graph slots in the core's
    :class:`~trt_runtime.graphs.GraphCache`, the torch replay shortcuts and the capture
    stream. Its methods take the lane whose context they capture and launch."""

    __slots__ = ("cache", "capture_stream", "d2d", "res", "rt", "shortcuts", "state")

    def __init__(self, rt: Any, state: Any, res: Any) -> None:
        self.rt = rt
        self.d2d = rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        #: The engine's ``cuda.DeviceState`` (the capture stream is made on it) and the
        #: finalizer's resources (which destroy the graphs of an engine never closed).
        self.state = state
        self.res = res
        #: Slots by (input shapes, profile), bounded (``OuterGraph.max_graphs``).
        self.cache: GraphCache[tuple[Any, int], GraphSlot] = GraphCache(self._release)
        #: Captured slots of torch calls by input shapes (the replay fast path).
        self.shortcuts: dict[tuple[Any, ...], GraphSlot] = {}
        self.capture_stream: Any = None

    def close(self) -> None:
        """Close the capture stream (the lane closes, after :meth:`drop`)."""
        stream, self.capture_stream = self.capture_stream, None
        cuda.close_quietly(stream)

    def static_inputs(self, lane: Any, shapes: tuple[tuple[int, ...], ...], profile: int,
                      as_torch: bool | None) -> list[Any]:
        """The static buffers of the slot of (``shapes``, ``profile``): ``DeviceArray``s, or
        torch views (through DLPack) when ``as_torch``."""
        if not hasattr(lane._threads, "ready"):
            lane._activate_thread()
        slot = self.slot(lane, (shapes, profile))
        if not as_torch:
            return list(slot.inputs)
        if slot.torch_inputs is None:
            slot.torch_inputs = _torch_views(slot.inputs)
        return list(slot.torch_inputs)

    def run_outer(self, lane: Any, ctx: Any, inspection: Inspection, stream: Any,
                  outputs: Sequence[Any] | None) -> list[Any]:
        """One call under the outer graph: replay the slot of its (shapes, profile), or
        capture it (its eager warm-up run is then this call's result)."""
        if lane._multi_device:
            lane._set_device()
        key = (inspection.shapes, inspection.profile)
        slot = self.cache.get(key)
        if slot is None or slot.exec is None:
            # Shapes first: fitting the context's memory to them may drop graphs.
            if ctx.shape_key != key:
                ctx.shape_key = None
                lane._apply_shapes(ctx, inspection.shapes, inspection.profile)
                ctx.shape_key = key
            self.refuse_allocators(lane, ctx)
            slot = self.slot(lane, key)
        kind = inspection.kind
        ours = lane._stream_handle
        caller = lane._order.caller(stream, kind == KIND_TORCH)
        if caller is not None:
            lane._order.before(caller)
        self.fill_inputs(lane, slot, inspection, ours)
        if slot.exec is None:
            self.capture(lane, ctx, slot, ours)  # its eager warm-up run is this call's result
        else:
            self.launch(lane, ctx, slot, ours)
        results = self.graph_results(lane, ctx, slot, inspection, outputs, caller, ours)
        if caller is not None:
            lane._order.after(caller)
        if (outputs is None and inspection.remember and kind == KIND_TORCH and inspection.host is None
                and slot.exec is not None):
            if len(self.shortcuts) >= _SHORTCUTS:
                self.shortcuts.clear()
            self.shortcuts[inspection.shapes] = slot
        return results

    def replay_torch(self, lane: Any, inputs: tuple[Any, ...], stream: Any) -> list[Any] | None:
        """A replay for CUDA torch inputs of shapes already captured; ``None`` when the call
        does not qualify (the full path then checks and runs it). One dict get finds the
        slot; then one copy per input not already in its static buffer, one
        ``cudaGraphLaunch`` (no TensorRT call: the graph holds its shapes and addresses),
        and the static outputs (``"view"``) or copies of them, all on the caller's stream
        (:meth:`.stream_order.StreamOrder.follow`)."""
        found = torch_lookup(lane, inputs, stream, self.shortcuts)
        if found is None:
            return None
        slot, caller = found
        self.cache.touch(slot.key)
        if lane._multi_device:
            lane._set_device()
        order = lane._order
        run = order.tail  # the caller's stream when it made the lane's previous call too
        if caller != run and (caller is not None or run != lane._stream_handle):
            run = order.follow(caller)
        rt = self.rt
        for x, dst, nbytes in zip(inputs, slot.in_ptrs, slot.in_nbytes, strict=False):
            src = x.data_ptr()
            if src != dst and nbytes:
                (err,) = rt.cudaMemcpyAsync(dst, src, nbytes, self.d2d, run)
                if err:
                    cuda.check((err,), "cudaMemcpyAsync")
        (err,) = rt.cudaGraphLaunch(slot.exec, run)
        if err:
            self.launch_failed(lane, err)
        views = slot.torch_outputs  # made only in "view" mode
        results = list(views) if views is not None else self.torch_results(lane, slot, run)
        if caller is not None and run != caller:
            order.after(caller)
        return results

    def torch_results(self, lane: Any, slot: GraphSlot, ours: int) -> list[Any]:
        """Torch outputs of a replay: views of the static buffers, or new tensors."""
        if lane._outer_graph.outputs == "view":
            if slot.torch_outputs is None:
                slot.torch_outputs = _torch_views(slot.outputs)
            return list(slot.torch_outputs)
        rt = lane._rt
        d2d = rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        empty = lane._torch.empty
        torch_device = lane._torch.device
        results = []
        for io, arr in zip(lane._out, slot.outputs, strict=False):
            y = empty(arr.shape, dtype=io.torch_dtype, device=torch_device)
            nbytes = arr.nbytes
            if nbytes:
                (err,) = rt.cudaMemcpyAsync(y.data_ptr(), arr.ptr, nbytes, d2d, ours)
                if err:
                    cuda.check((err,), "cudaMemcpyAsync")
            results.append(y)
        return results

    # -- slots, capture and launch ----------------------------------------------------------------
    def slot(self, lane: Any, key: tuple[Any, int]) -> GraphSlot:
        slot = self.cache.peek(key)
        if slot is None:
            slot = GraphSlot(key, lane._in, lane._state, lane._stream, lane._device)
            outer = lane._outer_graph
            if outer is not None:
                self.cache.max_graphs = outer.max_graphs
            self.cache.add(key, slot, captured=False)
        return slot

    def fill_inputs(self, lane: Any, slot: GraphSlot, inspection: Inspection, ours: int) -> None:
        """Copy the call's inputs into the static input buffers (not those already there)."""
        rt = lane._rt
        host = dict(inspection.host) if inspection.host else None
        if host:
            lane._binding.log_staging(inspection.host)  # type: ignore[arg-type]
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

    def capture_handle(self) -> int:
        if self.capture_stream is None:
            # A private non-blocking stream: never the legacy default stream, and free of
            # the implicit synchronization a blocking engine stream has with it.
            self.capture_stream = self.state.create_stream()
        return int(self.capture_stream.handle)

    def capture(self, lane: Any, ctx: Any, slot: GraphSlot, ours: int) -> None:
        """Run the slot once eagerly on ``ours``, then capture and instantiate its graph.
        The context already has the slot's shapes.

        One capture at a time in the process (:data:`_CAPTURE_LOCK`): TensorRT-RTX 1.6.1
        crashed (segfault, H100, 2026-11-24) when two contexts of one engine ran this at
        once. Captures happen once per shapes and context, so the lock costs no steady call.
        """
        with _CAPTURE_LOCK:
            self._capture(lane, ctx, slot, ours)

    def _capture(self, lane: Any, ctx: Any, slot: GraphSlot, ours: int) -> None:
        trt_context = ctx.trt_context
        capture = self.capture_handle()
        capturable = getattr(trt_context, "is_stream_capturable", None)
        if capturable is not None and not capturable(capture):
            raise CapabilityError(
                f"engine {lane.name!r}: TensorRT says its execution context cannot be captured into a "
                "CUDA graph (IExecutionContext.is_stream_capturable returned False). TensorRT-RTX captures "
                "only contexts whose memory the application provides (this backend creates them "
                "USER_MANAGED, which engines built with BuilderFlag.REQUIRE_USER_ALLOCATION need); "
                "data-dependent shapes and on-device control flow cannot be captured. Run it without the "
                "outer graph wrap, or with cuda_graph_strategy='whole_graph_capture'"
            )
        if not slot.outputs:
            slot.out_shapes = list(ctx.out_shapes)
            slot.outputs = [_static(lane._state, lane._stream, tuple(shape), io, lane._device)
                            for io, shape in zip(lane._out, slot.out_shapes, strict=True)]
            slot.out_ptrs = tuple(a.ptr for a in slot.outputs)
            slot.out_nbytes = tuple(a.nbytes for a in slot.outputs)
        bound = ctx.bound
        for name, ptr in zip(lane._io_names, (*slot.in_ptrs, *slot.out_ptrs), strict=True):
            if bound.get(name) != ptr:
                trt_context.set_tensor_address(name, ptr)
                bound[name] = ptr
        ctx.bound_ptrs = ()
        if not trt_context.execute_async_v3(ours):
            lane._execute_failed()
        rt = lane._rt
        cuda.check(rt.cudaStreamSynchronize(ours), "cudaStreamSynchronize")
        mark = lane._logger.mark()
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
            detail = "; ".join(lane._logger.errors_since(mark)[-3:]) or f"cudaStreamEndCapture: {err!s}"
            raise EngineError(
                f"engine {lane.name!r}: capturing execute_async_v3 into a CUDA graph failed: {detail}"
            )
        try:
            slot.exec = cuda.check(rt.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")
        finally:
            rt.cudaGraphDestroy(graph)  # the executable graph does not need it
        lane._res.graph_execs.append(slot.exec)
        lane._graph_captures += 1  # the core's count, per lane
        self.cache.captures += 1

    def refuse_allocators(self, lane: Any, ctx: Any) -> None:
        if ctx.allocators:
            names = sorted(ctx.allocators)
            raise CapabilityError(
                f"engine {lane.name!r}: outputs {names} go through an IOutputAllocator (data-dependent "
                "shapes, or output_allocator='always'); a CUDA graph cannot capture them"
            )

    def launch(self, lane: Any, ctx: Any, slot: GraphSlot, ours: int) -> None:
        """Replay the slot's graph. It touches no TensorRT context state: the graph holds its
        shapes, profile and addresses, so the context keeps whatever it had (``shape_key``
        stays true) and the next eager call sets only what differs."""
        (err,) = lane._rt.cudaGraphLaunch(slot.exec, ours)
        if err:
            self.launch_failed(lane, err)

    def launch_failed(self, lane: Any, err: Any) -> None:
        try:
            cuda.check((err,), "cudaGraphLaunch")
        except Exception as exc:
            raise EngineError(f"engine {lane.name!r}: replaying its CUDA graph failed: {exc}") from exc

    def graph_results(self, lane: Any, ctx: Any, slot: GraphSlot, inspection: Inspection,
                       outputs: Sequence[Any] | None, caller: int | None, ours: int) -> list[Any]:
        """The call's outputs from the static output buffers, by output mode and input kind."""
        rt = lane._rt
        kind = inspection.kind
        d2d = rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        if outputs is not None:
            given, ptrs = lane._binding.check_outputs(ctx, outputs)
            for dst, src, nbytes in zip(ptrs, slot.out_ptrs, slot.out_nbytes, strict=True):
                if nbytes and dst != src:
                    cuda.check(rt.cudaMemcpyAsync(dst, src, nbytes, d2d, ours), "cudaMemcpyAsync")
            if kind == KIND_HOST and caller is None:  # host inputs promise ready results
                cuda.check(rt.cudaStreamSynchronize(ours), "cudaStreamSynchronize")
            return given
        if kind == KIND_HOST:  # host in, host out: always new host arrays
            staged = [(a.ptr, a.shape) for a in slot.outputs]
            return lane._binding.to_host(staged, ours, inspection.torch_host)
        if kind == KIND_TORCH:
            return self.torch_results(lane, slot, ours)
        if lane._outer_graph.outputs == "view":
            for a in slot.outputs:
                a.stream = ours if caller is None else 0
            return list(slot.outputs)
        results: list[Any] = []
        for io, arr in zip(lane._out, slot.outputs, strict=True):
            buf = lane._state.allocate(arr.nbytes, lane._stream)
            y = DeviceArray(buf, arr.shape, io.dtype, lane._device, stream=ours if caller is None else 0)
            if arr.nbytes:
                cuda.check(rt.cudaMemcpyAsync(y.ptr, arr.ptr, arr.nbytes, d2d, ours), "cudaMemcpyAsync")
            results.append(y)
        return results

    def drop(self) -> None:
        """Destroy every graph and let go of the static buffers (arrays handed out as views
        keep their memory alive). Called after _sync, with the lane held."""
        self.shortcuts.clear()
        self.cache.clear()
        self.res.graph_execs.clear()

    def _release(self, slot: GraphSlot) -> None:
        """The core's graph cache let go of ``slot`` (evicted or dropped): destroy its graph."""
        self.shortcuts.clear()  # may point at it
        if slot.exec is not None:
            destroy = getattr(self.rt, "cudaGraphExecDestroy", None)
            if destroy is not None:
                destroy(slot.exec)
            execs = self.res.graph_execs
            if slot.exec in execs:
                execs.remove(slot.exec)
            slot.exec = None
