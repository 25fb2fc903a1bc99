"""What every backend's GPU conformance run shares: the engine, tolerances, example budget."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from trt_runtime import EngineSource
from trt_runtime.testing.conformance import BackendConformance


class GpuConformance(BackendConformance):
    """The conformance suite on the two-profile ``dynamic`` engine of trt_runtime.builders.

    Subclasses provide the ``backend`` and ``make_inputs`` fixtures.
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

    @pytest.fixture
    def engine_source(self, engines: Any) -> EngineSource:
        return EngineSource(engines("dynamic").plan, name="dynamic")
