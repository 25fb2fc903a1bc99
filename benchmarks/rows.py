"""The rows of the benchmark table: what each calls, what it needs, and how it is set up.

Every row runs on every workload, interleaved with the others (see :mod:`.runner`). A
row whose requirement is not met here is kept as ``skipped: <reason>``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from . import backend_rows, raw_rows, torch_tensorrt_rows
from .row_base import Bench, Workbench

__all__ = ["ROWS", "ROWS_BY_NAME", "RowSpec", "parse_rows"]


@dataclasses.dataclass(frozen=True)
class RowSpec:
    """One row: its name, what one call is, the requirements it needs, its setup."""

    name: str
    title: str
    call: str
    #: Requirement keys of :class:`~benchmarks.environment.Environment` (all must be met).
    needs: tuple[str, ...]
    setup: Callable[[Workbench], Bench]


ROWS = (
    RowSpec("raw-prebound", "raw TensorRT-RTX loop, bound once",
            "context.execute_async_v3(stream)", ("gpu", "tensorrt"), raw_rows.prebound),
    RowSpec("raw-bind-alloc", "raw loop, bind + allocate per call",
            "set_input_shape (dynamic) + set_tensor_address x + torch.empty y + set_tensor_address y "
            "+ execute_async_v3", ("gpu", "tensorrt"), raw_rows.bind_alloc),
    RowSpec("raw-graph-replay", "raw loop captured in a torch.cuda.CUDAGraph, replayed",
            "graph.replay() of execute_async_v3 (one graph and context per shape)",
            ("gpu", "tensorrt"), raw_rows.graph_replay),
    RowSpec("python-natural", "python backend engine(x)",
            "engine(x) on torch's current stream", ("gpu", "backend:python"), backend_rows.python_natural),
    RowSpec("python-prebound", "python backend, outputs= on engine.stream",
            "engine.execute(x, outputs=[y], stream=engine.stream)", ("gpu", "backend:python"),
            backend_rows.python_prebound),
    RowSpec("python-outer-copy", "python backend, outer CUDA graph (copy)",
            "engine(x) under enable_cudagraphs(engine, outer=True)",
            ("gpu", "backend:python", "outer:python"), backend_rows.python_outer_copy),
    RowSpec("python-outer-replay", "python backend, outer graph replay floor",
            "engine(s) under enable_cudagraphs(engine, outer='view'), s = engine.static_inputs(shape)",
            ("gpu", "backend:python", "outer:python"), backend_rows.python_outer_replay),
    RowSpec("torchbind", "torchbind backend engine(x)",
            "engine(x) on torch's current stream", ("gpu", "backend:torchbind"), backend_rows.torchbind),
    RowSpec("torchbind-outer-copy", "torchbind backend, outer CUDA graph (copy)",
            "engine(x) under enable_cudagraphs(engine, outer=True)",
            ("gpu", "backend:torchbind"), backend_rows.torchbind_outer_copy),
    RowSpec("torchbind-outer-replay", "torchbind backend, outer graph replay floor",
            "engine(s) under enable_cudagraphs(engine, outer='view'), s = engine.static_inputs(shape)",
            ("gpu", "backend:torchbind"), backend_rows.torchbind_outer_replay),
    RowSpec("execute-engine-op", "bare execute_engine op",
            "torch.ops.tensorrt.execute_engine([x], engine.native)", ("gpu", "backend:torchbind"),
            backend_rows.execute_engine_op),
    RowSpec("torch-tensorrt-python", "torch-tensorrt Python runtime",
            "TRTEngine.execute([x]) (PythonTorchTensorRTModule(x) up to 2.12)", ("gpu", "torch_tensorrt"),
            torch_tensorrt_rows.python_runtime),
)
ROWS_BY_NAME = {spec.name: spec for spec in ROWS}


def parse_rows(text: str) -> list[RowSpec]:
    """Row specs from a comma-separated list of names, in table order (ValueError naming
    the allowed set for an unknown one)."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    for name in names:
        if name not in ROWS_BY_NAME:
            raise ValueError(f"row must be one of {', '.join(ROWS_BY_NAME)}; got {name!r}")
    if not names:
        raise ValueError(f"no row given: choose from {', '.join(ROWS_BY_NAME)}")
    return [spec for spec in ROWS if spec.name in names]
