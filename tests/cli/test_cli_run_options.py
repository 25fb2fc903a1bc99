"""``run`` and ``bench`` options shared with trtexec and Polygraphy, on the CPU with memory engines:
--shapes, --load-inputs, --save-inputs/--save-outputs, --compare/--atol/--rtol, output summaries,
--iterations/--duration, the H2D / compute / D2H split (n/a on CPU) and --log-level."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _cli_runner import error_lines
from _cli_runner import run_cli as _run

from trt_runtime import TensorSpec, bench
from trt_runtime.cli.compare import compare, summarize
from trt_runtime.testing.memory import AffineOutput, MemoryBackend

#: Memory engines start with no TensorRT magic: kept so these tests pass whether or not the
#: commands still need --force for them.
FORCE = "--force"


def _error(err: str) -> str:
    lines = error_lines(err)
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def affine(tmp_path: Path) -> Path:
    """y = 2x + 1 and z = -x, x dynamic in its batch (profile 1..8, opt 2)."""
    x = TensorSpec("x", "float32", (-1, 4), True, profiles=(((1, 4), (2, 4), (8, 4)),))
    data = MemoryBackend.build_engine(
        [x], [AffineOutput("y", "x", scale=2.0, bias=1.0), AffineOutput("z", "x", scale=-1.0)], name="affine"
    )
    path = tmp_path / "affine.mem"
    path.write_bytes(data)
    return path


def _run_mem(
    capsys: pytest.CaptureFixture[str], engine: Path, tmp_path: Path, *extra: Any
) -> tuple[int, Any, str]:
    code, out, err = _run(
        capsys,
        "--json",
        "run",
        engine,
        "--backend",
        "memory",
        FORCE,
        "--output-dir",
        tmp_path / "out",
        *extra,
    )
    return code, json.loads(out) if out.strip() else None, err


# -- --shapes -----------------------------------------------------------------------------


def test_run_shapes_sets_the_input_shape(
    capsys: pytest.CaptureFixture[str], affine: Path, tmp_path: Path
) -> None:
    code, doc, err = _run_mem(capsys, affine, tmp_path, "--shapes", "x:5x4")
    assert code == 0, err
    assert [o["shape"] for o in doc["outputs"]] == [[5, 4], [5, 4]]
    assert doc["summaries"]["y"]["shape"] == [5, 4]


@pytest.mark.parametrize(
    ("shape", "match"),
    [
        (
            "x:9x4",
            "shape 9x4 of input 'x' is outside every optimization profile of the engine "
            "(profile 0: 1x4 .. 8x4)",
        ),
        ("x:2x5", "shape 2x5 does not fit input 'x' of the engine, whose shape is ?x4"),
        ("x:2x4x1", "shape 2x4x1 does not fit input 'x'"),
        ("w:2x4", "--shapes names ['w'], which are not inputs of the engine; its inputs are ['x']"),
        ("x:2xfour", "dimension 'four' of shape '2xfour' is not a positive integer"),
    ],
)
def test_run_shapes_refused_with_a_clear_error(
    capsys: pytest.CaptureFixture[str], affine: Path, tmp_path: Path, shape: str, match: str
) -> None:
    code, _, err = _run_mem(capsys, affine, tmp_path, "--shapes", shape)
    assert code == 2
    assert match in _error(err)


# -- inputs and outputs as .npz, summaries ------------------------------------------------------


def test_run_save_load_and_summaries(
    capsys: pytest.CaptureFixture[str], affine: Path, tmp_path: Path
) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.savez(tmp_path / "in.npz", x=x)
    code, doc, err = _run_mem(capsys, affine, tmp_path, "--load-inputs", tmp_path / "in.npz",
                              "--save-outputs", tmp_path / "o.npz", "--save-inputs", tmp_path / "i.npz")
    assert code == 0, err
    with np.load(tmp_path / "o.npz") as saved:
        np.testing.assert_array_equal(saved["y"], 2 * x + 1)
        np.testing.assert_array_equal(saved["z"], -x)
    with np.load(tmp_path / "i.npz") as saved:
        np.testing.assert_array_equal(saved["x"], x)
    y = doc["summaries"]["y"]
    assert y == {
        "shape": [3, 4],
        "dtype": "float32",
        "min": 1.0,
        "max": 23.0,
        "mean": pytest.approx(12.0),
        "std": pytest.approx(float(np.std(2 * x + 1))),
    }


def test_run_summary_table_in_text_mode(
    capsys: pytest.CaptureFixture[str], affine: Path, tmp_path: Path
) -> None:
    code, out, err = _run(capsys, "run", affine, "--backend", "memory", FORCE, "--output-dir", tmp_path)
    assert code == 0, err
    assert "output values" in out and "mean" in out and "std" in out


def test_run_load_inputs_refusals(capsys: pytest.CaptureFixture[str], affine: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "one.npy", np.zeros((2, 4), np.float32))
    code, _, err = _run_mem(capsys, affine, tmp_path, "--load-inputs", tmp_path / "one.npy")
    assert code == 1 and "is not an .npz file of named arrays" in _error(err)
    np.savez(tmp_path / "big.npz", x=np.zeros((9, 4), np.float32))
    code, _, err = _run_mem(capsys, affine, tmp_path, "--load-inputs", tmp_path / "big.npz")
    assert code == 2  # as the same shape from --shapes
    assert (
        "the array given for input 'x': shape 9x4 of input 'x' is outside every optimization profile"
        in _error(err)
    )
    np.savez(tmp_path / "other.npz", q=np.zeros((2, 4), np.float32))
    code, _, err = _run_mem(capsys, affine, tmp_path, "--load-inputs", tmp_path / "other.npz")
    assert code == 2 and "--load-inputs names ['q'], which are not inputs" in _error(err)
    np.savez(tmp_path / "x.npz", x=np.zeros((2, 4), np.float32))
    code, _, err = _run_mem(
        capsys, affine, tmp_path, "--load-inputs", tmp_path / "x.npz", "--shapes", "x:2x4"
    )
    assert code == 2 and "given by more than one of --input, --load-inputs, --shapes" in _error(err)


# -- --compare ----------------------------------------------------------------------------


def _reference(tmp_path: Path, x: np.ndarray, **changes: np.ndarray) -> Path:
    arrays = {"y": 2 * x + 1, "z": -x, **changes}
    np.savez(tmp_path / "in.npz", x=x)
    np.savez(tmp_path / "ref.npz", **arrays)
    return tmp_path / "ref.npz"


def test_run_compare_passes_within_tolerance(
    capsys: pytest.CaptureFixture[str], affine: Path, tmp_path: Path
) -> None:
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    ref = _reference(tmp_path, x, y=(2 * x + 1) * (1 + 1e-6), extra=np.zeros(3))
    code, doc, err = _run_mem(capsys, affine, tmp_path, "--load-inputs", tmp_path / "in.npz",
                              "--compare", ref, "--rtol", "1e-4", "--atol", "0")
    assert code == 0, err
    assert doc["compare"]["ok"] is True and doc["compare"]["ignored"] == ["extra"]
    y, z = doc["compare"]["outputs"]
    assert y["name"] == "y" and y["ok"] and 0 < y["max_rel_error"] < 2e-6 and y["mismatched"] == 0
    assert z["max_abs_error"] == 0.0


def test_run_compare_mismatch_exits_1_with_a_report(
    capsys: pytest.CaptureFixture[str], affine: Path, tmp_path: Path
) -> None:
    x = np.ones((2, 4), np.float32)
    wrong = -x
    wrong[0, 1] = 0.5
    ref = _reference(tmp_path, x, z=wrong)
    args = ("run", affine, "--backend", "memory", FORCE, "--output-dir", tmp_path / "o",
            "--load-inputs", tmp_path / "in.npz", "--compare", ref)
    code, out, err = _run(capsys, *args)
    assert code == 1
    assert "1 of 2 output(s) differ from" in _error(err) and ": z" in _error(err)
    assert "FAIL" in out and "PASS" in out and "1.5" in out  # the max abs error of z
    code, out, _ = _run(capsys, "--json", *args)
    doc = json.loads(out)
    z = next(r for r in doc["compare"]["outputs"] if r["name"] == "z")
    assert code == 1 and z == {
        "name": "z",
        "ok": False,
        "max_abs_error": 1.5,
        "max_rel_error": 3.0,
        "mismatched": 1,
        "note": "",
    }


def test_run_compare_missing_output_and_shape_mismatch(
    capsys: pytest.CaptureFixture[str], affine: Path, tmp_path: Path
) -> None:
    x = np.ones((2, 4), np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    np.savez(tmp_path / "ref.npz", y=np.ones((3, 4)))
    code, doc, _ = _run_mem(
        capsys, affine, tmp_path, "--load-inputs", tmp_path / "in.npz", "--compare", tmp_path / "ref.npz"
    )
    assert code == 1
    y, z = doc["compare"]["outputs"]
    assert not y["ok"] and "shape [2, 4] differs from the reference's [3, 4]" in y["note"]
    assert not z["ok"] and "not in the reference" in z["note"]


def test_run_compare_checks_its_file_and_tolerances_before_running(
    capsys: pytest.CaptureFixture[str], affine: Path, tmp_path: Path
) -> None:
    code, _, err = _run_mem(capsys, affine, tmp_path, "--compare", tmp_path / "missing.npz")
    assert code == 1 and "no such file" in _error(err)
    assert not (tmp_path / "out").exists()
    code, _, err = _run_mem(capsys, affine, tmp_path, "--save-outputs", tmp_path / "no" / "o.npz")
    assert code == 1 and "is in a directory that does not exist" in _error(err)
    assert not (tmp_path / "out").exists()
    code, _, err = _run_mem(capsys, affine, tmp_path, "--compare", affine, "--atol", "-1")
    assert code == 2 and "--atol must be a number >= 0; got -1.0" in _error(err)


def test_compare_and_summarize_functions() -> None:
    assert summarize(np.zeros((0, 3), np.float16)) == {
        "shape": [0, 3],
        "dtype": "float16",
        "min": None,
        "max": None,
        "mean": None,
        "std": None,
    }
    (report,) = compare({"a": np.array([1.0, np.nan])}, {"a": np.array([1.0, 1.0])}, atol=1, rtol=0)
    assert not report["ok"] and report["note"] == "1 NaN value(s)"
    (report,) = compare({"a": np.array([0.0, 2.0])}, {"a": np.array([0.0, 1.0])}, atol=0, rtol=0.5)
    assert report["max_rel_error"] == 1.0 and report["mismatched"] == 1


# -- bench --------------------------------------------------------------------------------


def test_bench_shapes_duration_and_split_na_on_cpu(capsys: pytest.CaptureFixture[str], affine: Path) -> None:
    code, out, err = _run(
        capsys,
        "--json",
        "bench",
        affine,
        "--backend",
        "memory",
        FORCE,
        "--iterations",
        "3",
        "--warmup",
        "1",
        "--duration",
        "0.15",
        "--shapes",
        "x:7x4",
    )
    assert code == 0, err
    doc = json.loads(out)
    (result,) = doc["results"]
    assert doc["shapes"] == [[7, 4]] and doc["duration_s"] == 0.15
    assert result["iterations"] > 3  # --duration keeps calling past --iterations
    assert result["transfer_split"]["note"].startswith("n/a: ")
    code, out, err = _run(
        capsys, "bench", affine, "--backend", "memory", FORCE, "--iterations", "2", "--warmup", "0"
    )
    assert code == 0, err
    assert "H2D" in out and "compute" in out and "n/a" in out


def test_bench_refusals(capsys: pytest.CaptureFixture[str], affine: Path) -> None:
    code, _, err = _run(capsys, "bench", affine, "--backend", "memory", FORCE, "--duration", "-2")
    assert code == 2 and "--duration must be a number of seconds >= 0; got -2.0" in _error(err)
    code, _, err = _run(capsys, "bench", affine, "--backend", "memory", FORCE, "--shapes", "x:0x4")
    assert code == 2 and "dimension '0'" in _error(err)


def test_benchmark_duration_runs_at_least_that_long() -> None:
    result = bench.benchmark(lambda: None, iterations=1, warmup=0, duration=0.05)
    assert result.iterations > 1 and result.total_s >= 0.05
    with pytest.raises(ValueError, match="duration must be a number of seconds >= 0 or None; got -1"):
        bench.benchmark(lambda: None, duration=-1)


# -- --log-level --------------------------------------------------------------------------


def test_log_level_shows_tensorrt_messages_backends_forward(
    capsys: pytest.CaptureFixture[str], affine: Path, tmp_path: Path
) -> None:
    """Backends forward TensorRT's messages to ``trt_runtime.<backend>.tensorrt`` loggers;
    --log-level decides which reach stderr."""
    from trt_runtime.cli.io_options import set_log_level

    forwarded = logging.getLogger("trt_runtime.python.tensorrt")
    try:
        set_log_level("verbose")
        forwarded.debug("kernel cache hit")
        forwarded.warning("engine built for another GPU")
        logging.getLogger("trt_runtime.other").debug("not TensorRT's")
        err = capsys.readouterr().err
        assert "[TensorRT] info: kernel cache hit" in err and "[TensorRT] warning: engine built" in err
        assert "not TensorRT's" not in err
        set_log_level("error")
        forwarded.warning("hidden")
        assert "hidden" not in capsys.readouterr().err
    finally:
        set_log_level("warning")
    code, _, err = _run_mem(capsys, affine, tmp_path, "--log-level", "loud")
    assert code == 2 and "--log-level" in _error(err)
