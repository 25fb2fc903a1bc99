"""Finding torch-tensorrt's runtime library without importing the ``torch_tensorrt`` package.

``import torch_tensorrt`` pulls in the whole compiler (dynamo, FX, TorchScript frontends,
the TensorRT proxy module). The runtime needs only ``lib/libtorchtrt_runtime.so``, which
registers ``torch.classes.tensorrt.*`` and ``torch.ops.tensorrt.*`` when torch loads it.
This module finds that file through the distribution's installed-files record
(``importlib.metadata``), falling back to :func:`importlib.util.find_spec`, which locates
a package without executing it.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import os
import re
import sys
from pathlib import Path

from trt_runtime.extras import install_hint

__all__ = [
    "DISTRIBUTIONS",
    "INSTALL_HINT",
    "RuntimeLibrary",
    "find_runtime_library",
    "installed_distribution",
]

#: Distributions that ship torch-tensorrt's runtime, in order of preference.
DISTRIBUTIONS = ("torch-tensorrt-rtx", "torch-tensorrt")
INSTALL_HINT = (
    "the 'torchbind' backend needs torch-tensorrt-rtx: " + install_hint("torchbind")
)

_PACKAGE = "torch_tensorrt"
if sys.platform.startswith("win"):
    _RUNTIME_LIB = "torchtrt_runtime.dll"
else:
    _RUNTIME_LIB = "libtorchtrt_runtime.so"


@dataclasses.dataclass(frozen=True, slots=True)
class RuntimeLibrary:
    """Where torch-tensorrt's runtime library is, and which distribution installed it."""

    path: Path
    distribution: str
    version: str

    @property
    def flavour(self) -> str:
        """``tensorrt_rtx`` for torch-tensorrt-rtx, ``tensorrt`` for torch-tensorrt."""
        return "tensorrt_rtx" if self.distribution.endswith("-rtx") else "tensorrt"

    @property
    def version_tuple(self) -> tuple[int, ...]:
        """Leading numeric components of :attr:`version` (``2.14.0+cu130`` -> ``(2, 14, 0)``)."""
        match = re.match(r"\d+(?:\.\d+)*", self.version)
        return tuple(int(p) for p in match.group(0).split(".")) if match else ()


def installed_distribution() -> tuple[str, str] | None:
    """``(name, version)`` of the first installed distribution of :data:`DISTRIBUTIONS`."""
    for name in DISTRIBUTIONS:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _from_record(name: str) -> Path | None:
    try:
        files = importlib.metadata.distribution(name).files
    except importlib.metadata.PackageNotFoundError:
        return None
    for entry in files or ():
        parts = Path(str(entry)).parts
        if len(parts) >= 3 and parts[-3:] == (_PACKAGE, "lib", _RUNTIME_LIB):
            path = Path(str(importlib.metadata.distribution(name).locate_file(entry)))
            if path.is_file():
                return path
    return None


def _from_spec() -> Path | None:
    try:
        spec = importlib.util.find_spec(_PACKAGE)  # locates; does not execute the package
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / "lib" / _RUNTIME_LIB
        if path.is_file():
            return path
    return None


def find_runtime_library() -> RuntimeLibrary | str:
    """The runtime library, or a sentence saying why it cannot be found (with the install hint).

    ``TRT_RUNTIME_TORCHTRT_LIB`` names the library explicitly (a source build, say); the
    distribution is then still looked up for the version.
    """
    found = installed_distribution()
    override = os.environ.get("TRT_RUNTIME_TORCHTRT_LIB")
    if override:
        if not Path(override).is_file():
            return f"TRT_RUNTIME_TORCHTRT_LIB={override!r} is not a file"
        name, version = found if found else ("torch-tensorrt-rtx", "unknown")
        return RuntimeLibrary(path=Path(override), distribution=name, version=version)
    if found is None:
        return INSTALL_HINT
    name, version = found
    located = _from_record(name) or _from_spec()
    if located is None:
        return (
            f"{name} {version} is installed but its runtime library "
            f"{_PACKAGE}/lib/{_RUNTIME_LIB} was not found; reinstall it: "
            "pip install --force-reinstall -c constraints.txt -e '.[torchbind]'"
        )
    return RuntimeLibrary(path=located, distribution=name, version=version)
