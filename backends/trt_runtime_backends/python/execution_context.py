"""The execution context of a python-backend engine, and what its finalizer releases.

:class:`ExecutionContext` wraps an ``IExecutionContext`` with the state the hot paths
compare instead of asking TensorRT: the bound addresses, the input shapes and profile in
force, output shapes per input-shape signature, the output allocators, and the scratch
memory the runtime owns for contexts created ``USER_MANAGED``. :class:`Resources` is
what an engine's ``weakref.finalize`` releases when an engine is collected unclosed.
"""

from __future__ import annotations

from typing import Any

from trt_runtime_backends.python import cuda

__all__ = ["ExecutionContext", "Resources", "drop_context", "finalize", "trt_enum"]


class ExecutionContext:
    """An execution context and the bindings it currently holds."""

    __slots__ = (
        "allocators",
        "bound",
        "bound_ptrs",
        "config",
        "device_memory",
        "enqueue",
        "native_cache",
        "out_shape_cache",
        "out_shapes",
        "parked",
        "per_shape",
        "profile",
        "roaming",
        "shape_key",
        "trt_context",
        "user_managed",
    )

    def __init__(self, trt_context: Any, config: Any, native_cache: Any) -> None:
        self.trt_context: Any = None
        #: ``trt_context.execute_async_v3``, bound once (:meth:`use`): a plan's enqueue is then
        #: one attribute read and the call, no lookup of the method on the TensorRT object.
        self.enqueue: Any = None
        self.use(trt_context)
        self.config = config
        self.native_cache = native_cache
        self.bound: dict[str, int] = {}
        #: The addresses bound, inputs then outputs (compared whole by the fast path;
        #: ``()`` when only ``bound`` is up to date).
        self.bound_ptrs: tuple[int, ...] = ()
        self.shape_key: tuple[Any, ...] | None = None
        self.out_shapes: list[tuple[int, ...]] = []
        self.out_shape_cache: dict[Any, list[tuple[int, ...]]] = {}
        self.profile = 0
        self.allocators: dict[str, Any] = {}
        #: Whether the context's scratch memory is ours (USER_MANAGED), and that memory.
        self.user_managed = False
        self.device_memory: Any = None
        #: Whether that memory is sized again after each change of input shapes (see
        #: ``engine.MEMORY_PER_SHAPE``); otherwise it fits every shape of every profile.
        self.per_shape = False
        #: The lane's other contexts, by the input-shape key they are in (``.shape_contexts``).
        self.parked: dict[Any, Any] = {}
        #: The lane's first context, when another is in use (``.shapes.ShapeContexts``).
        self.roaming: Any = None

    def use(self, trt_context: Any) -> None:
        """Run on ``trt_context`` (``None``: none, the context is dropped) from now on."""
        self.trt_context = trt_context
        self.enqueue = None if trt_context is None else trt_context.execute_async_v3


def trt_enum(enum_type: Any, member: Any) -> Any:
    """The TensorRT enum value of one of our settings enums (by name, else by code)."""
    value = getattr(enum_type, member.name, None)
    return value if value is not None else enum_type(member.code)


class Resources:
    """What the finalizer of an engine releases (it must not reference the engine)."""

    __slots__ = ("context", "events", "graph_execs", "graphs", "order", "rt", "stream_handle")

    def __init__(self, rt: Any) -> None:
        self.rt = rt
        self.stream_handle = 0
        self.events: tuple[Any, ...] = ()
        #: The lane's StreamOrder: its ``tail`` is the caller stream its last fast call used.
        self.order: Any = None
        self.context: ExecutionContext | None = None
        #: Instantiated outer CUDA graphs (destroyed before the context).
        self.graph_execs: list[Any] = []
        #: Graphs kept for their nodes (``trt_runtime.graphs.CopyNodes``), destroyed after their executables.
        self.graphs: list[Any] = []


def drop_context(context: ExecutionContext) -> None:
    context.allocators.clear()
    context.parked.clear()
    context.roaming = None
    context.use(None)
    context.device_memory = None  # after the context: it used the memory until now
    context.config = None
    context.native_cache = None


def finalize(res: Resources) -> None:
    tail = getattr(res.order, "tail", None)
    try:
        if tail is not None and tail != res.stream_handle:
            res.rt.cudaStreamSynchronize(tail)
        res.rt.cudaStreamSynchronize(res.stream_handle)
    except Exception:  # a dying process; nothing to report to
        pass
    _destroy_all(res.rt, "cudaGraphExecDestroy", res.graph_execs)
    _destroy_all(res.rt, "cudaGraphDestroy", res.graphs)  # after their executables
    if res.context is not None:
        drop_context(res.context)
        res.context = None
    for event in res.events:
        cuda.destroy_event(event, res.rt)
    res.events = ()


def _destroy_all(rt: Any, call: str, handles: list[Any]) -> None:
    """``rt.<call>(h)`` for each handle (errors ignored: a dying process), then forget them."""
    destroy = getattr(rt, call, None)
    for handle in handles:
        try:
            if destroy is not None:
                destroy(handle)
        except Exception:
            pass
    handles.clear()
