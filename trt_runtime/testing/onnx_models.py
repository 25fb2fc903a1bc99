"""Small ONNX models made with the ``onnx`` package, for tests, the demo and GPU checks.

Each maker returns an :class:`OnnxModel`: the serialized model, the shapes to build it
with (``(min, opt, max)`` per dynamic input, as :func:`trt_runtime.onnx_build.build_onnx`
takes them) and a float64 numpy ``reference`` of what it computes, so a check needs
neither onnxruntime nor a GPU. Needs ``onnx`` and numpy (``pip install -c constraints.txt -e '.[onnx]'``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from trt_runtime.extras import install_hint
from trt_runtime.shapes import ShapeRange

__all__ = ["OnnxModel", "conv_model", "matmul_model_file", "mlp_model", "unsupported_model"]

OPSET = 17


@dataclasses.dataclass(frozen=True)
class OnnxModel:
    """A serialized ONNX model, the shapes to build it with and its numpy reference."""

    name: str
    data: bytes
    shapes: Mapping[str, ShapeRange]
    #: float64 reference: ``reference(*inputs) -> list of outputs``.
    reference: Callable[..., list[Any]]

    def save(self, path: Any) -> Any:
        """Write the model to ``path``; return ``path``."""
        with open(path, "wb") as f:
            f.write(self.data)
        return path

    def random_inputs(self, seed: int = 0) -> dict[str, Any]:
        """float32 inputs of each input's *opt* shape, by name."""
        import numpy as np

        rng = np.random.default_rng(seed)
        return {name: rng.standard_normal(r[1]).astype(np.float32) for name, r in self.shapes.items()}


def _onnx() -> tuple[Any, Any, Any, Any]:
    try:
        import onnx
        from onnx import TensorProto, helper, numpy_helper
    except ImportError as exc:
        raise ImportError("making ONNX models needs onnx: " + install_hint("onnx")) from exc
    return onnx, helper, TensorProto, numpy_helper


def _finish(onnx: Any, helper: Any, graph: Any) -> bytes:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8  # readable by every onnxruntime and TensorRT parser in use
    onnx.checker.check_model(model)
    data: bytes = model.SerializeToString()
    return data


def mlp_model(*, features: int = 8, hidden: int = 16, classes: int = 4, max_batch: int = 16,
              seed: int = 0) -> OnnxModel:
    """``y = relu(x @ W1 + b1) @ W2 + b2`` with a dynamic batch (profile 1 / 4 / ``max_batch``)."""
    import numpy as np

    onnx, helper, tp, nh = _onnx()
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((features, hidden)) / np.sqrt(features)).astype(np.float32)
    b1 = rng.standard_normal(hidden).astype(np.float32) * 0.1
    w2 = (rng.standard_normal((hidden, classes)) / np.sqrt(hidden)).astype(np.float32)
    b2 = rng.standard_normal(classes).astype(np.float32) * 0.1
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h1"], name="fc1"),
        helper.make_node("Add", ["h1", "b1"], ["h2"], name="fc1_bias"),
        helper.make_node("Relu", ["h2"], ["h3"], name="relu"),
        helper.make_node("MatMul", ["h3", "W2"], ["h4"], name="fc2"),
        helper.make_node("Add", ["h4", "b2"], ["y"], name="fc2_bias"),
    ]
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", tp.FLOAT, ["batch", features])],
        [helper.make_tensor_value_info("y", tp.FLOAT, ["batch", classes])],
        [nh.from_array(a, n) for a, n in ((w1, "W1"), (b1, "b1"), (w2, "W2"), (b2, "b2"))],
    )

    def reference(x: Any) -> list[Any]:
        h = np.maximum(np.asarray(x, np.float64) @ w1 + b1, 0.0)
        return [h @ w2 + b2]

    shapes = {"x": ((1, features), (4, features), (max_batch, features))}
    return OnnxModel("mlp", _finish(onnx, helper, graph), shapes, reference)


def conv_model(*, channels: int = 3, filters: int = 8, size: int = 16, classes: int = 10,
               max_batch: int = 8, seed: int = 0) -> OnnxModel:
    """Conv 3x3 (pad 1) -> Relu -> GlobalAveragePool -> Flatten -> Gemm, dynamic batch."""
    import numpy as np

    from trt_runtime.builders import _conv_ref

    onnx, helper, tp, nh = _onnx()
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((filters, channels, 3, 3)) / np.sqrt(channels * 9)).astype(np.float32)
    b = rng.standard_normal(filters).astype(np.float32) * 0.1
    fc = (rng.standard_normal((filters, classes)) / np.sqrt(filters)).astype(np.float32)
    fcb = rng.standard_normal(classes).astype(np.float32) * 0.1
    nodes = [
        helper.make_node("Conv", ["image", "conv_w", "conv_b"], ["c"], name="conv",
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten", axis=1),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"], name="fc"),
    ]
    graph = helper.make_graph(
        nodes, "convnet",
        [helper.make_tensor_value_info("image", tp.FLOAT, ["batch", channels, size, size])],
        [helper.make_tensor_value_info("logits", tp.FLOAT, ["batch", classes])],
        [nh.from_array(a, n) for a, n in ((w, "conv_w"), (b, "conv_b"), (fc, "fc_w"), (fcb, "fc_b"))],
    )

    def reference(image: Any) -> list[Any]:
        x = np.asarray(image, np.float64)
        r = np.maximum(_conv_ref(x, w.astype(np.float64), b.astype(np.float64), 1, 1), 0.0)
        return [r.mean(axis=(2, 3)) @ fc + fcb]

    dims = (channels, size, size)
    shapes = {"image": ((1, *dims), (2, *dims), (max_batch, *dims))}
    return OnnxModel("convnet", _finish(onnx, helper, graph), shapes, reference)


def unsupported_model(ops: tuple[str, ...] = ("NoSuchOp",)) -> OnnxModel:
    """A chain of nodes of custom (unknown) op types, ``bad_0``, ``bad_1``...: the parser refuses it."""
    _onnx_module, helper, tp, _nh = _onnx()
    names = ["x", *(f"t{i}" for i in range(len(ops) - 1)), "y"]
    nodes = [
        helper.make_node(op, [names[i]], [names[i + 1]], name=f"bad_{i}", domain="custom.ops")
        for i, op in enumerate(ops)
    ]
    graph = helper.make_graph(
        nodes, "unsupported",
        [helper.make_tensor_value_info("x", tp.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", tp.FLOAT, [2, 4])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("custom.ops", 1)]
    )
    model.ir_version = 8
    data: bytes = model.SerializeToString()  # the checker refuses unknown ops: not checked

    def reference(x: Any) -> list[Any]:
        raise NotImplementedError("this model exists to be refused")

    return OnnxModel("unsupported", data, {}, reference)


def matmul_model_file(folder: Any, weights: Any, *, external: bool = True) -> Any:
    """``folder/model.onnx``: ``y = x @ w`` for ``x`` of shape ``(2, rows of w)``, with ``w``'s
    bytes in ``folder/weights/w.bin`` as external data (``external``) or inline. Returns the path.

    The tests of external weights build it both ways: the same weights must make the same
    engine, whichever way the parser was given them.
    """
    from pathlib import Path

    onnx, helper, tp, numpy_helper = _onnx()
    rows, cols = weights.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "matmul",
        [helper.make_tensor_value_info("x", tp.FLOAT, [2, rows])],
        [helper.make_tensor_value_info("y", tp.FLOAT, [2, cols])],
        [numpy_helper.from_array(weights, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    folder = Path(folder)
    (folder / "weights").mkdir(parents=True)  # onnx 1.23 will not make the folder itself
    path = folder / "model.onnx"
    if external:
        onnx.save_model(model, path, save_as_external_data=True, location="weights/w.bin", size_threshold=0)
    else:
        onnx.save_model(model, path)
    return path
