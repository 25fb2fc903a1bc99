"""Call plans: the python backend's fast paths, compiled for one call signature.

A repeat call is only a few µs of Python on top of TensorRT's enqueue, and on a busy
host each attribute read and each function call of it shows (measured step by step
with ``benchmarks/probes/gpu_step_costs.py`` on an H100 host: 3 to 5 µs over the raw loops, spread
over some thirty small steps). So once the full path has validated a call, the lane
keeps a *plan* for it: a function made for that call's arity (the number of inputs and
outputs) whose constants (the arrays or dtypes and shapes seen, the device, the
context, the bound methods it calls) are closure variables, with nothing looked up
twice. The core pipeline calls the lane's current plan first (``Lane.fast_entry``);
a plan that does not apply hands the call to the lane's ``call_fast``, which finds the
plan that does in its tables (and makes it current) or sends the call down the full
path.

Three kinds, each checking exactly what the table lookup they replace checked:

* ``prebound`` (:class:`.fast_path.FastPath`): ``execute(*inputs, outputs=[...])`` with
  the very arrays of an earlier call, their pointers and shapes unchanged (other arrays
  remembered before go straight to their plan);
* ``natural`` (:class:`.fast_path.NaturalCall`): ``engine(x)`` with contiguous CUDA torch
  tensors of the engine's dtypes, on its device, of shapes seen before (inputs of another
  shape seen before go straight to that shape's plan);
* ``replay`` (an outer-graph slot, ``trt_runtime.outer.GraphSlot``): the same call
  under the outer graph, replayed. Inputs of another shape captured before go straight
  to that slot's plan (a dynamic engine fed shapes in turn switches plans on every call).
  Its ``copying`` form (same template) copies through memcpy nodes of a second graph
  (``trt_runtime.graphs.CopyNodes``) and hands calls given a static buffer to the plain form;
  in ``"copy"`` mode its outputs come from slabs (``copying-slab``), as a natural call's do.

A plan holds no TensorRT object: it reads the context's ``trt_context`` on each call, so
dropping a context (``execution_context.drop_context``) releases it then and there,
whatever plan is still referenced; nor does it reference its table entry (a cycle would
keep it, and anything it holds, until the garbage collector runs).

The plans are generated source (as :mod:`dataclasses` generates ``__init__``): one
template per kind, unrolled for the call's arity, compiled once per (kind, arity,
variant) and then only bound to constants.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from trt_runtime.slabs import SLAB_BYTES, SLAB_CALLS, SLAB_STREAMS, slab_calls, slab_pools

__all__ = ["SLAB_BYTES", "SLAB_CALLS", "SLAB_STREAMS", "natural_plan", "prebound_plan", "replay_plan",
           "slab_calls"]

Plan = Callable[[tuple[Any, ...], Any, Any], "list[Any] | None"]

# -- the shared tail: order with the caller's stream, enqueue, hand the results over -------------
_CALLER = """\
        if stream is None:
            caller = {default_caller}
        elif stream is own:
            caller = None
        else:
            caller = order.caller(stream, {torch_kind})
"""

_RUN = """\
        if caller is None:
            run = order.ours
            if order.tail != run:
                order.join(run)
        elif caller == order.tail:  # follow()'s common case, inline: the lane's last work went there
            run = caller
        else:
            run = order.follow(caller)
"""

_AFTER = """\
        if caller is not None and run != caller:
            order.after(caller)
"""

# the start of the natural and replay plans: ``n`` torch tensors passing ``checks``, no outputs=
_TORCH_HEAD = """\
        if outputs is not None or len(inputs) != {n}:
            return miss(inputs, stream, outputs)
        {unpack_in}
        if {checks}:
            return miss(inputs, stream, outputs)
"""

# ... then, for other inputs (of another shape; other arrays, for a pre-bound call), the
# plan of those from ``table`` (keyed as the lane's lookup keys it) when there is one: no
# way round ``call_fast`` on every call of a dynamic engine fed shapes in turn.
# (``core.fast_entry``, the lane's, is this plan: no name for it here, a closure on itself is a
# reference cycle.)
_SWITCH = """\
{before}\
        if {differs}:
            other = table.get({key})
            other = None if other is None{unusable} else other.plan
{pick}\
            if other is None or other is core.fast_entry:
                return miss(inputs, stream, outputs)
            core.fast_entry = other
            return {enter}(inputs, stream, outputs)
"""

# ... then TensorRT's enqueue on that stream (``trt``: the context's expression)
_ENQUEUE = """\
{caller}{run}\
        if not {trt}.execute_async_v3(run):
            lane.execute_failed()
{after}\
        return [{outs}]
    return plan
"""

_PREBOUND = """\
def make(lane, miss, order, own, ctx, key, ptrs, prepare, torch_kind, table, {consts}):
    core = lane.lane
    def plan(inputs, stream, outputs):
        if outputs is None or len(inputs) != {n} or len(outputs) != {m}:
            return miss(inputs, stream, outputs)
        {unpack_in}
        {unpack_out}
{switch}\
        if {pointers} or {shapes}:
            return miss(inputs, stream, outputs)
        if core.context is not ctx:
            return None
        if (ctx.shape_key is not key or ctx.bound_ptrs is not ptrs) and not prepare():
            return None
{enqueue}"""

_NATURAL = """\
def make(lane, miss, order, own, ctx, key, restore, tensor, device, raw_stream, bound, empty, torch_device,
         table, {consts}):
    core = lane.lane
    bound_get = bound.get
    def plan(inputs, stream, outputs):
{torch_head}\
{switch}\
        if core.context is not ctx:
            return None
        if ctx.shape_key is not key and ctx.shape_key != key and not restore():
            return None
        if lane._multi_device:
            lane._set_device()
        trt_context = ctx.trt_context
        set_address = trt_context.set_tensor_address
{bind_in}{alloc_out}{enqueue}"""

# the replay of a captured slot; two kinds share it. "replay": copies each input that is not
# its static buffer with cudaMemcpyAsync and launches the captured graph. "copying": the
# slot's copies are nodes of a second graph (trt_runtime.graphs.CopyNodes): each input's address set in
# its memcpy node, each output made and its address set, one launch of that graph. A slot
# with both has two plans, and the lane's current one is the one its last call needed: a
# call with an input that is its static buffer itself goes from "copying" to the slot's
# "replay" plan (plain), one with none from "replay" to the slot's own plan ("copying").
_REPLAY = """\
def make(lane, miss, order, own, slot, graph0, touch, launch, copy, set1d, d2d, failed, results, views, plain,
         cexec, last, empty, torch_device, tensor, device, raw_stream, table, {consts}):
    core = lane.lane
    def plan(inputs, stream, outputs):
{torch_head}\
{switch}\
{body}\
    # entered by another plan of the lane on a shape switch: the inputs passed the checks
    # above there (every plan of a lane takes one tensor type and the same dtypes), and the
    # table found this plan by their shapes
    def go(inputs, stream, outputs):
        {unpack_in}
{body}\
    plan.go = go
    return plan
"""

_REPLAY_BODY = """\
        graph = slot.graph
        if {graph_gone}:
            return miss(inputs, stream, outputs)
        {sources}
{to_copying}\
        if {foreign_device}:
            return miss(inputs, stream, outputs)
{plain_way}\
        touch(slot.key)
        if lane._multi_device:
            lane._set_device()
{caller}{run}{copies}\
        (err,) = launch({launched}, run)
        if err:
            failed(err, "cudaGraphLaunch")
        out = {results}
{after}\
        return out
"""

_TORCH_CALLER = "None if (c := raw_stream(device)) in order.skip or c == order.ours else c"


def _names(prefix: str, count: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(count)]


def _unpack(names: list[str], source: str) -> str:
    return f"{', '.join(names)}, = {source}"


def _any(terms: list[str]) -> str:
    return " or ".join(terms)


def _indent(lines: list[str]) -> str:
    return "".join(f"        {line}\n" for line in lines)


def _bind(var: str, name: str) -> list[str]:
    """Bind ``var``'s address to tensor ``name`` unless the context has it already (the
    record forgotten before TensorRT is told: an interrupt in between leaves it unbound)."""
    return [f"p = {var}.data_ptr()", f"if bound_get({name}) != p:", "    ctx.bound_ptrs = ()",
            f"    bound[{name}] = 0", f"    set_address({name}, p)", f"    bound[{name}] = p"]


def _torch_head(xs: list[str], checks: list[str]) -> str:
    """The start of a plan taking torch tensors ``xs`` (no ``outputs=``) that pass ``checks``."""
    return _TORCH_HEAD.format(n=len(xs), unpack_in=_unpack(xs, "inputs"), checks=_any(checks))


def _switch(xs: list[str], unusable: str = "", pick: str = "", enter: str = "other") -> str:
    """Inputs ``xs`` of other shapes than ``s0``, ``s1``... go to that shape's plan in ``table``
    (``unusable``: a further condition on the entry, such as a released graph; ``pick``: a
    line choosing among the entry's plans; ``enter``: the function of it called)."""
    shapes = _names("sh", len(xs))
    return _SWITCH.format(before=_indent([f"{h} = {x}.shape" for h, x in zip(shapes, xs, strict=True)]),
                          differs=_any([f"{h} != s{i}" for i, h in enumerate(shapes)]),
                          key="(" + "".join(f"{h}, " for h in shapes) + ")", unusable=unusable,
                          pick=pick, enter=enter)


def _replay_head(xs: list[str], consts: list[str], plain: bool) -> dict[str, str]:
    """The fields the two replay templates share: constants, the torch check of inputs
    ``xs``, the switch to other captured shapes (``plain``: to the plain plan of a slot that
    has two, since calls given static buffers tend to come in runs), the inputs'
    addresses, the caller."""
    return {
        "consts": ", ".join(consts),
        "torch_head": _torch_head(xs, [
            f"type({x}) is not tensor or {x}.dtype is not d{i} or not {x}.is_contiguous()"
            for i, x in enumerate(xs)
        ]),
        "switch": _switch(xs, " or other.graph is None", enter="other.go",
                          pick=_indent(['    other = getattr(other, "plain", other)']) if plain else ""),
        "sources": "; ".join(f"src{i} = {x}.data_ptr()" for i, x in enumerate(xs)),
        "caller": _CALLER.format(default_caller=_TORCH_CALLER, torch_kind="True"),
    }


def _node_update(node: str, dst: str, src: str, nbytes: str, index: int, changing: str) -> list[str]:
    """Lines pointing memcpy ``node`` (``index`` in ``last``) at ``dst`` and ``src``, unless
    ``changing`` (the side that changes per call) is the address it has: the rule of
    :meth:`trt_runtime.graphs.CopyNodes.point`, inlined (a call per node would cost the plan
    about 0.2 µs). A refused address sends the call the plain way."""
    return [f"if {changing} != last[{index}]:",
            f"    (err,) = set1d(cexec, {node}, {dst}, {src}, {nbytes}, d2d)",
            "    if err:",
            f"        last[{index}] = None",
            "        return plain(inputs, stream, outputs)",
            f"    last[{index}] = {changing}"]


def _slab_take(ys: list[str], var: str, stream: str) -> list[str]:
    """Lines taking this call's outputs ``ys`` from the slabs made on torch's current stream
    (``stream``, kept in ``var``; see :mod:`trt_runtime.slabs`)."""
    return [f"{var} = {stream}", f"pool = pools.get({var})", "if not pool:", f"    pool = refill({var})",
            _unpack(ys, "pool.pop()") if ys else "pool.pop()"]


def _enqueue(trt: str, outs: list[str], default_caller: str, torch_kind: str) -> str:
    """The tail of the pre-bound and natural plans: order with the caller, enqueue, return."""
    caller = _CALLER.format(default_caller=default_caller, torch_kind=torch_kind)
    return _ENQUEUE.format(caller=caller, run=_RUN, after=_AFTER, trt=trt, outs=", ".join(outs))


@functools.cache
def _compile(kind: str, n: int, m: int, variant: bool) -> Callable[..., Plan]:
    """The ``make`` function of plan ``kind`` for ``n`` inputs and ``m`` outputs.
    ``variant``: prebound, torch tensors (``data_ptr()``, else ``DeviceArray.ptr``);
    natural, outputs made by ``x0.new_empty`` (else ``torch.empty``); replay and copying,
    the static outputs' views handed over (else copies)."""
    if n < 1:
        raise ValueError(f"a plan needs at least one input; got {n}")
    xs, ys = _names("x", n), _names("y", m)
    fields: dict[str, str] = {"n": str(n), "m": str(m), "unpack_in": _unpack(xs, "inputs"),
                              "outs": ", ".join(ys), "run": _RUN, "after": _AFTER}
    if kind == "prebound":
        arrays = xs + ys
        ptr = "{}.data_ptr()" if variant else "{}.ptr"
        consts = _names("a", n + m) + _names("p", n + m) + _names("s", n + m)
        fields.update(
            consts=", ".join(consts),
            unpack_out=_unpack(ys, "outputs") if m else "",
            # other arrays: the plan remembered for them (keyed by their ids, as
            # fast_path.FastPaths.call_prebound looks them up)
            switch=_SWITCH.format(differs=_any([f"{v} is not a{i}" for i, v in enumerate(arrays)]),
                                  key="(" + "".join(f"id({v}), " for v in arrays) + ")", unusable="",
                                  pick="", before="", enter="other"),
            pointers=_any([f"{ptr.format(v)} != p{i}" for i, v in enumerate(arrays)]),
            shapes=_any([f"{v}.shape != s{i}" for i, v in enumerate(arrays)]),
            enqueue=_enqueue("ctx.trt_context", ys, "order.caller(None, torch_kind)", "torch_kind"),
        )
        template = _PREBOUND
    elif kind in ("natural", "slab"):
        consts = _names("d", n) + _names("s", n) + _names("name", n) + _names("out", m) + _names("shape", m)
        bind_in = [line for i, x in enumerate(xs) for line in _bind(x, f"name{i}")]
        alloc_out = []
        caller = _TORCH_CALLER
        if kind == "slab":
            alloc_out += _slab_take(ys, "c", "raw_stream(device)")
            caller = "None if c in order.skip or c == order.ours else c"
        for i, y in enumerate(ys):
            if kind == "natural":
                alloc_out.append(f"{y} = x0.new_empty(shape{i})" if variant
                                 else f"{y} = empty(shape{i}, dtype=od{i}, device=torch_device)")
            alloc_out += _bind(y, f"out{i}")
        consts += _names("od", m) + (["pools", "refill"] if kind == "slab" else [])
        fields.update(
            consts=", ".join(consts),
            torch_head=_torch_head(xs, [
                f"type({x}) is not tensor or {x}.dtype is not d{i} or {x}.get_device() != device "
                f"or not {x}.is_contiguous()" for i, x in enumerate(xs)
            ]),
            switch=_switch(xs),
            bind_in=_indent(bind_in), alloc_out=_indent(alloc_out),
            enqueue=_enqueue("trt_context", ys, caller, "True"),
        )
        template = _NATURAL
    elif kind == "replay":
        consts = _names("d", n) + _names("s", n) + _names("dst", n) + _names("nb", n)
        # cuda-python's own functions: no wrapper in the call
        copies = []
        for i in range(n):
            copies += [f"if src{i} != dst{i} and nb{i}:",
                       f"    (err,) = copy(dst{i}, src{i}, nb{i}, d2d, run)",
                       "    if err:", "        failed(err, 'cudaMemcpyAsync')"]
        fields.update(
            _replay_head(xs, consts, plain=True),
            graph_gone="graph is None", plain_way="", launched="graph",
            # no input in its static buffer: the slot's own plan when that is another (copying)
            to_copying=_indent([
                f"if {' and '.join(f'src{i} != dst{i}' for i in range(n))} and (other := slot.plan) "
                "is not None and other is not core.fast_entry:",
                "    core.fast_entry = other",
                "    return other.go(inputs, stream, outputs)"]),
            # an input that is not the static buffer itself must be on the engine's device
            foreign_device=_any([f"(src{i} != dst{i} and {x}.get_device() != device)"
                                 for i, x in enumerate(xs)]),
            copies=_indent(copies),
            results="list(views)" if variant else "results(run)",
        )
        template = _REPLAY
    elif kind in ("copying", "copying-slab"):
        consts = (_names("d", n) + _names("s", n) + _names("dst", n) + _names("nb", n) + _names("nin", n)
                  + _names("shape", m) + _names("od", m) + _names("so", m) + _names("onb", m)
                  + _names("nout", m) + (["pools", "refill"] if kind == "copying-slab" else []))
        # each node pointed at the call's buffers where it changed (CopyNodes.point); an
        # address CUDA refuses (memory of another kind than the node was built with) sends
        # the call the plain way, copying with cudaMemcpyAsync
        set_in = []
        for i in range(n):
            set_in += _node_update(f"nin{i}", f"dst{i}", f"src{i}", f"nb{i}", i, changing=f"src{i}")
        alloc_out = []
        if kind == "copying-slab":
            # (``c``: torch's current stream when the caller's is torch's, from the caller expression)
            alloc_out += _slab_take(ys, "cs", "c if stream is None else raw_stream(device)")
        for j, y in enumerate(ys):
            if kind == "copying":
                alloc_out.append(f"{y} = empty(shape{j}, dtype=od{j}, device=torch_device)")
            alloc_out += [f"p = {y}.data_ptr()",
                          *_node_update(f"nout{j}", "p", f"so{j}", f"onb{j}", n + j, changing="p")]
        fields.update(
            _replay_head(xs, consts, plain=False),
            graph_gone="graph is not graph0", launched="cexec",
            foreign_device=_any([f"{x}.get_device() != device" for x in xs]),
            to_copying="",
            plain_way=_indent([f"if {_any([f'src{i} == dst{i}' for i in range(n)])}:",
                               "    core.fast_entry = plain",
                               "    return plain.go(inputs, stream, outputs)"]),
            copies=_indent(set_in + alloc_out),
            # variant: "view" mode, the static outputs' views handed over (no output nodes)
            results="list(views)" if variant else f"[{', '.join(ys)}]",
        )
        template = _REPLAY
    else:
        raise ValueError(
            "plan kind must be one of 'prebound', 'natural', 'slab', 'replay', 'copying', 'copying-slab'; "
            f"got {kind!r}"
        )
    if template is _REPLAY:
        fields["body"] = _REPLAY_BODY.format(**fields)
    source = template.format(**fields)
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<trt_runtime plan: {kind} {n}->{m}>", "exec"), namespace)
    return namespace["make"]  # type: ignore[no-any-return]


def prebound_plan(lane: Any, fast: Any, torch_ptrs: bool) -> Plan:
    """The plan of a remembered pre-bound call ``fast`` (a :class:`.fast_path.FastPath`)
    of the lane's current context; ``torch_ptrs``: its arrays are torch tensors (else
    ``DeviceArray``\\ s)."""
    from trt_runtime_backends.python.fast_path import prepare_state

    make = _compile("prebound", len(fast.in_ids), len(fast.out_ids), torch_ptrs)
    prepare = functools.partial(prepare_state, lane, fast.shape_key, fast.dynamic_dims, fast.out_shapes,
                                fast.ptrs)
    return make(lane, lane.call_fast, lane._order, lane._stream, lane.lane.context, fast.shape_key, fast.ptrs,
                prepare, fast.torch, lane._fast_paths.prebound, *fast.arrays, *fast.ptrs, *fast.shapes)


def natural_plan(lane: Any, entry: Any, shapes: tuple[Any, ...]) -> Plan:
    """The plan of a remembered natural call ``entry`` (a :class:`.fast_path.NaturalCall`)
    of the lane's current context, for torch inputs of ``shapes`` (``torch.Size``\\ s)."""
    from trt_runtime_backends.python.fast_path import restore_shapes

    bridge = lane._torch
    ctx = lane.lane.context
    names, out_shapes, dtypes = zip(*entry.outputs, strict=True) if entry.outputs else ((), (), ())
    slabs = slab_pools(bridge.empty, bridge.device, out_shapes, dtypes) or ()
    make = _compile("slab" if slabs else "natural", len(shapes), len(entry.outputs), entry.like_input)
    restore = functools.partial(restore_shapes, lane, ctx, entry.shape_key, entry.dynamic_dims,
                                entry.out_shapes)
    return make(
        lane, lane.call_fast, lane._order, lane._stream, ctx, entry.shape_key, restore, bridge.tensor,
        lane._device, bridge.raw_stream, ctx.bound, bridge.empty, bridge.device, lane._fast_paths.natural,
        *bridge.in_dtypes, *shapes, *lane._in_names, *names, *out_shapes, *dtypes, *slabs,
    )


def replay_plan(lane: Any, slot: Any, shapes: tuple[Any, ...], graphs: Any) -> Plan:
    """The plan of a captured outer-graph ``slot`` for torch inputs of ``shapes``: its
    static outputs handed back when it has views of them (``"view"``), else copies; the
    copies made by the memcpy nodes of the slot's :class:`~trt_runtime.graphs.CopyNodes` graph when it
    has one (inputs that are the static buffers themselves go the plain way)."""
    from trt_runtime_backends.python.graphs import replay_failed, torch_results

    bridge = lane._torch
    ops = lane.graphs
    views = slot.output_views  # "view" mode: handed over as they are
    make = _compile("replay", len(shapes), 0, views is not None)
    launch, copy = ops.rt.cudaGraphLaunch, ops.rt.cudaMemcpyAsync
    results = functools.partial(torch_results, lane, slot, view=False)
    failed = functools.partial(replay_failed, lane)
    set1d = getattr(ops.rt, "cudaGraphExecMemcpyNodeSetParams1D", None)
    head = (lane, lane.call_fast, lane._order, lane._stream, slot, slot.graph, graphs.cache.touch, launch,
            copy, set1d, ops.d2d, failed, results, views)
    tail = (bridge.empty, bridge.device, bridge.tensor, lane._device, bridge.raw_stream, graphs.shortcuts,
            *bridge.in_dtypes, *shapes, *slot.in_ptrs, *slot.in_nbytes)
    plain = make(*head, None, None, None, *tail)
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
    slabs = slab_pools(bridge.empty, bridge.device, out_shapes, out_dtypes) or ()
    make = _compile("copying-slab" if slabs else "copying", len(shapes), m, views is not None)
    made = make(*head, plain, copying.exec, copying.last, *tail, *copying.ins, *out_shapes, *out_dtypes,
                *slot.out_ptrs[:m], *slot.out_nbytes[:m], *copying.outs, *slabs)
    made.plain = plain  # type: ignore[attr-defined]  # where a plain plan's shape switch goes
    return made
