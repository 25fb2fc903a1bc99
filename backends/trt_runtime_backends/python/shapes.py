"""Input shapes on a lane's execution context, and a context per shape.

:func:`apply_shapes` (the full path's, and the outer graph's before a capture) and
:func:`restore_shapes` (a fast path's, with what an earlier call learnt) put the lane's
``ExecutionContext`` in a call's input shapes and optimization profile
(:func:`select_profile`).

Changing shapes without TensorRT-RTX's cost of changing them: on TensorRT-RTX 1.6.1 (an
H100, the benchmark's dynamic MLP fed batches 1, 8 and 64 in turn;
``benchmarks/probes/gpu_shape_switch_probe.py``) ``set_input_shape`` + ``execute_async_v3``
costs 77 to 100 µs a call when the shape changes and 24 µs when it does not: the first
enqueue after a change specializes again on the host. A context keeps what it specialized
for its shapes, so a lane keeps up to :attr:`ShapeContexts.limit` execution contexts of its
engine (:data:`SHAPE_CONTEXTS` by default), each in the shapes of a recent call, all given
the lane's one USER_MANAGED scratch buffer. That is safe because a lane's calls run one
after another on the GPU (its stream order; see :mod:`.stream_order`), so no two of its
contexts use the buffer at once. A call whose shapes one of them holds swaps it in, with
no TensorRT call at all; the probe measured 24 µs for contexts fed in turn, 0 wrong of 300
results, and no device memory beyond the shared buffer.

A context is made only when shapes *come back* (the lane ran them before, then others), so
shapes seen once cost nothing. Making one took 40 to 80 ms on that host, and about 11 ms
when a runtime cache (the ``runtime_cache`` setting) that earlier contexts filled is
attached; it happens once per shape and lane. Past the limit, the lane's first context
takes the other shapes, changing its shapes as before (see :class:`ShapeContexts`). Not
used for contexts that size their scratch memory per shape
(``engine.MEMORY_PER_SHAPE``), contexts with output allocators (data-dependent outputs),
nor TensorRT without USER_MANAGED contexts. ``engine.shape_contexts = 1`` turns it off.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from trt_runtime.contract import fmt_shape
from trt_runtime.errors import EngineError, InputError

__all__ = ["SHAPE_CONTEXTS", "ShapeContexts", "apply_shapes", "prepare_state", "restore_shapes",
           "select_profile"]

#: Execution contexts a lane may hold, one per input-shape signature, by default.
SHAPE_CONTEXTS = 4


@dataclass(slots=True)
class Parked:
    """A context of the lane not in use, and the state the lane's context object had with it."""

    trt_context: Any
    bound: dict[str, int]
    bound_ptrs: tuple[int, ...]
    out_shapes: list[tuple[int, ...]]
    profile: int
    key: tuple[Any, int]


class ShapeContexts:
    """The lane's part that swaps contexts by input shapes (see the module docstring).

    The lane's first context *roams*: it takes every shape that has no context of its own,
    changing its shapes as one context always did. Each context made later keeps the shapes
    it was made for, so it specializes once. (Contexts that took whatever shapes came, past
    the limit, would each specialize again for shapes new to them: on the GPU that was
    slower than one context changing its shapes, 988 against 158 µs a call for 6 shapes
    over 4 contexts.) ``ExecutionContext.parked`` holds the contexts of their own shapes
    not in use, ``ExecutionContext.roaming`` the roaming one when it is not in use.

    ``made``: contexts made for shapes that came back; ``swaps``: changes of shapes served by
    a context already in them; ``making``: False once making one failed (the lane goes on
    with those it has)."""

    __slots__ = ("limit", "made", "making", "swaps")

    def __init__(self, limit: int = SHAPE_CONTEXTS) -> None:
        self.limit = limit
        self.made = 0
        self.swaps = 0
        self.making = True

    def take(self, lane: Any, ctx: Any, key: tuple[Any, int], make: bool) -> bool:
        """Give ``ctx`` (the lane's ``ExecutionContext``) a TensorRT context already in the
        shapes and profile of ``key``: one parked, or one made now if ``make`` (callers pass
        it for shapes the lane ran before) and the limit allows. False: the caller sets the
        shapes, on the roaming context, which is then the one in use. The caller sets
        ``ctx.out_shapes`` after."""
        current = ctx.shape_key
        if (self.limit <= 1 or current is None or not ctx.user_managed or ctx.per_shape or ctx.allocators
                or ctx.device_memory is None):
            return False
        roaming = ctx.roaming  # None: the roaming context is the one in use
        entry = ctx.parked.pop(key, None)
        if entry is None and roaming is not None and roaming.key == key:
            entry = roaming
        if entry is None and make and self.making and self.count(ctx) < self.limit:
            entry = self._make(lane, ctx, key)
        elif entry is not None:
            self.swaps += 1
        if entry is None:
            if roaming is None:
                return False
            entry = roaming  # in, for the caller to set its shapes
        record = Parked(ctx.trt_context, dict(ctx.bound), ctx.bound_ptrs, ctx.out_shapes, ctx.profile,
                        current)
        if roaming is None:
            ctx.roaming = record
        else:
            ctx.parked[current] = record
            if entry is roaming:
                ctx.roaming = None
        ctx.use(entry.trt_context)
        bound = ctx.bound  # the same dict: the natural plans hold its get
        bound.clear()
        bound.update(entry.bound)
        ctx.bound_ptrs = entry.bound_ptrs
        ctx.out_shapes = entry.out_shapes
        ctx.profile = entry.profile
        ctx.shape_key = entry.key
        return entry.key == key

    def _make(self, lane: Any, ctx: Any, key: tuple[Any, int]) -> Parked | None:
        """A new context in ``key``'s shapes; ``None`` (warned, and no more tries on this lane)
        when TensorRT cannot make one: the call goes on the roaming context."""
        try:
            made = _make(lane, ctx, key)
        except Exception as exc:
            self.making = False
            warnings.warn(f"engine {lane.name!r}: no context per shape from now on ({exc})",
                          RuntimeWarning, stacklevel=3)
            return None
        self.made += 1
        return Parked(made, {}, (), [], key[1], key)

    def count(self, ctx: Any) -> int:
        """Contexts ``ctx`` holds: the one in use and the parked ones (0 before the first)."""
        if ctx is None or ctx.trt_context is None:
            return 0
        return 1 + len(ctx.parked) + (ctx.roaming is not None)


def _make(lane: Any, ctx: Any, key: tuple[Any, int]) -> Any:
    """A new context of the lane's engine in ``key``'s profile and input shapes, on the
    lane's scratch buffer (made with the lane's runtime config, so with its runtime cache)."""
    shapes, profile = key
    shown = ", ".join(fmt_shape(shape) for shape in shapes)
    with lane._state.scope():
        trt_context = lane._trt_engine.create_execution_context(ctx.config)
        if trt_context is None:
            raise EngineError(f"TensorRT could not create an execution context for input shapes {shown}")
        if not _switch_profile(lane, ctx, trt_context, profile):
            raise EngineError(f"could not select optimization profile {profile} in a new context")
        if _set_shapes(trt_context, _dynamic_dims(lane, shapes)) is not None:
            raise EngineError(f"TensorRT rejected input shapes {shown} in a new context")
    return trt_context


def _dynamic_dims(lane: Any, shapes: tuple[Any, ...]) -> list[tuple[str, tuple[int, ...]]]:
    """(name, dims) of each dynamic input of ``shapes``: what ``set_input_shape`` gets."""
    return [(io.name, tuple(int(d) for d in shape))
            for io, shape in zip(lane._in, shapes, strict=False) if io.spec.is_dynamic]


def _set_shapes(trt_context: Any, dims: Any) -> str | None:
    """``set_input_shape`` for each ``(name, dims)``; the name of the first one TensorRT
    refuses (``None``: all set)."""
    for name, shape in dims:
        if not trt_context.set_input_shape(name, shape):
            return name  # type: ignore[no-any-return]
    return None


def _switch_profile(lane: Any, ctx: Any, trt_context: Any, profile: int) -> bool:
    """Select ``profile`` on ``trt_context`` (on our stream, after the lane's work) and, for a
    USER_MANAGED context, hand it ``ctx``'s scratch buffer again once the switch is done (the
    whole buffer unless it is sized per shape; then the caller sizes it). False: refused."""
    lane._order.to_ours()
    if not trt_context.set_optimization_profile_async(profile, lane._stream_handle):
        return False
    if ctx.user_managed:
        lane.sync()
        memory = ctx.device_memory
        if not ctx.per_shape and memory is not None:
            trt_context.set_device_memory(int(memory.handle), int(memory.size))
    return True


def apply_shapes(lane: Any, ctx: Any, shapes: tuple[Any, ...], profile: int, make: bool = True) -> None:
    """Put ``ctx`` in ``shapes`` and ``profile`` (its ``shape_key`` then says so): a context
    already in them swapped in, else the profile selected and the shapes set on the context
    in use; the output shapes read (from TensorRT the first time). ``make=False`` (before an
    outer-graph capture, whose replays need no context in the shapes) makes no new context."""
    key = (shapes, profile)
    known = ctx.out_shape_cache.get(key)
    # (shapes never run: no new context, but the roaming one takes them, not one of a shape)
    if lane._shape_contexts.take(lane, ctx, key, make and known is not None):
        if known is not None:
            ctx.out_shapes = known
        return
    ctx.shape_key = None  # if applying fails halfway, the next call applies again
    trt_context = ctx.trt_context
    if profile != ctx.profile:
        select_profile(lane, ctx, profile)
    dims = _dynamic_dims(lane, shapes)
    refused = _set_shapes(trt_context, dims)
    if refused is not None:
        said = lane._logger.errors_since(None)[-1:]
        raise InputError(
            f"engine {lane.name!r}: TensorRT rejected shape {fmt_shape(dict(dims)[refused])} for input "
            f"{refused!r}" + (f": {said[0]}" if said else "")
        )
    lane._fit_device_memory(ctx)
    if known is None:  # TensorRT's shape inference runs for these shapes
        known = []
        for io in lane._out:
            shape = tuple(int(d) for d in trt_context.get_tensor_shape(io.name))
            if any(d < 0 for d in shape) and io.name not in ctx.allocators:
                # Only known after the engine ran: switch this output to an allocator.
                lane._mark_data_dependent(io)
                lane._attach_allocator(ctx, io.name)
            known.append(shape)
        if not ctx.allocators:
            if len(ctx.out_shape_cache) >= 64:
                ctx.out_shape_cache.clear()
            ctx.out_shape_cache[key] = known
    ctx.out_shapes = known
    ctx.shape_key = key


def restore_shapes(lane: Any, ctx: Any, shape_key: tuple[Any, int],
                   dynamic_dims: tuple[tuple[str, tuple[int, ...]], ...], out_shapes: Any) -> bool:
    """Put the context back in a state a fast path or a graph was recorded in: a context
    already in those shapes swapped in, else its profile (switched when it differs), its
    input shapes, memory that fits them; the output shapes are known from then. False when
    TensorRT refuses a shape."""
    if lane._shape_contexts.take(lane, ctx, shape_key, True):
        ctx.out_shapes = out_shapes
        return True
    ctx.shape_key = None  # if setting fails halfway, the next call sets the shapes again
    profile = shape_key[1]
    if ctx.profile != profile:
        select_profile(lane, ctx, profile)
    if _set_shapes(ctx.trt_context, dynamic_dims) is not None:
        return False
    if dynamic_dims:
        lane._fit_device_memory(ctx)
    ctx.shape_key = shape_key
    ctx.out_shapes = out_shapes
    return True


def prepare_state(lane: Any, shape_key: tuple[Any, int],
                  dynamic_dims: tuple[tuple[str, tuple[int, ...]], ...], out_shapes: Any,
                  ptrs: tuple[int, ...]) -> bool:
    """Put the lane's context in the state a pre-bound call was recorded in: its shapes (the
    same profile only) and its addresses. False sends the call down the full path."""
    ctx = lane.lane.context
    if ctx is None:
        return False
    if ctx.shape_key != shape_key and not restore_shapes(lane, ctx, shape_key, dynamic_dims, out_shapes):
        return False
    if ctx.bound_ptrs != ptrs:
        ctx.bound_ptrs = ()  # (records forgotten before TensorRT is told: see plans._bind)
        trt_context = ctx.trt_context
        bound = ctx.bound
        for name, ptr in zip(lane._io_names, ptrs, strict=True):
            if bound.get(name) != ptr:
                bound[name] = 0
                trt_context.set_tensor_address(name, ptr)
                bound[name] = ptr
    ctx.shape_key = shape_key
    ctx.bound_ptrs = ptrs
    return True


def select_profile(lane: Any, ctx: Any, profile: int) -> None:
    """Switch the context in use to optimization ``profile`` (its addresses must be set again).

    What the context records is forgotten first: a ``KeyboardInterrupt`` between TensorRT's
    switch and the record leaves a lane whose next call switches and binds again."""
    ctx.profile = -1
    ctx.bound.clear()
    ctx.bound_ptrs = ()
    if not _switch_profile(lane, ctx, ctx.trt_context, profile):
        raise EngineError(f"engine {lane.name!r}: could not select optimization profile {profile}")
    ctx.profile = profile
