"""What the torchbind backend's GPU tests share: the installed torch-tensorrt version, and inputs and
comparisons on the tiny engines."""

from __future__ import annotations

from typing import Any


def torchbind_version() -> tuple[int, ...]:
    from trt_runtime_backends.torchbind.library import installed_distribution

    found = installed_distribution()
    if found is None:
        return ()
    return tuple(int(p) for p in found[1].split("+")[0].split(".")[:2] if p.isdigit())


def tiny_input(torch: Any, built: Any, batch: int | None = None, seed: int = 0) -> Any:
    return torch.from_numpy(built.random_inputs(batch=batch, seed=seed)[0]).cuda()


def assert_same(torch: Any, got: Any, want: Any) -> None:
    torch.cuda.synchronize()
    assert tuple(got.shape) == tuple(want.shape) and got.dtype == want.dtype
    assert torch.equal(got, want), f"max abs diff {float((got.float() - want.float()).abs().max())}"


def assert_close_enough(torch: Any, got: Any, want: Any, bitwise: list[bool]) -> None:
    """Close within float32 rounding of different kernels; records whether bitwise equal."""
    torch.cuda.synchronize()
    assert tuple(got.shape) == tuple(want.shape) and got.dtype == want.dtype
    bitwise.append(bool(torch.equal(got, want)))
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
