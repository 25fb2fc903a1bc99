"""The warning an engine gives when it gets ``contexts > 1`` on a TensorRT build where
overlapping contexts gave wrong outputs (``trt_runtime.hazards``)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import trt_runtime
from trt_runtime import CacheKey, ContextOverlapWarning, EngineSource, TensorSpec
from trt_runtime.hazards import OVERLAP_HAZARDS, overlap_hazard
from trt_runtime.testing.memory import AffineOutput, MemoryBackend

AFFINE = MemoryBackend.build_engine(
    [TensorSpec("x", "float32", (2, 4), True)], [AffineOutput("y", "x", scale=2.0, bias=1.0)], name="affine"
)
RTX_161 = CacheKey("tensorrt_rtx", "1.6.1.120", "9.0", "13000")


class _Build(MemoryBackend):
    """The memory backend reporting another TensorRT build (its ``cache_key``)."""

    def __init__(self, key: CacheKey | Exception) -> None:
        super().__init__()
        self._key = key

    def cache_key(self, device: int | None = None) -> CacheKey:
        if isinstance(self._key, Exception):
            raise self._key
        return self._key


@pytest.mark.parametrize(
    ("key", "named"),
    [
        (RTX_161, "TensorRT-RTX 1.6.1.120 (sm 9.0)"),
        (CacheKey("tensorrt_rtx", "1.6.0.5", "8.9", "12080"), "TensorRT-RTX 1.6.0.5 (sm 8.9)"),
        (CacheKey("tensorrt_rtx", "1.7.0.1", "12.0", "13000"), None),
        (CacheKey("tensorrt_rtx", "1.60.0", "9.0", "13000"), None),
        (CacheKey("tensorrt", "1.6.1", "9.0", "13000"), None),
        (CacheKey("memory", "1", "0.0", "0"), None),
        (object(), None),
    ],
)
def test_overlap_hazard_names_only_the_builds_it_was_seen_on(key: object, named: str | None) -> None:
    assert overlap_hazard(key) == named
    assert ("tensorrt_rtx", "1.6.") in OVERLAP_HAZARDS


def test_contexts_above_one_warns_once_on_a_hazardous_build() -> None:
    engine = _Build(RTX_161).load_engine(EngineSource(AFFINE))
    try:
        with pytest.warns(ContextOverlapWarning) as caught:
            engine.contexts = 2
        (warning,) = caught
        text = str(warning.message)
        for part in ("'affine'", "contexts=2", "TensorRT-RTX 1.6.1.120 (sm 9.0)",
                     "trt-runtime check-contexts", "--contexts 2", "contexts=1", "docs/concurrency.md"):
            assert part in text, part
        assert warning.filename == __file__  # points at the line that asked for the contexts
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            engine.contexts = 4  # once per engine
            engine.contexts = 1
            engine.contexts = 3
        assert engine.contexts == 3
    finally:
        engine.close()


def test_load_with_contexts_warns_at_the_callers_line(tmp_path: Path) -> None:
    path = tmp_path / "affine.mem"
    path.write_bytes(AFFINE)
    with pytest.warns(ContextOverlapWarning, match="contexts=3") as caught:
        engine = trt_runtime.load(path, backend=_Build(RTX_161), contexts=3)
    try:
        assert caught[0].filename == __file__
        assert engine.contexts == 3
    finally:
        engine.close()


@pytest.mark.parametrize(
    "key",
    [CacheKey("tensorrt_rtx", "1.7.0.1", "12.0", "13000"), CacheKey("memory", "1", "0.0", "0"),
     RuntimeError("no GPU stack here")],
    ids=["newer-build", "memory", "key-unavailable"],
)
def test_no_warning_without_a_known_hazard(key: CacheKey | Exception) -> None:
    engine = _Build(key).load_engine(EngineSource(AFFINE))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            engine.contexts = 4
        assert engine.contexts == 4
    finally:
        engine.close()


def test_one_context_never_warns_even_on_a_hazardous_build() -> None:
    engine = _Build(RTX_161).load_engine(EngineSource(AFFINE))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            engine.contexts = 1
            assert engine.execute(np.ones((2, 4), np.float32))[0].tolist() == [[3.0] * 4] * 2
    finally:
        engine.close()
