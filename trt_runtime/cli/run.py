"""``trt-runtime run FILE``: run an engine once on random or given inputs; write ``.npy`` files.

The engine runs twice on the same inputs: the first call includes creating the execution
context and, on TensorRT-RTX, compiling kernels; both times are reported. Outputs go to
``DIR/<name>.npy`` and the inputs used to ``DIR/inputs/<name>.npy``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from typing import Any

from trt_runtime.cli.arrays import make_inputs, output_to_numpy, parse_given_inputs
from trt_runtime.cli.engine_files import backend_reason, check_engine_file
from trt_runtime.cli.output import CliError, Output, jsonable, new_dir

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
    check_engine_file(args.file, force=args.force, out=out)
    backend_name = args.backend
    reason = backend_reason(backend_name)
    if reason:
        raise CliError(f"cannot run {args.file}: {reason}")
    engine = trt_runtime.load(args.file, backend=backend_name, device=args.device,
                              settings=settings_overrides(args))
    with contextlib.closing(engine):
        inputs = make_inputs(engine.inputs, given, args.seed)
        outdir, fresh = new_dir(args.output_dir, "trt-runtime-run-")
        if fresh:
            out.info(f"output directory: {outdir}")
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
        written = []
        (outdir / "inputs").mkdir(exist_ok=True)
        for spec, array in zip(engine.inputs, inputs, strict=True):
            np.save(outdir / "inputs" / f"{spec.name}.npy", array)
        for spec, value in zip(engine.outputs, results, strict=True):
            array = output_to_numpy(value)
            target = outdir / f"{spec.name}.npy"
            np.save(target, array)
            written.append({"name": spec.name, "path": os.fspath(target),
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
            "output_dir": os.fspath(outdir),
            "outputs": written,
        }
    out.emit(document)
    out.info(f"ran {args.file} on the {document['backend']!r} backend")
    out.fields([("first call", f"{first_ms:.2f} ms (includes context creation and JIT)"),
                ("second call", f"{second_ms:.3f} ms")])
    out.table("outputs", ["name", "dtype", "shape", "file"],
              [[w["name"], w["dtype"], tuple(w["shape"]), w["path"]] for w in written])
    return 0
