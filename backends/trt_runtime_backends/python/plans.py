"""Call plans: the python backend's fast paths, made for one call signature.

A repeat call is only a few µs of Python on top of TensorRT's enqueue, and on a busy
host each attribute read and each function call of it shows (measured step by step
with ``benchmarks/probes/gpu_step_costs.py`` on an H100 host: 3 to 5 µs over the raw loops, spread
over some thirty small steps). So once the full path has validated a call, the lane
keeps a *plan* for it: a closure made for that call whose constants (the arrays or dtypes
and shapes seen, the device, the context, the functions it calls) are bound by name when
it is made, with nothing looked up twice. A plan of one input (most engines) takes a
branch written for one input (and one output); other arities loop. The core pipeline
calls the lane's current plan first (``Lane.fast_entry``); a plan that does not
apply hands the call to the lane ops' ``call_fast`` (:class:`.lane.PythonLane`), which finds
the plan that does in its tables (and makes it current) or sends the call down the full path.

Three kinds, each checking exactly what the table lookup they replace checked:

* ``prebound`` (:class:`.fast_path.FastPath`): ``execute(*inputs, outputs=[...])`` with
  the very arrays of an earlier call, their pointers and shapes unchanged (other arrays
  remembered before go straight to their plan);
* ``natural`` (:class:`.fast_path.NaturalCall`): ``engine(x)`` with contiguous CUDA torch
  tensors of the engine's dtypes, on its device, of shapes seen before (inputs of another
  shape seen before go straight to that shape's plan); its outputs come from slabs
  (:mod:`trt_runtime.slabs`) when they are small enough;
* ``replay`` (an outer-graph slot, ``trt_runtime.outer.GraphSlot``): the same call
  under the outer graph, replayed. Inputs of another shape captured before go straight
  to that slot's plan (a dynamic engine fed shapes in turn switches plans on every call).
  Its ``copying`` form copies through memcpy nodes of a second graph
  (``trt_runtime.graphs.CopyNodes``) and hands calls given a static buffer to the plain form;
  in ``"copy"`` mode its outputs come from slabs, as a natural call's do.

A switch to another shape's plan enters it past the input checks the call just passed
(every plan of a lane takes one tensor type, device and dtypes): the torch plans take
``checked=True`` for that, as do a slot's plain and copying plans handing a call to each
other.

A plan holds no TensorRT object: it reads the context's ``trt_context`` on each call, so
dropping a context (``execution_context.drop_context``) releases it then and there,
whatever plan is still referenced; nor does it reference itself, nor (natural and
pre-bound plans) its table entry: a cycle would keep it, and anything it holds, until the
garbage collector runs. Per call a plan reads these attributes and no other: of the core
lane (``trt_runtime.lane.Lane``), ``fast_entry`` (written on a switch) and ``context``; of
the lane's ops (:class:`.lane.PythonLane`), ``execute_failed``. On a host with several
GPUs a plan sets no device: every call runs inside the engine's device guard
(``cuda.CallerDevice``), which made the engine's primary context current when another was.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any

from trt_runtime_backends.python.graph_buffers import replay_failed, torch_results
from trt_runtime_backends.python.shapes import prepare_state, restore_shapes

from trt_runtime.slabs import SLAB_BYTES, SLAB_CALLS, SLAB_STREAMS, slab_calls, slab_pools

__all__ = ["SLAB_BYTES", "SLAB_CALLS", "SLAB_STREAMS", "natural_plan", "prebound_plan", "replay_plan",
           "slab_calls"]

Plan = Callable[[tuple[Any, ...], Any, Any], "list[Any] | None"]

#: What a plain replay plan remembers as its static buffer before any call gave it one: no input is it.
_NO_TENSOR: Any = object()

_ptr_attr = operator.attrgetter("ptr")
_shape_attr = operator.attrgetter("shape")


# -- what the plans call off their common path ------------------------------------------------------
def _bind(ctx: Any, name: str, ptr: int) -> None:
    """Bind address ``ptr`` to tensor ``name`` of the context, the record forgotten before
    TensorRT is told (an interrupt in between leaves the tensor unbound, never wrongly bound)."""
    bound = ctx.bound
    ctx.bound_ptrs = ()
    bound[name] = 0
    ctx.trt_context.set_tensor_address(name, ptr)
    bound[name] = ptr


def _bind_all(ctx: Any, names: Sequence[str], tensors: Sequence[Any]) -> None:
    """:func:`_bind` each torch tensor whose address is not the one bound to its name."""
    get = ctx.bound.get
    for name, x in zip(names, tensors, strict=True):
        if get(name) != (p := x.data_ptr()):
            _bind(ctx, name, p)


def _follow(order: Any, own: Any, stream: Any, current: Any) -> tuple[int | None, int]:
    """``(caller, run)`` of a torch call: the caller's stream to order with (``None``: no
    event needed) and the stream the work goes on, ordered after the lane's previous work
    (:meth:`.stream_order.StreamOrder.follow`); ``current`` is torch's current stream, the
    caller's when ``stream`` is ``None``. The plans test the usual case inline (torch's
    legacy default stream, the lane's last work on its own stream) and call this otherwise."""
    if stream is None:
        caller = None if current in order.skip or current == order.ours else current
    elif stream is own:
        caller = None
    else:
        caller = order.caller(stream, True)
    run = order.ours if caller is None else caller
    if run != order.tail:  # follow()'s common case, inline: the lane's last work went there
        run = order.follow(caller)
    return caller, run


def _switch(lane: Any, miss: Any, entry: Any, inputs: tuple[Any, ...], stream: Any, outputs: Any,
            checked: bool = True) -> Any:
    """Hand a call to the plan of ``entry``, what a table of the lane remembers for these
    inputs (their shapes; their arrays, not ``checked``), which becomes the lane's current
    plan, entered past the checks the inputs just passed when ``checked`` (every natural plan
    of a lane checks alike: one tensor type, device and dtypes); ``miss`` when there is none
    or it is the current plan (it declined this very call). No way round ``call_fast`` for
    inputs seen before."""
    core = lane.lane  # the core lane: its context and current plan
    other = None if entry is None else entry.plan
    if other is None or other is core.fast_entry:
        return miss(inputs, stream, outputs)
    core.fast_entry = other
    return other(inputs, stream, outputs, True) if checked else other(inputs, stream, outputs)


# -- prebound: execute(*inputs, outputs=[...]) with the very arrays of a validated call ------------
def _prebound(lane: Any, miss: Any, order: Any, own: Any, ctx: Any, key: Any, prepare: Any, torch_kind: bool,
              table: dict[Any, Any], arrays: tuple[Any, ...], ptrs: tuple[int, ...], shapes: tuple[Any, ...],
              n: int, ptr_of: Any) -> Plan:
    core = lane.lane  # the core lane: its context and current plan
    m = len(arrays) - n
    one = n == 1 and m == 1
    a0, a1, p0, p1, s0, s1 = arrays[0], arrays[-1], ptrs[0], ptrs[-1], shapes[0], shapes[-1]
    is_not = operator.is_not

    def plan(inputs: tuple[Any, ...], stream: Any, outputs: Any) -> list[Any] | None:
        if outputs is None or len(inputs) != n or len(outputs) != m:
            return miss(inputs, stream, outputs)  # type: ignore[no-any-return]
        if one:
            x, y = inputs[0], outputs[0]
            if x is not a0 or y is not a1:  # other arrays: their plan (keyed as call_prebound looks)
                fast = table.get((id(x), id(y)))
                return _switch(  # type: ignore[no-any-return]
                    lane, miss, fast, inputs, stream, outputs, False)
            if ptr_of(x) != p0 or ptr_of(y) != p1 or x.shape != s0 or y.shape != s1:
                return miss(inputs, stream, outputs)  # type: ignore[no-any-return]
        else:
            given = (*inputs, *outputs)
            if any(map(is_not, given, arrays)):
                fast = table.get(tuple(map(id, given)))
                return _switch(  # type: ignore[no-any-return]
                    lane, miss, fast, inputs, stream, outputs, False)
            if tuple(map(ptr_of, given)) != ptrs or tuple(map(_shape_attr, given)) != shapes:
                return miss(inputs, stream, outputs)  # type: ignore[no-any-return]
        if core.context is not ctx:
            return None
        if (ctx.shape_key is not key or ctx.bound_ptrs is not ptrs) and not prepare():
            return None
        caller = None if stream is own and stream is not None else order.caller(stream, torch_kind)
        run = order.ours if caller is None else caller
        if run != order.tail:
            run = order.follow(caller)
        if not ctx.trt_context.execute_async_v3(run):
            lane.execute_failed()
        if caller is not None and run != caller:
            order.after(caller)
        return [y] if one else list(outputs)

    return plan


# -- natural: engine(x) with CUDA torch tensors of shapes seen before ----------------------------------
def _fit(inputs: tuple[Any, ...], tensor: Any, dtypes: Sequence[Any], device: int | None) -> bool:
    """Whether each input is a contiguous torch tensor of type ``tensor`` exactly and its
    dtype (and on ``device`` unless it is ``None``): the check of a plan of several inputs."""
    return all(type(x) is tensor and x.dtype is dtype and (device is None or x.get_device() == device)
               and x.is_contiguous() for x, dtype in zip(inputs, dtypes, strict=True))


def _natural(lane: Any, miss: Any, order: Any, own: Any, ctx: Any, key: Any, restore: Any, tensor: Any,
             dtypes: Sequence[Any], shapes: tuple[Any, ...], device: int, table: dict[Any, Any],
             raw_stream: Any, names: Sequence[str], outs: Sequence[str], out_specs: Sequence[Any],
             like_input: bool, empty: Any, torch_device: Any, slabs: Any) -> Plan:
    """The plan of a natural call: inputs of type ``tensor`` exactly, of ``dtypes``, on
    ``device``, contiguous, of ``shapes`` (of other shapes: their plan in ``table``, if any);
    then the context in the call's shapes, the addresses that changed bound, the outputs made
    (from a slab, else ``x.new_empty`` when ``like_input``, else ``empty``) and bound, and
    ``execute_async_v3`` on the caller's stream."""
    core = lane.lane  # the core lane: its context and current plan
    n = len(shapes)
    one, one_out = n == 1, len(outs) == 1
    d0, s0, name0, out0 = dtypes[0], shapes[0], names[0], outs[0] if outs else ""
    shape0, dtype0 = out_specs[0] if out_specs else (None, None)
    pools: Any = slabs[0] if slabs else None  # (and refill: see trt_runtime.slabs.Slabs.fields)
    refill: Any = slabs[1] if slabs else None
    bound = ctx.bound  # the same dict for the context's life (swapped contexts refill it)
    bound_get = bound.get

    def plan(inputs: tuple[Any, ...], stream: Any, outputs: Any, checked: bool = False) -> list[Any] | None:
        if checked:  # handed over by another natural plan of the lane, which checked the inputs
            x = inputs[0]
        elif outputs is not None or len(inputs) != n:
            return miss(inputs, stream, outputs)  # type: ignore[no-any-return]
        elif one:
            x = inputs[0]
            if (type(x) is not tensor or x.dtype is not d0 or x.get_device() != device
                    or not x.is_contiguous()):
                return miss(inputs, stream, outputs)  # type: ignore[no-any-return]
            if (shape := x.shape) != s0:  # another shape: its plan, if the table has one
                return _switch(  # type: ignore[no-any-return]
                    lane, miss, table.get((shape,)), inputs, stream, outputs)
        elif not _fit(inputs, tensor, dtypes, device):
            return miss(inputs, stream, outputs)  # type: ignore[no-any-return]
        elif (seen := tuple([x.shape for x in inputs])) != shapes:
            return _switch(  # type: ignore[no-any-return]
                lane, miss, table.get(seen), inputs, stream, outputs)
        if core.context is not ctx:
            return None
        if ctx.shape_key is not key and ctx.shape_key != key and not restore():
            return None
        if not one:
            _bind_all(ctx, names, inputs)
        elif bound_get(name0) != (p := x.data_ptr()):
            _bind(ctx, name0, p)
        c = raw_stream(device) if stream is None or pools is not None else None
        if pools is not None:  # the slabs made on torch's current stream (see trt_runtime.slabs)
            ys = (pools.get(c) or refill(c)).pop()
        elif one_out:
            ys = (inputs[0].new_empty(shape0) if like_input
                  else empty(shape0, dtype=dtype0, device=torch_device),)
        else:
            ys = [inputs[0].new_empty(shape) if like_input else empty(shape, dtype=dtype, device=torch_device)
                  for shape, dtype in out_specs]
        if one_out:  # (_bind inline: a slab's output has a new address each call)
            if bound_get(out0) != (p := (y := ys[0]).data_ptr()):
                ctx.bound_ptrs = ()
                bound[out0] = 0
                ctx.trt_context.set_tensor_address(out0, p)
                bound[out0] = p
        else:
            _bind_all(ctx, outs, ys)
        if stream is None and c in order.skip and order.tail == order.ours:
            caller, run = None, order.ours
        else:
            caller, run = _follow(order, own, stream, c)
        if not ctx.trt_context.execute_async_v3(run):
            lane.execute_failed()
        if caller is not None and run != caller:
            order.after(caller)
        return [y] if one_out else list(ys)

    return plan


# -- replay: engine(x) under the outer graph, a captured slot replayed -----------------------------
def _enter(lane: Any, miss: Any, table: dict[Any, Any], plain_first: bool, shapes: tuple[Any, ...],
           inputs: tuple[Any, ...], stream: Any, outputs: Any) -> Any:
    """Hand a replay of inputs of other ``shapes`` to the plan of the slot ``table`` holds for
    them (its plain plan when ``plain_first``: calls given static buffers come in runs), which
    becomes the lane's current plan, entered past the input checks the call just passed (every
    plan of a lane makes them alike: one tensor type, the same dtypes); ``miss`` when there is
    none or it is the current plan (it declined this very call)."""
    core = lane.lane  # the core lane: its context and current plan
    slot = table.get(shapes)
    other = None if slot is None or slot.graph is None else slot.plan
    if plain_first:
        other = getattr(other, "plain", other)
    if other is None or other is core.fast_entry:
        return miss(inputs, stream, outputs)
    core.fast_entry = other
    return other(inputs, stream, outputs, True)


def _plain_replay(lane: Any, miss: Any, order: Any, own: Any, slot: Any, tensor: Any, dtypes: Sequence[Any],
                  shapes: tuple[Any, ...], table: dict[Any, Any], cache: Any, device: int, raw_stream: Any,
                  dsts: tuple[int, ...], nbs: tuple[int, ...], launch: Any, failed: Any, views: Any,
                  copy: Any, d2d: Any, results: Any) -> Plan:
    """The plain plan of a captured ``slot``: inputs of type ``tensor`` exactly, of ``dtypes``,
    contiguous, of ``shapes`` (of other shapes: their slot's plain plan, if any); each input
    that is not its static buffer (it must be on ``device``) copied in with ``copy``
    (``cudaMemcpyAsync``), the captured graph launched, the static outputs handed over
    (``views``) or copied out (``results``). A call whose every input is copied goes to the
    slot's own plan when that is another (through copy nodes). ``checked=True``: handed over
    by another plan of the lane, past the input checks.

    A single input that was its static buffer itself is remembered (the tensor object): that
    same object again skips the type, dtype and contiguity checks, as a pre-bound call's
    arrays do (nothing is copied from it; its shape and address are still checked, and one
    changed in place takes the general path)."""
    core = lane.lane  # the core lane: its context and current plan
    n = len(shapes)
    one, key, refresh = n == 1, slot.key, cache.refresh
    d0, s0, dst0, nb0 = dtypes[0], shapes[0], dsts[0], nbs[0]
    static: list[Any] = [_NO_TENSOR]  # the static buffer's tensor, once a call gave it (one input)

    def plan(inputs: tuple[Any, ...], stream: Any, outputs: Any, checked: bool = False) -> list[Any] | None:
        known = False
        if checked:
            x = inputs[0]
        elif one and outputs is None and len(inputs) == 1 and (x := inputs[0]) is static[0]:
            if x.shape != s0 or x.data_ptr() != dst0:  # (changed in place: checked in full)
                static[0] = _NO_TENSOR
                return miss(inputs, stream, outputs)  # type: ignore[no-any-return]
            known = True
        elif (outputs is not None or len(inputs) != n or type(x := inputs[0]) is not tensor
              or x.dtype is not d0 or not x.is_contiguous()
              or not (one or _fit(inputs, tensor, dtypes, None))):
            return miss(inputs, stream, outputs)  # type: ignore[no-any-return]
        elif one and (shape := x.shape) != s0:
            return _enter(lane, miss, table, True, (shape,), inputs, stream, outputs)  # type: ignore[no-any-return]
        elif not one and (given := tuple([y.shape for y in inputs])) != shapes:
            return _enter(lane, miss, table, True, given, inputs, stream, outputs)  # type: ignore[no-any-return]
        graph = slot.graph
        if graph is None:
            return miss(inputs, stream, outputs)  # type: ignore[no-any-return]
        if known:
            moved = foreign = False
        elif one:
            moved = (src := x.data_ptr()) != dst0  # not its static buffer: copied in
            foreign = moved and x.get_device() != device
            if not moved:
                static[0] = x
        else:
            srcs = [x.data_ptr() for x in inputs]
            moved = all(map(operator.ne, srcs, dsts))
            foreign = any(s != d and x.get_device() != device
                          for x, s, d in zip(inputs, srcs, dsts, strict=True))
        if foreign:  # (before the hand-over: the copying plan takes it checked)
            return miss(inputs, stream, outputs)  # type: ignore[no-any-return]
        if moved and (other := slot.plan) is not None and other is not core.fast_entry:
            core.fast_entry = other
            return other(inputs, stream, outputs, True)  # type: ignore[no-any-return]
        cache.hits += 1  # (GraphCache.touch, inline)
        refresh(key)
        if stream is None and (c := raw_stream(device)) in order.skip and order.tail == order.ours:
            caller, run, on = None, order.ours, order.ours_t
        else:
            caller, run = _follow(order, own, stream, c if stream is None else None)
            on = run
        if one:
            if moved and nb0 and (err := copy(dst0, src, nb0, d2d, on)[0]):
                failed(err, "cudaMemcpyAsync")
        else:
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

    return plan


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
              or not (one or _fit(inputs, tensor, dtypes, device))):
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
            caller, run = _follow(order, own, stream, c)
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


# -- the entry points: what a plan needs, read from the lane once ---------------------------------
def prebound_plan(lane: Any, fast: Any, torch_ptrs: bool) -> Plan:
    """The plan of a remembered pre-bound call ``fast`` (a :class:`.fast_path.FastPath`)
    of the lane's current context; ``torch_ptrs``: its arrays are torch tensors (else
    ``DeviceArray``\\ s)."""
    prepare = functools.partial(prepare_state, lane, fast.shape_key, fast.dynamic_dims, fast.out_shapes,
                                fast.ptrs)
    return _prebound(
        lane, lane.call_fast, lane._order, lane._stream, ctx=lane.lane.context, key=fast.shape_key,
        prepare=prepare, torch_kind=fast.torch, table=lane._fast_paths.prebound, arrays=fast.arrays,
        ptrs=fast.ptrs, shapes=fast.shapes, n=len(fast.in_ids),
        ptr_of=type(fast.arrays[0]).data_ptr if torch_ptrs else _ptr_attr,
    )


def natural_plan(lane: Any, entry: Any, shapes: tuple[Any, ...]) -> Plan:
    """The plan of a remembered natural call ``entry`` (a :class:`.fast_path.NaturalCall`)
    of the lane's current context, for torch inputs of ``shapes`` (``torch.Size``\\ s)."""
    bridge = lane._torch
    ctx = lane.lane.context
    names, out_shapes, dtypes = zip(*entry.outputs, strict=True) if entry.outputs else ((), (), ())
    restore = functools.partial(restore_shapes, lane, ctx, entry.shape_key, entry.dynamic_dims,
                                entry.out_shapes)
    return _natural(
        lane, lane.call_fast, lane._order, lane._stream, ctx, key=entry.shape_key, restore=restore,
        tensor=bridge.tensor, dtypes=bridge.in_dtypes, shapes=shapes, device=lane._device,
        table=lane._fast_paths.natural, raw_stream=bridge.raw_stream, names=tuple(lane._in_names), outs=names,
        out_specs=tuple(zip(out_shapes, dtypes, strict=True)), like_input=entry.like_input,
        empty=bridge.empty, torch_device=bridge.device,
        slabs=slab_pools(bridge.empty, bridge.device, out_shapes, dtypes),
    )


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
    plain = _plain_replay(**common, copy=ops.rt.cudaMemcpyAsync, d2d=ops.d2d, results=results)
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
    made = _nodes_replay(
        **common, empty=bridge.empty, torch_device=bridge.device, nodes=copying, plain=plain,
        out_specs=tuple(zip(out_shapes, out_dtypes, slot.out_ptrs[:m], slot.out_nbytes[:m], strict=True)),
        slabs=slab_pools(bridge.empty, bridge.device, out_shapes, out_dtypes),
    )
    made.plain = plain  # type: ignore[attr-defined]  # where a plain plan's shape switch goes
    return made
