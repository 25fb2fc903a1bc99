"""``ServeOptions``: how a replica loads, batches and guards one engine (a frozen value)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from trt_runtime.errors import SettingsError
from trt_runtime.graphs import OuterGraph
from trt_runtime.settings import RuntimeSettings, SettingsLike

__all__ = ["AUTO", "DEFAULT_MAX_BODY_BYTES", "ServeOptions"]

#: The value of :attr:`ServeOptions.outer_graph` and :attr:`ServeOptions.pad_batches` that leaves the
#: choice to the engine and the backend (:func:`trt_runtime.serve.replica.open_engine`).
AUTO = "auto"

#: Largest HTTP body a replica reads (64 MiB); larger ones get 413 before they are read.
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class ServeOptions:
    """What every replica of a deployment does with its engine.

    ``max_batch``: requests Ray Serve gathers into one batch (1 turns batching off);
    the rows run in one engine call never exceed the engine profile's maximum batch,
    so a large batch of requests may take several calls. ``batch_wait_ms``: how long a
    batch waits for more requests once the first one arrived. ``runtime_cache``:
    ``"auto"`` (a file per node and GPU model in the per-user cache directory), a path,
    or ``None``. ``contexts`` > 1 needs a backend with ``supports_multiple_contexts``.
    ``warmup`` runs one call at each input's optimization-profile ``opt`` shape before
    the replica reports ready, so the first request does not pay the JIT compile.
    ``pad_batches``: pad the rows of each batched engine call up to the next power of two (at
    most the profile's maximum) with copies of its last row, so the engine sees a few input
    shapes only (a context given new shapes sets itself up again; the padded rows' outputs
    are dropped).

    ``outer_graph`` and ``pad_batches`` also take ``"auto"`` (what ``trt-runtime serve`` passes
    unless told otherwise): the outer CUDA graph when batching is on, the engine can batch (a
    dynamic leading dimension everywhere) and the backend has ``supports_outer_cuda_graph``, with
    the batches padded wherever the outer graph runs, so each padded size is captured once. An
    engine whose context cannot be captured then runs without the outer graph (found by the
    warm-up call, which ``"auto"`` always makes).
    """

    backend: str | None = None
    device: int | None = None
    settings: SettingsLike = None
    contexts: int = 1
    outer_graph: bool | str = False  # or an OuterGraph mode, or "auto"
    max_batch: int = 16
    batch_wait_ms: float = 2.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    runtime_cache: str | Path | None = "auto"
    warmup: bool = True
    pad_batches: bool | str = False  # or "auto"

    def __post_init__(self) -> None:
        for field, low in (("contexts", 1), ("max_batch", 1), ("max_body_bytes", 1)):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise SettingsError(f"{field} must be an integer >= {low}; got {value!r}")
        wait = self.batch_wait_ms
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait <= 10_000:
            raise SettingsError(f"batch_wait_ms must be a number of milliseconds in [0, 10000]; got {wait!r}")
        if self.device is not None and (isinstance(self.device, bool) or not isinstance(self.device, int)
                                        or self.device < 0):
            raise SettingsError(f"device must be None or a CUDA device index >= 0; got {self.device!r}")
        if self.outer_graph != AUTO:
            OuterGraph.coerce(self.outer_graph)  # raises TypeError naming the bad value
        if not isinstance(self.pad_batches, bool) and self.pad_batches != AUTO:
            raise SettingsError(f"pad_batches must be True, False or 'auto'; got {self.pad_batches!r}")
        object.__setattr__(self, "settings", RuntimeSettings.coerce(self.settings))
        cache = self.runtime_cache
        if isinstance(cache, str) and cache != "auto":
            cache = Path(cache)
        elif isinstance(cache, os.PathLike):
            cache = Path(cache)
        if not (cache is None or cache == "auto" or isinstance(cache, Path)):
            raise SettingsError(f"runtime_cache must be 'auto', a path or None; got {self.runtime_cache!r}")
        object.__setattr__(self, "runtime_cache", cache)

    @property
    def batching(self) -> bool:
        return self.max_batch > 1

    @classmethod
    def coerce(cls, value: ServeOptions | dict[str, Any] | None) -> ServeOptions:
        """``None`` (defaults), a mapping of fields, or an instance."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            return cls(**value)
        raise TypeError(f"serve options must be None, a dict or ServeOptions; got {type(value).__name__}")
