"""A stand-in for a ``threading.Lock`` that records when it is held (capture-lock tests)."""

from __future__ import annotations


class RecordingLock:
    """``held`` gets ``True`` on each enter and ``False`` on each exit."""

    def __init__(self) -> None:
        self.held: list[bool] = []

    def __enter__(self) -> None:
        self.held.append(True)

    def __exit__(self, *exc: object) -> None:
        self.held.append(False)
