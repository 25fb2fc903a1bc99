"""The ``torchbind`` backend: engines run by torch-tensorrt(-rtx)'s C++ runtime.

Registered as the ``torchbind`` entry point of ``trt_runtime.backends``. Importing this
package imports neither torch nor torch_tensorrt; the runtime library is loaded on
first use (:attr:`TorchbindBackend.runtime`).
"""

from __future__ import annotations

from .abi import SerializedLayout
from .backend import TorchbindBackend
from .cache import TorchbindCacheHandle
from .engine import TorchbindEngine
from .library import RuntimeLibrary, find_runtime_library
from .runtime import ADDED_IN, TorchbindRuntime, load_runtime

__all__ = [
    "ADDED_IN",
    "RuntimeLibrary",
    "SerializedLayout",
    "TorchbindBackend",
    "TorchbindCacheHandle",
    "TorchbindEngine",
    "TorchbindRuntime",
    "find_runtime_library",
    "load_runtime",
]
