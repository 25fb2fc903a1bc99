"""The conformance kit's array kinds: the mixing rule, and telling the kinds apart."""

from __future__ import annotations

import numpy as np
import pytest

from trt_runtime.testing import array_kinds
from trt_runtime.testing.array_kinds import CUDA_ARRAY, NUMPY, TORCH_CPU, TORCH_CUDA


@pytest.mark.parametrize(
    ("kinds", "expected"),
    [
        ([NUMPY], NUMPY),
        ([NUMPY, TORCH_CPU], TORCH_CPU),
        ([TORCH_CPU, CUDA_ARRAY], CUDA_ARRAY),
        ([CUDA_ARRAY, TORCH_CUDA, NUMPY], TORCH_CUDA),
        ([], NUMPY),
    ],
)
def test_array_kinds_output_kind_follows_the_mixing_rule(kinds, expected):
    assert array_kinds.output_kind(kinds) == expected


def test_array_kinds_numpy_round_trip():
    convert = array_kinds.converter(NUMPY)
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    array = convert(base)
    assert array is not base and array_kinds.kind_of(array) == NUMPY
    assert array_kinds.dtype_of(array) == "float32" and array_kinds.device_of(array) is None
    assert array_kinds.address(array) == array.ctypes.data
    assert array_kinds.shape_key([array, np.zeros(2)]) == ((3, 4), (2,))
    array_kinds.assert_output(NUMPY, array, name="y", dtype="float32", shape=(3, 4), device=0)
    strided = array_kinds.non_contiguous(NUMPY, base, convert)
    assert not strided.flags.c_contiguous and np.array_equal(strided, base)
    assert array_kinds.non_contiguous(NUMPY, np.zeros((1, 1), np.float32), convert) is None
    assert array_kinds.empty(NUMPY, (2, 3), "int32").dtype == np.int32


def test_array_kinds_assert_output_names_what_is_wrong():
    value = np.zeros((2, 4), np.float32)
    with pytest.raises(AssertionError, match="output 'y': inputs of kind 'torch_cpu' must give outputs"):
        array_kinds.assert_output(TORCH_CPU, value, name="y", dtype="float32", shape=(2, 4), device=0)
    with pytest.raises(AssertionError, match="output 'y' has dtype float32; the engine's output is float16"):
        array_kinds.assert_output(NUMPY, value, name="y", dtype="float16", shape=(2, 4), device=0)
    with pytest.raises(AssertionError, match=r"output 'y' has shape \(2, 4\); expected \(4, 2\)"):
        array_kinds.assert_output(NUMPY, value, name="y", dtype="float32", shape=(4, 2), device=0)
    with pytest.raises(AssertionError, match="kind None"):
        array_kinds.assert_output(NUMPY, value.tolist(), name="y", dtype="float32", shape=(2, 4), device=0)


def test_array_kinds_unknown_kind_refused():
    with pytest.raises(ValueError, match=r"array kind must be one of 'numpy', .*; got 'cupy'"):
        array_kinds.unavailable("cupy")
    with pytest.raises(ValueError, match="got 'cupy'"):
        array_kinds.converter("cupy")


def test_array_kinds_host_kinds_need_host_io():
    assert array_kinds.unavailable(NUMPY, host_io=False) == "the backend lacks supports_host_io"
    assert NUMPY not in array_kinds.standard_converters(host_io=False)
    assert NUMPY in array_kinds.standard_converters()


def test_array_kinds_cuda_array_unavailable_says_why():
    from trt_runtime.testing.cuda_arrays import cuda_unavailable

    reason = array_kinds.unavailable(CUDA_ARRAY)
    assert reason == cuda_unavailable()
    if reason is not None:
        assert "cuda" in reason.lower()


def test_array_kinds_torch_cpu():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    convert = array_kinds.converter(TORCH_CPU)
    base = np.arange(8, dtype=np.float32).reshape(2, 4)
    tensor = convert(base)
    assert isinstance(tensor, torch.Tensor) and array_kinds.kind_of(tensor) == TORCH_CPU
    assert array_kinds.dtype_of(tensor) == "float32" and array_kinds.device_of(tensor) is None
    assert array_kinds.address(tensor) == tensor.data_ptr()
    np.testing.assert_array_equal(array_kinds.to_numpy(tensor), base)
    array_kinds.assert_output(TORCH_CPU, tensor, name="y", dtype="float32", shape=(2, 4), device=0)
    with pytest.raises(AssertionError, match="must give outputs of kind 'numpy'"):
        array_kinds.assert_output(NUMPY, tensor, name="y", dtype="float32", shape=(2, 4), device=0)
    strided = array_kinds.non_contiguous(TORCH_CPU, base, convert)
    assert not strided.is_contiguous() and torch.equal(strided, tensor)
    assert array_kinds.empty(TORCH_CPU, (3,), "float16").dtype == torch.float16
    assert array_kinds.output_kind([array_kinds.kind_of(tensor), NUMPY]) == TORCH_CPU
