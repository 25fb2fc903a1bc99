"""``trt-runtime build`` and :func:`trt_runtime.onnx_build.build_onnx`: ONNX models made here,
built with the real TensorRT-RTX builder on the CPU, written as plan / TR01 / .pte and inspected."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _cli_runner import error_lines
from _cli_runner import run_cli as _run

from trt_runtime import BuildError, FormatError
from trt_runtime.shapes import check_in_profiles, parse_shape, parse_shapes, profile_ranges

pytest.importorskip("tensorrt_rtx", reason="building engines needs tensorrt-rtx")
pytest.importorskip("onnx", reason="making ONNX models needs onnx: "
                            "pip install -c constraints.txt -e '.[onnx]'")

from trt_runtime.onnx_build import build_onnx
from trt_runtime.testing.onnx_models import conv_model, mlp_model, unsupported_model

_errors = error_lines


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("onnx")
    return {
        "mlp": mlp_model().save(root / "mlp.onnx"),
        "conv": conv_model().save(root / "conv.onnx"),
        "bad": unsupported_model(("NoSuchOp", "AlsoMissing")).save(root / "bad.onnx"),
    }


# -- shapes -------------------------------------------------------------------------------


def test_shapes_parse_names_and_dims() -> None:
    assert parse_shape("1x3X64x64") == (1, 3, 64, 64)
    assert parse_shapes(["x:1x8,scope:name:2x3", "y:4"]) == {"x": (1, 8), "scope:name": (2, 3), "y": (4,)}


@pytest.mark.parametrize(
    ("items", "match"),
    [
        (["x:1xqx3"], r"--shapes x: dimension 'q' of shape '1xqx3' is not a positive integer"),
        (["x:1x0"], r"dimension '0' of shape '1x0'"),
        (["x1x8"], r"'x1x8' is not NAME:SHAPE"),
        (["x:"], r"--shapes x: empty shape"),
        (["x:1x8", "x:2x8"], r"input 'x' is given twice"),
    ],
)
def test_shapes_parse_refuses_naming_the_bad_value(items: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_shapes(items)


def test_shapes_profile_ranges() -> None:
    assert profile_ranges(shapes={"x": (2, 8)}) == {"x": ((2, 8), (2, 8), (2, 8))}
    got = profile_ranges(min_shapes={"x": (1, 8)}, opt_shapes={"x": (4, 8)}, max_shapes={"x": (16, 8)})
    assert got == {"x": ((1, 8), (4, 8), (16, 8))}
    with pytest.raises(ValueError, match=r"input 'x' needs .*missing --max-shapes"):
        profile_ranges(min_shapes={"x": (1, 8)}, opt_shapes={"x": (4, 8)})
    with pytest.raises(ValueError, match=r"min <= opt <= max .* 8x8 / 4x8 / 16x8"):
        profile_ranges(min_shapes={"x": (8, 8)}, opt_shapes={"x": (4, 8)}, max_shapes={"x": (16, 8)})
    with pytest.raises(ValueError, match=r"differ in rank"):
        profile_ranges(min_shapes={"x": (1,)}, opt_shapes={"x": (4, 8)}, max_shapes={"x": (16, 8)})
    with pytest.raises(ValueError, match=r"both --shapes and --min/opt/max-shapes"):
        profile_ranges(shapes={"x": (1, 8)}, min_shapes={"x": (1, 8)})


# -- the library --------------------------------------------------------------------------


def test_build_onnx_mlp_dynamic_batch_records_the_profile(models: dict[str, Path]) -> None:
    model = mlp_model()
    built = build_onnx(models["mlp"], shapes=model.shapes, progress=lambda *a: None)
    (x,), (y,) = built.inputs, built.outputs
    assert (x.name, x.dtype, x.shape) == ("x", "float32", (-1, 8))
    assert x.profiles == (((1, 8), (4, 8), (16, 8)),)
    assert (y.name, y.shape) == ("y", (-1, 4))
    assert built.plan[:4] and len(built.plan) > 1000


def test_build_onnx_progress_is_reported(models: dict[str, Path]) -> None:
    seen: list[tuple[str, int, int]] = []
    build_onnx(models["mlp"], shapes=mlp_model().shapes, progress=lambda *a: seen.append(a))
    assert seen, "the IProgressMonitor reported no phase"
    assert all(0 <= step <= total or total == 0 for _, step, total in seen)


def test_build_onnx_from_bytes_fp16_and_fp32(models: dict[str, Path]) -> None:
    pytest.importorskip("onnxconverter_common", reason="--fp16 needs onnxconverter-common")
    model = conv_model()
    fp32 = build_onnx(model.data, shapes=model.shapes, precision="fp32", name="conv")
    fp16 = build_onnx(model.data, shapes=model.shapes, precision="fp16")
    assert fp32.name == "conv" and fp16.precision == "fp16"
    # fp16 keeps float32 inputs and outputs: the casts are inside the engine.
    assert [s.dtype for s in fp16.bindings] == ["float32", "float32"]
    assert fp16.plan != fp32.plan


def test_build_onnx_refuses_a_dynamic_input_without_shapes(models: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match=r"input 'x' of .*mlp.onnx has dynamic shape \?x8; give its shape"):
        build_onnx(models["mlp"])


@pytest.mark.parametrize(
    ("shapes", "match"),
    [
        ({"nope": ((1, 8),) * 3}, r"shapes given for \['nope'\], which are not inputs .* x \(\?x8\)"),
        ({"x": ((1, 9), (4, 8), (8, 8))},
         r"the min of the range given for 'x': shape 1x9 does not fit input 'x' .* whose shape is \?x8"),
        ({"x": ((1, 8, 1),) * 3}, r"^shape 1x8x1 does not fit input 'x'"),
    ],
)
def test_build_onnx_refuses_bad_shapes(models: dict[str, Path], shapes: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build_onnx(models["mlp"], shapes=shapes)


def test_build_onnx_one_failure_per_unsupported_node(models: dict[str, Path]) -> None:
    with pytest.raises(BuildError, match="reported 2 errors") as info:
        build_onnx(models["bad"])
    first, second = info.value.failures
    assert "node 0 'bad_0' (op NoSuchOp)" in first and "not supported" in first
    assert "node 1 'bad_1' (op AlsoMissing)" in second


def test_build_onnx_refuses_bytes_that_are_not_onnx() -> None:
    # Refused before TensorRT's parser sees them (tests/formats/test_hostile_onnx.py has more).
    with pytest.raises(FormatError, match=r"the ONNX model: not an ONNX model \(Error parsing message"):
        build_onnx(b"\x08\x07garbage" * 10)
    # Bytes protobuf reads as an empty model.
    with pytest.raises(FormatError, match=r"the ONNX model: the model has no graph outputs; is it an ONNX"):
        build_onnx(b"")


def test_build_onnx_argument_checks(models: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"precision must be one of fp32, fp16 or None; got 'int8'"):
        build_onnx(models["mlp"], precision="int8")
    with pytest.raises(ValueError, match=r"log_level must be one of error, warning, info, verbose"):
        build_onnx(models["mlp"], log_level="loud")
    with pytest.raises(FileNotFoundError):
        build_onnx(tmp_path / "missing.onnx")


# -- the command --------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".plan", ".tr01", ".pte"])
def test_cli_build_writes_each_format_and_inspect_shows_the_profile(
    capsys: pytest.CaptureFixture[str], models: dict[str, Path], tmp_path: Path, suffix: str
) -> None:
    target = tmp_path / f"mlp{suffix}"
    code, out, err = _run(capsys, "--json", "build", models["mlp"], "-o", target,
                          "--min-shapes", "x:1x8", "--opt-shapes", "x:4x8", "--max-shapes", "x:16x8")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["format"] == suffix[1:] and doc["bytes"] == target.stat().st_size
    assert doc["inputs"][0]["profiles"] == [[[1, 8], [4, 8], [16, 8]]]
    code, out, err = _run(capsys, "--json", "inspect", target, "--no-load")
    assert code == 0, err
    report = json.loads(out)
    if suffix == ".plan":
        assert report["bindings"] == []  # a raw plan records no bindings
    else:
        x = next(b for b in report["bindings"] if b["name"] == "x")
        assert x["profiles"] == [[[1, 8], [4, 8], [16, 8]]]


def test_cli_build_format_option_overrides_the_extension(
    capsys: pytest.CaptureFixture[str], models: dict[str, Path], tmp_path: Path
) -> None:
    target = tmp_path / "conv.bin"
    code, _, err = _run(capsys, "build", models["conv"], "-o", target, "--format", "tr01",
                        "--shapes", "image:2x3x16x16", "--fp32")
    assert code == 0, err
    assert target.read_bytes()[:4] == b"TR01"


def test_cli_build_refuses_an_unknown_extension(
    capsys: pytest.CaptureFixture[str], models: dict[str, Path], tmp_path: Path
) -> None:
    code, _, err = _run(capsys, "build", models["mlp"], "-o", tmp_path / "m.bin", "--shapes", "x:2x8")
    assert code == 2
    (line,) = _errors(err)
    assert "cannot tell the format of" in line and "'.bin'" in line and ".pte (pte)" in line
    assert not (tmp_path / "m.bin").exists()


@pytest.mark.parametrize(
    ("shape_args", "match"),
    [
        (["--shapes", "x:2xabc"], "--shapes x: dimension 'abc' of shape '2xabc'"),
        (["--shapes", "x=2x8"], "'x=2x8' is not NAME:SHAPE"),
        (["--shapes", "y:2x8"], "shapes given for ['y'], which are not inputs"),
        (["--shapes", "x:2x9"], "shape 2x9 does not fit input 'x'"),
        (["--min-shapes", "x:1x8", "--max-shapes", "x:4x8"], "missing --opt-shapes"),
        ([], "has dynamic shape ?x8"),
    ],
)
def test_cli_build_bad_shapes_are_usage_errors(
    capsys: pytest.CaptureFixture[str], models: dict[str, Path], tmp_path: Path,
    shape_args: list[str], match: str,
) -> None:
    target = tmp_path / "m.plan"
    code, _, err = _run(capsys, "build", models["mlp"], "-o", target, *shape_args)
    assert code == 2, err
    (line,) = _errors(err)
    assert match in line
    assert "min shape" not in line  # --shapes gives one shape, not a range
    assert not target.exists()


def test_cli_build_prints_one_line_per_parser_failure(
    capsys: pytest.CaptureFixture[str], models: dict[str, Path], tmp_path: Path
) -> None:
    target = tmp_path / "bad.plan"
    code, _, err = _run(capsys, "build", models["bad"], "-o", target)
    assert code == 1
    lines = _errors(err)
    assert len(lines) == 2, err
    assert "node 0 'bad_0' (op NoSuchOp): Op type NoSuchOp is not supported" in lines[0]
    assert "node 1 'bad_1' (op AlsoMissing)" in lines[1]
    assert "ModelImporter" not in err  # TensorRT's multi-line copy of the same errors is muted
    assert not target.exists()


def test_cli_build_refuses_a_file_that_is_not_onnx(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x08\x07garbage" * 10)
    code, _, err = _run(capsys, "build", junk, "-o", tmp_path / "j.plan")
    assert code == 1
    (line,) = _errors(err)
    assert "junk.onnx" in line and "not an ONNX model" in line
    code, _, err = _run(capsys, "build", tmp_path / "missing.onnx", "-o", tmp_path / "j.plan")
    assert code == 1 and "no such ONNX model" in _errors(err)[0]


def test_cli_build_log_level_verbose_shows_tensorrt_messages(
    capsys: pytest.CaptureFixture[str], models: dict[str, Path], tmp_path: Path
) -> None:
    code, _, err = _run(capsys, "-q", "build", models["mlp"], "-o", tmp_path / "m.plan",
                        "--shapes", "x:2x8", "--log-level", "verbose")
    assert code == 0
    assert "[TensorRT] verbose:" in err or "[TensorRT] info:" in err
    code, _, err = _run(capsys, "-q", "build", models["mlp"], "-o", tmp_path / "m.plan",
                        "--shapes", "x:2x8", "--log-level", "error")
    assert code == 0 and "[TensorRT]" not in err


def test_cli_build_then_run_goes_as_far_as_the_cpu_allows(
    capsys: pytest.CaptureFixture[str], models: dict[str, Path], tmp_path: Path
) -> None:
    """On a CPU the engine is built, written and inspected; running it needs a GPU backend,
    and `run` says so in one line instead of failing inside TensorRT."""
    from trt_runtime.cli.engine_files import backend_reason

    target = tmp_path / "conv.tr01"
    code, _, err = _run(capsys, "build", models["conv"], "-o", target, "--shapes", "image:2x3x16x16")
    assert code == 0, err
    reason = backend_reason("python")
    if not reason:
        pytest.skip("a GPU backend is available here: tests/gpu covers the run")
    code, _, err = _run(capsys, "run", target, "--backend", "python")
    assert code == 1
    (line,) = _errors(err)
    assert line.startswith(f"trt-runtime: error: cannot run {target}")


def test_onnx_models_references_match_onnxruntime() -> None:
    ort = pytest.importorskip("onnxruntime")
    for model in (mlp_model(), conv_model()):
        inputs = model.random_inputs(seed=1)
        got = ort.InferenceSession(model.data, providers=["CPUExecutionProvider"]).run(None, inputs)
        for a, b in zip(got, model.reference(*inputs.values()), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_check_in_profiles_names_the_ranges() -> None:
    from trt_runtime import TensorSpec

    spec = TensorSpec("x", "float32", (-1, 8), True, profiles=(((1, 8), (4, 8), (16, 8)),))
    assert check_in_profiles(spec, (16, 8)) == ""
    assert "outside every optimization profile of e (profile 0: 1x8 .. 16x8)" in check_in_profiles(
        spec, (17, 8), engine="e")
    assert "does not fit input 'x' of the engine, whose shape is ?x8" in check_in_profiles(spec, (2, 9))


def test_demo_starts_from_an_onnx_model_or_says_what_it_fell_back_to(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trt_runtime.testing import onnx_models

    code, out, err = _run(capsys, "--json", "demo", "--out", tmp_path / "onnx")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["source"]["onnx"] == os.fspath(tmp_path / "onnx" / "convnet.onnx")
    assert (tmp_path / "onnx" / "convnet.onnx").is_file()

    def no_onnx(**kwargs: Any) -> Any:
        raise ImportError("making ONNX models needs onnx: pip install -c constraints.txt -e '.[onnx]'")

    monkeypatch.setattr(onnx_models, "conv_model", no_onnx)
    code, out, err = _run(capsys, "demo", "--out", tmp_path / "api")
    assert code == 0, err
    assert "built with the TensorRT-RTX network API: making ONNX models needs onnx" in " ".join(out.split())
    assert not list((tmp_path / "api").glob("*.onnx"))
