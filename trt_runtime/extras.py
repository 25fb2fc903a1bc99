"""The optional extras of trt-runtime and the one line that installs each.

No index carries a ``trt-runtime`` distribution: every install runs from a checkout, with
``constraints.txt`` pinning the versions the project is tested with. Every "install this"
hint a message gives comes from :func:`install_hint`, so none names a form that cannot
work. :data:`EXTRAS` lists what each extra brings (the same lists as ``pyproject.toml``'s
``[project.optional-dependencies]``; a test keeps the two equal).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from trt_runtime.errors import SettingsError

__all__ = ["EXTRAS", "install_hint"]

#: Extra -> the packages it installs (requirement strings, as in ``pyproject.toml``).
EXTRAS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "rtx": ("tensorrt-rtx", "numpy>=1.24", "onnx>=1.16"),
    "cuda": ("cuda-core>=1.0", "cuda-bindings>=12.8"),
    "torch": ("torch>=2.4",),
    "torchbind": ("torch>=2.11", "torch-tensorrt-rtx>=2.11"),
    "executorch": ("executorch>=1.5.1", "torch>=2.11"),
    "cli": ("rich>=13", "numpy>=1.24"),
    "plot": ("matplotlib>=3.7",),
    "serve": (
        "ray[serve]>=2.40", "numpy>=1.24", "starlette>=0.40", "uvicorn>=0.30", "prometheus-client>=0.20",
    ),
    "onnx": ("onnx>=1.16", "onnxconverter-common>=1.14", "numpy>=1.24"),
    "test": (
        "pytest>=8", "pytest-xdist>=3.5", "hypothesis>=6.100", "numpy>=1.24", "rich>=13", "flatbuffers>=23",
        "onnx>=1.16", "onnxruntime>=1.18", "onnxconverter-common>=1.14",
        "mypy>=1.10", "basedpyright>=1.20",
        "mkdocs>=1.6", "mkdocs-material>=9.5", "mkdocstrings[python]>=0.25",
        "tritonclient[http]>=2.40",
    ),
    "docs": ("mkdocs>=1.6", "mkdocs-material>=9.5", "mkdocstrings[python]>=0.25", "ruff>=0.5"),
    "dev": ("nox>=2024.3", "mypy>=1.10", "ruff>=0.5", "mkdocs-material>=9.5", "mkdocstrings[python]>=0.25"),
})


def install_hint(extra: str) -> str:
    """The command that installs ``extra`` from a checkout: ``pip install -c constraints.txt -e '.[EXTRA]'``.

    Raises :class:`~trt_runtime.errors.SettingsError` (a ``ValueError``) for a name that is
    not one of :data:`EXTRAS`.
    """
    if extra not in EXTRAS:
        raise SettingsError(f"extra must be one of {', '.join(map(repr, EXTRAS))}; got {extra!r}")
    return f"pip install -c constraints.txt -e '.[{extra}]'"

