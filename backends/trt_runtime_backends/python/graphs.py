"""The python backend's part of the outer CUDA graph: capture ``execute_async_v3`` into a
CUDA graph and launch it, as the core's :class:`trt_runtime.outer.OuterGraphs` asks.

The core keeps the graphs (per input shapes and profile, an LRU), the static buffers, the
first-call-eager-then-capture rule, the capture lock and the release rules.
:class:`PythonGraphs` is a lane's :class:`~trt_runtime.lane.GraphOps` and keeps the torch
replay fast path (:meth:`PythonGraphs.replay_torch`).

Static buffers are cuda.core device memory, shown as ``DeviceArray``\\ s or zero-copy torch
views. The warm-up run goes on the engine's stream; the capture on a private non-blocking
capture stream (``cudaStreamCaptureModeThreadLocal``; never the legacy default stream),
then the graph is instantiated, or, when the lane has a spare executable graph (the last
one released while its context lives on: an LRU eviction, ``reset_graphs``, a change of
the wrap), that one is updated in place (``cudaGraphExecUpdate``: same topology, new
shapes, addresses and kernel parameters; counted in ``graph_stats()["updates"]``); an
update CUDA refuses falls back to a new instantiation. A replay copies the inputs in (host
inputs straight from host memory), launches the graph on the engine's stream and hands the
outputs over; ordering with the caller's stream is the same as for eager calls
(:mod:`.stream_order`).

A context that TensorRT says cannot be captured (``is_stream_capturable`` false) raises
:class:`~trt_runtime.CapabilityError`; so do outputs that go through an
``IOutputAllocator``. TensorRT-RTX 1.6.1 reports a context capturable when its memory is
provided by the application: the engine creates its contexts ``USER_MANAGED`` (see
``lane.py``); when that memory has to grow for new shapes, the graphs (which hold its
address) are dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from trt_runtime_backends.python import cuda, replay_plans
from trt_runtime_backends.python.arrays import DeviceArray, torch_module
from trt_runtime_backends.python.contract import Inspection
from trt_runtime_backends.python.fast_path import shape_key
from trt_runtime_backends.python.graph_buffers import copy_device, replay_failed, torch_results, torch_views
from trt_runtime_backends.python.output_binding import host_memory
from trt_runtime_backends.python.shapes import apply_shapes

from trt_runtime.contract import KIND_HOST, KIND_TORCH, cuda_result, numel
from trt_runtime.dtypes import itemsize
from trt_runtime.errors import CapabilityError, EngineError
from trt_runtime.graphs import CopyNodes, build_copy_nodes
from trt_runtime.lane import GraphOps
from trt_runtime.outer import GraphSlot, OuterGraphs

if TYPE_CHECKING:
    from trt_runtime_backends.python.lane import PythonLane

__all__ = ["PythonGraphs"]


class PythonGraphs(GraphOps):
    """One lane's outer graphs, the CUDA side: the CUDA runtime, the capture stream, the
    caller stream of the call in flight, capture and launch of ``execute_async_v3``, and the
    torch replay fast path."""

    __slots__ = (
        "caller", "capture_stream", "copying", "d2d", "ops", "res", "rt", "spare", "state", "statics",
    )

    def __init__(self, ops: PythonLane) -> None:
        #: The lane's ops (its context, stream, bindings and ordering).
        self.ops = ops
        rt = self.rt = ops._rt
        self.d2d = rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        #: The engine's ``cuda.DeviceState`` (the capture stream is made on it) and the
        #: finalizer's resources (which destroy the graphs of an engine never closed).
        self.state = ops._state
        self.res = ops._res
        self.capture_stream: Any = None
        #: The caller's stream handle of the call in flight (``None``: no event needed).
        self.caller: int | None = None
        #: :class:`~trt_runtime.graphs.CopyNodes` graphs by their executable graph's handle (``int``).
        self.copying: dict[int, CopyNodes] = {}
        #: ``(executable graph, the context it was captured with)``: the last graph released
        #: while its context lived on, kept for the next capture to update in place.
        self.spare: tuple[Any, Any] | None = None
        #: The slots of the plain replay plans by the ``id`` of the static input buffer each was
        #: last given (one input): a replay given another slot's static buffer goes straight to
        #: that slot's plain plan.
        #: Emptied whenever a graph goes (:meth:`destroy_graph`) and when the profile changes.
        self.statics: dict[int, Any] = {}

    def _outer(self) -> OuterGraphs:
        outer = self.ops.lane.outer_graphs
        assert outer is not None  # (these are its ops)
        return outer

    def close(self) -> None:
        """Close the capture stream (the lane closes, after its graphs were dropped and
        the finalizer destroyed every executable graph, the spare one included)."""
        self.spare = None
        self.copying.clear()
        self.statics.clear()
        stream, self.capture_stream = self.capture_stream, None
        cuda.close_quietly(stream)

    def capture_handle(self) -> int:
        if self.capture_stream is None:
            # A private non-blocking stream: never the legacy default stream, and free of
            # the implicit synchronization a blocking engine stream has with it.
            self.capture_stream = self.state.create_stream()
        return int(self.capture_stream.handle)

    def replay_torch(self, inputs: tuple[Any, ...], stream: Any, graphs: OuterGraphs
                     ) -> list[Any] | None:
        """A replay for CUDA torch inputs of shapes already captured, through the slot's
        plan (:func:`.replay_plans.replay_plan`, made on first use; it becomes the lane's current
        one); ``None`` when no slot has those shapes or its plan just declined the call (the
        full path then checks and runs it). A plan copies each input that is not already
        in its static buffer, makes one ``cudaGraphLaunch`` (no TensorRT call: the graph
        holds its shapes and addresses) and hands over the static outputs (``"view"``) or
        copies of them, all on the caller's stream (:meth:`.stream_order.StreamOrder.follow`)."""
        key = shape_key(inputs)
        slot = None if key is None else graphs.shortcuts.get(key)
        if key is None or slot is None or slot.graph is None:
            return None
        plan = slot.plan
        lane = self.ops
        if plan is None:
            plan = slot.plan = replay_plans.replay_plan(lane, slot, key, graphs)
        return lane.lane.switch_fast(plan, inputs, stream, None)

    # -- GraphOps: what the core's OuterGraphs asks ------------------------------------------
    def graph_call(self, call: Any) -> tuple[Any, Sequence[Any], Sequence[int], Any]:
        """Key, sources (device addresses, or the host arrays), addresses, shortcut key."""
        lane = self.ops
        inspection: Inspection = call
        ptrs = inspection.ptrs
        host = inspection.host
        sources: list[Any] = ptrs
        if host:
            lane._binding.log_staging(host)
            sources = list(ptrs)
            for i, array in host:
                sources[i] = array
        shortcut = None
        if inspection.remember and inspection.kind == KIND_TORCH and host is None:
            shortcut = inspection.shapes
        return (inspection.shapes, inspection.profile), sources, ptrs, shortcut

    def graph_enter(self, stream: Any, call: Any) -> Any:
        lane = self.ops
        lane._order.to_ours()  # the general path works on our stream (see stream_order)
        caller = lane._order.caller(stream, call.kind == KIND_TORCH)
        if caller is not None:
            lane._order.before(caller)
        self.caller = caller
        return lane._stream_handle

    def graph_exit(self, stream: Any) -> None:
        lane = self.ops
        caller = self.caller
        if caller is not None:
            lane._order.after(caller)

    def alloc_static(self, shape: tuple[int, ...], spec: Any) -> tuple[Any, int]:
        lane = self.ops
        if not hasattr(lane._threads, "ready"):
            lane._activate_thread()
        lane._order.to_ours()  # allocated on our stream
        buf = lane._state.allocate(numel(shape) * itemsize(spec.dtype), lane._stream)
        array = DeviceArray(buf, shape, spec.dtype, lane._device)
        return array, array.ptr

    def input_views(self, slot: GraphSlot, as_torch: bool | None) -> list[Any]:
        """``DeviceArray``\\ s, or torch views (through DLPack) when ``as_torch``."""
        if not as_torch:
            return list(slot.inputs)
        if slot.input_views is None:
            slot.input_views = torch_views(slot.inputs)
        return list(slot.input_views)

    def bind_static(self, context: Any, slot: GraphSlot) -> None:
        lane = self.ops
        ctx = context
        key = slot.key
        if ctx.shape_key != key:  # (a context already in the shapes, else the one in use: the
            apply_shapes(lane, ctx, key[0], key[1], make=False)  # replays need none in them)
        if ctx.allocators:
            names = sorted(ctx.allocators)
            raise CapabilityError(
                f"engine {lane.name!r}: outputs {names} go through an IOutputAllocator (data-dependent "
                "shapes, or output_allocator='always'); a CUDA graph cannot capture them"
            )
        trt_context = ctx.trt_context
        capturable = getattr(trt_context, "is_stream_capturable", None)
        if capturable is not None and not capturable(self.capture_handle()):
            raise CapabilityError(
                f"engine {lane.name!r}: TensorRT says its execution context cannot be captured into a "
                "CUDA graph (IExecutionContext.is_stream_capturable returned False). TensorRT-RTX captures "
                "only contexts whose memory the application provides (this backend creates them "
                "USER_MANAGED, which engines built with BuilderFlag.REQUIRE_USER_ALLOCATION need); "
                "data-dependent shapes and on-device control flow cannot be captured. Run it without the "
                "outer graph wrap, or with cuda_graph_strategy='whole_graph_capture'"
            )
        if not slot.outputs:
            self._outer().alloc_outputs(slot, ctx.out_shapes)
        bound = ctx.bound
        ctx.bound_ptrs = ()  # records forgotten before TensorRT is told (see plans._bind)
        for name, ptr in zip(lane._io_names, (*slot.in_ptrs, *slot.out_ptrs), strict=True):
            if bound.get(name) != ptr:
                bound[name] = 0
                trt_context.set_tensor_address(name, ptr)
                bound[name] = ptr

    def graph_capturable(self) -> bool:
        return True

    def warm_up(self, context: Any, slot: GraphSlot, stream: Any) -> None:
        self.enqueue(context, slot, stream)

    def enqueue(self, context: Any, slot: GraphSlot, stream: Any) -> list[Any] | None:
        lane = self.ops
        if not context.trt_context.execute_async_v3(stream):
            lane.execute_failed()
        return None

    def capture(self, fn: Callable[[Any], list[Any] | None], stream: Any, slot: GraphSlot
                ) -> tuple[Any, list[Any] | None]:
        """Capture ``fn`` (``execute_async_v3``) on the capture stream once the warm-up on
        ``stream`` (the engine's) is done, and instantiate the graph; ``slot``'s copies become
        nodes of a second graph built around it (:func:`build_copying`)."""
        lane = self.ops
        rt = lane._rt
        cuda_result(rt.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        capture_stream = self.capture_handle()
        mark = lane._logger.mark()
        mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        cuda_result(
            rt.cudaStreamBeginCapture(capture_stream, mode),
            "cudaStreamBeginCapture",
        )
        ok = False
        try:
            fn(capture_stream)
            ok = True
        except EngineError:
            pass  # said below, with TensorRT's messages
        finally:
            err, graph = rt.cudaStreamEndCapture(capture_stream)
        if not ok or err:
            if not err and graph is not None:
                rt.cudaGraphDestroy(graph)
            detail = "; ".join(lane._logger.errors_since(mark)[-3:]) or f"cudaStreamEndCapture: {err!s}"
            raise EngineError(
                f"engine {lane.name!r}: capturing execute_async_v3 into a CUDA graph failed: {detail}"
            )
        try:
            graph_exec = self.executable(graph)
            outer = lane.lane.outer_graph
            if outer is not None:
                copying = build_copying(lane, graph, slot, copy_out=outer.outputs == "copy")
                if copying is not None:
                    self.copying[int(graph_exec)] = copying
            return graph_exec, None
        finally:
            rt.cudaGraphDestroy(graph)  # the executable graphs do not need it (a child node is a copy)

    def executable(self, graph: Any) -> Any:
        """The executable graph of a captured ``graph``: the lane's spare one updated in place
        when it was captured with the same context and CUDA accepts the update, else a new
        instantiation (the spare one is then destroyed)."""
        lane = self.ops
        rt = lane._rt
        spare, self.spare = self.spare, None
        if spare is not None:
            graph_exec, context = spare
            update = getattr(rt, "cudaGraphExecUpdate", None)
            if update is not None and context is lane.lane.context:
                err, _ = update(graph_exec, graph)
                if not err:
                    self._outer().cache.updates += 1
                    return graph_exec
            self._destroy_exec(graph_exec)
        graph_exec = cuda_result(rt.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")
        lane._res.graph_execs.append(graph_exec)
        return graph_exec

    def launch(self, graph: Any, stream: Any) -> None:
        """Replay a graph. It touches no TensorRT context state: the graph holds its shapes,
        profile and addresses, so the context keeps whatever it had (``shape_key`` stays true)
        and the next eager call sets only what differs."""
        lane = self.ops
        (err,) = self.rt.cudaGraphLaunch(graph, stream)
        if err:
            replay_failed(lane, err)

    def copy(self, dst: Any, src: Any, nbytes: int, stream: Any) -> None:
        """Into a static input (a ``DeviceArray``) from a device address or a host array."""
        lane = self.ops
        if isinstance(src, int):
            copy_device(lane, dst.ptr, src, nbytes, stream)
            return
        rt = lane._rt
        src, nbytes = host_memory(src)
        h2d = rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        cuda_result(rt.cudaMemcpyAsync(dst.ptr, src, nbytes, h2d, stream), "cudaMemcpyAsync")

    def destroy_graph(self, graph: Any) -> None:
        """Keep the released ``graph`` as the lane's spare while its context lives on (the
        spare it replaces is destroyed); destroy it when the context is gone. Its
        :class:`~trt_runtime.graphs.CopyNodes` graph goes either way (the next capture builds its own),
        and so does the lane's ``statics`` (its plans may hold the released slot)."""
        lane = self.ops
        self.statics.clear()
        drop_copying(lane, graph)
        context = lane.lane.context
        if context is not None and getattr(lane._rt, "cudaGraphExecUpdate", None) is not None:
            spare, self.spare = self.spare, (graph, context)
            if spare is not None:
                self._destroy_exec(spare[0])
            return
        self._destroy_exec(graph)

    def drop_spare(self) -> None:
        """Destroy the lane's spare executable graph (its context goes; the lane's work is done)."""
        spare, self.spare = self.spare, None
        if spare is not None:
            self._destroy_exec(spare[0])

    def _destroy_exec(self, graph: Any) -> None:
        lane = self.ops
        drop_copying(lane, graph)
        destroy = getattr(lane._rt, "cudaGraphExecDestroy", None)
        if destroy is not None:
            destroy(graph)
        execs = lane._res.graph_execs
        if graph in execs:
            execs.remove(graph)

    def graph_results(self, context: Any, slot: GraphSlot, call: Any,
                      outputs: Sequence[Any] | None, view: bool, stream: Any) -> list[Any]:
        """The call's outputs from the static output buffers, by output mode and input kind."""
        lane = self.ops
        ctx, inspection, ours = context, call, stream
        rt = lane._rt
        kind = inspection.kind
        caller = self.caller
        if outputs is not None:
            # checked before the launch when the lane knew the shapes, else against the graph's (a
            # replay leaves the context in whatever shapes it had)
            given, ptrs = inspection.checked or lane._binding.check_outputs(
                ctx, outputs, [tuple(a.shape) for a in slot.outputs])
            for dst, src, nbytes in zip(ptrs, slot.out_ptrs, slot.out_nbytes, strict=True):
                if dst != src:
                    copy_device(lane, dst, src, nbytes, ours)
            if kind == KIND_HOST and caller is None:  # host inputs promise ready results
                cuda_result(rt.cudaStreamSynchronize(ours), "cudaStreamSynchronize")
            return given  # type: ignore[no-any-return]
        if kind == KIND_HOST:  # host in, host out: always new host arrays
            staged = [(a.ptr, a.shape) for a in slot.outputs]
            return lane._binding.to_host(staged, ours, inspection.torch_host)  # type: ignore[no-any-return]
        if kind == KIND_TORCH:
            return torch_results(lane, slot, ours, view)
        if view:
            for a in slot.outputs:
                a.stream = ours if caller is None else 0
            return list(slot.outputs)
        results: list[Any] = []
        for io, arr in zip(lane._out, slot.outputs, strict=True):
            buf = lane._state.allocate(arr.nbytes, lane._stream)
            y = DeviceArray(buf, arr.shape, io.dtype, lane._device, stream=ours if caller is None else 0)
            copy_device(lane, y.ptr, arr.ptr, arr.nbytes, ours)
            results.append(y)
        return results


def _graphs(lane: PythonLane) -> PythonGraphs:
    return cast(PythonGraphs, lane.graphs)  # (the lane's graph side, made by PythonGraphs)


def build_copying(lane: PythonLane, graph: Any, slot: GraphSlot, copy_out: bool) -> CopyNodes | None:
    """The :class:`~trt_runtime.graphs.CopyNodes` graph of ``slot``'s captured ``graph``;
    ``None`` when the lane has seen no torch tensor (the replays through nodes take torch
    tensors) or :func:`~trt_runtime.graphs.build_copy_nodes` makes none (replays then copy
    with ``cudaMemcpyAsync``). The static side of each node is the static buffer (cuda.core
    pool memory); the side that changes per call is built on a torch tensor."""
    bridge = lane._torch
    torch = torch_module()
    if bridge.empty is None or torch is None:
        return None

    def placeholder(nbytes: int) -> tuple[Any, int]:
        tensor = bridge.empty((nbytes,), dtype=torch.uint8, device=bridge.device)
        return tensor, tensor.data_ptr()

    outs = list(zip(slot.out_ptrs, slot.out_nbytes, strict=True)) if copy_out else []
    copying = build_copy_nodes(lane._rt, graph, list(zip(slot.in_ptrs, slot.in_nbytes, strict=True)), outs,
                               placeholder, _graphs(lane).d2d)
    if copying is not None:
        lane._res.graph_execs.append(copying.exec)
        lane._res.graphs.append(copying.graph)
    return copying


def drop_copying(lane: PythonLane, graph_exec: Any) -> None:
    """Destroy the :class:`~trt_runtime.graphs.CopyNodes` graph made for ``graph_exec``, if any."""
    copying = _graphs(lane).copying.pop(int(graph_exec), None)
    if copying is None:
        return
    for handles, handle in ((lane._res.graph_execs, copying.exec), (lane._res.graphs, copying.graph)):
        if handle in handles:  # no longer the finalizer's
            handles.remove(handle)
    copying.destroy()
