"""Loading torch-tensorrt's runtime library and detecting what it can do.

Capabilities are found by probing the registered torchbind classes, not by reading
version strings: ``torch.classes.tensorrt.RuntimeCacheHandle`` exists from
torch-tensorrt-rtx 2.13 on, together with ``Engine.update_runtime_settings`` (whose
signature names that class, so one cannot exist without the other). Each engine
confirms ``update_runtime_settings`` on its own instance when it is loaded.
"""

from __future__ import annotations

import ctypes
import dataclasses
import glob
import importlib.util
import logging
import os
import re
import threading
from typing import Any

from trt_runtime.errors import BackendUnavailableError
from trt_runtime.extras import install_hint
from trt_runtime.protocols import BackendCapabilities

from .abi import SerializedLayout
from .bridge import TorchBridge
from .library import RuntimeLibrary, find_runtime_library

__all__ = ["ADDED_IN", "TorchbindRuntime", "load_runtime"]

logger = logging.getLogger("trt_runtime.torchbind")

#: The torch-tensorrt-rtx release that added each capability this backend uses.
ADDED_IN = {
    "RuntimeCacheHandle": "2.13",
    "update_runtime_settings": "2.13",
}


@dataclasses.dataclass
class TorchbindRuntime:
    """A loaded torch-tensorrt runtime: the library, its layout and what it can do."""

    bridge: TorchBridge
    library: RuntimeLibrary
    layout: SerializedLayout
    has_cache_handle: bool
    has_runtime_settings: bool
    #: Whether this process loaded the library (False: torch_tensorrt had already).
    loaded_here: bool = True
    platform: str = "linux_x86_64"

    def capabilities(self) -> BackendCapabilities:
        settings = self.has_runtime_settings
        cache = self.has_cache_handle and settings
        found = f"{self.library.distribution} {self.library.version} is installed"
        notes: dict[str, str] = {
            "cache_deserialize_merges": "TensorRT-RTX's IRuntimeCache.deserialize replaces the contents"
        }
        if not settings:
            note = (
                f"Engine.update_runtime_settings needs torch-tensorrt-rtx >= "
                f"{ADDED_IN['update_runtime_settings']}; {found}"
            )
            notes["supports_cuda_graph_strategy"] = note
            notes["supports_dynamic_shapes_kernel_specialization_strategy"] = note
        if not cache:
            notes["supports_runtime_cache"] = (
                f"RuntimeCacheHandle and Engine.update_runtime_settings need torch-tensorrt-rtx >= "
                f"{ADDED_IN['RuntimeCacheHandle']}; {found}"
            )
        if self.library.flavour != "tensorrt_rtx":
            note = f"runtime settings and caches need TensorRT-RTX; {found}"
            for flag in (
                "supports_cuda_graph_strategy",
                "supports_dynamic_shapes_kernel_specialization_strategy",
                "supports_runtime_cache",
            ):
                notes[flag] = note
            settings = cache = False
        graphs = self.bridge.cuda_graphs_available()
        if not graphs:
            notes["supports_outer_cuda_graph"] = "this torch has no torch.cuda.CUDAGraph / torch.cuda.graph"
        notes["supports_profile_selection"] = (
            "torch-tensorrt picks the optimization profile itself (Engine._auto_select_profiles, "
            "2.14+); a per-call profile= is not offered"
        )
        lacking = {
            "supports_runtime_cache": not cache,
            "supports_cuda_graph_strategy": not settings,
            "supports_dynamic_shapes_kernel_specialization_strategy": not settings,
            "supports_outer_cuda_graph": not graphs,
            "supports_profile_selection": True,
            "cache_deserialize_merges": True,
        }
        off = [flag for flag, missing in lacking.items() if missing]
        return dataclasses.replace(BackendCapabilities.all_on().without(*off), notes=notes)

    def new_native_cache_handle(self, path: str = "") -> Any:
        cls = self.bridge.cache_handle_class()
        if cls is None:
            raise BackendUnavailableError("torch.classes.tensorrt.RuntimeCacheHandle is not registered")
        return cls(path)

    def describe(self) -> dict[str, Any]:
        """A plain summary (for logs, ``trt-runtime`` diagnostics and bug reports)."""
        return {
            "distribution": self.library.distribution,
            "version": self.library.version,
            "library": str(self.library.path),
            "abi_version": self.layout.abi_version,
            "serialization_len": self.layout.length,
            "fields": self.layout.field_names(),
            "has_cache_handle": self.has_cache_handle,
            "has_runtime_settings": self.has_runtime_settings,
            "loaded_here": self.loaded_here,
        }


_lock = threading.Lock()
_loaded: TorchbindRuntime | None = None


def _preload_tensorrt(library: RuntimeLibrary) -> None:
    """Make ``libtensorrt_rtx.so.1`` (or ``libnvinfer``) resident before the runtime library
    is opened: its RUNPATH points at build-tree paths, so the dynamic loader must find the
    TensorRT library already loaded (by soname) or on ``LD_LIBRARY_PATH``."""
    packages: tuple[str, ...]
    if library.flavour == "tensorrt_rtx":
        packages, pattern = ("tensorrt_rtx_libs",), "libtensorrt_rtx.so*"
    else:
        packages, pattern = ("tensorrt_libs", "tensorrt_cu13_libs", "tensorrt_cu12_libs"), "libnvinfer.so*"
    for package in packages:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            for path in sorted(glob.glob(os.path.join(location, pattern))):
                try:
                    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                    return
                except OSError as exc:
                    logger.debug("could not preload %s: %s", path, exc)
    # A system install (LD_LIBRARY_PATH, ldconfig) needs no help; the load below says if not.


def load_runtime(bridge: TorchBridge | None = None) -> TorchbindRuntime:
    """Load torch-tensorrt's runtime library once per process and probe it.

    If ``torch_tensorrt`` (or anything else) already registered the ``tensorrt`` torch
    namespace, the library is not loaded a second time: torch refuses a second
    ``TORCH_LIBRARY(tensorrt)`` block.
    """
    global _loaded
    with _lock:
        shared = bridge is None  # only the default bridge's runtime is cached per process
        if shared and _loaded is not None:
            return _loaded
        library = find_runtime_library()
        if isinstance(library, str):
            raise BackendUnavailableError(library)
        if bridge is None:
            try:
                bridge = TorchBridge()
            except ImportError as exc:
                raise BackendUnavailableError(
                    "the 'torchbind' backend needs torch: "
                    f"{install_hint('torchbind')} ({exc})"
                ) from exc
        loaded_here = False
        if not bridge.is_registered():
            _preload_tensorrt(library)
            _load_with_dependencies(bridge, library)
            loaded_here = True
            if not bridge.is_registered():
                raise BackendUnavailableError(
                    f"{library.path} loaded but registered no torch.classes.tensorrt.Engine / "
                    "torch.ops.tensorrt.execute_engine"
                )
        layout = SerializedLayout.read(bridge.ops)
        has_cache_handle = _probe_cache_handle(bridge)
        platform = "linux_x86_64"
        try:
            platform = str(bridge.ops.get_current_platform())
        except Exception as exc:  # very old runtimes; the engine constructor checks it anyway
            logger.debug("torch.ops.tensorrt.get_current_platform unavailable: %s", exc)
        runtime = TorchbindRuntime(
            bridge=bridge,
            library=library,
            layout=layout,
            has_cache_handle=has_cache_handle,
            has_runtime_settings=has_cache_handle,
            loaded_here=loaded_here,
            platform=platform,
        )
        logger.debug("torch-tensorrt runtime: %s", runtime.describe())
        if shared:
            _loaded = runtime
        return runtime


_MISSING = re.compile(r"(lib[\w.+-]+?\.so[\w.]*): cannot open shared object file")


def _load_with_dependencies(bridge: TorchBridge, library: RuntimeLibrary) -> None:
    """``torch.ops.load_library`` the runtime; if a dependency is not found (its RUNPATH
    names build-tree directories), preload it from torch's or the NVIDIA wheels' library
    directories, as ``import torch_tensorrt`` would have, and try again."""
    tried: set[str] = set()
    while True:
        try:
            bridge.load_library(str(library.path))
            return
        except Exception as exc:
            match = _MISSING.search(str(exc))
            missing = match.group(1) if match else None
            if missing is None or missing in tried or not _preload_by_name(missing):
                raise BackendUnavailableError(
                    f"could not load torch-tensorrt's runtime library {library.path} "
                    f"({library.distribution} {library.version}): {exc}"
                ) from exc
            tried.add(missing)


def _preload_by_name(soname: str) -> bool:
    directories: list[str] = []
    for package in ("torch", "nvidia", "tensorrt_rtx_libs", "tensorrt_libs"):
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            directories.append(os.path.join(location, "lib"))
            directories.append(location)
            directories.extend(glob.glob(os.path.join(location, "*", "lib")))
    for directory in directories:
        candidate = os.path.join(directory, soname)
        if os.path.isfile(candidate):
            try:
                ctypes.CDLL(candidate, mode=ctypes.RTLD_GLOBAL)
                logger.debug("preloaded %s for torch-tensorrt's runtime library", candidate)
                return True
            except OSError as exc:
                logger.debug("could not preload %s: %s", candidate, exc)
    return False


def _probe_cache_handle(bridge: TorchBridge) -> bool:
    cls = bridge.cache_handle_class()
    if cls is None:
        return False
    try:
        handle = cls("")
    except Exception as exc:
        logger.debug("RuntimeCacheHandle('') failed: %s", exc)
        return False
    return all(bridge.has_method(handle, m) for m in ("serialize", "deserialize", "has_cache"))
