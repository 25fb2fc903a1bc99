"""The ``python`` backend: TensorRT-RTX through its Python API, CUDA through cuda-python.

Registered as ``python = "trt_runtime_backends.python:PythonBackend"`` in the
``trt_runtime.backends`` entry-point group. Importing this package imports neither
TensorRT nor cuda-python; the backend loads them on first use.
"""

from __future__ import annotations

from trt_runtime_backends.python.backend import CUDA_HINT, RTX_HINT, PythonBackend

__all__ = ["CUDA_HINT", "RTX_HINT", "PythonBackend"]
