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

Three kinds, each checking exactly what the table lookup they replace checked (the third, the
outer graph's replays, in :mod:`.replay_plans`):

* ``prebound`` (:class:`.fast_path.FastPath`): ``execute(*inputs, outputs=[...])`` with
  the very arrays of an earlier call, their pointers and shapes unchanged (other arrays
  remembered before go straight to their plan);
* ``natural`` (:class:`.fast_path.NaturalCall`): ``engine(x)`` with contiguous CUDA torch
  tensors of the engine's dtypes, on its device, of shapes seen before (inputs of another
  shape seen before go straight to that shape's plan); its outputs come from slabs
  (:mod:`trt_runtime.slabs`) when they are small enough;
* ``replay`` (an outer-graph slot, ``trt_runtime.outer.GraphSlot``): the same call
  under the outer graph, replayed (:mod:`.replay_plans`).

A switch to another shape's plan enters it past the input checks the call just passed
(every plan of a lane takes one tensor type, device and dtypes): the torch plans take
``checked=True`` for that, as do a slot's plain and copying plans handing a call to each
other.

A plan holds no TensorRT object: it reads the context's ``enqueue`` (its TensorRT context's
``execute_async_v3``, bound by the context: ``ExecutionContext.use``) and ``trt_context`` on
each call, so dropping a context (``execution_context.drop_context``) releases it then and there,
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

from trt_runtime_backends.python.shapes import prepare_state, restore_shapes

from trt_runtime.slabs import SLAB_BYTES, SLAB_CALLS, SLAB_STREAMS, slab_calls, slab_pools

__all__ = ["SLAB_BYTES", "SLAB_CALLS", "SLAB_STREAMS", "Plan", "fits", "follow", "natural_plan",
           "prebound_plan", "slab_calls"]

Plan = Callable[[tuple[Any, ...], Any, Any], "list[Any] | None"]

#: What a pre-bound plan of a lane without a stream object compares ``stream=`` with: no stream is it.
_NO_STREAM: Any = object()

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


def follow(order: Any, own: Any, stream: Any, current: Any) -> tuple[int | None, int]:
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
    if n == 1 and len(arrays) == 2:
        return _prebound_one(lane, miss, order, own, ctx, key, prepare, torch_kind, table, arrays, ptrs,
                             shapes, ptr_of)
    core = lane.lane  # the core lane: its context and current plan
    m = len(arrays) - n
    is_not = operator.is_not

    def plan(inputs: tuple[Any, ...], stream: Any, outputs: Any) -> list[Any] | None:
        if outputs is None or len(inputs) != n or len(outputs) != m:
            return miss(inputs, stream, outputs)  # type: ignore[no-any-return]
        given = (*inputs, *outputs)
        if any(map(is_not, given, arrays)):  # other arrays: their plan (keyed as call_prebound looks)
            return _switch(  # type: ignore[no-any-return]
                lane, miss, table.get(tuple(map(id, given))), inputs, stream, outputs, False)
        if tuple(map(ptr_of, given)) != ptrs or tuple(map(_shape_attr, given)) != shapes:
            return miss(inputs, stream, outputs)  # type: ignore[no-any-return]
        if core.context is not ctx:
            return None
        if (ctx.shape_key is not key or ctx.bound_ptrs is not ptrs) and not prepare():
            return None
        return _run_prebound(lane, order, own, ctx, torch_kind, stream, list(outputs))

    return plan


def _run_prebound(lane: Any, order: Any, own: Any, ctx: Any, torch_kind: bool, stream: Any, out: list[Any]
                  ) -> list[Any]:
    """``execute_async_v3`` of a pre-bound call, ordered with the caller's ``stream``; ``out``."""
    caller = None if stream is own and stream is not None else order.caller(stream, torch_kind)
    run = order.ours if caller is None else caller
    if run != order.tail:
        run = order.follow(caller)
    if not ctx.enqueue(run):
        lane.execute_failed()
    if caller is not None and run != caller:
        order.after(caller)
    return out


def _prebound_one(lane: Any, miss: Any, order: Any, own: Any, ctx: Any, key: Any, prepare: Any,
                  torch_kind: bool, table: dict[Any, Any], arrays: tuple[Any, ...], ptrs: tuple[int, ...],
                  shapes: tuple[Any, ...], ptr_of: Any) -> Plan:
    """The pre-bound plan of one input and one output, the usual engine, written out for it:
    the arrays unpacked (no ``len``), and a call on the engine's own stream enqueued without
    the caller-stream steps (next to TensorRT's enqueue each bytecode of a call shows)."""
    core = lane.lane  # the core lane: its context and current plan
    a0, a1, p0, p1, s0, s1 = arrays[0], arrays[1], ptrs[0], ptrs[1], shapes[0], shapes[1]
    mine = _NO_STREAM if own is None else own  # stream=mine: the engine's own stream, no ordering
    # the lane's stream (it changes only with a new context, which this plan does not run on)
    ours = order.ours

    def plan(inputs: tuple[Any, ...], stream: Any, outputs: Any) -> list[Any] | None:
        try:
            (x,) = inputs
            (y,) = outputs
        except (TypeError, ValueError):  # no outputs=, or other counts
            return miss(inputs, stream, outputs)  # type: ignore[no-any-return]
        if x is not a0 or y is not a1:  # other arrays: their plan (keyed as call_prebound looks)
            return _switch(  # type: ignore[no-any-return]
                lane, miss, table.get((id(x), id(y))), inputs, stream, outputs, False)
        if ptr_of(x) != p0 or ptr_of(y) != p1 or x.shape != s0 or y.shape != s1:
            return miss(inputs, stream, outputs)  # type: ignore[no-any-return]
        if core.context is not ctx:
            return None
        if (ctx.shape_key is not key or ctx.bound_ptrs is not ptrs) and not prepare():
            return None
        if stream is not mine:
            return _run_prebound(lane, order, own, ctx, torch_kind, stream, [y])
        if order.tail != ours:
            order.follow(None)
        if not ctx.enqueue(ours):
            lane.execute_failed()
        return [y]

    return plan


# -- natural: engine(x) with CUDA torch tensors of shapes seen before ----------------------------------
def fits(inputs: tuple[Any, ...], tensor: Any, dtypes: Sequence[Any], device: int | None) -> bool:
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
        elif not fits(inputs, tensor, dtypes, device):
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
            caller, run = follow(order, own, stream, c)
        if not ctx.enqueue(run):
            lane.execute_failed()
        if caller is not None and run != caller:
            order.after(caller)
        return [y] if one_out else list(ys)

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
