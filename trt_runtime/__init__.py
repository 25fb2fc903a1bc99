"""trt-runtime: a pure-Python runtime for TensorRT and TensorRT-RTX engines.

Importing this package never imports torch, tensorrt or tensorrt_rtx; backends load
them on first use.
"""

from __future__ import annotations

from trt_runtime.cache import CacheKey, RuntimeCache
from trt_runtime.contexts import (
    enable_cudagraphs,
    runtime_cache,
    runtime_config,
    set_cuda_graph_strategy,
    set_dynamic_shapes_kernel_specialization_strategy,
    set_dynamic_shapes_kernel_strategy,
)
from trt_runtime.engine import EngineBase
from trt_runtime.errors import (
    ArraySizeError,
    BackendError,
    BackendNotFoundError,
    BackendUnavailableError,
    BuildError,
    CacheError,
    CacheLockTimeout,
    CacheWarning,
    CapabilityError,
    ContextLeaseTimeout,
    ContextOverlapWarning,
    DataDependentShapeError,
    EngineError,
    FormatError,
    InputError,
    LostUpdateWarning,
    RequestError,
    SettingsError,
    StaleCacheWarning,
    StorageError,
    TrtRuntimeError,
)
from trt_runtime.graphs import OuterGraph
from trt_runtime.loader import load
from trt_runtime.protocols import (
    Availability,
    Backend,
    BackendCapabilities,
    Engine,
    EngineSource,
    RuntimeCacheHandle,
    TensorSpec,
)
from trt_runtime.registry import (
    available_backends,
    backend_status,
    get_backend,
    installed_backends,
    load_backend,
    register_backend,
)
from trt_runtime.settings import (
    CudaGraphStrategy,
    CudaGraphStrategyName,
    DynamicShapesKernelSpecializationStrategy,
    DynamicShapesKernelSpecializationStrategyName,
    RuntimeSettings,
    SettingsOverrides,
)

__version__ = "0.1.0"

__all__ = [
    "ArraySizeError",
    "Availability",
    "Backend",
    "BackendCapabilities",
    "BackendError",
    "BackendNotFoundError",
    "BackendUnavailableError",
    "BuildError",
    "CacheError",
    "CacheKey",
    "CacheLockTimeout",
    "CacheWarning",
    "CapabilityError",
    "ContextLeaseTimeout",
    "ContextOverlapWarning",
    "CudaGraphStrategy",
    "CudaGraphStrategyName",
    "DataDependentShapeError",
    "DynamicShapesKernelSpecializationStrategy",
    "DynamicShapesKernelSpecializationStrategyName",
    "Engine",
    "EngineBase",
    "EngineError",
    "EngineSource",
    "FormatError",
    "InputError",
    "LostUpdateWarning",
    "OuterGraph",
    "RuntimeCache",
    "RequestError",
    "RuntimeCacheHandle",
    "RuntimeSettings",
    "SettingsError",
    "SettingsOverrides",
    "StaleCacheWarning",
    "StorageError",
    "TensorSpec",
    "TrtRuntimeError",
    "__version__",
    "available_backends",
    "backend_status",
    "enable_cudagraphs",
    "get_backend",
    "installed_backends",
    "load",
    "load_backend",
    "register_backend",
    "runtime_cache",
    "runtime_config",
    "set_cuda_graph_strategy",
    "set_dynamic_shapes_kernel_specialization_strategy",
    "set_dynamic_shapes_kernel_strategy",
]
