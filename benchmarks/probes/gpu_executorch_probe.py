"""Does ExecuTorch's own runtime load trt-runtime's .pte programs, up to delegate init?

Load trt-runtime's ``.pte`` programs with ExecuTorch's own runtime, up to delegate init.

Run on the GPU host (torch present, executorch 1.5.1 carried as a wheel); every
outcome, failures included, lands in ``$OUT/executorch_probe.json``:

1. ``environment``: Python, torch (and CUDA), executorch, trt-runtime, TensorRT-RTX;
2. the programs: ``ours_*`` written here by ``trt_runtime.executorch.to_pte`` around the
   engine of ``tests/fixtures/executorch/tensorrt_dynamic_cuda1.pte`` (or a fresh one
   when TensorRT-RTX is importable), and ExecuTorch-written fixtures for contrast;
3. ``deserializer``: ExecuTorch's Python ``deserialize_pte_binary`` (with torch) on
   each, and whether our program deserializes to the same ``Program`` as ExecuTorch's;
4. ``runtime``: ExecuTorch's C++ runtime through its Python bindings
   (``executorch.extension.pybindings._C``): registered backends,
   ``_load_program_from_buffer`` with ``InternalConsistency`` verification, each
   method's ``MethodMeta`` (sizes, dtype, memory planning), ``load_method`` (which
   initialises delegates: the portable wheel registers no ``TensorRTBackend``, so we
   expect the load to stop there, with ExecuTorch's own log line saying so) and the
   ``Module`` path; the XNNPACK fixture is executed to show the runtime itself works;
5. ``trt_runtime``: the ExecuTorch-written TensorRT fixture and ours run through the
   python backend (when TensorRT-RTX and a GPU are there), against a NumPy reference.

Each ExecuTorch step runs in a child process, so a crash is recorded (exit status,
stderr) instead of losing the report. Usage::

    python3 benchmarks/probes/gpu_executorch_probe.py [--out DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "executorch"
TENSORRT_FIXTURE = FIXTURES / "tensorrt_dynamic_cuda1.pte"
CHILD_TIMEOUT = 240


def _error(exc: BaseException) -> dict[str, Any]:
    return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


# ----------------------------------------------------------------------------- children


def child_deserialize(paths: list[str]) -> dict[str, Any]:
    """ExecuTorch's Python deserializer on each file; pairwise equality of the programs."""
    import dataclasses

    result: dict[str, Any] = {"torch": None}
    try:
        import torch

        result["torch"] = torch.__version__
        from executorch.exir._serialize._program import deserialize_pte_binary

        result["reader"] = "executorch.exir._serialize._program (with torch)"
    except Exception as exc:
        # exir may not import with this torch; its reader does not need torch at all.
        result["import"] = _error(exc)
        for name in [n for n in sys.modules if n.startswith("executorch.exir")]:
            del sys.modules[name]
        try:
            sys.path.insert(0, str(ROOT / "tests"))
            import _executorch_schema

            deserialize_pte_binary = _executorch_schema.load(force_stubs=True).deserialize_pte_binary
            result["reader"] = "executorch's reader without torch (tests/_executorch_schema.py)"
        except Exception as fallback:
            result["fallback"] = _error(fallback)
            return result
    programs = {}
    for path in paths:
        data = Path(path).read_bytes()
        try:
            program = deserialize_pte_binary(data).program
        except Exception as exc:
            result[Path(path).name] = _error(exc)
            continue
        programs[Path(path).name] = program
        plans = []
        for plan in program.execution_plan:
            tensors = [dataclasses.asdict(v.val) for v in plan.values if type(v.val).__name__ == "Tensor"]
            plans.append(
                {
                    "name": plan.name,
                    "inputs": plan.inputs,
                    "outputs": plan.outputs,
                    "non_const_buffer_sizes": plan.non_const_buffer_sizes,
                    "delegates": [
                        {
                            "id": d.id,
                            "compile_specs": {
                                c.key: bytes(c.value).decode("utf-8", "replace") for c in d.compile_specs
                            },
                        }
                        for d in plan.delegates
                    ],
                    "tensors": json.loads(json.dumps(tensors, default=str)),
                }
            )
        result[Path(path).name] = {"ok": True, "plans": plans}
    names = sorted(programs)
    result["equal_programs"] = [
        [a, b] for i, a in enumerate(names) for b in names[i + 1 :] if programs[a] == programs[b]
    ]
    return result


def child_runtime(path: str) -> dict[str, Any]:
    """ExecuTorch's C++ runtime on one file, step by step."""
    steps: dict[str, Any] = {}
    try:
        import torch  # loads libtorch, which the bindings link against

        steps["torch"] = {"ok": True, "version": torch.__version__}
        from executorch.extension.pybindings import _C as et
    except Exception as exc:
        steps["import"] = _error(exc)
        return steps
    steps["import"] = {"ok": True, "module": et.__file__}
    try:
        steps["registered_backends"] = {"ok": True, "names": list(et._get_registered_backend_names())}
        available = bool(et._is_available("TensorRTBackend"))
        steps["is_available_TensorRTBackend"] = {"ok": True, "value": available}
    except Exception as exc:
        steps["registered_backends"] = _error(exc)
    data = Path(path).read_bytes()
    try:
        program = et._load_program_from_buffer(data, program_verification=et.Verification.InternalConsistency)
        names = [program.get_method_name(i) for i in range(program.num_methods())]
        steps["load_program"] = {"ok": True, "methods": names}
    except Exception as exc:
        steps["load_program"] = _error(exc)
        return steps
    for name in names:
        try:
            meta = program.method_meta(name)

            def info(t: Any) -> dict[str, Any]:
                return {
                    "sizes": list(t.sizes()),
                    "dtype": int(t.dtype()),
                    "is_memory_planned": bool(t.is_memory_planned()),
                    "nbytes": int(t.nbytes()),
                }

            steps[f"method_meta[{name}]"] = {
                "ok": True,
                "inputs": [info(meta.input_tensor_meta(i)) for i in range(meta.num_inputs())],
                "outputs": [info(meta.output_tensor_meta(i)) for i in range(meta.num_outputs())],
            }
        except Exception as exc:
            steps[f"method_meta[{name}]"] = _error(exc)
        sys.stderr.write(f"--- load_method({name!r})\n")
        sys.stderr.flush()
        try:
            method = program.load_method(name)
            steps[f"load_method[{name}]"] = {"ok": True}
        except Exception as exc:
            steps[f"load_method[{name}]"] = _error(exc)
            continue
        meta_in = steps.get(f"method_meta[{name}]", {}).get("inputs", [])
        if meta_in:
            try:
                inputs = [torch.ones(t["sizes"]) for t in meta_in]
                outputs = method.call(inputs)
                steps[f"execute[{name}]"] = {
                    "ok": True,
                    "outputs": [list(o.shape) for o in outputs],
                    "first": [float(o.flatten()[0]) for o in outputs],
                }
            except Exception as exc:
                steps[f"execute[{name}]"] = _error(exc)
    sys.stderr.write("--- _load_for_executorch_from_buffer\n")
    sys.stderr.flush()
    try:
        module = et._load_for_executorch_from_buffer(data)
        steps["module_load"] = {"ok": True, "methods": list(module.method_names())}
        meta_in = steps.get("method_meta[forward]", {}).get("inputs", [])
        if "forward" in names and meta_in:
            try:
                outputs = module.forward([torch.ones(t["sizes"]) for t in meta_in])
                steps["module_forward"] = {"ok": True, "outputs": [list(o.shape) for o in outputs]}
            except Exception as exc:
                steps["module_forward"] = _error(exc)
    except Exception as exc:
        steps["module_load"] = _error(exc)
    return steps


def child_backend(path: str) -> dict[str, Any]:
    """trt-runtime's python backend on a TensorRT .pte: load on GPU 0, run, compare."""
    import numpy as np

    import trt_runtime
    from trt_runtime import builders

    result: dict[str, Any] = {"backend_status": str(trt_runtime.backend_status())}
    built = builders.build_dynamic(width=4, profiles=((1, 4, 8),))
    engine = trt_runtime.load(path, backend="python", device=0)
    try:
        x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
        (y,) = engine.execute(x)
        expected = built.reference(x)[0]
        result.update(
            ok=True,
            shape=list(np.asarray(y).shape),
            max_abs_error=float(np.max(np.abs(np.asarray(y, np.float64) - expected))),
        )
    finally:
        engine.close()
    return result


CHILDREN = {"runtime": child_runtime, "backend": child_backend}


# ----------------------------------------------------------------------------- parent


def run_child(mode: str, *paths: str) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", mode, *paths]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT, check=False)
    except subprocess.TimeoutExpired as exc:
        return {"ok": False, "error": f"timed out after {CHILD_TIMEOUT} s", "stderr": str(exc.stderr)[-4000:]}
    record: dict[str, Any] = {
        "exit_status": done.returncode,
        "seconds": round(time.perf_counter() - started, 2),
        # ExecuTorch's C++ log (ET_LOG) goes to stderr: keep its lines.
        "stderr": [ln for ln in done.stderr.splitlines() if ln.strip()][-60:],
    }
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if lines:
        record["result"] = json.loads(lines[-1])
    return record


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "executorch": _version("executorch"),
        "trt_runtime": _version("trt-runtime"),
        "tensorrt_rtx": _version("tensorrt-rtx") or _version("tensorrt_rtx"),
        "flatbuffers": _version("flatbuffers"),
    }
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda_available"] = torch.cuda.is_available()
        env["device_count"] = torch.cuda.device_count()
        if torch.cuda.is_available():
            env["device_name"] = torch.cuda.get_device_name(0)
    except Exception as exc:
        env["torch"] = _error(exc)
    return env


def write_programs(workdir: Path) -> tuple[dict[str, Path], dict[str, Any]]:
    """Our programs next to ExecuTorch's, all around the same engine."""
    sys.path.insert(0, str(ROOT))
    from trt_runtime import TensorSpec
    from trt_runtime.executorch import read_program, to_pte

    (reference,) = read_program(TENSORRT_FIXTURE).delegates
    engine = bytes(reference.blob.engine)
    notes: dict[str, Any] = {"engine_from": "tests/fixtures/executorch/tensorrt_dynamic_cuda1.pte"}
    bindings = (
        TensorSpec("x", "float32", (-1, 4), True, profiles=(((1, 4), (4, 4), (8, 4)),)),
        TensorSpec("y", "float32", (-1, 4), False),
    )
    static = (TensorSpec("x", "float32", (2, 4), True), TensorSpec("y", "float32", (2, 4), False))
    platform_tag = reference.blob.target_platform
    programs = [
        # Same engine, device and blob as ExecuTorch's fixture: the programs must match.
        ("ours_like_executorch_dynamic_cuda1.pte", bindings, 1, "segment"),
        ("ours_dynamic_cuda0.pte", bindings, 0, "segment"),
        ("ours_static_inline_cuda0.pte", static, 0, "inline"),
    ]
    paths: dict[str, Path] = {}
    for name, specs, device_id, location in programs:
        path = workdir / name
        to_pte(engine, specs, path, device_id=device_id, location=location, target_platform=platform_tag)
        paths[name] = path
    written_by_executorch = (
        "tensorrt_dynamic_cuda1.pte",
        "tensorrt_static_inline_cuda0.pte",
        "xnnpack_linear_segment.pte",
    )
    for name in written_by_executorch:
        paths[f"executorch_{name}"] = FIXTURES / name
    return paths, notes


def summary(path: Path) -> dict[str, Any]:
    from trt_runtime.formats import read_engine_source

    data = path.read_bytes()
    entry: dict[str, Any] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    try:
        source = read_engine_source(path)
        entry["trt_runtime"] = {
            "device_id": source.device_id,
            "compile_specs": source.metadata.get("compile_specs"),
            "warnings": source.metadata.get("warnings"),
            "program_tensors": source.metadata.get("program_tensors"),
        }
    except Exception as exc:
        entry["trt_runtime"] = _error(exc)
    return entry


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "probe-out")))
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, *paths = args.child
        sys.path.insert(0, str(ROOT))
        result = child_deserialize(paths) if mode == "deserialize" else CHILDREN[mode](paths[0])
        print(json.dumps(result, default=str))
        return 0

    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "environment": environment()}
    target = args.out / "executorch_probe.json"

    def save() -> None:
        target.write_text(json.dumps(report, indent=2, default=str) + "\n")

    save()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            paths, notes = write_programs(Path(tmp))
            report["programs_written"] = notes
        except Exception as exc:
            report["programs_written"] = _error(exc)
            save()
            return 1
        report["programs"] = {name: summary(path) for name, path in paths.items()}
        save()
        report["deserializer"] = run_child("deserialize", *map(str, paths.values()))
        save()
        report["runtime"] = {}
        for name, path in paths.items():
            report["runtime"][name] = run_child("runtime", str(path))
            save()
        report["trt_runtime_backend"] = {}
        gpu = report["environment"].get("cuda_available") and report["environment"].get("tensorrt_rtx")
        for name in ("executorch_tensorrt_dynamic_cuda1.pte", "ours_dynamic_cuda0.pte"):
            if gpu:
                report["trt_runtime_backend"][name] = run_child("backend", str(paths[name]))
            else:
                report["trt_runtime_backend"][name] = {"skipped": "needs a CUDA GPU and TensorRT-RTX"}
            save()
        for name in ("ours_dynamic_cuda0.pte", "ours_static_inline_cuda0.pte"):
            (args.out / name).write_bytes(paths[name].read_bytes())
    report["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    save()
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
