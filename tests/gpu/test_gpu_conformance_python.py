"""The backend conformance suite against the python backend, on a GPU."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from _gpu_conformance import GpuConformance

pytestmark = pytest.mark.gpu


class TestPythonBackendConformance(GpuConformance):
    """Host (numpy) inputs on the two-profile ``dynamic`` engine of trt_runtime.builders."""

    @pytest.fixture
    def backend(self, python_backend: Any) -> Any:
        return python_backend

    @pytest.fixture
    def make_inputs(self) -> Callable[[Any], Sequence[Any]]:
        def make(rng: np.random.Generator) -> list[Any]:
            batch = int(rng.integers(1, 33))  # spans both profiles (1..8, 9..32)
            return [rng.standard_normal((batch, 16)).astype(np.float32)]

        return make

    @pytest.fixture
    def reference(self, engines: Any) -> Callable[[Sequence[Any]], Sequence[Any]]:
        built = engines("dynamic")
        return lambda inputs: built.reference(*inputs)


class TestPythonBackendConformanceTorch(TestPythonBackendConformance):
    """The same suite with torch CUDA tensors in and out (zero-copy path)."""

    @pytest.fixture
    def make_inputs(self) -> Callable[[Any], Sequence[Any]]:
        torch = pytest.importorskip("torch", reason="torch is not installed on this GPU host")

        def make(rng: np.random.Generator) -> list[Any]:
            batch = int(rng.integers(1, 33))
            return [torch.from_numpy(rng.standard_normal((batch, 16)).astype(np.float32)).cuda()]

        return make

    def as_backend_input(self, array: Any, like: Any) -> Any:
        import torch

        return torch.from_numpy(np.ascontiguousarray(array)).to(like.device)

    @pytest.fixture
    def reference(self, engines: Any) -> Callable[[Sequence[Any]], Sequence[Any]]:
        built = engines("dynamic")
        return lambda inputs: built.reference(*[i.cpu().numpy() for i in inputs])
