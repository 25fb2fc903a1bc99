"""On the GPU: an ONNX model whose weights are external data builds into an engine that
computes with those weights, whether the parser got them as checked buffers
(``load_initializer``: from a path, or bytes with ``base_dir``) or inlined (``--fp16``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import trt_runtime as trt

pytest.importorskip("onnx", reason="needs onnx: pip install -c constraints.txt -e '.[onnx]'")

from trt_runtime.onnx_build import build_onnx
from trt_runtime.testing.onnx_models import matmul_model_file


def _model_with_external_weights(folder: Path) -> tuple[Path, np.ndarray]:
    weights = np.random.default_rng(3).standard_normal((8, 4)).astype(np.float32)
    path = matmul_model_file(folder, weights)
    assert (folder / "weights" / "w.bin").stat().st_size == weights.nbytes
    return path, weights


@pytest.mark.parametrize("how", ["path", "bytes", "fp16"])
def test_gpu_onnx_external_weights_are_the_engines_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    path, weights = _model_with_external_weights(tmp_path / "m")
    monkeypatch.chdir(tmp_path)  # not the model's folder: nothing may resolve against it
    if how == "bytes":
        built = build_onnx(path.read_bytes(), base_dir=path.parent)
    else:
        built = build_onnx(path, precision="fp16" if how == "fp16" else "fp32")
    plan = tmp_path / "model.plan"
    plan.write_bytes(built.plan)
    x = np.random.default_rng(4).standard_normal((2, 8)).astype(np.float32)
    with trt.load(plan) as engine:
        y = np.asarray(engine(x))
    expected = x.astype(np.float64) @ weights.astype(np.float64)
    tolerance = 2e-2 if how == "fp16" else 2e-3  # TF32 for float32 matrix multiplies
    np.testing.assert_allclose(y, expected, rtol=tolerance, atol=tolerance * np.abs(expected).max())
