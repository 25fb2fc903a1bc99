"""``.npy`` bytes read and written with cached headers (``trt_runtime.arrays_io``): the same bytes
as numpy's own, and a cached header never lets a bad body through."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest

from trt_runtime import FormatError
from trt_runtime.arrays_io import _READ_HEADERS, _WRITTEN_HEADERS, npy_bytes, read_npy


def _saved(array: Any) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


ARRAYS = [
    np.ones((1, 16), np.float32), np.arange(6, dtype=">i8").reshape(2, 3), np.array([True, False]),
    np.float16(2.5).reshape(()), np.zeros((0, 4), np.uint8), np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2],  # not contiguous
]


@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: f"{a.dtype.str}{a.shape}")
def test_npy_bytes_are_numpy_save_bytes_first_and_from_the_cache(array: Any) -> None:
    _WRITTEN_HEADERS.clear()
    first, again = npy_bytes(array), npy_bytes(array)
    assert first == again == _saved(array)
    other = np.full(array.shape, 7, array.dtype)  # same header, other data: nothing of the first kept
    assert npy_bytes(other) == _saved(other)
    got = read_npy(first, "t")
    assert got.dtype == array.dtype.newbyteorder("=") and got.shape == array.shape
    np.testing.assert_array_equal(got, array)
    np.testing.assert_array_equal(read_npy(first, "t"), array)  # the parsed header from the cache


def test_npy_cached_header_still_checks_the_data_size_and_bad_headers_stay_out() -> None:
    _READ_HEADERS.clear()
    good = _saved(np.ones((1, 16), np.float32))
    read_npy(good, "body")
    assert len(_READ_HEADERS) == 1
    with pytest.raises(FormatError, match=r"shape \[1, 16\] of float32 \(64 bytes\); the data has 60"):
        read_npy(good[:-4], "body")
    pickled = io.BytesIO()
    np.save(pickled, np.array([None, 1], dtype=object), allow_pickle=True)
    for _ in range(2):
        with pytest.raises(FormatError, match="objects are refused"):
            read_npy(pickled.getvalue(), "body")
    assert len(_READ_HEADERS) == 1
    with pytest.raises(FormatError, match=r"not a valid \.npy array"):
        read_npy(b"\x93NUMPY\x01\x00\xff\x00{'descr'", "body")  # a header longer than the bytes
