"""The conformance kit for trt-runtime backends, shipped with the package.

* :mod:`trt_runtime.testing.memory`: ``MemoryBackend``, a numpy-only backend for tests.
* :mod:`trt_runtime.testing.model`: the pure-Python reference model.
* :mod:`trt_runtime.testing.array_kinds`: the array kinds of the device contract.
* :mod:`trt_runtime.testing.cuda_arrays`: ``CudaArray``, a CUDA array made with cuda-python.
* :mod:`trt_runtime.testing.overlap`: ``check_overlap``, whether an engine's contexts give
  their serial outputs when their calls overlap on the GPU (needs torch with CUDA).
* :mod:`trt_runtime.testing.onnx_models`: small ONNX models with numpy references (needs ``onnx``).
* :mod:`trt_runtime.testing.strategies`: Hypothesis strategies (needs ``hypothesis``).
* :mod:`trt_runtime.testing.stateful`: the ``RuleBasedStateMachine`` (needs ``hypothesis``).
* :mod:`trt_runtime.testing.conformance`: ``BackendConformance`` (needs ``pytest``,
  ``hypothesis``), with its parts in ``conformance_base``, ``conformance_contract`` and
  ``conformance_graphs``.

Importing this package imports none of them: the ``memory`` entry point loads
:mod:`trt_runtime.testing.memory` without pulling in pytest or hypothesis. Names are
resolved lazily from the submodules.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "AffineOutput",
    "BackendConformance",
    "BackendHarness",
    "BackendStateMachine",
    "CacheModel",
    "CudaArray",
    "EngineModel",
    "MemoryBackend",
]

_LAZY = {
    "AffineOutput": "memory",
    "MemoryBackend": "memory",
    "CacheModel": "model",
    "EngineModel": "model",
    "BackendHarness": "stateful",
    "BackendStateMachine": "stateful",
    "BackendConformance": "conformance",
    "CudaArray": "cuda_arrays",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trt_runtime.testing' has no attribute {name!r}")
    return getattr(importlib.import_module(f"trt_runtime.testing.{module}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
