"""The device contract written once in the core: array kinds, shapes and profiles, streams."""

from __future__ import annotations

import pytest

from trt_runtime.contract import (
    ArrayKind,
    CallKind,
    ShapeChecker,
    call_kind,
    fmt_shape,
    output_kind,
    require_outer_graph,
    stream_handle,
)
from trt_runtime.errors import EngineError, InputError
from trt_runtime.protocols import TensorSpec

DYN = TensorSpec("x", "float32", (-1, 4), True, (((1, 4), (4, 4), (8, 4)), ((9, 4), (16, 4), (32, 4))))
STATIC = TensorSpec("y", "float32", (2, 4), True)


def test_contract_fmt_shape() -> None:
    assert fmt_shape((8, 256)) == "(8, 256)"
    assert fmt_shape((4,)) == "(4,)"
    assert fmt_shape(()) == "()"


def test_contract_output_kind_follows_the_mixing_rule() -> None:
    assert output_kind(["numpy", "torch_cuda"]) is ArrayKind.TORCH_CUDA
    assert output_kind([ArrayKind.NUMPY, ArrayKind.CUDA_ARRAY]) is ArrayKind.CUDA_ARRAY
    assert output_kind(["numpy", "torch_cpu"]) is ArrayKind.TORCH_CPU
    assert output_kind(["numpy"]) is ArrayKind.NUMPY
    assert call_kind(["torch_cpu", "cuda_array"]) is CallKind.DEVICE
    assert call_kind(["torch_cuda"]) is CallKind.TORCH
    assert call_kind(["torch_cpu"]) is CallKind.HOST
    assert ArrayKind.TORCH_CPU.on_host and not ArrayKind.CUDA_ARRAY.on_host
    assert ArrayKind.NUMPY == "numpy" and str(ArrayKind.NUMPY) == "numpy"
    with pytest.raises(ValueError, match="'floppy' is not a valid ArrayKind"):
        output_kind(["floppy"])


def test_contract_shape_checker_picks_the_profile() -> None:
    checker = ShapeChecker("e", [DYN, STATIC])
    assert checker.num_profiles == 2
    assert checker.select(((2, 4), (2, 4))) == 0
    assert checker.select(((20, 4), (2, 4))) == 1
    assert checker.select(((2, 4), (2, 4)), 0) == 0


@pytest.mark.parametrize(
    ("shapes", "profile", "message"),
    [
        (((2,), (2, 4)), None, r"input 'x' must have 2 dimension\(s\) \(-1, 4\); got shape \(2,\)"),
        (((2, 5), (2, 4)), None, r"input 'x' must have shape \(-1, 4\); got \(2, 5\)"),
        (((2, 4), (3, 4)), None, r"input 'y' must have shape \(2, 4\); got \(3, 4\)"),
        (((64, 4), (2, 4)), None,
         r"input .x. has shape \(64, 4\), outside every optimization profile .*profile 1: min \(9, 4\)"),
        (((20, 4), (2, 4)), 0,
         r"input .x. has shape \(20, 4\), outside optimization profile 0 \(min \(1, 4\), max \(8, 4\)\)"),
        (((2, 4), (2, 4)), 2, r"profile must be an int in 0\.\.1; got 2"),
        (((2, 4), (2, 4)), True, r"profile must be an int in 0\.\.1; got True"),
    ],
)
def test_contract_shape_checker_messages(shapes: tuple, profile: object, message: str) -> None:
    with pytest.raises(InputError, match=r"engine 'e': " + message):
        ShapeChecker("e", [DYN, STATIC]).select(shapes, profile)  # type: ignore[arg-type]


def test_contract_shape_checker_counts_inputs_and_remembers() -> None:
    checker = ShapeChecker("e", [DYN, STATIC])
    with pytest.raises(InputError, match=r"engine 'e' takes 2 input\(s\) \(x, y\); got 1"):
        checker.check_count(1)
    with pytest.raises(InputError, match=r"takes 2 input\(s\) \(x, y\); static_inputs\(\) got 3 shape\(s\)"):
        checker.check_count(3, "static_inputs()")
    key = ((2, 4), (2, 4))
    checker.select(key)
    assert (key, None) in checker._checked  # a repeat is one dict lookup


def test_contract_static_inputs_guard() -> None:
    require_outer_graph("e", object())
    with pytest.raises(EngineError, match=r"static_inputs\(\) needs the outer CUDA-graph wrap"):
        require_outer_graph("e", None)


def test_contract_stream_handle_accepts_every_stream_kind() -> None:
    class Method:
        def __cuda_stream__(self) -> tuple[int, int]:
            return (0, 77)

    class Attribute:
        __cuda_stream__ = (0, 78)

    class TorchLike:
        cuda_stream = 88

    class CoreLike:
        handle = 99

    class CupyLike:
        ptr = 111

    class CUstreamLike:
        def getPtr(self) -> int:
            return 222

    assert stream_handle(5) == 5
    assert stream_handle(Method()) == 77
    assert stream_handle(Attribute()) == 78
    assert stream_handle(TorchLike()) == 88
    assert stream_handle(CoreLike()) == 99
    assert stream_handle(CupyLike()) == 111
    assert stream_handle(CUstreamLike()) == 222
    with pytest.raises(TypeError, match=r"stream must be None, an int cudaStream_t.*got str"):
        stream_handle("default")
    with pytest.raises(TypeError, match=r"got bool"):
        stream_handle(True)


def test_contract_cuda_result_unpacks_and_names_the_error() -> None:
    """One helper for every cuda-python result in the core and the python backend (runtime and
    driver calls alike): the value(s), ``None`` for none, else a BackendError naming the call and
    the error by its name."""
    import enum

    from trt_runtime.contract import cuda_result
    from trt_runtime.errors import BackendError

    class Err(enum.IntEnum):  # cuda-python's enums: cudaError_t, CUresult
        cudaSuccess = 0
        cudaErrorMemoryAllocation = 2

    assert cuda_result((Err.cudaSuccess,), "cudaFree") is None
    assert cuda_result((Err.cudaSuccess, 7), "cudaMalloc") == 7
    assert cuda_result((0, 1, 2), "two values") == (1, 2)
    with pytest.raises(BackendError, match=r"^cudaMalloc failed: cudaErrorMemoryAllocation$"):
        cuda_result((Err.cudaErrorMemoryAllocation, None), "cudaMalloc")
    with pytest.raises(BackendError, match=r"^cudaGraphLaunch failed: 700$"):  # (a bare int: as it is)
        cuda_result((700,), "cudaGraphLaunch")
