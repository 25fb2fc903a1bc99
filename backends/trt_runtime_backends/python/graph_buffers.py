"""The outer graph's static buffers as a caller gets them: torch views of them, new torch
outputs copied out of them, device-to-device copies, and the error of a failed replay.

Shared by the outer graph's hooks (:mod:`.graphs`) and the replay plans (:mod:`.plans`),
which import this module and not each other.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from trt_runtime_backends.python.arrays import DeviceArray, torch_module

from trt_runtime.contract import cuda_result
from trt_runtime.errors import EngineError
from trt_runtime.outer import GraphSlot

__all__ = ["copy_device", "replay_failed", "torch_results", "torch_views"]


def torch_views(arrays: Sequence[DeviceArray]) -> list[Any]:
    """Zero-copy torch tensors of the static buffers (through DLPack)."""
    torch = torch_module()
    if torch is None:  # static_inputs(as_torch=True) before any torch tensor was passed
        torch = importlib.import_module("torch")
    return [torch.from_dlpack(a) for a in arrays]


def torch_results(lane: Any, slot: GraphSlot, stream: Any, view: bool) -> list[Any]:
    """Torch outputs of a replay: views of the static buffers, or new tensors copied on ``stream``
    (a handle or a ``cudaStream_t``)."""
    if view:
        if slot.output_views is None:
            slot.output_views = torch_views(slot.outputs)
        return list(slot.output_views)
    empty = lane._torch.empty
    torch_device = lane._torch.device
    results = []
    for io, arr in zip(lane._out, slot.outputs, strict=False):
        y = empty(arr.shape, dtype=io.torch_dtype, device=torch_device)
        copy_device(lane, y.data_ptr(), arr.ptr, arr.nbytes, stream)
        results.append(y)
    return results


def copy_device(lane: Any, dst: int, src: int, nbytes: int, stream: Any) -> None:
    """Copy ``nbytes`` between device addresses on ``stream`` (a handle or a ``cudaStream_t``;
    nothing for 0 bytes)."""
    if nbytes:
        ops = lane.graphs
        (err,) = ops.rt.cudaMemcpyAsync(dst, src, nbytes, ops.d2d, stream)
        if err:
            cuda_result((err,), "cudaMemcpyAsync")


def replay_failed(lane: Any, err: Any, call: str = "cudaGraphLaunch") -> None:
    """Raise the :class:`~trt_runtime.EngineError` of a replay whose ``call`` returned ``err``."""
    try:
        cuda_result((err,), call)
    except Exception as exc:
        raise EngineError(f"engine {lane.name!r}: replaying its CUDA graph failed: {exc}") from exc
