"""On the GPU: ONNX models built with ``trt-runtime build`` match onnxruntime through
``trt-runtime run --compare``; ``bench`` splits H2D / compute / D2H with CUDA events.

The work is benchmarks/probes/gpu_onnx_compare.py (each step a command in its own process, as a user
runs it); this test runs it and records the max relative error of the --fp32 builds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_onnx_build_run_compare_matches_onnxruntime(
    tmp_path: Path, report_measurement: Callable[[str, str], None]
) -> None:
    pytest.importorskip("onnx", reason="needs onnx: pip install -c constraints.txt -e '.[onnx]'")
    pytest.importorskip("onnxruntime", reason="needs onnxruntime for the reference outputs")
    probe = ROOT / "benchmarks" / "probes" / "gpu_onnx_compare.py"
    done = subprocess.run([sys.executable, probe, "--out", tmp_path],
                          capture_output=True, text=True, check=False)
    print(done.stdout, done.stderr)
    assert (tmp_path / "onnx_compare.json").is_file(), done.stderr
    result = json.loads((tmp_path / "onnx_compare.json").read_text())
    report_measurement("onnx_build_max_rel_error_fp32", f"{result['max_rel_error_fp32']:.3g}")
    for row in result["rows"]:
        split = row["transfer_split"]
        report_measurement(
            f"onnx_{row['model']}_{row['precision']}_{row['output']}",
            f"max abs {row['max_abs_error']:.3g}, max rel {row['max_rel_error']:.3g}, ok {row['ok']}; "
            f"median {row['median_us']:.1f} us; split {split}",
        )
        # On a GPU the split is measured, not n/a.
        assert "note" not in split and split["compute_us"] > 0 and split["h2d_us"] > 0, split
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(r["ok"] for r in result["rows"] if r["precision"] == "fp32")


def test_gpu_run_shapes_outside_the_profile_is_refused_before_tensorrt(tmp_path: Path) -> None:
    pytest.importorskip("onnx", reason="needs onnx: pip install -c constraints.txt -e '.[onnx]'")
    from trt_runtime.testing.onnx_models import mlp_model

    model = mlp_model()
    onnx_path = model.save(tmp_path / "mlp.onnx")
    plan = tmp_path / "mlp.plan"
    cli = [sys.executable, "-m", "trt_runtime.cli"]
    subprocess.run([*cli, "build", onnx_path, "-o", plan, "--min-shapes", "x:1x8", "--opt-shapes", "x:4x8",
                    "--max-shapes", "x:16x8"], check=True, capture_output=True)
    done = subprocess.run([*cli, "run", plan, "--shapes", "x:32x8", "--output-dir", tmp_path / "o"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2, done.stderr
    assert "shape 32x8 of input 'x' is outside every optimization profile" in done.stderr
    done = subprocess.run([*cli, "--json", "run", plan, "--shapes", "x:16x8", "--output-dir", tmp_path / "o"],
                          capture_output=True, text=True, check=True)
    assert json.loads(done.stdout[done.stdout.index("{"):])["summaries"]["y"]["shape"] == [16, 4]
