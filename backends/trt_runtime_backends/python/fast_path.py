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

:class:`FastPaths`, a part of each ``PythonEngine`` lane, owns both caches. Each entry
carries its *plan* (:mod:`.plans`), the function that runs such a call; the last plan
used is the lane's current one (``Lane.fast_entry``), which the core pipeline calls
first: a thread that repeats its call goes from ``engine(x)`` straight into it. A plan
that does not take a call hands it to the lane's ``call_fast``, which looks the call up
here (:func:`shape_key` for natural calls, shared with the outer graphs' replay) and
switches plans (``Lane.switch_fast``).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

from trt_runtime_backends.python import plans
from trt_runtime_backends.python.arrays import DeviceArray
from trt_runtime_backends.python.contract import TensorInfo
from trt_runtime_backends.python.shapes import prepare_state, restore_shapes

from trt_runtime.contract import KIND_TORCH

__all__ = [
    "FAST_ENTRIES", "FastPath", "FastPaths", "NaturalCall", "prepare_state", "restore_shapes", "shape_key",
]

#: How many validated calls of each kind an engine remembers (a few cycled shapes or buffers).
FAST_ENTRIES = 16

_ptr_attr = operator.attrgetter("ptr")
_shape_attr = operator.attrgetter("shape")

#: Whether a natural call makes its outputs with ``inputs[0].new_empty(shape)`` (when every
#: output has the first input's dtype; same device) instead of ``torch.empty(shape, dtype=,
#: device=)``: about 1 µs less per call on an H100 (benchmarks/probes/gpu_call_overhead.py).
NEW_EMPTY = True


class FastPath:
    """A validated ``outputs=`` call: a repeat call with the same objects, pointers and
    shapes goes straight to ``execute_async_v3``."""

    __slots__ = (
        "arrays", "dynamic_dims", "in_ids", "out_ids", "out_shapes", "plan", "ptr_of", "ptrs",
        "shape_key", "shapes", "torch",
    )

    arrays: tuple[Any, ...]
    dynamic_dims: tuple[tuple[str, tuple[int, ...]], ...]
    out_shapes: list[tuple[int, ...]]
    shape_key: tuple[Any, ...]
    in_ids: tuple[int, ...]
    out_ids: tuple[int, ...]
    plan: Any
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
        self.shape_key = shape_key
        self.out_shapes = ctx.out_shapes
        self.dynamic_dims = _dynamic_dims(engine._in, shape_key)
        return self


class NaturalCall:
    """What a call without ``outputs=`` needs for one input-shape signature (torch inputs)."""

    __slots__ = ("dynamic_dims", "like_input", "out_shapes", "outputs", "plan", "shape_key")

    plan: Any

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
    """Remembers :class:`FastPath` and :class:`NaturalCall` calls and runs them through their
    plans (:mod:`.plans`): a part of each ``PythonEngine`` lane, owning both tables. Its
    methods take the lane whose context they run."""

    __slots__ = ("natural", "prebound")

    def __init__(self) -> None:
        #: Validated ``outputs=`` calls by the identities of their arrays.
        self.prebound: dict[tuple[int, ...], FastPath] = {}
        #: Validated torch calls without ``outputs=`` by their input shapes.
        self.natural: dict[tuple[Any, ...], NaturalCall] = {}

    def forget(self) -> None:
        """Drop every remembered call (the context, profile or engine changed); the lane's
        current plan goes too (``Lane.reset_fast``)."""
        self.prebound.clear()
        self.natural.clear()

    # -- outputs= with the same arrays --------------------------------------------------------
    def call_prebound(self, lane: Any, inputs: tuple[Any, ...], outputs: Sequence[Any], stream: Any
                      ) -> list[Any] | None:
        """Run a call with the very arrays of a remembered :class:`FastPath` through its plan
        (which becomes the lane's current one); ``None`` when there is none, or when it is
        the plan that just declined the call (the full path then runs it)."""
        fast = self.prebound.get((*map(id, inputs), *map(id, outputs)))
        return None if fast is None else lane.lane.switch_fast(fast.plan, inputs, stream, outputs)

    def remember_prebound(self, lane: Any, ctx: Any, inputs: Sequence[Any], outputs: Sequence[Any],
                          in_ptrs: list[int], out_ptrs: list[int], kind: int) -> None:
        fast = FastPath.make(lane, ctx, inputs, outputs, in_ptrs, out_ptrs, kind)
        if fast is not None:
            if len(self.prebound) >= FAST_ENTRIES:
                self.prebound.clear()
            ctx.bound_ptrs = fast.ptrs  # the same object: the next call's identity check holds
            fast.plan = plans.prebound_plan(lane, fast, fast.ptr_of is not _ptr_attr)
            self.prebound[fast.in_ids + fast.out_ids] = fast
            lane.lane.fast_entry = fast.plan

    # -- engine(x) with torch tensors ---------------------------------------------------------
    def remember_natural(self, lane: Any, ctx: Any, shapes: tuple[Any, ...]) -> None:
        if ctx.shape_key is None or ctx.allocators:
            return
        if len(self.natural) >= FAST_ENTRIES:
            self.natural.clear()
        entry = self.natural[shapes] = NaturalCall(lane, ctx)
        entry.plan = plans.natural_plan(lane, entry, shapes)
        lane.lane.fast_entry = entry.plan

    def call_natural(self, lane: Any, inputs: tuple[Any, ...], stream: Any) -> list[Any] | None:
        """Run a call whose inputs have the shapes of a remembered :class:`NaturalCall`
        through its plan (which checks that they are the torch tensors it takes); ``None``
        when there is none, or when it is the plan that just declined the call."""
        key = shape_key(inputs)
        entry = None if key is None else self.natural.get(key)
        return None if entry is None else lane.lane.switch_fast(entry.plan, inputs, stream, None)


def shape_key(inputs: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The shapes of ``inputs`` as the tables key them (``None``: something without a shape)."""
    try:
        if len(inputs) == 1:
            return (inputs[0].shape,)
        return tuple([x.shape for x in inputs])
    except AttributeError:
        return None
