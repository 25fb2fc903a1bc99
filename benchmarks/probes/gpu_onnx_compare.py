"""Do ONNX models built and run with the command line match onnxruntime, in each precision?

ONNX -> ``trt-runtime build`` -> ``trt-runtime run --compare`` against onnxruntime, on a GPU.

For a small MLP (dynamic batch) and a small conv net, both made here with the ``onnx``
package, in each precision available (``--fp32``: TF32 off; default: TF32 on; ``--fp16``
when onnxconverter-common is installed): build the engine with the command line, run
onnxruntime (CPU) on random inputs of the profile's largest shape, run the engine with
``trt-runtime run --load-inputs --compare`` and collect each output's max absolute and
relative error; then ``trt-runtime bench`` for the H2D / compute / D2H split. Every step
is the command a user types, in its own process.

    python benchmarks/probes/gpu_onnx_compare.py [--out DIR]

Prints one line per run and the largest relative error of the --fp32 builds; writes
``DIR/onnx_compare.json`` (DIR defaults to $OUT, else a new temporary directory). Exits
1 if an --fp32 build does not match onnxruntime within atol 1e-3 + rtol 1e-2 (TF32's
rounding: TensorRT-RTX 1.6.1 does not honour a cleared BuilderFlag.TF32).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

#: (flag, atol, rtol) per precision. fp32 gets TF32's tolerance: TensorRT-RTX 1.6.1 keeps
#: TF32 for float32 matrix multiplies and convolutions with BuilderFlag.TF32 cleared (on the
#: H100, 2026-11-24, --fp32 and default builds gave bit-identical errors against onnxruntime).
PRECISIONS = {"fp32": ("--fp32", 1e-3, 1e-2), "tf32": (None, 1e-2, 1e-2), "fp16": ("--fp16", 5e-2, 5e-2)}


def _cli(*args: Any, ok_codes: tuple[int, ...] = (0,)) -> dict[str, Any]:
    command = [sys.executable, "-m", "trt_runtime.cli", "--json", *map(str, args)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode not in ok_codes:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr}")
    lines = done.stdout.splitlines()
    if "{" not in lines:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode} without a result:\n{done.stderr}")
    start = max(i for i, ln in enumerate(lines) if ln == "{")
    doc: dict[str, Any] = json.loads("\n".join(lines[start:]))
    doc["exit_code"] = done.returncode
    return doc


def _shape_args(model: Any) -> list[str]:
    args = []
    for flag, index in (("--min-shapes", 0), ("--opt-shapes", 1), ("--max-shapes", 2)):
        args += [flag, ",".join(f"{n}:{'x'.join(map(str, r[index]))}" for n, r in model.shapes.items())]
    return args


def main() -> int:
    import numpy as np
    import onnxruntime as ort

    from trt_runtime.testing.onnx_models import conv_model, mlp_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    parser.add_argument("--out", type=Path, default=default)
    out = parser.parse_args().out or Path(tempfile.mkdtemp(prefix="onnx-compare-"))
    out.mkdir(parents=True, exist_ok=True)
    try:
        import onnxconverter_common  # noqa: F401
        precisions = list(PRECISIONS)
    except ImportError:
        precisions = ["fp32", "tf32"]
        print("fp16 skipped: onnxconverter-common is not installed (pip install 'trt-runtime[onnx]')")
    rows = []
    for model in (mlp_model(), conv_model()):
        onnx_path = model.save(out / f"{model.name}.onnx")
        rng = np.random.default_rng(0)
        inputs = {n: rng.standard_normal(r[2]).astype(np.float32) for n, r in model.shapes.items()}
        np.savez(out / f"{model.name}-inputs.npz", **inputs)
        session = ort.InferenceSession(model.data, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        reference = dict(zip(names, session.run(None, inputs), strict=True))
        np.savez(out / f"{model.name}-ref.npz", **reference)
        for precision in precisions:
            flag, atol, rtol = PRECISIONS[precision]
            plan = out / f"{model.name}-{precision}.plan"
            _cli("build", onnx_path, "-o", plan, *_shape_args(model), *([flag] if flag else []))
            run = _cli("run", plan, "--load-inputs", out / f"{model.name}-inputs.npz",
                       "--compare", out / f"{model.name}-ref.npz", "--atol", atol, "--rtol", rtol,
                       "--output-dir", out / f"run-{model.name}-{precision}", ok_codes=(0, 1))
            bench = _cli("bench", plan, "--load-inputs", out / f"{model.name}-inputs.npz",
                         "--iterations", 200, "--warmup", 20)
            for report in run["compare"]["outputs"]:
                row = {"model": model.name, "precision": precision, "backend": run["backend"],
                       "shape": run["summaries"][report["name"]]["shape"],
                       "output": report["name"], "max_abs_error": report["max_abs_error"],
                       "max_rel_error": report["max_rel_error"], "ok": report["ok"],
                       # the error against the output's largest magnitude: max_rel_error is
                       # dominated by elements whose reference is near zero
                       "max_error_vs_peak": report["max_abs_error"]
                       / max(float(np.abs(reference[report["name"]]).max()), 1e-30),
                       "atol": atol, "rtol": rtol,
                       "median_us": bench["results"][0]["median_us"],
                       "transfer_split": bench["results"][0]["transfer_split"]}
                rows.append(row)
                print(f"{model.name:8} {precision:5} {row['output']:7} shape {row['shape']}: "
                      f"max abs {row['max_abs_error']:.3g}, max rel {row['max_rel_error']:.3g}, "
                      f"vs peak {row['max_error_vs_peak']:.3g} "
                      f"(atol {atol:g}, rtol {rtol:g}) {'PASS' if row['ok'] else 'FAIL'}; "
                      f"bench median {row['median_us']:.1f} us, split {row['transfer_split']}")
    strict = [r for r in rows if r["precision"] == "fp32"]
    worst = max(r["max_rel_error"] for r in strict)
    peak = max(r["max_error_vs_peak"] for r in strict)
    print(f"max relative error, --fp32 builds vs onnxruntime: {worst:.3g} (largest error / largest output "
          f"magnitude: {peak:.3g})")
    (out / "onnx_compare.json").write_text(
        json.dumps({"rows": rows, "max_rel_error_fp32": worst, "max_error_vs_peak_fp32": peak}, indent=2)
    )
    print(f"wrote {out / 'onnx_compare.json'}")
    return 0 if all(r["ok"] for r in strict) else 1


if __name__ == "__main__":
    sys.exit(main())
