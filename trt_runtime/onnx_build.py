"""Build a TensorRT-RTX engine from an ONNX model with TensorRT's own ONNX parser.

:func:`build_onnx` parses the model (``trt.OnnxParser``), adds one optimization profile
from the input shapes given (:func:`trt_runtime.shapes.profile_ranges`), builds and
returns an :class:`OnnxEngine`: the serialized plan and the bindings, with profiles,
ready for :func:`trt_runtime.formats.write.write_engine`. Building needs
``tensorrt_rtx`` but no GPU (TensorRT-RTX compiles kernels when the engine first runs).

Precision. TensorRT-RTX 1.6 builds *strongly typed* networks only: it has no
``BuilderFlag.FP16``, ``INT8`` or ``OBEY_PRECISION_CONSTRAINTS`` (weak typing is gone),
so every layer runs in the type the ONNX graph gives it. ``precision`` therefore means:

* ``None``: the model's types with TensorRT's defaults (``BuilderFlag.TF32`` on: float32
  matrix multiplies and convolutions may use TF32 tensor cores);
* ``"fp32"``: the model's types with ``BuilderFlag.TF32`` cleared. TensorRT-RTX 1.6.1 still
  uses TF32 for float32 matrix multiplies and convolutions (measured on an H100: results
  bit-identical to the default build), so expect TF32's rounding either way;
* ``"fp16"``: the model's float32 tensors and weights are converted to float16 before
  parsing, with float32 inputs and outputs kept (casts at the edges), using
  onnxconverter-common's converter (``pip install -c constraints.txt -e '.[onnx]'``).

``tensorrt_rtx``, ``onnx`` and onnxconverter-common are imported when called, never at
import time.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trt_runtime.builders import ProgressCallback, import_tensorrt
from trt_runtime.errors import BuildError, SettingsError
from trt_runtime.extras import install_hint
from trt_runtime.onnx_model import CheckedModel, read_model
from trt_runtime.protocols import TensorSpec
from trt_runtime.shapes import ShapeRange, check_in_profiles, format_shape

__all__ = ["LOG_LEVELS", "PRECISIONS", "OnnxEngine", "build_onnx", "parser_failures"]

#: ``precision=`` values (see the module docstring).
PRECISIONS = ("fp32", "fp16")
#: TensorRT's logger severities, most severe first; ``log_level=`` takes one.
LOG_LEVELS = ("error", "warning", "info", "verbose")

#: ``sink(severity, message)``: where TensorRT's log messages at or above the level go.
LogSink = Callable[[str, str], None]


@dataclasses.dataclass(frozen=True)
class OnnxEngine:
    """A plan built from an ONNX model and its bindings (inputs carry their profiles)."""

    plan: bytes
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    name: str
    #: ``None``, ``"fp32"`` or ``"fp16"`` as asked (see the module docstring).
    precision: str | None = None

    @property
    def bindings(self) -> tuple[TensorSpec, ...]:
        return (*self.inputs, *self.outputs)


class _Log:
    """The process's one TensorRT logger for builds: a level and a sink that callers set.

    TensorRT keeps the first logger a process hands it, so builds share one and change
    only where its messages go.
    """

    _lock = threading.Lock()
    _instance: Any = None

    @classmethod
    def get(cls, trt: Any) -> Any:
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls._make(trt)
            return cls._instance

    @staticmethod
    def _make(trt: Any) -> Any:
        names = {int(v): k.lower() for k, v in trt.ILogger.Severity.__members__.items()}

        class Logger(trt.ILogger):  # type: ignore[misc, name-defined]
            def __init__(self) -> None:
                trt.ILogger.__init__(self)
                self.level = 1  # ERROR
                self.sink: LogSink | None = None
                self.muted = False

            def log(self, severity: Any, msg: str) -> None:
                rank = int(severity)
                # Parser errors are reported by parser_failures, one line each; the
                # logger's multi-line copy of them would say it twice.
                if rank > self.level or self.sink is None or (self.muted and rank <= 1):
                    return
                self.sink(names.get(rank, str(rank)).replace("internal_error", "error"), msg)

        return Logger()


def _default_sink(severity: str, message: str) -> None:
    import sys

    line = " ".join(message.split())
    print(f"[TensorRT] {severity}: {line}", file=sys.stderr, flush=True)


def parser_failures(parser: Any, model: str) -> list[str]:
    """One line per error the ONNX parser recorded: node index and name, op, message."""
    lines = []
    for i in range(parser.num_errors):
        error = parser.get_error(i)
        desc = " ".join(str(error.desc()).split())
        node = int(error.node())
        if node >= 0:
            name = error.node_name() or "(unnamed)"
            lines.append(f"{model}: node {node} {name!r} (op {error.node_operator()}): {desc}")
        else:
            lines.append(f"{model}: {desc}")
    return lines


def _convert_fp16(checked: CheckedModel) -> CheckedModel:
    try:
        from onnxconverter_common import float16
    except ImportError as exc:
        raise ImportError(
            "precision='fp16' converts the ONNX model with onnx and onnxconverter-common: "
            + install_hint("onnx")
        ) from exc
    converted = float16.convert_float_to_float16(checked.inline(), keep_io_types=True)
    return dataclasses.replace(checked, proto=converted, data=converted.SerializeToString(), external=())


def _parse(parser: Any, checked: CheckedModel) -> bool:
    """Hand the parser the checked bytes, and the external data as buffers: it opens no file."""
    import ctypes

    if not checked.external:
        return bool(parser.parse(checked.data))
    data = checked.data
    if any(not item.top_level for item in checked.external):
        data = checked.inline(nested_only=True).SerializeToString()
    if not parser.load_model_proto(data):
        return False
    for item in checked.external:
        if item.top_level:
            address = ctypes.addressof(ctypes.c_char.from_buffer(item.data)) if item.data else 0
            if not parser.load_initializer(item.name, address, len(item.data)):
                return False
    return bool(parser.parse_model_proto())


def _inputs(network: Any) -> list[Any]:
    return [network.get_input(i) for i in range(network.num_inputs)]


def _check_ranges(network: Any, ranges: Mapping[str, ShapeRange], model: str) -> None:
    tensors = {t.name: t for t in _inputs(network)}
    unknown = sorted(set(ranges) - set(tensors))
    if unknown:
        raise SettingsError(f"shapes given for {unknown}, which are not inputs of {model}; its inputs are "
                         f"{', '.join(f'{n} ({format_shape(t.shape)})' for n, t in tensors.items())}")
    for name, tensor in tensors.items():
        shape = tuple(tensor.shape)
        if name not in ranges:
            if any(d < 0 for d in shape):
                raise SettingsError(
                    f"input {name!r} of {model} has dynamic shape {format_shape(shape)}; give its "
                    f"shape with --shapes {name}:... or a range with --min-shapes/--opt-shapes/--max-shapes"
                )
            continue
        spec = TensorSpec(name, "", shape, True)
        fixed = len(set(ranges[name])) == 1  # one shape (--shapes), not a min/opt/max range
        for label, value in zip(("min", "opt", "max"), ranges[name], strict=True):
            reason = check_in_profiles(spec, value, engine=model)
            if reason:
                where = "" if fixed else f"the {label} of the range given for {name!r}: "
                raise SettingsError(where + reason)


def build_onnx(
    model: str | os.PathLike[str] | bytes,
    *,
    shapes: Mapping[str, ShapeRange] | None = None,
    precision: str | None = None,
    progress: ProgressCallback | None = None,
    log_level: str = "warning",
    log_sink: LogSink | None = None,
    name: str | None = None,
    base_dir: str | os.PathLike[str] | None = None,
) -> OnnxEngine:
    """Parse ``model`` (a path or the bytes of an ONNX model) and build a TensorRT-RTX plan.

    ``shapes`` maps input names to ``(min, opt, max)``; every input with a dynamic
    dimension needs one, and the engine gets one optimization profile. A model the
    parser refuses raises :class:`~trt_runtime.BuildError` whose ``failures`` hold one
    line per parser error (node, op, message); bad shapes raise SettingsError naming them.
    TensorRT's messages at ``log_level`` and above go to ``log_sink(severity, message)``
    (default: ``[TensorRT] severity: message`` on stderr).

    The model is checked before any parser sees it (:func:`trt_runtime.onnx_model.read_model`):
    a malformed model, or external data outside the model's folder, not a regular file or
    shorter than ``offset + length``, raises :class:`~trt_runtime.FormatError`. External
    data of a model given as bytes is read from ``base_dir``, which it then needs.
    """
    if precision is not None and precision not in PRECISIONS:
        raise SettingsError(f"precision must be one of {', '.join(PRECISIONS)} or None; got {precision!r}")
    if log_level not in LOG_LEVELS:
        raise SettingsError(f"log_level must be one of {', '.join(LOG_LEVELS)}; got {log_level!r}")
    source: Path | bytes = model if isinstance(model, bytes) else Path(model)
    label = "the ONNX model" if isinstance(source, bytes) else os.fspath(source)
    if isinstance(source, Path):
        if not source.is_file():
            raise FileNotFoundError(2, "no such ONNX model", os.fspath(source))
    ranges = dict(shapes or {})
    stem = name or ("model" if isinstance(source, bytes) else source.stem)
    checked = read_model(source, base_dir=base_dir, label=label)
    trt = import_tensorrt()
    if precision == "fp16":
        checked = _convert_fp16(checked)
    logger = _Log.get(trt)
    logger.level = LOG_LEVELS.index(log_level) + 1
    logger.sink = log_sink or _default_sink
    try:
        builder = trt.Builder(logger)
        network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
        parser = trt.OnnxParser(network, logger)
        logger.muted = log_level != "verbose"
        try:
            ok = _parse(parser, checked)
        finally:
            logger.muted = False
        if not ok or parser.num_errors:
            failures = parser_failures(parser, label) or [f"{label}: the ONNX parser failed"]
            raise BuildError(failures[0] if len(failures) == 1 else
                             f"{label}: the ONNX parser reported {len(failures)} errors", failures)
        if network.num_outputs == 0:
            # protobuf reads many byte strings as an empty model, which the parser accepts
            raise BuildError(f"{label}: the model has no outputs; is it an ONNX model?")
        _check_ranges(network, ranges, label)
        from trt_runtime.builders import _build, _specs

        profiles = [ranges] if ranges else []
        try:
            plan = _build(trt, builder, network, profiles, progress, repr(stem),
                          strict_fp32=precision == "fp32")
        except RuntimeError as exc:
            raise BuildError(f"{exc}", [str(exc)]) from exc
        inputs, outputs = _specs(network, profiles)
    finally:
        logger.sink = None
    return OnnxEngine(plan=plan, inputs=inputs, outputs=outputs, name=stem, precision=precision)
