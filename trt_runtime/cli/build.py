"""``trt-runtime build MODEL.onnx -o FILE``: an engine from an ONNX model, as plan, TR01 or ``.pte``.

The library call is :func:`trt_runtime.onnx_build.build_onnx`; this module turns the
options into its arguments, shows the builder's progress and writes the file with
:func:`trt_runtime.formats.write.write_engine` (the format from ``--format`` or the
extension). Each ONNX parser error is printed as its own line (node, op, message).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from trt_runtime.cli.engine_files import spec_dict
from trt_runtime.cli.io_options import add_log_level
from trt_runtime.cli.output import PROG, CliError, Output, UsageError, human_size, print_error
from trt_runtime.extras import install_hint

__all__ = ["add_build_parser", "build_command", "shape_options"]


def add_build_parser(parser: argparse.ArgumentParser) -> None:
    """The options of ``build`` on its subparser."""
    from pathlib import Path

    parser.add_argument("model", type=Path, help="the ONNX model (.onnx)")
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="FILE",
                        help="the engine file to write (.plan/.engine/.trt, .tr01 or .pte)")
    parser.add_argument("--format", choices=("plan", "tr01", "pte"), default=None,
                        help="container to write (default: from the extension of -o)")
    precision = parser.add_mutually_exclusive_group()
    precision.add_argument("--fp16", dest="precision", action="store_const", const="fp16",
                           help="convert the model's float32 tensors to float16 before building "
                                "(inputs and outputs stay float32; needs the onnx extra: "
                                f"{install_hint('onnx')})")
    precision.add_argument("--fp32", dest="precision", action="store_const", const="fp32",
                           help="the model's types with BuilderFlag.TF32 cleared (TensorRT-RTX 1.6.1 still "
                                "uses TF32; default: the model's types, TF32 allowed)")
    parser.add_argument("--shapes", metavar="NAME:AxB,...", action="append", default=[],
                        help="fixed shape of inputs, e.g. x:1x3x64x64 (repeatable, or comma-separated)")
    parser.add_argument("--min-shapes", metavar="NAME:AxB,...", action="append", default=[],
                        help="smallest shape of a dynamic input's profile "
                             "(with --opt-shapes and --max-shapes)")
    parser.add_argument("--opt-shapes", metavar="NAME:AxB,...", action="append", default=[],
                        help="shape the profile is tuned for")
    parser.add_argument("--max-shapes", metavar="NAME:AxB,...", action="append", default=[],
                        help="largest shape of the profile")
    add_log_level(parser)


def shape_options(args: argparse.Namespace) -> dict[str, Any]:
    """``--shapes``/``--min-shapes``/... as ``profile_ranges`` ranges; a usage error if malformed."""
    from trt_runtime.shapes import parse_shapes, profile_ranges

    try:
        parsed = {
            key: parse_shapes(getattr(args, key, []) or [], option="--" + key.replace("_", "-"))
            for key in ("shapes", "min_shapes", "opt_shapes", "max_shapes")
        }
        return profile_ranges(**parsed)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def build_command(args: argparse.Namespace, out: Output) -> int:
    """``trt-runtime build``."""
    from trt_runtime.errors import BuildError, FormatError
    from trt_runtime.formats.write import format_for_path, write_engine
    from trt_runtime.onnx_build import build_onnx

    ranges = shape_options(args)
    try:
        kind = format_for_path(args.output, args.format)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if not args.model.is_file():
        raise CliError(f"no such ONNX model: {args.model}")
    if args.output.is_dir():
        raise CliError(f"-o {args.output} is a directory; expected the engine file to write")
    if not args.output.parent.is_dir() and str(args.output.parent):
        raise CliError(f"-o {args.output}: directory {args.output.parent} does not exist")

    with out.status(f"building {args.model.name} with the TensorRT-RTX builder...") as update:
        t0 = time.perf_counter()
        try:
            built = build_onnx(
                args.model, shapes=ranges, precision=args.precision, log_level=args.log_level,
                progress=lambda phase, step, total: update(f"building: {phase} {step}/{total}"),
            )
        except BuildError as exc:
            for line in exc.failures[:-1] if len(exc.failures) > 1 else ():
                print_error(line, False)
            raise CliError(exc.failures[-1] if len(exc.failures) > 1 else str(exc)) from exc
        except FormatError as exc:  # a malformed model or external data: exit 1, not a usage error
            raise CliError(str(exc)) from exc
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
        seconds = time.perf_counter() - t0
    write_engine(args.output, built.plan, built.bindings, format=kind)
    size = args.output.stat().st_size
    document = {
        "model": os.fspath(args.model),
        "output": os.fspath(args.output),
        "format": kind,
        "precision": args.precision or "model",
        "build_seconds": seconds,
        "bytes": size,
        "inputs": [spec_dict(s) for s in built.inputs],
        "outputs": [spec_dict(s) for s in built.outputs],
    }
    out.emit(document)
    out.info(f"built {args.model} in {seconds:.2f} s; wrote {args.output} ({kind}, {human_size(size)})")
    out.table("bindings", ["name", "io", "dtype", "shape", "profile (min / opt / max)"], [
        [b["name"], b["io"], b["dtype"], tuple(b["shape"]),
         "; ".join(" / ".join("x".join(map(str, s)) for s in t) for t in b["profiles"]) or "-"]
        for b in (*document["inputs"], *document["outputs"])
    ])
    out.info(f"run it: {PROG} run {args.output}")
    return 0
