"""What every backend's GPU conformance run shares: the engine, tolerances, example budget,
and the array kinds of the device contract."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from trt_runtime import EngineSource
from trt_runtime.testing import array_kinds
from trt_runtime.testing.conformance import BackendConformance


class GpuConformance(BackendConformance):
    """The conformance suite on the two-profile ``dynamic`` engine of trt_runtime.builders.

    Subclasses provide the ``backend`` and ``make_inputs`` fixtures (and ``reference`` /
    ``as_backend_input`` for their tensor type). Every test of the device contract runs for
    the four array kinds (:mod:`trt_runtime.testing.array_kinds`): numpy and CPU torch
    (host, staged), CUDA torch, and ``CudaArray`` (a ``__cuda_array_interface__`` array made
    with cuda-python, neither torch nor CuPy); a kind whose library is missing on the host
    skips with the reason.
    """

    rtol = 5e-3  # float32 matmuls may run in TF32
    atol = 5e-3
    # Each example builds contexts and JIT-compiles kernels: keep the machine short.
    state_machine_settings = hypothesis_settings(
        max_examples=15,
        stateful_step_count=15,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    # GPU backends write outputs= into device arrays, whatever the inputs' kind; under
    # outer_graph="view" only device outputs are the static buffers (host ones are copies).
    preallocated_output_kinds = (array_kinds.TORCH_CUDA, array_kinds.CUDA_ARRAY)
    static_output_kinds = (array_kinds.TORCH_CUDA, array_kinds.CUDA_ARRAY)

    @pytest.fixture
    def engine_source(self, engines: Any) -> EngineSource:
        return EngineSource(engines("dynamic").plan, name="dynamic")

    @pytest.fixture
    def input_kinds(self, backend: Any, device: int) -> Mapping[str, Callable[[Any], Any]]:
        converters: dict[str, Callable[[Any], Any]] = {}
        host_io = backend.capabilities.supports_host_io
        if host_io:
            converters[array_kinds.NUMPY] = array_kinds.converter(array_kinds.NUMPY)
        if array_kinds.unavailable(array_kinds.TORCH_CPU, host_io=host_io) is None:
            converters[array_kinds.TORCH_CPU] = array_kinds.converter(array_kinds.TORCH_CPU)
        if array_kinds.unavailable(array_kinds.TORCH_CUDA) is None:
            converters[array_kinds.TORCH_CUDA] = array_kinds.converter(array_kinds.TORCH_CUDA, device)
        # The torch- and CuPy-free device kind: cuda-python memory behind
        # __cuda_array_interface__ only (cuda-python is on every GPU host this project uses).
        if array_kinds.unavailable(array_kinds.CUDA_ARRAY) is None:
            converters[array_kinds.CUDA_ARRAY] = array_kinds.converter(array_kinds.CUDA_ARRAY, device)
        return converters
