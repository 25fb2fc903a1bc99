"""A user's script written from the README and docs; type-checked by tests/docs/test_user_types.py.

It is never run (it needs an engine file and a GPU); `mypy --strict` and pyright must
report 0 errors on it after the README's install.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import trt_runtime_backends

import trt_runtime as trt
from trt_runtime import (
    BackendCapabilities,
    CudaGraphStrategy,
    DynamicShapesKernelSpecializationStrategy,
    RuntimeCache,
    RuntimeSettings,
    TensorSpec,
)
from trt_runtime.testing.memory import AffineOutput, MemoryBackend


def settings_examples() -> RuntimeSettings:
    s = RuntimeSettings(cuda_graph_strategy="whole_graph_capture")
    s = s.merge(dynamic_shapes_kernel_specialization_strategy="eager")
    s = s.merge(cuda_graph_strategy=CudaGraphStrategy.DISABLED, runtime_cache="kernels.cache")
    strategy: DynamicShapesKernelSpecializationStrategy = s.dynamic_shapes_kernel_specialization_strategy
    code: int = strategy.code
    assert code >= 0
    return RuntimeSettings(
        cuda_graph_strategy=CudaGraphStrategy.WHOLE_GRAPH_CAPTURE, runtime_cache=Path("c.bin")
    )


def run_engine(path: str, x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    with trt.load(path, settings={"cuda_graph_strategy": "whole_graph_capture"}) as engine:
        device: int = engine.device
        specs: tuple[TensorSpec, ...] = engine.inputs
        assert device >= 0 and specs
        outputs: list[npt.NDArray[np.float32]] = engine.execute(x)
        with trt.runtime_config(engine, cuda_graph_strategy="whole_graph_capture") as same:
            again = same.execute(x)
        with trt.runtime_cache(engine, "kernels.cache") as cache, trt.enable_cudagraphs(engine):
            cached: RuntimeCache = cache
            y: npt.NDArray[np.float32] = engine(x)  # numpy in, numpy.ndarray out
            assert cached is not None and y.shape
        trt.set_dynamic_shapes_kernel_specialization_strategy(engine, "eager")
        trt.set_cuda_graph_strategy(engine, "disabled")
        return outputs[0] + again[0]


def capabilities(name: str) -> bool:
    caps: BackendCapabilities = trt.load_backend(name).capabilities
    return caps.supports_dynamic_shapes_kernel_specialization_strategy and caps.supports_runtime_cache


def cpu_engine() -> list[npt.NDArray[np.float32]]:
    spec = TensorSpec("x", "float32", (2, 3), is_input=True)
    data = MemoryBackend.build_engine([spec], [AffineOutput("y", "x", scale=2.0, bias=1.0)], name="affine")
    with trt.load(data, backend="memory") as engine:
        y = engine(np.ones((2, 3), np.float32))
        assert bool((y == 3.0).all()) and y.dtype == np.float32  # an ndarray, not Any
        return engine.execute(np.ones((2, 3), np.float32))


BACKENDS_PACKAGE = trt_runtime_backends.__name__
