"""The torchbind backend's part of the outer CUDA graph: ``execute_engine`` captured into a
``torch.cuda.CUDAGraph`` and replayed, as the core's :class:`trt_runtime.outer.OuterGraphs`
asks.

The core keeps the graphs (per input shapes, an LRU), the static inputs, the
first-call-eager-then-capture rule, the capture lock and the release rules;
:class:`TorchbindGraphs` is a lane's :class:`~trt_runtime.lane.GraphOps`, and
:meth:`TorchbindGraphs.replay_plan` makes the replay fast path.

It follows torch-tensorrt's own cudagraphs module (``_CudaGraphsTorchTensorRTModule``):
static input tensors owned by the engine, a warm-up on a side stream so that first-run
allocations and kernel compilation stay out of the graph, capture under
``torch.cuda.graph(graph, stream=side)``, then ``replay()``; the static outputs are the
tensors the captured call returned, cloned (``"copy"``) or returned as they are
(``"view"``). Where it differs: a graph is kept per input-shape key (torch-tensorrt keeps
one and captures again on every shape change); capture happens on an engine-owned side
stream, never on the legacy default stream, ordered against the caller's stream with
events; replays run on the caller's stream, so a call queues a graph launch and its copies
and nothing else. Where torch keeps the captured graph (``keep_graph=True``) and cuda-python
is there, those copies are memcpy nodes of a second graph built around it
(:meth:`TorchbindGraphs.copy_nodes`, as the python backend does): one launch per call. When
replays move to another stream, that stream first waits for the last one (the graphs share
the execution context's memory).

torch-tensorrt's ``execute_engine`` ignores a failed ``enqueueV3``; a context TensorRT-RTX
cannot capture (engines built without ``BuilderFlag.REQUIRE_USER_ALLOCATION``) would give a
graph that computes nothing. So each new graph is replayed once into outputs filled with
NaN and compared with the warm-up run; a graph that left them unwritten, or a capture that
raised, is a :class:`~trt_runtime.CapabilityError` (which the core keeps until the graphs
are dropped).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from operator import is_not
from typing import TYPE_CHECKING, Any

from trt_runtime.contract import KIND_HOST
from trt_runtime.errors import CapabilityError, EngineError, TrtRuntimeError
from trt_runtime.graphs import CopyNodes
from trt_runtime.lane import GraphOps
from trt_runtime.outer import GraphSlot
from trt_runtime.slabs import slab_pools

from .bridge import translate_errors
from .lane import CURRENT

if TYPE_CHECKING:
    from .contract import Call
    from .lane import TorchbindLane

__all__ = ["WARMUP_RUNS", "TorchbindGraphs"]

#: Eager runs on the side stream before a capture: the first compiles TensorRT-RTX's
#: kernels for the shapes, the second settles what the first allocated.
WARMUP_RUNS = 2

_NOT_CAPTURABLE = (
    "TensorRT-RTX captures an execution context only when the engine was built with "
    "BuilderFlag.REQUIRE_USER_ALLOCATION and "
    "IExecutionContext.is_stream_capturable is true; run the engine without the outer "
    "graph, or with cuda_graph_strategy='whole_graph_capture' (TensorRT-RTX's own capture)"
)


class TorchbindGraphs(GraphOps):
    """One lane's outer graphs, the backend's side: their streams, the capture and replay
    of ``execute_engine``, and the replay fast path. Not thread-safe: the lane is leased by
    one call. (Static inputs are torch CUDA tensors whatever ``static_inputs(as_torch=)``
    says: this backend has no other kind.)"""

    __slots__ = ("bridge", "caller_stream", "copying", "device", "eager", "last", "last_raw",
                 "ops", "scope", "side")

    def __init__(self, ops: TorchbindLane) -> None:
        #: The lane's ops (the engine's ``execute_engine``, its stream bookkeeping).
        self.ops = ops
        self.device = ops.shared.device
        self.bridge = ops.shared.runtime.bridge
        #: The graphs' copies as nodes (:meth:`copy_nodes`), by ``id(graph)``.
        self.copying: dict[int, CopyNodes] = {}
        self.side: Any = None  # the capture stream, made at the first capture
        self.last: Any = None  # the stream the graphs last ran on
        self.last_raw: int | None = None  # its handle, when a replay put it there
        #: The warm-up's outputs, which the new graph's check compares with.
        self.eager: list[Any] = []
        #: The call in flight: the stream scope entered for it, and whether ``stream=`` was given.
        self.scope: Any = None
        self.caller_stream = False

    def streams(self) -> tuple[Any, ...]:
        """The streams the graphs ran on: each replay waits for the one before (``last``),
        so these cover them all."""
        return tuple(s for s in (self.last, self.side) if s is not None)

    def release(self) -> None:
        side, self.side, self.last, self.last_raw = self.side, None, None, None
        if side is not None:
            self.bridge.give_back(side)

    def follow(self, current: Any) -> None:
        """Order ``current`` after the stream the graphs last ran on; it becomes the last."""
        last = self.last
        if last is not None and last is not current:
            self.bridge.wait_stream(current, last)
        self.last = current
        self.last_raw = None

    def copy_nodes(self, slot: GraphSlot, view: bool) -> CopyNodes | None:
        """``slot``'s replay copies as memcpy nodes around its graph (the bridge's
        :meth:`~.bridge.TorchBridge.copy_nodes`: inputs in and, unless ``view``, outputs
        out), made once per graph; ``None`` where they cannot be made. (A change of output
        mode drops the graphs, so one graph's nodes serve one mode.)"""
        key = id(slot.graph)
        made = self.copying.get(key)
        if made is None:
            ins = [(t.data_ptr(), t.numel() * t.element_size()) for t in slot.inputs]
            outs = [] if view else [(t.data_ptr(), t.numel() * t.element_size()) for t in slot.outputs]
            made = self.bridge.copy_nodes(slot.graph, ins, outs, self.device)
            if made is None:
                return None
            if not self.copying:  # destroyed with this lane if nothing released them before,
                # but not at interpreter exit, where a daemon thread may still replay them
                weakref.finalize(self, _destroy_nodes, self.copying).atexit = False
            self.copying[key] = made
        return made

    def drop_nodes(self, graph: Any) -> None:
        """Destroy the copy nodes made for ``graph`` (before the graph itself goes)."""
        made = self.copying.pop(id(graph), None)
        if made is not None:
            made.destroy()

    def replay_plan(self, slot: GraphSlot, shapes: tuple[Any, ...], view: bool
                    ) -> Callable[[tuple[Any, ...], Any, Any], list[Any] | None]:
        """The replay fast path of ``slot`` (captured for torch inputs of ``shapes``) as one
        function, the lane's ``fast_entry`` while its calls keep coming: it checks what the
        shortcut lookup checked (CUDA torch tensors of the engine's dtypes, contiguous, of
        these shapes, on the engine's device and current there; no ``stream=`` or
        ``outputs=``), copies each input that is not the static input itself, launches the
        graph on torch's current stream and hands the static outputs over (``view``) or
        clones of them; a call of another captured shape goes to that slot's plan, any
        other call to the lane's ``call_fast``.

        The current stream is told by its handle (torch's stream object only when it moved),
        and the graph is launched through cuda-python's ``cudaGraphLaunch`` of its executable
        graph where there is one (:meth:`.bridge.TorchBridge.graph_launcher`: about 1 µs less
        per call than ``CUDAGraph.replay()``, measured on an H100), else ``replay()``; the
        inputs are then copied with the launcher's device copy too (one cuda-python call
        instead of a torch operation). Where the copies can be nodes of a second graph
        (:meth:`copy_nodes`), a call whose inputs are none of the static inputs sets the
        nodes' addresses where they changed (the new outputs' too, made with ``empty_like``)
        and launches that graph once: about 8 µs against 16 to 20 for copy, launch and clone (H100,
        ``benchmarks/probes/gpu_keep_graph_probe.py``); an address CUDA refuses sends that call the
        other way. The lane's ``last_stream`` is then :data:`CURRENT` (torch's current stream)."""
        bridge = self.bridge
        lane = self.ops
        core = lane.lane
        outer = core.outer_graphs
        assert outer is not None
        name = lane.name
        current = CURRENT
        miss = lane.call_fast
        cache = outer.cache
        refresh = cache.refresh
        shortcuts = outer.shortcuts  # keyed as TorchbindLane.torch_key keys
        key = slot.key
        statics = tuple(slot.inputs)
        outputs = slot.outputs
        tensor_type = lane._tensor_type
        checks = tuple(zip(lane._torch_dtypes, shapes, strict=True))
        n = len(checks)
        device = self.device
        single = lane._single_device
        raw_stream = bridge.raw_current_stream
        copy_, clone = bridge.copy_, bridge.clone
        graph = slot.graph
        launch = copy = None
        if raw_stream(device) is not None:  # else this torch tells the stream only as an object
            launch, copy = bridge.graph_launcher(graph) or (_on_current(bridge, graph), None)
        # each static input with its address and size, for copies through ``copy``
        targets = tuple((s, s.data_ptr(), s.numel() * s.element_size()) for s in statics)
        ops = self
        nodes = None if launch is None or bridge.empty_like is None else self.copy_nodes(slot, view)
        cexec: Any = None
        point: Any = None
        launch_nodes: Any = None
        empty_like: Any = bridge.empty_like
        # each static output to copy out through its node: the output, its address and size
        out_targets = () if view else tuple((o, o.data_ptr(), o.numel() * o.element_size()) for o in outputs)
        if nodes is not None and len(nodes.outs) == len(out_targets):  # nodes made for this mode
            cexec, point, launch_nodes = nodes.exec, nodes.point, nodes.rt.cudaGraphLaunch
        # "copy" mode through the nodes: the outputs from slabs (trt_runtime.slabs), one
        # torch.empty per SLAB_CALLS calls, each call's at a new address its node is pointed at
        pools: Any = None
        refill: Any = None
        if cexec is not None and out_targets:
            pools, refill = slab_pools(bridge.empty, outputs[0].device, [tuple(o.shape) for o in outputs],
                                       [o.dtype for o in outputs]) or (None, None)

        (dtype0, shape0), static0 = checks[0], statics[0]

        def plan(inputs: tuple[Any, ...], stream: Any, outs: Any) -> list[Any] | None:
            if stream is not None or outs is not None or len(inputs) != n:
                return miss(inputs, stream, outs)
            if n == 1:  # (most engines: the loop below unrolled)
                x = inputs[0]
                if (type(x) is not tensor_type or x.dtype is not dtype0 or not x.is_cuda
                        or not x.is_contiguous()):
                    return miss(inputs, stream, outs)
                shaped = x.shape == shape0
            else:
                shaped = True
                for x, (dtype, shape) in zip(inputs, checks):  # noqa: B905 - lengths checked above
                    if (type(x) is not tensor_type or x.dtype is not dtype or not x.is_cuda
                            or not x.is_contiguous()):
                        return miss(inputs, stream, outs)
                    if x.shape != shape:
                        shaped = False
            if not shaped:  # another shape: that shape's plan, if it has one (not round miss)
                other = shortcuts.get((inputs[0].shape,) if n == 1 else tuple([x.shape for x in inputs]))
                other = None if other is None or other.graph is None else other.plan
                if other is None or other is core.fast_entry:
                    return miss(inputs, stream, outs)
                core.fast_entry = other
                return other.go(inputs, stream, outs)  # type: ignore[no-any-return]  # checked here
            return go(inputs, stream, outs)

        def go(inputs: tuple[Any, ...], stream: Any, outs: Any) -> list[Any] | None:
            """The replay of inputs that passed ``plan``'s checks (this plan's, or another
            plan's of the lane on a shape switch: one tensor type and dtypes per lane)."""
            if slot.graph is None or (not single and (
                lane._get_device() != device or any(x.get_device() != device for x in inputs)
            )):
                return miss(inputs, stream, outs)
            cache.hits += 1  # (GraphCache.touch, inline)
            refresh(key)
            raw: Any = None
            if launch is None:
                ops.follow(bridge.current_stream(device))
            else:
                raw = raw_stream(device)
                if raw != ops.last_raw:
                    ops.follow(bridge.current_stream(device))
                    ops.last_raw = raw
            if cexec is not None and (inputs[0] is not static0 if n == 1 else
                                      all(map(is_not, inputs, statics))):
                # through the copy nodes: pointed where they changed, one launch (a static
                # input given needs no copy in: the other way; so does an address CUDA refuses)
                ok = True
                for i, ((_, dst, nbytes), x) in enumerate(zip(targets, inputs)):  # noqa: B905
                    if not point(i, dst, x.data_ptr(), nbytes):
                        ok = False
                        break
                results = list(outputs) if view else []
                made = None if pools is None or not ok else (pools.get(raw) or refill(raw)).pop()
                for i, (o, src, nbytes) in enumerate(out_targets, n):
                    if not ok:
                        break
                    y = empty_like(o) if made is None else made[i - n]
                    ok = point(i, y.data_ptr(), src, nbytes)
                    results.append(y)
                if ok:
                    (err,) = launch_nodes(cexec, raw)
                    if err:
                        raise EngineError(f"engine {name!r}: replaying a CUDA graph failed: "
                                          f"cudaGraphLaunch returned {err!r}")
                    lane.last_stream = current
                    return results
            for (static, dst, nbytes), x in zip(targets, inputs):  # noqa: B905
                if x is not static:  # the caller may fill the static inputs itself
                    if copy is None:
                        copy_(static, x)
                    elif nbytes and (err := copy(dst, x.data_ptr(), nbytes, raw)):
                        raise EngineError(f"engine {name!r}: copying an input into its CUDA graph's "
                                          f"static buffer failed: {err!r}")
            if launch is None:
                bridge.replay(graph)
            else:
                launch(raw)
            lane.last_stream = current
            return list(outputs) if view else [clone(o) for o in outputs]

        plan.go = go  # type: ignore[attr-defined]  # where another plan's shape switch enters
        return plan


    # -- GraphOps: what the core's OuterGraphs asks -------------------------------------------
    def graph_call(self, call: Any) -> tuple[Any, Sequence[Any], Sequence[int], Any]:
        shared = self.ops.shared
        if call.host:
            shared.log_staging(call)
        host = call.host
        addresses = [-1 if i in host else t.data_ptr() for i, t in enumerate(call.tensors)]
        key = (call.shapes, shared.contract.shapes.select(call.shapes, None))
        return key, call.tensors, addresses, call.shapes

    def graph_enter(self, stream: Any, call: Call) -> Any:
        """The caller's torch stream (``stream``, or torch's current one on the engine's
        device), made current for the call; it waits for the graphs' last stream."""
        bridge = self.bridge
        ops = self.ops
        self.caller_stream = stream is not None
        if stream is None and (ops._single_device or ops._get_device() == self.device):
            current = bridge.current_stream(self.device)
            self.follow(current)
            return current
        with translate_errors(ops.name, "resolving the stream"):
            current = bridge.resolve_stream(stream, self.device)
        self.follow(current)
        scope = bridge.stream_scope(current)
        scope.__enter__()
        self.scope = scope
        return current

    def graph_exit(self, stream: Any) -> None:
        scope, self.scope = self.scope, None
        if scope is None:
            self.ops.last_stream = CURRENT
        else:
            self.ops.last_stream = stream
            scope.__exit__(None, None, None)

    def graph_capturable(self) -> bool:
        return self.ops.shared.graph_capturable(self.ops.lane.settings)

    def alloc_static(self, shape: tuple[int, ...], spec: Any) -> tuple[Any, int]:
        tensor = self.bridge.zeros(shape, spec.dtype, self.device)
        return tensor, tensor.data_ptr()

    def input_views(self, slot: GraphSlot, as_torch: bool | None) -> list[Any]:
        return list(slot.inputs)

    def bind_static(self, context: Any, slot: GraphSlot) -> None:
        """Nothing to bind: ``execute_engine`` takes the static inputs as its arguments and
        allocates the outputs (the captured call's outputs become the static outputs)."""

    def warm_up(self, context: Any, slot: GraphSlot, stream: Any) -> None:
        """``WARMUP_RUNS`` eager runs on the side stream, after the caller's stream (which
        copied the inputs in)."""
        bridge = self.bridge
        if self.side is None:
            self.side = bridge.new_stream(self.device)
        side = self.side
        bridge.wait_stream(side, stream)  # the caller's stream copied the inputs in
        try:
            with bridge.stream_scope(side):
                for _ in range(WARMUP_RUNS):
                    self.eager = self.ops.raw_execute(slot.inputs)
        except TrtRuntimeError:
            raise
        except Exception as exc:
            raise EngineError(
                f"engine {self.ops.name!r}: execute_engine failed in torch-tensorrt's runtime "
                f"(warm-up before the outer CUDA graph capture): {exc}"
            ) from exc

    def enqueue(self, context: Any, slot: GraphSlot, stream: Any) -> list[Any] | None:
        """One ``execute_engine`` on the static inputs, on the current stream."""
        return self.ops.raw_execute(slot.inputs)

    def capture(self, fn: Callable[[Any], list[Any] | None], stream: Any, slot: GraphSlot
                ) -> tuple[Any, list[Any] | None]:
        """Capture ``fn`` on the side stream (after the warm-up there), check that the graph
        writes its outputs, and order the caller's stream after it."""
        bridge = self.bridge
        side = self.side
        name = self.ops.name
        try:
            graph, outputs = bridge.capture(lambda: fn(side), side)
        except Exception as exc:
            raise CapabilityError(
                f"engine {name!r}: the outer CUDA graph could not capture torch-tensorrt's "
                f"execute_engine ({type(exc).__name__}: {exc}); {_NOT_CAPTURABLE}"
            ) from exc
        outputs = list(outputs)
        eager, self.eager = self.eager, []
        try:
            self._verify(graph, outputs, eager, side)
        except TrtRuntimeError:
            raise
        except Exception as exc:  # the replay itself failed
            raise CapabilityError(
                f"engine {name!r}: the outer CUDA graph captured from torch-tensorrt's "
                f"execute_engine could not be replayed ({type(exc).__name__}: {exc}); {_NOT_CAPTURABLE}"
            ) from exc
        bridge.wait_stream(stream, side)  # the caller's stream waits for the capture
        return graph, outputs

    def _verify(self, graph: Any, outputs: list[Any], eager: list[Any], side: Any) -> None:
        """Replay the new graph into NaN-filled outputs once: an output it did not write
        means TensorRT-RTX enqueued nothing under capture (waits for the side stream)."""
        bridge = self.bridge
        names = [o.name for o in self.ops.shared.outputs]
        with bridge.stream_scope(side):
            poisoned = [bridge.poison(o) for o in outputs]
            bridge.replay(graph)
            for name, out, ref, checked in zip(names, outputs, eager, poisoned, strict=True):
                if checked and bridge.unwritten(out, ref):
                    bridge.reset_graph(graph)
                    raise CapabilityError(
                        f"engine {self.ops.name!r}: the CUDA graph captured from torch-tensorrt's "
                        f"execute_engine did not write output {name!r}: TensorRT-RTX did not enqueue "
                        f"the engine under stream capture; {_NOT_CAPTURABLE}"
                    )

    def launch(self, graph: Any, stream: Any) -> None:
        try:
            self.bridge.replay(graph)
        except Exception as exc:
            raise self._torch_failed(exc) from exc

    def copy(self, dst: Any, src: Any, nbytes: int, stream: Any) -> None:
        """Into a static input, on the current stream (host tensors included)."""
        try:
            self.bridge.copy_(dst, src)
        except Exception as exc:
            raise self._torch_failed(exc) from exc

    def destroy_graph(self, graph: Any) -> None:
        self.drop_nodes(graph)  # first: they run the graph's memory
        self.bridge.reset_graph(graph)

    def graph_results(self, context: Any, slot: GraphSlot, call: Any, outputs: Sequence[Any] | None,
                      view: bool, stream: Any) -> list[Any]:
        """Clones of the static outputs (``"copy"``), the static outputs (``"view"``), or
        ``outputs=`` filled from them (nothing allocated); host calls get host arrays."""
        bridge = self.bridge
        try:
            if outputs is not None:
                views = call.views
                assert views is not None
                self.ops.shared.contract.check_results(slot.outputs, views)
                for dst, src in zip(views, slot.outputs, strict=True):
                    bridge.copy_(dst, src)
                if call.kind == KIND_HOST and not self.caller_stream:  # host inputs promise ready results
                    bridge.synchronize(stream)
                return list(outputs)
            if call.kind == KIND_HOST:
                host = [bridge.to_host(r) for r in slot.outputs]  # new arrays, whatever the mode
                return host if call.torch_host else [bridge.to_numpy(t) for t in host]
            if view:
                return list(slot.outputs)
            return [bridge.clone(o) for o in slot.outputs]
        except TrtRuntimeError:
            raise
        except Exception as exc:
            raise self._torch_failed(exc) from exc

    def _torch_failed(self, exc: Exception) -> EngineError:
        return EngineError(f"engine {self.ops.name!r}: the call failed in torch: {exc}")

def _destroy_nodes(copying: dict[int, CopyNodes]) -> None:
    """Destroy the copy nodes a lane still holds (it was collected without a close)."""
    while copying:
        copying.popitem()[1].destroy()


def _on_current(bridge: Any, graph: Any) -> Callable[[int], None]:
    """Launch ``graph`` with ``CUDAGraph.replay()`` (on torch's current stream)."""

    def launch(raw: int) -> None:
        bridge.replay(graph)

    return launch
