"""External ONNX weights reach the engine: the TensorRT-RTX builder (deterministic here, on
the CPU) writes the same plan for a model whose weights are external data, given by path
or as bytes with ``base_dir``, as for the same model with its weights inline, and another
plan for other weights. The GPU test (``tests/gpu/test_gpu_onnx_external_data.py``) runs
such an engine against numpy."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorrt_rtx", reason="building engines needs tensorrt-rtx")
pytest.importorskip("onnx", reason="making ONNX models needs onnx")

from trt_runtime.onnx_build import build_onnx
from trt_runtime.testing.onnx_models import matmul_model_file as _matmul


def _digest(plan: bytes) -> str:
    return hashlib.sha256(plan).hexdigest()


def test_onnx_external_weights_build_the_plan_inline_weights_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    weights = np.random.default_rng(3).standard_normal((8, 4)).astype(np.float32)
    other = np.random.default_rng(5).standard_normal((8, 4)).astype(np.float32)
    external = _matmul(tmp_path / "external", weights, external=True)
    monkeypatch.chdir(tmp_path)  # not the model's folder: nothing may resolve against it
    inline = _digest(build_onnx(_matmul(tmp_path / "inline", weights, external=False)).plan)
    assert inline == _digest(build_onnx(_matmul(tmp_path / "inline2", weights, external=False)).plan), (
        "the builder is not deterministic on this machine: the comparison below would prove nothing"
    )
    assert _digest(build_onnx(external).plan) == inline
    assert _digest(build_onnx(external.read_bytes(), base_dir=external.parent).plan) == inline
    assert _digest(build_onnx(_matmul(tmp_path / "other", other, external=False)).plan) != inline
