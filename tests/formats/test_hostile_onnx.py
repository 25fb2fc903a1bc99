"""Hostile ONNX models for ``trt-runtime build`` and ``build_onnx``: external data that leaves
the model's folder, lies about its size or is a FIFO, and malformed model bytes.

Targets: ``FormatError`` (CLI: exit 1, one line), at most 2 s of CPU on inputs up to 1 MB,
peak RSS at most 300 MB + 4x the input in a fresh process, no file outside the model's
folder opened (an audit hook records every open), no signal death, no hang.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trt_runtime import FormatError

pytest.importorskip("tensorrt_rtx", reason="building engines needs tensorrt-rtx")
onnx = pytest.importorskip("onnx", reason="making ONNX models needs onnx: pip install 'trt-runtime[onnx]'")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from trt_runtime.onnx_build import build_onnx  # noqa: E402

MB = 2**20
WORKER = Path(__file__).with_name("_hostile_cli.py")
WEIGHTS = np.arange(32, dtype=np.float32).reshape(8, 4)


def _model(external: dict[str, str] | None = None, tensor: Any = None) -> Any:
    """``y = x @ w`` with ``w`` inline, or external with the ``external`` entries given."""
    w = tensor if tensor is not None else numpy_helper.from_array(WEIGHTS, "w")
    if external is not None:
        w.ClearField("raw_data")
        w.data_location = TensorProto.EXTERNAL
        for key, value in external.items():
            w.external_data.add(key=key, value=value)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _save(folder: Path, external: dict[str, str] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    path.write_bytes(_model(external).SerializeToString())
    return path


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file outside the model's folder, the size of the weights: what an attacker wants read."""
    path = tmp_path / "outside" / "secret.bin"
    path.parent.mkdir()
    path.write_bytes(b"S" * WEIGHTS.nbytes)
    return path


def _cli(*argv: Any, cwd: Path | None = None) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(WORKER), *map(os.fspath, argv)], capture_output=True,
                          text=True, timeout=60, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-2000:]  # no signal death, no traceback
    result: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return result


def _assert_refused(result: dict[str, Any], match: str, size: int, secret: Path | None = None) -> None:
    lines = result["stderr"].strip().splitlines()
    assert result["exit"] == 1, result
    assert len(lines) == 1 and lines[0].startswith("trt-runtime: error: ") and match in lines[0], lines
    assert result["seconds"] < 2.0, result
    assert result["peak_rss"] <= 300 * MB + 4 * size, result
    if secret is not None:
        assert os.path.realpath(secret) not in {os.path.realpath(p) for p in result["opened"]}, result


# -- external data ------------------------------------------------------------------------


def test_hostile_onnx_external_data_is_read_from_the_model_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _save(tmp_path / "m", {"location": "w.bin"})
    (tmp_path / "m" / "w.bin").write_bytes(WEIGHTS.tobytes())
    built = build_onnx(path)
    assert [s.name for s in built.inputs] == ["x"] and built.plan
    # Bytes with a base folder, from another directory: the parser opens no file by name.
    monkeypatch.chdir(tmp_path)
    assert build_onnx(path.read_bytes(), base_dir=tmp_path / "m").plan


@pytest.mark.parametrize("how", ["file", "directory"])
def test_hostile_onnx_symlink_out_of_the_folder_is_refused_unopened(
    tmp_path: Path, secret: Path, how: str
) -> None:
    folder = tmp_path / "m"
    if how == "file":
        path = _save(folder, {"location": "w.bin"})
        (folder / "w.bin").symlink_to(secret)
    else:
        path = _save(folder, {"location": "sub/secret.bin"})
        (folder / "sub").symlink_to(secret.parent, target_is_directory=True)
    with pytest.raises(FormatError, match=r"initializer 'w' has external data .* outside the model's folder"):
        build_onnx(path)
    for fp16 in ([], ["--fp16"]):
        result = _cli("build", path, "-o", tmp_path / "out.plan", *fp16)
        _assert_refused(result, "outside the model's folder", path.stat().st_size, secret)
    assert not (tmp_path / "out.plan").exists()


@pytest.mark.parametrize(
    ("external", "match"),
    [
        ({"location": "w.bin", "length": "1073741824"}, r"offset 0 \+ length 1073741824 is past the end"),
        ({"location": "w.bin", "offset": "64", "length": "128"}, r"offset 64 \+ length 128 is past the end"),
        ({"location": "w.bin", "offset": "4096"}, r"offset 4096 is past the end of the file \(128 bytes\)"),
        ({"location": "w.bin", "offset": "-8"}, r"offset '-8'; expected a non-negative integer"),
        ({"location": "w.bin", "length": "64"}, r"length 64 bytes, but its dims \[8, 4\] need 128"),
        ({"location": "../secret.bin"}, r"a location must be a relative path inside the model's folder"),
        ({"location": "/etc/passwd"}, r"a location must be a relative path inside the model's folder"),
        ({"location": "missing.bin"}, r"external data 'missing.bin': No such file"),
    ],
)
def test_hostile_onnx_bad_external_ranges_are_format_errors(
    tmp_path: Path, external: dict[str, str], match: str
) -> None:
    path = _save(tmp_path / "m", external)
    (tmp_path / "m" / "w.bin").write_bytes(WEIGHTS.tobytes())
    with pytest.raises(FormatError, match=match):
        build_onnx(path)
    for fp16 in ([], ["--fp16"]):  # exit 1 either way, never the usage error's 2
        _assert_refused(_cli("build", path, "-o", tmp_path / "out.plan", *fp16), "initializer 'w'",
                        path.stat().st_size)


def test_hostile_onnx_fifo_as_external_data_does_not_block(tmp_path: Path) -> None:
    path = _save(tmp_path / "m", {"location": "w.bin"})
    os.mkfifo(tmp_path / "m" / "w.bin")
    result = _cli("build", path, "-o", tmp_path / "out.plan")  # the 60 s timeout catches a hang
    _assert_refused(result, "it is a FIFO (named pipe), not a regular file", path.stat().st_size)
    assert result["wall_seconds"] < 10


def test_hostile_onnx_bytes_with_external_data_need_a_base_folder(
    tmp_path: Path, secret: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _model({"location": "secret.bin"}).SerializeToString()
    monkeypatch.chdir(secret.parent)  # where the old code resolved the location
    match = r"initializer 'w' has external data 'secret.bin', but the model was given as bytes; pass base_dir"
    with pytest.raises(FormatError, match=match):
        build_onnx(data)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "link.bin").symlink_to(secret)
    with pytest.raises(FormatError, match=r"resolves to .*outside the model's folder"):
        build_onnx(_model({"location": "link.bin"}).SerializeToString(), base_dir=tmp_path / "m")


# -- malformed models ---------------------------------------------------------------------


def _malformed() -> dict[str, bytes]:
    good = _model().SerializeToString()
    huge = numpy_helper.from_array(np.zeros((2, 2), np.float32), "w")
    del huge.dims[:]
    huge.dims.extend([2**31, 2**31])
    negative = numpy_helper.from_array(WEIGHTS, "w")
    negative.dims[0] = -8
    return {
        "truncated": good[: len(good) // 2],
        "garbage": bytes(range(256)) * 64,
        "empty": b"",
        "text": b"ir_version: 8\ngraph { name: 'g' }\n" * 100,
        "varint overflow": b"\x08" + b"\xff" * 11 + b"\x01",
        "dims overflow int64": good.replace(b"\x08\x08\x08\x04", b"\x08" + b"\xff" * 10 + b"\x02", 1),
        "huge inline tensor": _model(tensor=huge).SerializeToString(),
        "negative dim": _model(tensor=negative).SerializeToString(),
        "1 MB inline tensor with lying dims": _model(tensor=_lying_tensor()).SerializeToString(),
    }


def _lying_tensor() -> Any:
    tensor = numpy_helper.from_array(np.ones(MB // 4, np.float32), "w")
    tensor.dims[0] = MB  # four times what it holds
    return tensor


@pytest.mark.parametrize("case", list(_malformed()))
def test_hostile_onnx_malformed_models_are_one_line_format_errors(tmp_path: Path, case: str) -> None:
    data = _malformed()[case]
    with pytest.raises(FormatError, match=r"the ONNX model"):
        build_onnx(data)
    path = tmp_path / "model.onnx"
    path.write_bytes(data)
    _assert_refused(_cli("build", path, "-o", tmp_path / "out.plan"), str(path), len(data))
