"""What a row is once set up (:class:`Bench`), and what the rows of one workload share (:class:`Workbench`).

A row's setup function takes the workload's :class:`Workbench` and returns a
:class:`Bench`: the per-call closures (call ``i`` is ``calls[i % len(calls)]``, one per
input shape), the stream the work is ordered on, a ``check`` that returns the first
shape's output, and ``close``. It raises :class:`RowSkip` for a reason known only once
it tries (a missing attribute, a version without a feature).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

__all__ = ["Bench", "RowSkip", "Workbench"]


class RowSkip(Exception):
    """A row that cannot run, for the reason given (recorded as its note)."""


@dataclasses.dataclass
class Bench:
    """One row set up on one workload."""

    calls: list[Callable[[], Any]]
    #: ``cudaStream_t`` the row's work is ordered on: GPU events are recorded there.
    stream: int
    close: Callable[[], None] = lambda: None
    #: Runs the first shape once and returns its output (compared with the reference).
    check: Callable[[], Any] | None = None
    #: How the row calls (shown in the JSON), e.g. which stream and what resources.
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Workbench:
    """The engine, tensors and device of one workload, and objects its rows share.

    ``shared(key, make)`` builds an object once per workload (e.g. one python-backend
    engine for the natural and the pre-bound rows, one deserialized TensorRT engine for
    both raw loops); ``make`` returns ``(object, close)`` and every ``close`` runs, newest
    first, in :meth:`close`.
    """

    workload: Any
    built: Any
    tensors: Any
    device: Any
    torch: Any = None
    logger: Any = None
    _shared: dict[str, Any] = dataclasses.field(default_factory=dict)
    _closers: list[Callable[[], None]] = dataclasses.field(default_factory=list)

    def shared(self, key: str, make: Callable[[], tuple[Any, Callable[[], None]]]) -> Any:
        if key not in self._shared:
            value, close = make()
            self._shared[key] = value
            self._closers.append(close)
        return self._shared[key]

    def on_close(self, close: Callable[[], None]) -> None:
        self._closers.append(close)

    def expected(self) -> Any:
        """The float64 reference output of the first shape (None without a reference)."""
        reference = getattr(self.built, "reference", None)
        host = getattr(self.tensors, "host_input", None)
        if reference is None or host is None:
            return None
        return reference(host)[0]

    @property
    def tolerance(self) -> tuple[float, float]:
        return tuple(getattr(self.built, "tolerance", (1e-3, 1e-3)))  # type: ignore[return-value]

    def close(self) -> None:
        """Run every registered close, newest first; errors are ignored (a benchmark ends anyway)."""
        while self._closers:
            close = self._closers.pop()
            try:
                close()
            except Exception:
                pass
        self._shared.clear()
