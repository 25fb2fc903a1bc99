"""ExecuTorch's own deserializer, importable without torch, for the interop tests.

``executorch/exir/__init__.py`` (and ``exir/_serialize/__init__.py``) import torch, but
the code that reads a ``.pte`` does not need it: the flatc-generated schema classes
need only ``flatbuffers``, and ``exir/_serialize/_program.py``'s
``deserialize_pte_binary`` (extended header, segments, flatbuffer -> ``exir.schema``
dataclasses) uses torch only through three imports it does not call when reading.

When torch is importable everything is imported normally. Otherwise the two package
``__init__`` files are skipped (the packages are registered with their real paths)
and the three torch-only modules are replaced by stubs that raise if used:
``exir.tensor`` (only ``ALIGNMENT``, a constant, is read), ``_named_data_store`` (used
only for named-data programs) and ``data_serializer`` (type hints). Every line that
parses the file is ExecuTorch's.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from typing import Any

#: The ExecuTorch release the tests and the committed fixtures were checked with.
EXECUTORCH_VERSION = "1.5.1"
#: Set to 1 (CI does) to make a missing executorch a failure instead of a skip.
REQUIRE_ENV = "TRT_RUNTIME_REQUIRE_EXECUTORCH"


class _Unavailable:
    """A stand-in for a torch-only class; using it says why it is missing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(
            f"{type(self).__name__} needs torch; the interop harness reads programs without it"
        )


def _register_package(name: str, root: str) -> None:
    module = types.ModuleType(name)
    module.__path__ = [os.path.join(root, *name.split(".")[1:])]
    module.__package__ = name
    sys.modules[name] = module


def _stub(name: str, **attributes: Any) -> None:
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    sys.modules[name] = module


def load(*, force_stubs: bool = False) -> types.SimpleNamespace:
    """ExecuTorch's reading API: ``deserialize_pte_binary``, ``schema``, ``generated``.

    Raises ImportError when ``executorch`` (or ``flatbuffers``) is not installed.
    ``force_stubs`` takes the torch-free path even where torch imports (for a torch
    that executorch's ``exir`` cannot import with); call it before anything imported
    ``executorch.exir``.
    """
    spec = importlib.util.find_spec("executorch")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("executorch is not installed")
    root = next(iter(spec.submodule_search_locations))
    with_torch = importlib.util.find_spec("torch") is not None and not force_stubs
    if not with_torch and "executorch.exir" not in sys.modules:
        _register_package("executorch.exir", root)
        _register_package("executorch.exir._serialize", root)
        # ALIGNMENT is exir.tensor's constant (16); the rest of the module needs torch.
        _stub("executorch.exir.tensor", ALIGNMENT=16)
        _stub(
            "executorch.exir._serialize._named_data_store",
            NamedDataStore=type("NamedDataStore", (_Unavailable,), {}),
            NamedDataStoreOutput=type("NamedDataStoreOutput", (_Unavailable,), {}),
        )
        _stub("executorch.exir._serialize.data_serializer", DataEntry=type("DataEntry", (_Unavailable,), {}))
    program = importlib.import_module("executorch.exir._serialize._program")
    return types.SimpleNamespace(
        deserialize_pte_binary=program.deserialize_pte_binary,
        get_extended_header=program._get_extended_header,
        flatbuffer_to_program=importlib.import_module(
            "executorch.exir._serialize._flatbuffer_program"
        )._flatbuffer_to_program,
        schema=importlib.import_module("executorch.exir.schema"),
        generated=importlib.import_module("executorch.exir._serialize.generated.executorch_flatbuffer"),
        program_fb=importlib.import_module(
            "executorch.exir._serialize.generated.executorch_flatbuffer.Program"
        ),
        with_torch=with_torch,
        version=_version(),
    )


def load_or_skip() -> types.SimpleNamespace:
    """:func:`load`, or skip the test (fail it when ``TRT_RUNTIME_REQUIRE_EXECUTORCH=1``)."""
    import pytest

    try:
        return load()
    except ImportError as exc:
        reason = (
            f"executorch not importable ({exc}): pip install --no-deps executorch=={EXECUTORCH_VERSION} "
            "(flatbuffers is in the test extra)"
        )
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but {reason}")
        pytest.skip(reason)


def _version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("executorch")
    except PackageNotFoundError:
        return None
