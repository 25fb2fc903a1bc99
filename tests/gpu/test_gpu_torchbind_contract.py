"""The torchbind backend's device contract on a GPU: output kind per input kind, the hot path for
CUDA tensors, caller-stream ordering and ``outputs=``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _gpu_torchbind import assert_same, tiny_input

from trt_runtime.errors import InputError
from trt_runtime.lane import Lane

pytestmark = pytest.mark.gpu


# -- the device contract: output kind follows input kind -------------------------------------------------
class _CudaArrayInterface:
    """A CUDA array that is not a torch tensor (as CuPy's or Numba's): ``__cuda_array_interface__`` only."""

    def __init__(self, tensor: Any) -> None:
        self._tensor = tensor

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return self._tensor.__cuda_array_interface__  # type: ignore[no-any-return]


class _DLPackArray:
    """A CUDA array seen through DLPack only."""

    def __init__(self, tensor: Any) -> None:
        self._tensor = tensor

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._tensor.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self._tensor.__dlpack_device__()


def test_gpu_torchbind_output_kind_follows_input_kind(open_torchbind: Any, torch: Any) -> None:
    engine, built = open_torchbind("mlp_fp16")
    host = built.random_inputs(seed=21)[0]
    x = torch.from_numpy(host).cuda()
    out = engine(x)
    assert isinstance(out, torch.Tensor) and out.is_cuda and out.device.index == engine.device
    assert out.dtype == torch.float16 and tuple(out.shape) == (8, 256)
    want = out.cpu().numpy()
    got = engine(host)  # numpy in: numpy out, ready
    assert type(got) is np.ndarray and got.dtype == np.float16
    np.testing.assert_array_equal(got, want)
    got = engine(torch.from_numpy(host))  # CPU tensor in: CPU tensor out
    assert isinstance(got, torch.Tensor) and got.device.type == "cpu" and got.dtype == torch.float16
    np.testing.assert_array_equal(got.numpy(), want)
    for wrap in (_CudaArrayInterface, _DLPackArray):  # other CUDA arrays in: a device array out
        got = engine(wrap(x))
        assert hasattr(got, "__cuda_array_interface__") and hasattr(got, "__dlpack__")
        assert got.is_cuda and got.device.index == engine.device
        np.testing.assert_array_equal(got.cpu().numpy(), want)
    with pytest.raises(InputError, match=r"input 'x' is not contiguous"):
        engine(_CudaArrayInterface(x.t().contiguous().t()))  # refused, never copied


def test_gpu_torchbind_hot_path_taken_for_cuda_tensors(
    open_torchbind: Any, torch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With real torch tensors (torch.Size keys, torch dtypes) the common call skips the full check."""
    engine, built = open_torchbind("mlp_fp16")
    x = tiny_input(torch, built, seed=1)
    want = engine(x).clone()
    slow: list[Any] = []
    original = Lane.call  # the core pipeline's general path
    monkeypatch.setattr(Lane, "call", lambda lane, *a: slow.append(a) or original(lane, *a))
    for _ in range(5):
        assert_same(torch, engine(x), want)
    assert slow == []


def test_gpu_torchbind_orders_with_the_callers_stream(open_torchbind: Any, torch: Any) -> None:
    """A result read on the caller's stream right after the call, behind a long kernel queued
    there, is correct: the engine waits for the caller's work and the caller for the engine's."""
    engine, built = open_torchbind("mlp_fp16")
    x = tiny_input(torch, built, seed=9)
    want = engine(x).clone()
    side = torch.cuda.Stream()
    for stream in (side, torch.cuda.default_stream()):
        with torch.cuda.stream(stream):
            torch.cuda._sleep(50_000_000)  # ~25 ms: the input below is late
            late = x * 1
            got = engine(late) * 1
        stream.synchronize()
        assert torch.equal(got, want)
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        late = x * 1
    (got,) = engine.execute(late, stream=side)
    with torch.cuda.stream(side):
        got = got * 1
    side.synchronize()
    assert torch.equal(got, want)
    host_x = x.cpu().numpy()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        host = engine(host_x)  # staged and run behind the sleep; ready when returned
    np.testing.assert_array_equal(host, want.cpu().numpy())


def test_gpu_torchbind_preallocated_outputs(open_torchbind: Any, torch: Any) -> None:
    engine, built = open_torchbind("mlp_fp16")
    x = tiny_input(torch, built, seed=2)
    want = engine(x).clone()
    y = torch.empty_like(want)
    assert engine.execute(x, outputs=[y])[0] is y
    assert_same(torch, y, want)
    z = torch.zeros_like(want)
    through = _CudaArrayInterface(z)
    assert engine.execute(x, outputs=[through])[0] is through
    assert_same(torch, z, want)
    ready = torch.zeros_like(want)
    engine.execute(x.cpu().numpy(), outputs=[ready])  # host inputs: ready when returned
    assert torch.equal(ready, want)
    dynamic, _ = open_torchbind("mlp_dynamic")
    x3 = torch.randn(3, 64, device="cuda")
    wrong = torch.zeros(4, 64, device="cuda")
    with pytest.raises(InputError, match=r"output 'y' must have shape \(3, 64\); got \(4, 64\)"):
        dynamic.execute(x3, outputs=[wrong])
    assert not bool(wrong.any()), "a refused output is never written"
    right = torch.empty(3, 64, device="cuda")
    dynamic.execute(x3, outputs=[right])
    assert_same(torch, right, dynamic(x3))
