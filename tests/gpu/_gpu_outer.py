"""Checks the outer-graph GPU tests of both backends share."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

__all__ = [
    "check_host_inputs_and_preallocated_outputs", "check_late_inputs_on_caller_streams", "engine_opener",
]


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


def check_late_inputs_on_caller_streams(torch: Any, engine: Any, x: Any, want: Any, streams: Any) -> None:
    """Under the outer graph (captured already): on each of ``streams``, an input written
    late on the caller's stream and the output read there at once equal ``want``."""
    for stream in streams:
        with torch.cuda.stream(stream):
            torch.cuda._sleep(50_000_000)  # ~25 ms: the input below is late
            late = x * 1
            got = engine(late) * 1  # read on the caller's stream right away
        stream.synchronize()
        assert torch.equal(got, want)


@contextlib.contextmanager
def engine_opener(backend: Any, find: Callable[[str], Any]) -> Iterator[Callable[..., tuple[Any, Any]]]:
    """``open(name, **load_kwargs) -> (engine, built)``: the engine ``backend`` loads from
    ``find(name)``'s plan; every engine opened is closed on leaving."""
    from trt_runtime import EngineSource

    opened: list[Any] = []

    def _open(name: str, **kwargs: Any) -> tuple[Any, Any]:
        built = find(name)
        engine = backend.load_engine(EngineSource(built.plan, name=name), **kwargs)
        opened.append(engine)
        return engine, built

    try:
        yield _open
    finally:
        for engine in opened:
            engine.close()
