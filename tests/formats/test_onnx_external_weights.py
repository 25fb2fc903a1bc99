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
onnx = pytest.importorskip("onnx", reason="making ONNX models needs onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from trt_runtime.onnx_build import build_onnx  # noqa: E402


def _matmul(folder: Path, weights: np.ndarray, *, external: bool) -> Path:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(weights, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (folder / "weights").mkdir(parents=True)
    path = folder / "model.onnx"
    if external:
        onnx.save_model(model, path, save_as_external_data=True, location="weights/w.bin", size_threshold=0)
    else:
        onnx.save_model(model, path)
    return path


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
