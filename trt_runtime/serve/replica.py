"""Opening an engine for serving: backend, runtime cache per node and GPU model, warm-up.

Nothing here needs Ray: :func:`open_engine` is what each replica runs once in its
constructor, and what a test or the benchmark runs in-process to compare against.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Any, NamedTuple

from trt_runtime.cache import RuntimeCache, default_cache_dir
from trt_runtime.errors import CapabilityError
from trt_runtime.protocols import Backend, Engine
from trt_runtime.registry import get_backend
from trt_runtime.serve.options import AUTO, ServeOptions
from trt_runtime.serve.validation import RequestChecker

__all__ = ["CallModes", "call_modes", "node_cache_path", "open_engine"]


def node_cache_path(backend: Backend, device: int | None = None, node: str | None = None) -> Path:
    """The runtime-cache file of ``backend`` on this node and GPU model.

    ``<default_cache_dir()>/runtime-cache-<key slug>-<node>.bin``: the key slug names the
    TensorRT build, the GPU architecture and the driver; the node name (default: the
    host name) keeps nodes apart when the cache directory sits on a shared file system,
    where file locks cannot be trusted.
    """
    key = backend.cache_key(device)
    host = re.sub(r"[^A-Za-z0-9._-]", "_", node or socket.gethostname()) or "node"
    return default_cache_dir() / f"runtime-cache-{key.slug()}-{host}.bin"


def open_engine(
    source: bytes | str | os.PathLike[str], options: ServeOptions, *, device: int | None = None
) -> tuple[Engine, RuntimeCache | None]:
    """Load ``source`` as ``options`` say; the engine has its first context when this returns.

    With a runtime cache, the cache file is loaded first and saved after the warm-up
    call, so the next replica on this node starts with the kernels this one compiled.
    ``options.outer_graph == "auto"``: the outer graph where batching is on, the engine can batch
    and the backend supports it; the warm-up call is made whatever ``options.warmup`` says, and an
    engine whose context it finds cannot be captured runs without (``engine.outer_graph`` says which).
    """
    import trt_runtime

    backend = get_backend(options.backend)
    device = options.device if device is None else device
    settings = trt_runtime.RuntimeSettings.coerce(options.settings)
    cache = None
    if options.runtime_cache is not None and backend.capabilities.supports_runtime_cache:
        path = node_cache_path(backend, device) if options.runtime_cache == "auto" else options.runtime_cache
        cache = RuntimeCache(path, autosave=True)
        cache.bind(backend, key=backend.cache_key(device))
        cache.load()
        settings = settings.merge(runtime_cache=cache)
    extra: dict[str, Any] = {}
    if options.contexts != 1:  # load(contexts=) exists once concurrent callers are merged
        extra["contexts"] = options.contexts
    engine = trt_runtime.load(source, backend, device=device, settings=settings, **extra)
    try:
        checker = RequestChecker(getattr(engine, "name", "engine"), engine.inputs, engine.outputs)
        auto = options.outer_graph == AUTO
        if auto:
            wanted = (options.batching and checker.batchable
                      and backend.capabilities.supports_outer_cuda_graph)
            if wanted:
                engine.outer_graph = True  # type: ignore[attr-defined]
        elif options.outer_graph:
            engine.outer_graph = options.outer_graph  # type: ignore[attr-defined]
        engine.ensure_context()  # type: ignore[attr-defined]
        if options.warmup or auto:
            try:
                engine.execute(*checker.warmup_arrays())
            except CapabilityError:
                if not auto or getattr(engine, "outer_graph", None) is None:
                    raise
                engine.outer_graph = None  # type: ignore[attr-defined]  # (cannot be captured: eager)
                engine.execute(*checker.warmup_arrays())
        if cache is not None:
            cache.save()
    except BaseException:
        engine.close()
        raise
    return engine, cache


class CallModes(NamedTuple):
    """How an engine opened by :func:`open_engine` runs batched calls (what ``"auto"`` resolved to)."""

    outer_graph: bool  # each call under the outer CUDA graph
    pad_batches: bool  # each call's rows padded to a power of two
    #: Each call's outputs copied before they are answered: they are views of buffers that the next
    #: call overwrites (the outer graph's ``"view"`` mode; every other call returns new arrays).
    copy_outputs: bool


def call_modes(engine: Engine, options: ServeOptions) -> CallModes:
    """:class:`CallModes` of ``engine`` as ``options`` opened it; ``options.pad_batches == "auto"``
    pads wherever the outer graph runs."""
    graph = getattr(engine, "outer_graph", None)
    pad = options.pad_batches
    if pad == AUTO:
        pad = options.batching and graph is not None
    return CallModes(graph is not None, bool(pad), getattr(graph, "outputs", None) == "view")
