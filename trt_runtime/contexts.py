"""Context managers and setters that change the runtime settings of engines."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterable, Iterator
from typing import IO, Any, TypeVar

from typing_extensions import Unpack

from trt_runtime.cache import RuntimeCache
from trt_runtime.errors import CacheError, CacheWarning, SettingsError
from trt_runtime.graphs import OuterGraph
from trt_runtime.protocols import Engine
from trt_runtime.settings import (
    CudaGraphStrategy,
    CudaGraphStrategyName,
    DynamicShapesKernelSpecializationStrategy,
    DynamicShapesKernelSpecializationStrategyName,
    SettingsOverrides,
)

__all__ = [
    "enable_cudagraphs",
    "engines_of",
    "runtime_cache",
    "runtime_config",
    "set_cuda_graph_strategy",
    "set_dynamic_shapes_kernel_specialization_strategy",
    "set_dynamic_shapes_kernel_strategy",
]

#: What the context managers yield: the target they were given, with its own type.
TargetT = TypeVar("TargetT")


def engines_of(target: Any) -> list[Engine]:
    """The engines behind ``target``: an engine, a module exposing ``trt_engines()``,
    or an iterable of those."""
    if hasattr(target, "runtime_settings") and hasattr(target, "execute"):
        return [target]
    if hasattr(target, "trt_engines"):
        return list(target.trt_engines())
    if isinstance(target, Iterable) and not isinstance(target, (str, bytes)):
        found: list[Engine] = []
        for item in target:
            found.extend(engines_of(item))
        return found
    raise TypeError(
        f"expected an engine, a module with trt_engines() or an iterable of them; "
        f"got {type(target).__name__}"
    )


@contextlib.contextmanager
def runtime_config(target: TargetT, **overrides: Unpack[SettingsOverrides]) -> Iterator[TargetT]:
    """Apply settings ``overrides`` to every engine of ``target`` for the block.

    Changing settings drops an engine's execution context; a new one is created
    lazily at the next call. Nesting ``runtime_config`` outside ``enable_cudagraphs``
    therefore creates exactly one context for calls made in the inner block. On exit
    every engine gets its previous settings back (and a new context at its next call).
    """
    engines = engines_of(target)
    saved = [engine.runtime_settings for engine in engines]
    merged = [settings.merge(**overrides) for settings in saved]  # validate all first
    try:
        for engine, settings in zip(engines, merged, strict=True):
            engine.runtime_settings = settings
        yield target
    finally:
        for engine, settings in zip(engines, saved, strict=True):
            engine.runtime_settings = settings


@contextlib.contextmanager
def enable_cudagraphs(
    target: TargetT,
    cuda_graph_strategy: CudaGraphStrategy | CudaGraphStrategyName | None = None,
    *,
    outer: bool | str | OuterGraph = False,
) -> Iterator[TargetT]:
    """Run ``target`` with CUDA graphs in the block.

    ``cuda_graph_strategy`` is TensorRT-RTX's own capture inside the engine (default
    ``whole_graph_capture``). ``outer=True`` (or an output mode ``"copy"`` / ``"view"``,
    or an :class:`~trt_runtime.graphs.OuterGraph`) adds the runtime's outer wrap: each
    engine captures its whole call into a CUDA graph per input shape and replays it.
    With the outer wrap the strategy defaults to ``disabled`` (the outer graph already
    holds TensorRT's kernels); it is the only CUDA-graph mechanism of full TensorRT.

    On entry the settings are applied first (one execution context per engine, created
    at its next call), then the outer wrap is switched on; on exit both are restored.
    Capabilities are checked for every engine before any is changed.
    """
    graph = OuterGraph.coerce(outer)
    if cuda_graph_strategy is None:
        cuda_graph_strategy = CudaGraphStrategy.DISABLED if graph else CudaGraphStrategy.WHOLE_GRAPH_CAPTURE
    engines = engines_of(target)
    if graph is not None:
        for engine in engines:
            engine.backend.capabilities.require("supports_outer_cuda_graph", engine.backend.name)
    with runtime_config(engines, cuda_graph_strategy=cuda_graph_strategy):
        if graph is None:
            yield target
            return
        saved = [engine.outer_graph for engine in engines]
        try:
            for engine in engines:
                engine.outer_graph = graph
            yield target
        finally:
            for engine, previous in zip(engines, saved, strict=True):
                engine.outer_graph = previous


def set_cuda_graph_strategy(target: Any, strategy: CudaGraphStrategy | CudaGraphStrategyName) -> None:
    """Set the CUDA graph strategy of every engine of ``target`` (not scoped)."""
    for engine in engines_of(target):
        engine.runtime_settings = engine.runtime_settings.merge(cuda_graph_strategy=strategy)


def set_dynamic_shapes_kernel_specialization_strategy(
    target: Any,
    strategy: DynamicShapesKernelSpecializationStrategy | DynamicShapesKernelSpecializationStrategyName,
) -> None:
    """Set the dynamic-shapes kernel specialization strategy of every engine (not scoped)."""
    for engine in engines_of(target):
        engine.runtime_settings = engine.runtime_settings.merge(
            dynamic_shapes_kernel_specialization_strategy=strategy
        )


def _cache_keys(engines: list[Engine]) -> list[Any]:
    """Each engine's cache key on its own device (``None`` where the backend cannot say)."""
    keys: list[Any] = []
    for engine in engines:
        try:
            keys.append(engine.backend.cache_key(getattr(engine, "device", None)))
        except Exception:  # a backend without a runtime cache fails later, with its own message
            keys.append(None)
    return keys


def _models(keys: list[Any]) -> list[str]:
    return sorted({f"sm{key.compute_capability.replace('.', '')}" for key in keys if key is not None})


def _caches_per_model(
    engines: list[Engine], path_or_stream: Any
) -> tuple[list[tuple[list[Engine], RuntimeCache]], IO[bytes] | None]:
    """One (engines, cache) group per GPU model for a directory or ``None``; one group for a
    file, a stream or a cache, which must then serve a single GPU model."""
    directory = path_or_stream is None or (
        isinstance(path_or_stream, (str, os.PathLike)) and os.path.isdir(path_or_stream)
    )
    if directory:
        if not engines:
            raise SettingsError("runtime_cache(None) needs at least one engine to pick the default path")
        groups: dict[Any, tuple[list[Engine], RuntimeCache]] = {}
        for engine, key in zip(engines, _cache_keys(engines), strict=True):
            if key not in groups:
                device = getattr(engine, "device", None)
                if path_or_stream is None:
                    cache = RuntimeCache.default(engine.backend, device)
                else:
                    cache = RuntimeCache.in_directory(path_or_stream, engine.backend, device)
                cache.load()
                groups[key] = ([], cache)
            groups[key][0].append(engine)
        return list(groups.values()), None
    models = _models(_cache_keys(engines))
    if len(models) > 1:
        raise CacheError(
            f"the engines run on {len(models)} GPU models ({', '.join(models)}); one runtime cache "
            f"cannot serve them all ({path_or_stream!r}): pass a directory, or None for the default "
            "one, to get one file per GPU model"
        )
    stream: IO[bytes] | None = None
    if isinstance(path_or_stream, RuntimeCache):
        cache = path_or_stream
    elif isinstance(path_or_stream, (str, os.PathLike)):
        cache = RuntimeCache(path_or_stream)
        cache.load()
    else:
        stream = path_or_stream
        cache = RuntimeCache()
        cache.load_from_stream(stream)
    return [(engines, cache)], stream


def set_dynamic_shapes_kernel_strategy(
    target: Any,
    strategy: DynamicShapesKernelSpecializationStrategy | DynamicShapesKernelSpecializationStrategyName,
) -> None:
    """Deprecated alias of :func:`set_dynamic_shapes_kernel_specialization_strategy`."""
    warnings.warn(
        "set_dynamic_shapes_kernel_strategy is deprecated; use "
        "set_dynamic_shapes_kernel_specialization_strategy (the RuntimeSettings field's name)",
        DeprecationWarning,
        stacklevel=2,
    )
    set_dynamic_shapes_kernel_specialization_strategy(target, strategy)


@contextlib.contextmanager
def runtime_cache(
    target: Any,
    path_or_stream: str | os.PathLike[str] | IO[bytes] | RuntimeCache | None = None,
) -> Iterator[RuntimeCache]:
    """Share one runtime cache among the engines of ``target`` for the block.

    On enter the cache is loaded from ``path_or_stream`` (a path, a binary file
    object, an existing :class:`RuntimeCache`, or ``None`` for the default per-user
    location); a missing file is an empty cache. On exit the engines are synchronized
    and the cache is saved back; a failure to save warns (:class:`CacheWarning`) and
    never hides an exception raised in the block.

    Kernels of one GPU model are never fed to another: with ``None`` or a directory,
    the engines get one file per GPU model (``runtime-cache-<stack>-sm<NN>-....bin``, the
    key of each engine's own device) and the block yields the first engine's cache; a
    file, a stream or a cache given for engines of several GPU models is a
    :class:`CacheError` before anything is loaded.
    """
    engines = engines_of(target)
    groups, stream = _caches_per_model(engines, path_or_stream)
    with contextlib.ExitStack() as stack:
        for members, cache in groups:
            stack.enter_context(runtime_config(members, runtime_cache=cache))
        try:
            yield groups[0][1]
        finally:
            for engine in engines:
                engine.synchronize()
            for _, cache in groups:
                _save(cache, stream)


def _save(cache: RuntimeCache, stream: IO[bytes] | None) -> None:
    try:
        if stream is not None:
            stream.seek(0)
            stream.truncate()
            cache.save_to_stream(stream)
        elif cache.path is not None:
            cache.save()
    except Exception as exc:  # never mask the block's own exception
        warnings.warn(
            f"runtime cache was not saved to {cache.path or stream!r}: {exc}",
            CacheWarning,
            stacklevel=4,
        )
