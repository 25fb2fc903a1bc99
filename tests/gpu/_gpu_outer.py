"""Checks the outer-graph GPU tests of both backends share."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["check_host_inputs_and_preallocated_outputs"]


def check_host_inputs_and_preallocated_outputs(
    torch: Any, engine: Any, host: np.ndarray, want: np.ndarray
) -> None:
    """Under ``outer="view"`` (the caller's ``enable_cudagraphs``): numpy inputs give numpy
    outputs, CPU torch tensors CPU tensors, and ``outputs=`` is written and returned as
    given, every answer equal to ``want``."""
    for _ in range(3):
        got = engine(host)
        assert isinstance(got, np.ndarray)
        np.testing.assert_array_equal(got, want)
    cpu = engine(torch.from_numpy(host))
    assert isinstance(cpu, torch.Tensor) and not cpu.is_cuda
    np.testing.assert_array_equal(cpu.numpy(), want)
    y = torch.empty(want.shape, dtype=torch.from_numpy(want).dtype, device="cuda")
    assert engine.execute(torch.from_numpy(host).cuda(), outputs=[y])[0] is y
    torch.cuda.synchronize()
    np.testing.assert_array_equal(y.cpu().numpy(), want)
