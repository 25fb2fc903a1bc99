"""Engines of the torchbind doubles set up for outer CUDA graphs: a dynamic engine with ``eager``
kernel specialization, and one whose bridge builds copy nodes (used by tests in more than one folder)."""

from __future__ import annotations

from typing import Any

import numpy as np
from _torchbind_doubles import DYNAMIC_X, DYNAMIC_Y, make_backend, source
from _torchbind_fakes import FakeNodeRuntime, FakeTensor
from trt_runtime_backends.torchbind import graphs as graphs_module

from trt_runtime.settings import RuntimeSettings

WARMUP = graphs_module.WARMUP_RUNS


def dyn(rows: int, value: float = 1.0) -> FakeTensor:
    return FakeTensor(np.full((rows, 4), value, np.float32))


EAGER = RuntimeSettings(dynamic_shapes_kernel_specialization_strategy="eager")


def dynamic_engine(settings: RuntimeSettings = EAGER) -> tuple[Any, Any]:
    """An engine with a dynamic batch, with ``eager`` kernel specialization (``lazy`` is refused)."""
    backend, bridge = make_backend("2.14.0")
    return backend.load_engine(source(bindings=(DYNAMIC_X, DYNAMIC_Y)), settings=settings), bridge


def nodes_engine(mode: str) -> tuple[Any, Any, FakeNodeRuntime]:
    """A dynamic engine whose bridge builds copy nodes (and launches through cuda-python),
    captured for two rows under ``outer=mode``; the caller leaves the wrap."""
    engine, bridge = dynamic_engine()
    rt = bridge.node_runtime = FakeNodeRuntime(bridge)
    bridge.launcher_factory = lambda graph: (lambda stream: graph.replay())
    engine.outer_graph = mode
    engine.execute(dyn(2, 1.0))  # the capture (the general path: no nodes yet)
    return engine, bridge, rt
