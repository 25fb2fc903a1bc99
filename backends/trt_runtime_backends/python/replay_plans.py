"""Replay plans: the python backend's fast path for ``engine(x)`` under the outer CUDA graph.

A *replay* plan (see :mod:`.plans` for what a plan is) belongs to one outer-graph slot
(``trt_runtime.outer.GraphSlot``): the call of its input shapes, replayed. Inputs of another
shape captured before go straight to that slot's plan (a dynamic engine fed shapes in turn
switches plans on every call). A slot has a *plain* plan (copies with ``cudaMemcpyAsync``
where an input is not its static buffer, one launch) and, when its copies could be made
memcpy nodes of a second graph (``trt_runtime.graphs.CopyNodes``), a *copying* plan, which
hands calls given a static buffer to the plain one; in ``"copy"`` mode the copying plan's
outputs come from slabs, as a natural call's do. The plain plan is the slot's
``static_plan``, the copying one (else the plain one) its ``plan``.

A plain plan given its static buffer itself remembers that tensor object, and the lane's
``statics`` (:class:`.graphs.PythonGraphs`) maps it to the slot: a repeat call with it, or a
call of another slot's plan with it, skips the input checks and is a lookup, two checks of
the tensor and the launch.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any

from trt_runtime_backends.python.graph_buffers import replay_failed, torch_results
from trt_runtime_backends.python.plans import Plan, fits, follow

from trt_runtime.slabs import slab_pools

__all__ = ["replay_plan"]

#: What a plain replay plan remembers as its static buffer before any call gave it one: no input is it.
_NO_TENSOR: Any = object()


def _enter(lane: Any, miss: Any, table: dict[Any, Any], plain_first: bool, shapes: tuple[Any, ...],
           inputs: tuple[Any, ...], stream: Any, outputs: Any) -> Any:
    """Hand a replay of inputs of other ``shapes`` to the plan of the slot ``table`` holds for
    them (its plain plan when ``plain_first``: calls given static buffers come in runs), which
    becomes the lane's current plan, entered past the input checks the call just passed (every
    plan of a lane makes them alike: one tensor type, the same dtypes); ``miss`` when there is
    none or it is the current plan (it declined this very call)."""
    core = lane.lane  # the core lane: its context and current plan
    slot = table.get(shapes)
    other = None if slot is None or slot.graph is None else slot.static_plan if plain_first else slot.plan
    if other is None or other is core.fast_entry:
        return miss(inputs, stream, outputs)
    core.fast_entry = other
    return other(inputs, stream, outputs, True)


def _plain_replay(lane: Any, miss: Any, order: Any, own: Any, slot: Any, tensor: Any, dtypes: Sequence[Any],
                  shapes: tuple[Any, ...], table: dict[Any, Any], cache: Any, device: int, raw_stream: Any,
                  dsts: tuple[int, ...], nbs: tuple[int, ...], launch: Any, failed: Any, views: Any,
                  copy: Any, d2d: Any, results: Any, statics: dict[int, Any]) -> Plan:
    """The plain plan of a captured ``slot``: inputs of type ``tensor`` exactly, of ``dtypes``,
    contiguous, of ``shapes`` (of other shapes: their slot's plain plan, if any); each input
    that is not its static buffer (it must be on ``device``) copied in with ``copy``
    (``cudaMemcpyAsync``), the captured graph launched, the static outputs handed over
    (``views``) or copied out (``results``). A call whose every input is copied goes to the
    slot's own plan when that is another (through copy nodes). ``checked=True``: handed over
    by another plan of the lane, past the input checks.

    A single input that was its static buffer itself is remembered (the tensor object), here
    and in the lane's ``statics`` (its slot by its ``id``; see :class:`.graphs.PythonGraphs`):
    that same object again skips the type, dtype and contiguity checks, as a pre-bound call's
    arrays do, and the plan of another slot given it hands it to this one at once (a dynamic
    engine fed its static buffers in turn). Nothing is copied from it; its shape and address
    are still checked, and one changed in place takes the general path. (The plan reaches
    itself only through its slot's ``plan`` and ``static_plan``, which the core clears on
    release, as the lane clears ``statics``: no reference cycle outlives its graph.)"""
    finish = _replay_finish(lane, order, own, slot, cache, device, raw_stream, dsts, nbs, launch, failed,
                            views, copy, d2d, results)
    if len(shapes) > 1:
        return _plain_replay_many(lane, miss, slot, tensor, dtypes, shapes, table, device, dsts, finish)
    core = lane.lane  # the core lane: its context and current plan
    key, refresh = slot.key, cache.refresh
    d0, s0, dst0 = dtypes[0], shapes[0], dsts[0]
    static: list[Any] = [_NO_TENSOR]  # the static buffer's tensor, once a call gave it

    def remember(x: Any) -> None:
        """``x`` (or nothing: ``_NO_TENSOR``) is the tensor object of the static buffer from now on."""
        old, static[0] = static[0], x
        if old is not _NO_TENSOR and statics.get(id(old)) is slot:
            del statics[id(old)]
        if x is not _NO_TENSOR:
            if len(statics) >= _STATICS:
                statics.clear()
            statics[id(x)] = slot

    def plan(inputs: tuple[Any, ...], stream: Any, outputs: Any, checked: bool = False) -> list[Any] | None:
        if checked:
            x = inputs[0]
        elif outputs is not None or len(inputs) != 1:
            return miss(inputs, stream, outputs)  # type: ignore[no-any-return]
        elif (x := inputs[0]) is static[0]:  # the static buffer again: its graph launched, nothing copied
            if x.shape != s0 or x.data_ptr() != dst0:  # (changed in place: checked in full)
                remember(_NO_TENSOR)
                return miss(inputs, stream, outputs)  # type: ignore[no-any-return]
            graph = slot.graph
            if graph is None:
                return miss(inputs, stream, outputs)  # type: ignore[no-any-return]
            if stream is not None or raw_stream(device) not in order.skip or order.tail != order.ours:
                return finish(graph, None, stream)  # type: ignore[no-any-return]
            cache.hits += 1  # (GraphCache.touch, inline)
            refresh(key)
            on = order.ours_t  # torch's current stream needs no ordering: the launch on ours
            (err,) = launch(graph, on)
            if err:
                failed(err, "cudaGraphLaunch")
            return list(views) if views is not None else results(on)  # type: ignore[no-any-return]
        elif (mine := statics.get(id(x))) is not None and (other := mine.static_plan) is not None and (
                other is not core.fast_entry):
            core.fast_entry = other  # another slot's static buffer: its plain plan
            return other(inputs, stream, outputs)  # type: ignore[no-any-return]
        elif type(x) is not tensor or x.dtype is not d0 or not x.is_contiguous():
            return miss(inputs, stream, outputs)  # type: ignore[no-any-return]
        elif (shape := x.shape) != s0:
            return _enter(lane, miss, table, True, (shape,), inputs, stream, outputs)  # type: ignore[no-any-return]
        graph = slot.graph
        if graph is None:
            return miss(inputs, stream, outputs)  # type: ignore[no-any-return]
        if x.data_ptr() == dst0:  # its static buffer: remembered (the lane may have forgotten it)
            if statics.get(id(x)) is not slot:
                remember(x)
            return finish(graph, None, stream)  # type: ignore[no-any-return]
        if x.get_device() != device:  # (before the hand-over: the copying plan takes it checked)
            return miss(inputs, stream, outputs)  # type: ignore[no-any-return]
        if (other := slot.plan) is not None and other is not core.fast_entry:
            core.fast_entry = other
            return other(inputs, stream, outputs, True)  # type: ignore[no-any-return]
        return finish(graph, [x.data_ptr()], stream)  # type: ignore[no-any-return]

    return plan


#: How many static buffers a lane's ``statics`` remembers (one per plain plan; a bound all the same).
_STATICS = 64


def _plain_replay_many(lane: Any, miss: Any, slot: Any, tensor: Any, dtypes: Sequence[Any],
                       shapes: tuple[Any, ...], table: dict[Any, Any], device: int, dsts: tuple[int, ...],
                       finish: Any) -> Plan:
    """The plain plan of a slot of several inputs (see :func:`_plain_replay`)."""
    core = lane.lane  # the core lane: its context and current plan
    n = len(shapes)

    def plan(inputs: tuple[Any, ...], stream: Any, outputs: Any, checked: bool = False) -> list[Any] | None:
        if not checked:
            if outputs is not None or len(inputs) != n or not fits(inputs, tensor, dtypes, None):
                return miss(inputs, stream, outputs)  # type: ignore[no-any-return]
            if (given := tuple([y.shape for y in inputs])) != shapes:
                return _enter(lane, miss, table, True, given, inputs, stream, outputs)  # type: ignore[no-any-return]
        graph = slot.graph
        if graph is None:
            return miss(inputs, stream, outputs)  # type: ignore[no-any-return]
        srcs = [x.data_ptr() for x in inputs]
        # an input to copy from another device: the general path (before the hand-over: the
        # copying plan takes a call checked)
        if any(s != d and x.get_device() != device for x, s, d in zip(inputs, srcs, dsts, strict=True)):
            return miss(inputs, stream, outputs)  # type: ignore[no-any-return]
        other = slot.plan
        if all(map(operator.ne, srcs, dsts)) and other is not None and other is not core.fast_entry:
            core.fast_entry = other
            return other(inputs, stream, outputs, True)  # type: ignore[no-any-return]
        return finish(graph, srcs, stream)  # type: ignore[no-any-return]

    return plan


def _replay_finish(lane: Any, order: Any, own: Any, slot: Any, cache: Any, device: int, raw_stream: Any,
                   dsts: tuple[int, ...], nbs: tuple[int, ...], launch: Any, failed: Any, views: Any,
                   copy: Any, d2d: Any, results: Any) -> Callable[[Any, Any, Any], list[Any]]:
    """What a plain plan does once the call is checked: ``finish(graph, srcs, stream)``
    counts the replay, orders it with the caller's stream, copies in each input whose address
    in ``srcs`` is not its static buffer's (``None``: none is copied), launches ``graph`` and
    hands the outputs over."""
    key, refresh = slot.key, cache.refresh

    def finish(graph: Any, srcs: Any, stream: Any) -> list[Any]:
        cache.hits += 1  # (GraphCache.touch, inline)
        refresh(key)
        if stream is None and (c := raw_stream(device)) in order.skip and order.tail == order.ours:
            caller, run, on = None, order.ours, order.ours_t
        else:
            caller, run = follow(order, own, stream, c if stream is None else None)
            on = run
        if srcs is not None:
            for dst, s, nb in zip(dsts, srcs, nbs, strict=True):
                if s != dst and nb and (err := copy(dst, s, nb, d2d, on)[0]):
                    failed(err, "cudaMemcpyAsync")
        (err,) = launch(graph, on)
        if err:
            failed(err, "cudaGraphLaunch")
        out = list(views) if views is not None else results(on)
        if caller is not None and run != caller:
            order.after(caller)
        return out  # type: ignore[no-any-return]

    return finish


def _nodes_replay(lane: Any, miss: Any, order: Any, own: Any, slot: Any, tensor: Any, dtypes: Sequence[Any],
                  shapes: tuple[Any, ...], table: dict[Any, Any], cache: Any, device: int, raw_stream: Any,
                  dsts: tuple[int, ...], nbs: tuple[int, ...], launch: Any, failed: Any, views: Any,
                  empty: Any, torch_device: Any, nodes: Any, plain: Any, out_specs: Sequence[Any], slabs: Any
                  ) -> Plan:
    """The copying plan of a captured ``slot``, its copies made by the memcpy ``nodes`` (a
    :class:`~trt_runtime.graphs.CopyNodes`) around its graph: inputs of type ``tensor``
    exactly, of ``dtypes``, on ``device``, contiguous, of ``shapes`` (of other shapes: their
    slot's plan, if any); each input node pointed at the call's input where it changed, each
    output of ``out_specs`` (none in ``"view"`` mode) made, from a slab when ``slabs``, and
    its node pointed at it, one launch. A call given a static buffer goes to ``plain``, as does
    one with an address CUDA refuses for a node (memory of another kind than it was built
    with). ``checked=True``: handed over by another plan of the lane, past the input checks."""
    core = lane.lane  # the core lane: its context and current plan
    n = len(shapes)
    one, one_out, key, refresh = n == 1, len(out_specs) == 1, slot.key, cache.refresh
    d0, s0, dst0, nb0 = dtypes[0], shapes[0], dsts[0], nbs[0]
    shape0, dtype0, so0, onb0 = out_specs[0] if out_specs else (None, None, 0, 0)
    graph0, cexec, last, point = slot.graph, nodes.exec, nodes.last, nodes.point
    pools: Any = slabs[0] if slabs else None  # (and refill: see trt_runtime.slabs.Slabs.fields)
    refill: Any = slabs[1] if slabs else None

    def plan(inputs: tuple[Any, ...], stream: Any, outputs: Any, checked: bool = False) -> list[Any] | None:
        if checked:
            x = inputs[0]
        elif (outputs is not None or len(inputs) != n or type(x := inputs[0]) is not tensor
              or x.dtype is not d0 or x.get_device() != device or not x.is_contiguous()
              or not (one or fits(inputs, tensor, dtypes, device))):
            return miss(inputs, stream, outputs)  # type: ignore[no-any-return]
        elif one and (shape := x.shape) != s0:
            return _enter(lane, miss, table, False, (shape,), inputs, stream, outputs)  # type: ignore[no-any-return]
        elif not one and (given := tuple([y.shape for y in inputs])) != shapes:
            return _enter(lane, miss, table, False, given, inputs, stream, outputs)  # type: ignore[no-any-return]
        if slot.graph is not graph0:
            return miss(inputs, stream, outputs)  # type: ignore[no-any-return]
        if one:
            static = (src := x.data_ptr()) == dst0
        else:
            srcs = [x.data_ptr() for x in inputs]
            static = not all(map(operator.ne, srcs, dsts))
        if static:  # a static buffer given: nothing to copy in for it, the plain way
            core.fast_entry = plain
            return plain(inputs, stream, outputs, True)  # type: ignore[no-any-return]
        cache.hits += 1  # (GraphCache.touch, inline)
        refresh(key)
        c = raw_stream(device) if stream is None or pools is not None else None
        if stream is None and c in order.skip and order.tail == order.ours:
            caller, run, on = None, order.ours, order.ours_t
        else:
            caller, run = follow(order, own, stream, c)
            on = run
        # each node pointed where its address changed (CopyNodes.point; False: refused)
        if one:
            if src != last[0] and not point(0, dst0, src, nb0):
                return plain(inputs, stream, outputs)  # type: ignore[no-any-return]
        elif not all(s == last[i] or point(i, d, s, nb)
                     for i, (d, s, nb) in enumerate(zip(dsts, srcs, nbs, strict=True))):
            return plain(inputs, stream, outputs)  # type: ignore[no-any-return]
        if one_out:
            y = (pools.get(c) or refill(c)).pop()[0] if pools is not None else empty(
                shape0, dtype=dtype0, device=torch_device)
            if (p := y.data_ptr()) != last[n] and not point(n, p, so0, onb0):
                return plain(inputs, stream, outputs)  # type: ignore[no-any-return]
            out = [y]
        elif out_specs:
            out = list((pools.get(c) or refill(c)).pop()) if pools is not None else [
                empty(shape, dtype=dtype, device=torch_device) for shape, dtype, _, _ in out_specs]
            for j, (y, (_, _, so, onb)) in enumerate(zip(out, out_specs, strict=True), n):
                if (p := y.data_ptr()) != last[j] and not point(j, p, so, onb):
                    return plain(inputs, stream, outputs)  # type: ignore[no-any-return]
        else:
            out = list(views)
        (err,) = launch(cexec, on)
        if err:
            failed(err, "cudaGraphLaunch")
        if caller is not None and run != caller:
            order.after(caller)
        return out

    return plan


def replay_plan(lane: Any, slot: Any, shapes: tuple[Any, ...], graphs: Any) -> Plan:
    """The plan of a captured outer-graph ``slot`` for torch inputs of ``shapes``: its
    static outputs handed back when it has views of them (``"view"``), else copies; the
    copies made by the memcpy nodes of the slot's :class:`~trt_runtime.graphs.CopyNodes` graph when it
    has one (inputs that are the static buffers themselves go the plain way)."""
    bridge = lane._torch
    ops = lane.graphs
    views = slot.output_views  # "view" mode: handed over as they are
    common = dict(lane=lane, miss=lane.call_fast, order=lane._order, own=lane._stream, slot=slot,
                  tensor=bridge.tensor, dtypes=bridge.in_dtypes, shapes=shapes, table=graphs.shortcuts,
                  cache=graphs.cache, device=lane._device, raw_stream=bridge.raw_stream,
                  dsts=tuple(slot.in_ptrs), nbs=tuple(slot.in_nbytes), launch=ops.rt.cudaGraphLaunch,
                  failed=functools.partial(replay_failed, lane), views=views)
    results = functools.partial(torch_results, lane, slot, view=False)
    plain = _plain_replay(**common, copy=ops.rt.cudaMemcpyAsync, d2d=ops.d2d, results=results,
                          statics=ops.statics)
    slot.static_plan = plain
    copying = ops.copying.get(int(slot.graph))
    # "view" mode hands the views over and has no output nodes; "copy" mode copies every
    # output out through its node (the outer mode cannot change under a graph: changing it
    # drops the graphs)
    if copying is None or (views is None) == (not copying.outs):
        return plain
    m = len(copying.outs)
    out_shapes = [tuple(a.shape) for a in slot.outputs[:m]]
    out_dtypes = [io.torch_dtype for io in lane._out[:m]]
    # "copy" mode: the outputs copied out through the nodes come from slabs, as a natural
    # call's do (each call's at a new address: one node update per output, no torch.empty)
    return _nodes_replay(
        **common, empty=bridge.empty, torch_device=bridge.device, nodes=copying, plain=plain,
        out_specs=tuple(zip(out_shapes, out_dtypes, slot.out_ptrs[:m], slot.out_nbytes[:m], strict=True)),
        slabs=slab_pools(bridge.empty, bridge.device, out_shapes, out_dtypes),
    )
