"""Options of the outer CUDA-graph wrap: the runtime captures each engine call into a graph.

TensorRT-RTX's ``cuda_graph_strategy`` makes TensorRT capture its own kernels inside
``enqueueV3``. The *outer* wrap is the runtime's own: the whole call (the engine's
enqueue, with its inputs and outputs in static buffers owned by the engine) is captured
once per input shape and optimization profile, and later calls replay the graph. With
full TensorRT it is the only CUDA-graph mechanism there is.

Set it with :func:`trt_runtime.enable_cudagraphs` (``outer=True``) or
:attr:`Engine.outer_graph <trt_runtime.EngineBase.outer_graph>`; a backend declares it
with ``BackendCapabilities.supports_outer_cuda_graph``.
"""

from __future__ import annotations

import dataclasses

from trt_runtime.errors import SettingsError

__all__ = ["OUTPUT_MODES", "OuterGraph"]

#: ``copy``: every call returns new arrays (a device-to-device copy of the engine's static
#: output buffers, queued on the engine's stream). ``view``: zero-copy views of the static
#: output buffers, overwritten by the next replay of the same graph.
OUTPUT_MODES = ("copy", "view")


@dataclasses.dataclass(frozen=True, slots=True)
class OuterGraph:
    """How an engine runs under the outer CUDA-graph wrap.

    Graphs are keyed by the input shapes and the optimization profile; a graph is
    captured again when the execution context changes (a settings change), when the
    shapes of a call have no graph yet, and after :meth:`EngineBase.reset_graphs`. Inputs
    are copied into the engine's static input buffers unless the caller passes those very
    buffers (``engine.static_inputs(*shapes)``). An execution context that TensorRT says
    cannot be captured (``IExecutionContext.is_stream_capturable`` false) and engines with
    data-dependent output shapes are refused with :class:`~trt_runtime.CapabilityError`
    at the first call; nothing is ever captured on the legacy default stream. (The python
    backend creates TensorRT-RTX contexts with USER_MANAGED memory, which TensorRT-RTX
    reports capturable; see docs/python-backend.md.)
    """

    outputs: str = "copy"

    def __post_init__(self) -> None:
        if self.outputs not in OUTPUT_MODES:
            allowed = ", ".join(repr(m) for m in OUTPUT_MODES)
            raise SettingsError(f"outer graph outputs must be one of {allowed}; got {self.outputs!r}")

    @classmethod
    def coerce(cls, value: OuterGraph | bool | str | None) -> OuterGraph | None:
        """``None``/``False``: no outer wrap; ``True``: defaults; a mode name; an instance."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls(outputs=value)
        raise TypeError(
            f"outer graph must be None, a bool, one of {', '.join(map(repr, OUTPUT_MODES))} "
            f"or OuterGraph; got {type(value).__name__} {value!r}"
        )
