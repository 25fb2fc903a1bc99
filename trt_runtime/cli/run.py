"""``trt-runtime run FILE``: run an engine once on random or given inputs; write ``.npy`` files.

The engine runs twice on the same inputs: the first call includes creating the execution
context and, on TensorRT-RTX, compiling kernels; both times are reported. With
``--output-dir DIR`` the outputs go to ``DIR/<name>.npy`` and the inputs used to
``DIR/inputs/<name>.npy``, written after the run succeeded; without it nothing is written
there. ``--save-outputs`` / ``--save-inputs`` write them as one ``.npz``. Each output is
summarized (shape, dtype, min, max, mean, std); ``--compare REF.npz`` checks them against a
reference (:mod:`trt_runtime.cli.compare`) and exits 1 when one is off.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from typing import Any

from trt_runtime.cli.arrays import output_to_numpy, parse_given_inputs
from trt_runtime.cli.compare import render_outputs, report_outputs
from trt_runtime.cli.engine_files import check_backend_name, runnable_engine
from trt_runtime.cli.io_options import input_arrays, set_log_level
from trt_runtime.cli.output import Output, UsageError, jsonable

__all__ = ["run_command", "settings_dict", "settings_overrides"]


def settings_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The runtime settings named on the command line, as ``load(settings=...)`` takes them."""
    overrides: dict[str, Any] = {}
    if getattr(args, "cuda_graph_strategy", None):
        overrides["cuda_graph_strategy"] = args.cuda_graph_strategy
    if getattr(args, "dynamic_shapes_kernel_specialization_strategy", None):
        overrides["dynamic_shapes_kernel_specialization_strategy"] = (
            args.dynamic_shapes_kernel_specialization_strategy
        )
    return overrides


def settings_dict(engine: Any) -> dict[str, Any]:
    """The engine's settings as strings, without the cache (a path or handle)."""
    settings = engine.runtime_settings.to_dict()
    settings.pop("runtime_cache", None)
    return dict(jsonable(settings))


def run_command(args: argparse.Namespace, out: Output) -> int:
    """``trt-runtime run``."""
    import numpy as np

    import trt_runtime

    given = parse_given_inputs(args.input)
    set_log_level(args.log_level)
    check_backend_name(args.backend)
    if args.output_dir is not None and args.output_dir.exists() and not args.output_dir.is_dir():
        raise UsageError(f"--output-dir {args.output_dir} is a file, not a directory")
    backend_name = runnable_engine(args.file, args.backend, force=args.force, out=out)
    engine = trt_runtime.load(args.file, backend=trt_runtime.get_backend(backend_name), device=args.device,
                              settings=settings_overrides(args))
    with contextlib.closing(engine):
        inputs = input_arrays(args, engine.inputs, given)
        outdir = args.output_dir
        cache_cm: Any = contextlib.nullcontext()
        cache_existed = None
        if args.runtime_cache is not None:
            cache_existed = args.runtime_cache.exists()
            cache_cm = trt_runtime.runtime_cache(engine, args.runtime_cache)
        with cache_cm:
            with out.status("first inference (execution context + kernel JIT)..."):
                t0 = time.perf_counter()
                results = engine.execute(*inputs)
                engine.synchronize()
                first_ms = (time.perf_counter() - t0) * 1000.0
            t0 = time.perf_counter()
            engine.execute(*inputs)
            engine.synchronize()
            second_ms = (time.perf_counter() - t0) * 1000.0
        written: list[dict[str, Any]] = []
        if outdir is not None:
            (outdir / "inputs").mkdir(parents=True, exist_ok=True)
            for spec, array in zip(engine.inputs, inputs, strict=True):
                np.save(outdir / "inputs" / f"{spec.name}.npy", array)
        arrays = {s.name: output_to_numpy(value) for s, value in zip(engine.outputs, results, strict=True)}
        for spec in engine.outputs:
            array = arrays[spec.name]
            target = None if outdir is None else outdir / f"{spec.name}.npy"
            if target is not None:
                np.save(target, array)
            written.append({"name": spec.name, "path": None if target is None else os.fspath(target),
                            "dtype": str(array.dtype), "shape": list(array.shape)})
        document = {
            "file": os.fspath(args.file),
            "backend": engine.backend.name,
            "settings": settings_dict(engine),
            "runtime_cache": None if args.runtime_cache is None else {
                "path": os.fspath(args.runtime_cache),
                "existed_before": cache_existed,
                "bytes_after": args.runtime_cache.stat().st_size if args.runtime_cache.exists() else 0,
            },
            "first_call_ms": first_ms,
            "second_call_ms": second_ms,
            "output_dir": None if outdir is None else os.fspath(outdir),
            "outputs": written,
        }
        used = {s.name: a for s, a in zip(engine.inputs, inputs, strict=True)}
        checked = report_outputs(args, document, used, arrays)
    out.emit(document)
    out.info(f"ran {args.file} on the {document['backend']!r} backend")
    out.fields([("first call", f"{first_ms:.2f} ms (includes context creation and JIT)"),
                ("second call", f"{second_ms:.3f} ms")])
    out.table("outputs", ["name", "dtype", "shape", "file"],
              [[w["name"], w["dtype"], tuple(w["shape"]), w["path"] or "not written (no --output-dir)"]
               for w in written])
    return render_outputs(document, out, checked)
