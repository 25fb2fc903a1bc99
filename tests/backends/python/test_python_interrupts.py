"""A KeyboardInterrupt in the middle of a python-backend call leaves the engine usable: an
interrupt between TensorRT taking an address (or a profile) and the lane recording it must
not leave a record that says otherwise, or the next call skips the binding and TensorRT
reads memory the caller no longer gives it. Every binding path is interrupted right after
TensorRT took the new address; the next call with the previous arrays binds them again."""

from __future__ import annotations

from typing import Any

import pytest
from _python_doubles import FakeTorch, _fake_engine, _trt_calls


def _interrupt_next_address(engine: Any, name: str) -> None:
    """The next set_tensor_address of ``name`` on the lane's context takes effect, then the
    interrupt arrives (what a Ctrl-C between the two bytecodes does)."""
    ctx = engine._lanes[0].context.trt_context
    original = ctx.set_tensor_address

    def interrupted(tensor: str, ptr: int) -> None:
        original(tensor, ptr)
        if tensor == name:
            ctx.set_tensor_address = original
            raise KeyboardInterrupt

    ctx.set_tensor_address = interrupted


def _last_address(engine: Any, name: str) -> int:
    return [c[2] for c in _trt_calls(engine) if c[0] == "address" and c[1] == name][-1]


@pytest.mark.parametrize("warm", [1, 3], ids=["general-path", "natural-plan"])
def test_python_interrupts_natural_call_rebinds_after_an_interrupt(torch: FakeTorch, warm: int) -> None:
    engine = _fake_engine()
    x1, x2 = torch.cuda_tensor((2, 4)), torch.cuda_tensor((2, 4))
    for _ in range(warm):  # 3 calls: the natural plan runs the next one
        engine(x1)
    assert _last_address(engine, "x") == x1.data_ptr()
    _interrupt_next_address(engine, "x")
    with pytest.raises(KeyboardInterrupt):
        engine(x2)
    assert _last_address(engine, "x") == x2.data_ptr()  # TensorRT has x2 now
    engine(x1)
    assert _last_address(engine, "x") == x1.data_ptr()  # bound again
    engine.close()


def test_python_interrupts_prebound_call_rebinds_after_an_interrupt(torch: FakeTorch) -> None:
    engine = _fake_engine()
    x, y = torch.cuda_tensor((2, 4)), torch.cuda_tensor((2, 4))
    for _ in range(3):  # remembered: the pre-bound plan runs the next one
        engine.execute(x, outputs=[y])
    other = torch.cuda_tensor((2, 4))
    _interrupt_next_address(engine, "x")
    with pytest.raises(KeyboardInterrupt):
        engine.execute(other, outputs=[y])
    assert _last_address(engine, "x") == other.data_ptr()
    engine.execute(x, outputs=[y])  # the pre-bound plan's arrays again
    assert _last_address(engine, "x") == x.data_ptr()
    engine.close()


def test_python_interrupts_profile_switch_is_redone_after_an_interrupt(torch: FakeTorch) -> None:
    engine = _fake_engine()  # profiles: batches 1..8 and 9..32
    small, big = torch.cuda_tensor((2, 4)), torch.cuda_tensor((16, 4))
    engine(small)
    ctx = engine._lanes[0].context.trt_context
    original = ctx.set_optimization_profile_async

    def interrupted(index: int, stream: int) -> bool:
        original(index, stream)
        ctx.set_optimization_profile_async = original
        raise KeyboardInterrupt

    ctx.set_optimization_profile_async = interrupted
    with pytest.raises(KeyboardInterrupt):
        engine(big)  # TensorRT switched to profile 1, the lane did not record it
    engine(small)
    profiles = [c[1] for c in _trt_calls(engine) if c[0] == "profile"]
    assert profiles[-1] == 0  # switched back for the small batch
    engine.close()
