"""``trt-runtime demo``: build a small engine, write it three ways, inspect it, run it cold and warm.

The engine comes from an ONNX model the demo makes (a small conv net, written next to
the engines) and builds with TensorRT-RTX's ONNX parser, as ``trt-runtime build`` does;
without the ``onnx`` package it builds a conv net with the network API instead and says
so. The build (TensorRT-RTX builder) and the files need no GPU. When a backend can run
here, the plan is run twice with ``trt-runtime run``, each time in a fresh Python
process (a process that already compiled the kernels would hide the cache's effect):
cold, with no runtime cache, then warm, with the cache the cold run saved. Outputs are
checked against the builder's float64 numpy reference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trt_runtime.cli.engine_files import backend_reason, check_backend_name, spec_dict
from trt_runtime.cli.inspect import inspect_file, render_inspect
from trt_runtime.cli.output import PROG, CliError, Output, UsageError, human_size

__all__ = ["demo_command", "write_pte"]


def write_pte(built: Any, target: Path) -> str:
    """Write ``built`` as a single-delegate ``.pte``; return '' or why it was not written."""
    try:
        from trt_runtime.executorch import to_pte
    except ImportError as exc:
        return f"the .pte writer is not available ({exc})"
    try:
        to_pte(built.plan, (*built.inputs, *built.outputs), target)
    except ImportError as exc:
        return f"{exc}"
    return ""


def _run_in_subprocess(args: Sequence[str]) -> dict[str, Any]:
    """``trt-runtime --json ARGS`` in a fresh interpreter (a fresh process has no JIT state)."""
    command = [sys.executable, "-m", "trt_runtime.cli", "--json", *args]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
        last = lines[-1] if lines else f"exit code {done.returncode}"
        raise CliError(f"'trt-runtime {' '.join(args)}' failed: {last.removeprefix(PROG + ': error: ')}")
    # The document is the last thing printed; a library may have logged to stdout before it.
    lines = done.stdout.splitlines()
    start = max((i for i, ln in enumerate(lines) if ln == "{"), default=0)
    try:
        document: dict[str, Any] = json.loads("\n".join(lines[start:]))
    except json.JSONDecodeError as exc:
        raise CliError(f"'trt-runtime {' '.join(args)}' printed no JSON: {exc}") from exc
    return document


def _check_against_reference(built: Any, run_doc: Mapping[str, Any]) -> dict[str, Any]:
    """Compare the outputs a ``run`` wrote with the builder's float64 numpy reference."""
    import numpy as np

    outdir = Path(run_doc["output_dir"])
    inputs = [np.load(outdir / "inputs" / f"{s.name}.npy") for s in built.inputs]
    expected = built.reference(*inputs)
    rtol, atol = built.tolerance
    checks = []
    for spec, want in zip(built.outputs, expected, strict=True):
        got = np.load(outdir / f"{spec.name}.npy").astype(np.float64)
        want = np.asarray(want, np.float64)
        same_shape = got.shape == want.shape
        err = float(np.max(np.abs(got - want))) if same_shape and got.size else float("nan")
        checks.append({
            "output": spec.name,
            "max_abs_error": err,
            "ok": bool(same_shape and np.allclose(got, want, rtol=rtol, atol=atol)),
            "rtol": rtol,
            "atol": atol,
        })
    return {"ok": all(c["ok"] for c in checks), "outputs": checks}


def _cold_and_warm(
    built: Any, plan_path: Path, outdir: Path, backend: str | None, out: Output
) -> dict[str, Any]:
    """Run ``plan_path`` cold, then with the runtime cache the cold run saved; check both."""
    cache_path = outdir / "demo.runtime-cache"
    cache_path.unlink(missing_ok=True)
    backend_args = ["--backend", backend] if backend else []
    runs = {}
    for label, note in (("cold", "empty runtime cache: kernels are JIT-compiled"),
                        ("warm", "runtime cache loaded from the cold run")):
        with out.status(f"{label} run in a fresh process ({note})..."):
            runs[label] = _run_in_subprocess([
                # --force: the demo wrote this plan itself; a builder newer than this
                # trt-runtime may start it with a magic it does not know yet.
                "run", os.fspath(plan_path), "--force", *backend_args,
                "--runtime-cache", os.fspath(cache_path),
                "--output-dir", os.fspath(outdir / label),
            ])
        runs[label]["check"] = _check_against_reference(built, runs[label])
    out.info("")
    out.table(
        f"first inference on the {runs['cold']['backend']!r} backend (each in a fresh process)",
        ["run", "first call (ms)", "second call (ms)", "cache bytes after", "matches numpy", "max abs error"],
        [[label, f"{r['first_call_ms']:.2f}", f"{r['second_call_ms']:.3f}", r["runtime_cache"]["bytes_after"],
          r["check"]["ok"], f"{max(c['max_abs_error'] for c in r['check']['outputs']):.2e}"]
         for label, r in runs.items()],
    )
    cold_ms, warm_ms = runs["cold"]["first_call_ms"], runs["warm"]["first_call_ms"]
    if warm_ms > 0:
        out.info(f"warm runtime cache: first inference {cold_ms / warm_ms:.1f}x faster than cold")
    return {"ran": True, "backend": runs["cold"]["backend"], "runs": runs,
            "runtime_cache": os.fspath(cache_path)}


def _build_engine(outdir: Path, progress: Any) -> tuple[Any, dict[str, Any]]:
    """The demo's engine, from an ONNX model it makes (``onnx`` installed) or the network API.

    Returns the :class:`~trt_runtime.builders.BuiltEngine` and where it came from:
    ``{"onnx": path or None, "why": reason the network API was used}``.
    """
    from trt_runtime import builders

    try:
        from trt_runtime.testing.onnx_models import conv_model

        model = conv_model()
    except ImportError as exc:
        built = builders.build_convnet(batch=None, max_batch=8, progress=progress)
        return built, {"onnx": None, "why": f"{exc}"}
    from trt_runtime.onnx_build import build_onnx

    onnx_path = model.save(outdir / f"{model.name}.onnx")
    # fp32 (TF32 cleared; TensorRT-RTX 1.6.1 keeps TF32, ~3e-4 of the peak): within the 1e-3 check.
    engine = build_onnx(onnx_path, shapes=model.shapes, precision="fp32", progress=progress,
                        log_level="error")
    built = builders.BuiltEngine(engine.plan, engine.inputs, engine.outputs, {}, model.reference,
                                 (1e-3, 1e-3), name=model.name)
    return built, {"onnx": os.fspath(onnx_path), "why": ""}


def demo_command(args: argparse.Namespace, out: Output) -> int:
    """``trt-runtime demo``: the files go to ``--out DIR`` (kept) or a temporary directory
    removed at the end, so that a demo leaves nothing behind unless asked to."""
    import tempfile

    check_backend_name(args.backend)
    if args.out is not None:
        if args.out.exists() and not args.out.is_dir():
            raise UsageError(f"--out {args.out} is a file; give a directory (new or existing)")
        args.out.mkdir(parents=True, exist_ok=True)
        out.notice(f"demo output directory: {args.out}")
        return _demo(args, out, args.out)
    with tempfile.TemporaryDirectory(prefix="trt-runtime-demo-") as tmp:
        out.notice(f"demo output directory: {tmp} (temporary, removed at the end; --out DIR keeps the files)")
        return _demo(args, out, Path(tmp))


def _demo(args: argparse.Namespace, out: Output, outdir: Path) -> int:
    from trt_runtime.formats import write_plan, write_tr01

    document: dict[str, Any] = {"output_dir": os.fspath(outdir), "files": {}, "inspect": {}, "gpu": {}}

    # 1. build ---------------------------------------------------------------------
    with out.status("building a small conv net with the TensorRT-RTX builder...") as update:
        t0 = time.perf_counter()
        built, source = _build_engine(
            outdir, lambda phase, step, total: update(f"building engine: {phase} {step}/{total}")
        )
        build_s = time.perf_counter() - t0
    if source["onnx"] is None:
        out.notice(f"built with the TensorRT-RTX network API: {source['why']}")
    else:
        out.info(f"made the ONNX model {source['onnx']} and built it with the TensorRT-RTX ONNX parser")
    document["source"] = source
    document["engine"] = {
        "name": built.name,
        "build_seconds": build_s,
        "plan_bytes": len(built.plan),
        "inputs": [spec_dict(s) for s in built.inputs],
        "outputs": [spec_dict(s) for s in built.outputs],
    }
    out.info(f"built {built.name} in {build_s:.2f} s ({human_size(len(built.plan))}); "
             "TensorRT-RTX compiles its kernels at the first inference")

    # 2. write -----------------------------------------------------------------------
    plan_path = outdir / f"{built.name}.plan"
    tr01_path = outdir / f"{built.name}.tr01"
    pte_path = outdir / f"{built.name}.pte"
    write_plan(plan_path, built.plan)
    write_tr01(tr01_path, built.plan, (*built.inputs, *built.outputs))
    document["files"]["plan"] = os.fspath(plan_path)
    document["files"]["tr01"] = os.fspath(tr01_path)
    pte_reason = write_pte(built, pte_path)
    document["files"]["pte"] = None if pte_reason else os.fspath(pte_path)
    document["pte_skipped"] = pte_reason or None
    out.info(f"wrote {plan_path.name}, {tr01_path.name}" + ("" if pte_reason else f", {pte_path.name}"))
    if pte_reason:
        out.notice(f"skipped the .pte: {pte_reason}")

    # 3. inspect ---------------------------------------------------------------------
    gpu_reason = backend_reason(args.backend)
    written = [p for p in (plan_path, tr01_path, pte_path) if p.exists()]
    for path in written:
        # force: these are the files just written (see the run below).
        report = inspect_file(path, backend=args.backend, load=not gpu_reason, force=True,
                              not_loaded=gpu_reason)
        document["inspect"][path.name] = report
        if not out.json_mode and not out.quiet:
            out.info("")
            render_inspect(report, out)

    # 4. GPU: cold and warm runtime cache, each in a fresh process ------------------------
    if gpu_reason:
        document["gpu"] = {"ran": False, "reason": gpu_reason}
        out.info("")
        out.notice(f"GPU part skipped: could not run the engine here: {gpu_reason}")
        out.notice("the CPU part (build, write, inspect) succeeded; on a machine with an NVIDIA GPU "
                   "this demo also runs the engine cold and with a warm runtime cache")
        out.emit(document)
        return 0

    document["gpu"] = _cold_and_warm(built, plan_path, outdir, args.backend, out)
    out.emit(document)
    if not all(r["check"]["ok"] for r in document["gpu"]["runs"].values()):
        raise CliError("engine outputs do not match the numpy reference (see the table above)")
    return 0
