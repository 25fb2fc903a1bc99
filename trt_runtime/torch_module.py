"""``TRTModule``: a ``torch.nn.Module`` around a trt-runtime engine.

This module imports torch; ``import trt_runtime`` never imports it. Import it only when
torch is installed (``pip install -c constraints.txt -e '.[torch]'``).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from trt_runtime.protocols import Engine

__all__ = ["TRTModule"]


class TRTModule(torch.nn.Module):
    """Runs ``engine`` on torch CUDA tensors, on torch's current stream.

    ``forward(*tensors)`` returns one tensor for a single-output engine, else a tuple in
    ``engine.outputs`` order. The engine orders its own stream after and before torch's
    current stream, so the module composes with other torch work without synchronizing.
    :meth:`trt_engines` lets :func:`trt_runtime.runtime_config`,
    :func:`trt_runtime.enable_cudagraphs` and :func:`trt_runtime.runtime_cache` find the
    engine. The module has no parameters: ``state_dict()`` is empty.
    """

    def __init__(self, engine: Engine) -> None:
        super().__init__()
        if not (hasattr(engine, "execute") and hasattr(engine, "runtime_settings")):
            raise TypeError(f"TRTModule needs a trt-runtime engine; got {type(engine).__name__}")
        self.engine = engine

    @classmethod
    def load(
        cls, source: str | os.PathLike[str] | bytes, backend: str | None = None, **kwargs: Any
    ) -> TRTModule:
        """Load an engine with :func:`trt_runtime.load` and wrap it."""
        from trt_runtime.loader import load

        return cls(load(source, backend, **kwargs))

    def forward(self, *tensors: torch.Tensor) -> Any:
        # Engines take torch's current stream as the caller's stream for CUDA tensors.
        outputs = self.engine.execute(*tensors)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def trt_engines(self) -> list[Engine]:
        """The engines this module runs (one)."""
        return [self.engine]

    def extra_repr(self) -> str:
        return f"engine={self.engine.name!r}, backend={self.engine.backend.name!r}"
