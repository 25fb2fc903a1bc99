"""TorchbindBackend: run engines with torch-tensorrt(-rtx)'s C++ runtime through torchbind."""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import importlib.util
import threading
from typing import Any

from trt_runtime.cache import CacheKey
from trt_runtime.errors import BackendUnavailableError, EngineError
from trt_runtime.formats import resolve_device
from trt_runtime.protocols import (
    Availability,
    BackendCapabilities,
    EngineSource,
)
from trt_runtime.settings import (
    CudaGraphStrategy,
    DynamicShapesKernelSpecializationStrategy,
    RuntimeSettings,
)

from .bindings import io_from_source, io_from_tensorrt, merge_container_flags
from .bridge import translate_errors
from .cache import TorchbindCacheHandle
from .engine import TorchbindEngine
from .library import INSTALL_HINT, find_runtime_library
from .runtime import TorchbindRuntime, load_runtime

__all__ = ["TorchbindBackend"]


class TorchbindBackend:
    """Runs engines through ``torch.classes.tensorrt.Engine`` and ``torch.ops.tensorrt.execute_engine``.

    Only torch-tensorrt's runtime library is loaded (``torch_tensorrt/lib/libtorchtrt_runtime.so``),
    never the ``torch_tensorrt`` package. Capabilities depend on the installed version:
    see :attr:`capabilities` and ``docs/torchbind.md``. ``runtime`` is for tests (a double
    of the loaded library); normally it is loaded on first use.
    """

    name = "torchbind"

    def __init__(self, *, runtime: TorchbindRuntime | None = None) -> None:
        self._runtime = runtime
        self._load_error: BackendUnavailableError | None = None
        self._lock = threading.Lock()

    # -- discovery ------------------------------------------------------------------------
    @property
    def runtime(self) -> TorchbindRuntime:
        """The loaded torch-tensorrt runtime (loads it on first use)."""
        with self._lock:
            if self._runtime is None:
                if self._load_error is not None:  # do not retry a failed load on every call
                    raise self._load_error
                try:
                    self._runtime = load_runtime()
                except BackendUnavailableError as exc:
                    self._load_error = exc
                    raise
            return self._runtime

    def is_available(self) -> Availability:
        """Whether torch, torch-tensorrt-rtx's runtime library and a CUDA GPU are here. Never raises."""
        try:
            if self._runtime is None:
                found = find_runtime_library()
                if isinstance(found, str):
                    return Availability(False, found)
                if importlib.util.find_spec("torch") is None:
                    return Availability(False, INSTALL_HINT.replace("torch-tensorrt-rtx", "torch"))
            runtime = self.runtime
            if not runtime.bridge.cuda_available():
                return Availability(
                    False, "the 'torchbind' backend needs a CUDA GPU: torch.cuda.is_available() is False"
                )
        except Exception as exc:  # never raise from here
            return Availability(False, f"the 'torchbind' backend cannot run here: {exc}")
        return Availability(True)

    @property
    def capabilities(self) -> BackendCapabilities:
        try:
            return self.runtime.capabilities()
        except Exception as exc:
            return BackendCapabilities.all_off(str(exc))

    # -- engines --------------------------------------------------------------------------
    def load_engine(
        self,
        source: EngineSource,
        *,
        device: int | None = None,
        settings: RuntimeSettings | None = None,
    ) -> TorchbindEngine:
        """Construct ``torch.classes.tensorrt.Engine`` for ``source`` on ``device``.

        ``device`` (else ``source.device_id``, else the current device) is used verbatim;
        a device that does not exist is an :class:`EngineError`. The engine bytes reach
        the C++ side as ``bytes`` (one copy into its ``std::string``); a ``memoryview`` or
        ``bytearray`` source costs one more copy into ``bytes`` first.
        """
        runtime = self.runtime
        bridge = runtime.bridge
        settings = RuntimeSettings.coerce(settings)
        _require(self.capabilities, settings, self.name)
        index = self._resolve_device(device, source)
        data = source.data if isinstance(source.data, bytes) else bytes(source.data)
        io = io_from_source(source)
        if io is None:
            io = io_from_tensorrt(
                data,
                flavour=runtime.library.flavour,
                device_scope=lambda: bridge.device_scope(index),
                name=source.name,
            )
            io = merge_container_flags(source, io)
        inputs, outputs = io
        make_native = functools.partial(self._build_native, source, index, inputs, outputs)
        return TorchbindEngine(
            self,
            runtime=runtime,
            native=make_native(),
            name=source.name,
            inputs=inputs,
            outputs=outputs,
            device=index,
            settings=settings,
            make_native=make_native,
        )

    def _build_native(self, source: EngineSource, index: int, inputs: Any, outputs: Any) -> Any:
        """One ``torch.classes.tensorrt.Engine`` of ``source`` on device ``index`` (each holds
        its own copy of the engine, weights included)."""
        runtime = self.runtime
        bridge = runtime.bridge
        data = source.data if isinstance(source.data, bytes) else bytes(source.data)
        major, minor, device_name = bridge.device_properties(index)
        info = runtime.layout.pack(
            name=source.name,
            device=runtime.layout.device_string(index, major, minor, device_name),
            engine=data,
            inputs=[s.name for s in inputs],
            outputs=[s.name for s in outputs],
            platform=runtime.platform,
            requires_output_allocator=any(o.data_dependent for o in outputs),
            hardware_compatible=bool(source.metadata.get("hardware_compatible", False)),
        )
        with translate_errors(source.name, "constructing torch.classes.tensorrt.Engine"), bridge.device_scope(
            index
        ):
            native = bridge.engine_class()(info)
        del info, data  # the C++ engine holds its own copy
        return native

    def _resolve_device(self, device: int | None, source: EngineSource) -> int:
        """The core placement rule (:func:`trt_runtime.formats.resolve_device`): ``device``
        verbatim, else the blob's ``device_id``, else the current device."""
        bridge = self.runtime.bridge
        if device is not None and (isinstance(device, bool) or not isinstance(device, int)):
            raise EngineError(f"device must be an int CUDA device index; got {device!r}")
        if device is None and source.device_id is None:
            return bridge.current_device()
        return resolve_device(source.device_id, device, bridge.device_count(), name=source.name)

    # -- caches ---------------------------------------------------------------------------
    def create_cache_handle(self) -> TorchbindCacheHandle:
        """A new ``RuntimeCacheHandle`` wrapper (torch-tensorrt-rtx >= 2.13)."""
        self.capabilities.require("supports_runtime_cache", self.name)
        return TorchbindCacheHandle(self.runtime)

    def cache_key(self, device: int | None = None) -> CacheKey:
        runtime = self.runtime
        index = runtime.bridge.current_device() if device is None else device
        major, minor, _ = runtime.bridge.device_properties(index)
        return CacheKey(
            flavour=runtime.library.flavour,
            version=_tensorrt_version(runtime.library.flavour),
            compute_capability=f"{major}.{minor}",
            driver=_driver_version(),
        )

    def __repr__(self) -> str:
        state = "not loaded" if self._runtime is None else (
            f"{self._runtime.library.distribution} {self._runtime.library.version}"
        )
        return f"<TorchbindBackend {state}>"


def _require(caps: BackendCapabilities, settings: RuntimeSettings, backend: str) -> None:
    """The capability checks EngineBase makes, before the engine is deserialized."""
    if settings.cuda_graph_strategy is not CudaGraphStrategy.DISABLED:
        caps.require("supports_cuda_graph_strategy", backend)
    lazy = DynamicShapesKernelSpecializationStrategy.LAZY
    if settings.dynamic_shapes_kernel_specialization_strategy is not lazy:
        caps.require("supports_dynamic_shapes_kernel_specialization_strategy", backend)
    if settings.runtime_cache is not None:
        caps.require("supports_runtime_cache", backend)


def _tensorrt_version(flavour: str) -> str:
    """The TensorRT(-RTX) library version, as its Python bindings report it."""
    module = "tensorrt_rtx" if flavour == "tensorrt_rtx" else "tensorrt"
    try:
        return str(__import__(module).__version__)
    except Exception:
        pass
    dashed = module.replace("_", "-")
    for dist in (module, dashed, f"{dashed}-cu13-libs", f"{dashed}-cu12-libs"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def _driver_version() -> str:
    """The CUDA driver version (``cuDriverGetVersion``), e.g. ``13000``."""
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        value = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(value)) == 0:
            return str(value.value)
    raise BackendUnavailableError("could not read the CUDA driver version (libcuda not loadable)")

