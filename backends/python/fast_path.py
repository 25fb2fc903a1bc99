"""The python backend's fast paths: repeat calls that skip the checks an earlier call made.

Two caches, both filled by a call that went through the full path (every check, shape
inference, binding) and both emptied when the execution context is dropped, the
profile changes or the engine closes:

* :class:`FastPath`, for ``execute(*inputs, outputs=[...])`` with **the same array
  objects** as an earlier call (the pre-bound low-latency loop, or a few preallocated
  views cycled): looked up by the identities of the arrays; only their pointers and
  shapes are compared again.
* :class:`NaturalCall`, for ``engine(x)`` / ``execute(x)`` with CUDA torch tensors and
  no ``outputs=``: looked up by the input shapes alone, whatever the tensor objects.
  A repeat call checks type, dtype, device and contiguity of each tensor (four C-level
  reads), binds changed addresses, makes each output with ``torch.empty`` from cached
  arguments and goes straight to ``execute_async_v3`` on the caller's stream (see
  :meth:`.stream_order.StreamOrder.follow`).

:class:`FastPaths`, a part of each ``PythonEngine`` lane, owns both caches and runs them
(from the lane's ``_call_fast`` hook of the core pipeline); :func:`torch_lookup` is
shared with the outer graphs' torch replay (which sets no shapes: a graph holds its own).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

from trt_runtime_backends.python.arrays import DeviceArray
from trt_runtime_backends.python.contract import TensorInfo

from trt_runtime.contract import KIND_TORCH

__all__ = ["FAST_ENTRIES", "FastPath", "FastPaths", "NaturalCall", "restore_shapes", "torch_lookup"]

#: How many validated calls of each kind an engine remembers (a few cycled shapes or buffers).
FAST_ENTRIES = 16

_ptr_attr = operator.attrgetter("ptr")
_shape_attr = operator.attrgetter("shape")

#: Whether a natural call makes its outputs with ``inputs[0].new_empty(shape)`` (when every
#: output has the first input's dtype; same device) instead of ``torch.empty(shape, dtype=,
#: device=)``: about 1 µs less per call on an H100 (tools/gpu_call_overhead.py).
NEW_EMPTY = True


class FastPath:
    """A validated ``outputs=`` call: a repeat call with the same objects, pointers and
    shapes goes straight to ``execute_async_v3``."""

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
    def make(cls, engine: Any, ctx: Any, inputs: Sequence[Any], outputs: Sequence[Any],
             in_ptrs: list[int], out_ptrs: list[int], kind: int) -> FastPath | None:
        arrays = (*inputs, *outputs)
        kinds = {type(a) for a in arrays}
        if len(kinds) != 1:
            return None
        (tp,) = kinds
        if tp is engine._torch.tensor and tp is not None:
            ptr_of = tp.data_ptr
        elif tp is DeviceArray:
            ptr_of = _ptr_attr
        else:
            return None
        shape_key = ctx.shape_key
        if shape_key is None:
            return None
        self = cls()
        self.arrays = arrays
        self.in_ids = tuple(map(id, inputs))
        self.out_ids = tuple(map(id, outputs))
        self.ptr_of = ptr_of
        self.ptrs = (*in_ptrs, *out_ptrs)
        self.shapes = tuple(map(_shape_attr, arrays))
        self.torch = kind == KIND_TORCH
        self.execute = ctx.trt_context.execute_async_v3
        self.shape_key = shape_key
        self.out_shapes = ctx.out_shapes
        self.dynamic_dims = _dynamic_dims(engine._in, shape_key)
        return self


class NaturalCall:
    """What a call without ``outputs=`` needs for one input-shape signature (torch inputs)."""

    __slots__ = ("dynamic_dims", "like_input", "out_shapes", "outputs", "shape_key")

    def __init__(self, engine: Any, ctx: Any) -> None:
        self.shape_key = ctx.shape_key
        self.out_shapes = ctx.out_shapes
        self.dynamic_dims = _dynamic_dims(engine._in, ctx.shape_key)
        #: (name, shape, torch dtype) of each output: the torch.empty arguments.
        self.outputs = tuple(
            (io.name, tuple(shape), io.torch_dtype)
            for io, shape in zip(engine._out, ctx.out_shapes, strict=True)
        )
        first = engine._in[0].torch_dtype if engine._in else None
        self.like_input = NEW_EMPTY and all(dtype is first for _, _, dtype in self.outputs)


def _dynamic_dims(
    ins: Sequence[TensorInfo], shape_key: tuple[Any, ...]
) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple(
        (io.name, tuple(int(d) for d in shape))
        for io, shape in zip(ins, shape_key[0], strict=True)
        if io.spec.is_dynamic
    )


class FastPaths:
    """Runs and remembers :class:`FastPath` and :class:`NaturalCall` calls: a part of each
    ``PythonEngine`` lane, owning both tables. Its methods take the lane whose context
    they run."""

    __slots__ = ("natural", "prebound")

    def __init__(self) -> None:
        #: Validated ``outputs=`` calls by the identities of their arrays.
        self.prebound: dict[tuple[int, ...], FastPath] = {}
        #: Validated torch calls without ``outputs=`` by their input shapes.
        self.natural: dict[tuple[Any, ...], NaturalCall] = {}

    def forget(self) -> None:
        """Drop every remembered call (the context, profile or engine changed)."""
        self.prebound.clear()
        self.natural.clear()

    # -- outputs= with the same arrays --------------------------------------------------------
    def call_prebound(self, lane: Any, inputs: tuple[Any, ...], outputs: Sequence[Any], stream: Any
                      ) -> list[Any] | None:
        """Run a call with the very arrays of a remembered :class:`FastPath` whose pointers
        and shapes are unchanged; ``None`` when there is none (the full path runs it)."""
        fast = self.prebound.get((*map(id, inputs), *map(id, outputs)))
        if (
            fast is None
            or tuple(map(fast.ptr_of, fast.arrays)) != fast.ptrs
            or tuple(map(_shape_attr, fast.arrays)) != fast.shapes
        ):
            return None
        ctx = lane._context
        # identity checks first: the context is normally still in this call's state
        if (ctx is None or ctx.shape_key is not fast.shape_key or ctx.bound_ptrs is not fast.ptrs) and (
            not self._prepare(lane, fast)
        ):
            return None
        order = lane._order
        caller = None if stream is lane._stream else order.caller(stream, fast.torch)
        run = order.follow(caller)
        if not fast.execute(run):
            lane._execute_failed()
        if caller is not None and run != caller:
            order.after(caller)
        return list(outputs)

    def _prepare(self, lane: Any, fast: FastPath) -> bool:
        """Put the context in the state ``fast`` was recorded in: its shapes (the same
        profile only) and its addresses. False sends the call down the full path."""
        ctx = lane._context
        if ctx is None:
            return False
        if ctx.shape_key != fast.shape_key and not restore_shapes(
            lane, ctx, fast.shape_key, fast.dynamic_dims, fast.out_shapes
        ):
            return False
        if ctx.bound_ptrs != fast.ptrs:
            trt_context = ctx.trt_context
            bound = ctx.bound
            for name, ptr in zip(lane._io_names, fast.ptrs, strict=True):
                if bound.get(name) != ptr:
                    trt_context.set_tensor_address(name, ptr)
                    bound[name] = ptr
        ctx.shape_key = fast.shape_key
        ctx.bound_ptrs = fast.ptrs
        return True

    def remember_prebound(self, lane: Any, ctx: Any, inputs: Sequence[Any], outputs: Sequence[Any],
                          in_ptrs: list[int], out_ptrs: list[int], kind: int) -> None:
        fast = FastPath.make(lane, ctx, inputs, outputs, in_ptrs, out_ptrs, kind)
        if fast is not None:
            if len(self.prebound) >= FAST_ENTRIES:
                self.prebound.clear()
            ctx.bound_ptrs = fast.ptrs  # the same object: the next call's identity check holds
            self.prebound[fast.in_ids + fast.out_ids] = fast

    # -- engine(x) with torch tensors ---------------------------------------------------------
    def remember_natural(self, lane: Any, ctx: Any, shapes: tuple[Any, ...]) -> None:
        if ctx.shape_key is None or ctx.allocators:
            return
        if len(self.natural) >= FAST_ENTRIES:
            self.natural.clear()
        self.natural[shapes] = NaturalCall(lane, ctx)

    def call_natural(self, lane: Any, inputs: tuple[Any, ...], stream: Any) -> list[Any] | None:
        """Run a call whose torch inputs have shapes an earlier call validated; ``None``
        when it does not qualify (the full path then checks and runs it)."""
        found = torch_lookup(lane, inputs, stream, self.natural)
        if found is None:
            return None
        entry, caller = found
        ctx = lane._context
        if ctx.shape_key is not entry.shape_key and (
            ctx.shape_key != entry.shape_key
            and not restore_shapes(lane, ctx, entry.shape_key, entry.dynamic_dims, entry.out_shapes)
        ):
            return None
        if lane._multi_device:
            lane._set_device()
        trt_context = ctx.trt_context
        bound = ctx.bound
        for name, x in zip(lane._in_names, inputs, strict=False):
            ptr = x.data_ptr()
            if bound.get(name) != ptr:
                trt_context.set_tensor_address(name, ptr)
                bound[name] = ptr
                ctx.bound_ptrs = ()
        results = []
        if entry.like_input:
            for name, shape, _ in entry.outputs:
                y = inputs[0].new_empty(shape)
                ptr = y.data_ptr()
                if bound.get(name) != ptr:
                    trt_context.set_tensor_address(name, ptr)
                    bound[name] = ptr
                    ctx.bound_ptrs = ()
                results.append(y)
        else:
            empty = lane._torch.empty
            torch_device = lane._torch.device
            for name, shape, dtype in entry.outputs:
                y = empty(shape, dtype=dtype, device=torch_device)
                ptr = y.data_ptr()
                if bound.get(name) != ptr:
                    trt_context.set_tensor_address(name, ptr)
                    bound[name] = ptr
                    ctx.bound_ptrs = ()
                results.append(y)
        order = lane._order
        run = order.follow(caller)
        if not trt_context.execute_async_v3(run):
            lane._execute_failed()
        if caller is not None and run != caller:
            order.after(caller)
        return results


def restore_shapes(lane: Any, ctx: Any, shape_key: tuple[Any, int],
                   dynamic_dims: tuple[tuple[str, tuple[int, ...]], ...], out_shapes: Any) -> bool:
    """Put the context back in a state a fast path or a graph was recorded in: its
    profile (switched when it differs), its input shapes, memory that fits them; the
    output shapes are known from then. False when TensorRT refuses a shape."""
    ctx.shape_key = None  # if setting fails halfway, the next call sets the shapes again
    profile = shape_key[1]
    if ctx.profile != profile:
        lane._select_profile(ctx, profile)
    trt_context = ctx.trt_context
    for name, dims in dynamic_dims:
        if not trt_context.set_input_shape(name, dims):
            return False
    if dynamic_dims:
        lane._fit_device_memory(ctx)
    ctx.shape_key = shape_key
    ctx.out_shapes = out_shapes
    return True


def torch_lookup(lane: Any, inputs: tuple[Any, ...], stream: Any, table: dict[Any, Any]
                 ) -> tuple[Any, int | None] | None:
    """For contiguous CUDA torch tensors of the right dtypes on the engine's device: the
    entry of ``table`` for their shapes and the caller's stream to order with (torch's
    current stream when ``stream`` is None; ``None`` when no event is needed). ``None``
    for anything else, or shapes ``table`` does not know (one function for both torch
    fast paths: every call in them counts)."""
    bridge = lane._torch
    tensor = bridge.tensor
    device = lane._device
    if len(inputs) == 1:  # most engines: no tuple building, one check
        (x,) = inputs
        if (type(x) is not tensor or x.dtype is not bridge.in_dtypes[0] or x.get_device() != device
                or not x.is_contiguous()):
            return None
        entry = table.get((x.shape,))
    else:
        if len(inputs) != lane._n_in:
            return None
        for x, dtype in zip(inputs, bridge.in_dtypes, strict=False):
            if (type(x) is not tensor or x.dtype is not dtype or x.get_device() != device
                    or not x.is_contiguous()):
                return None
        entry = table.get(tuple([x.shape for x in inputs]))
    if entry is None:
        return None
    if stream is None:
        caller: int | None = bridge.raw_stream(device)
        if caller in lane._order.skip or caller == lane._stream_handle:
            caller = None
    else:
        caller = lane._order.caller(stream, True)
    return entry, caller
