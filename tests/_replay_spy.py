"""Counting what one torchbind engine's outer-graph replays do, on the CPU doubles and on a GPU.

:class:`ReplaySpy` wraps the bridge of that engine's lanes (their ``ops.graphs.bridge``), never
a class: a monkeypatch of ``TorchBridge.copy_nodes`` or ``TorchBridge.graph_launcher`` would
also count every other engine of the process that builds a replay plan meanwhile (under
``pytest -n`` a worker runs the other GPU tests in the same process, so engines of earlier
tests may still be alive, replaying from their threads or waiting for the garbage
collector) and would add their copy nodes to the ones the test expects to be its own.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["ReplaySpy"]


class _CountingRuntime:
    """cuda-python's runtime module as one engine's copy nodes see it: counts its ``cudaGraph*`` calls."""

    def __init__(self, rt: Any, spy: ReplaySpy) -> None:
        self._rt = rt
        self._spy = spy
        self.counts: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._rt, name)
        if not name.startswith("cudaGraph"):
            return target
        counts, lock = self.counts, self._spy.lock

        def counted(*args: Any) -> Any:
            with lock:
                counts[name] = counts.get(name, 0) + 1
            return target(*args)

        return counted


class _SpiedBridge:
    """A lane's bridge with its ``copy_nodes`` and ``graph_launcher`` counted by ``spy``."""

    def __init__(self, bridge: Any, spy: ReplaySpy) -> None:
        self._bridge = bridge
        self._spy = spy

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bridge, name)

    def copy_nodes(self, graph: Any, ins: Any, outs: Any, index: int) -> Any:
        made = self._bridge.copy_nodes(graph, ins, outs, index)
        if made is not None:
            counting = _CountingRuntime(made.rt, self._spy)
            made.rt = counting  # what the nodes are pointed and launched through
            self._spy.nodes.append(counting)
        return made

    def graph_launcher(self, graph: Any) -> Any:
        found = self._bridge.graph_launcher(graph)
        if found is None:
            return None
        launch, copy = found
        count = self._spy.count

        def counted_launch(stream: int) -> None:
            count("launch")
            launch(stream)

        def counted_copy(dst: int, src: int, nbytes: int, stream: int) -> Any:
            count("copy")
            return copy(dst, src, nbytes, stream)

        return counted_launch, None if copy is None else counted_copy


class ReplaySpy:
    """The copy nodes one engine's lanes make (``nodes``: the counting runtime of each, in
    order, with ``counts`` by cuda-python call) and the launches and copies of its graph
    launchers (``plain``). Install it before the capture; only that engine is counted.
    Thread-safe."""

    def __init__(self, engine: Any) -> None:
        self.lock = threading.Lock()
        self.nodes: list[_CountingRuntime] = []
        self.plain = {"launch": 0, "copy": 0}
        for lane in engine._lanes:
            graphs = lane.ops.graphs  # the lane's TorchbindGraphs
            graphs.bridge = _SpiedBridge(graphs.bridge, self)

    def count(self, what: str) -> None:
        with self.lock:
            self.plain[what] += 1
