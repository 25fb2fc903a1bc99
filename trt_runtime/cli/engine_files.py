"""Which files the commands take for engines, and which backend can open them here.

``inspect``, ``run`` and ``bench`` refuse a file whose first bytes match none of the
known magics (TensorRT / TensorRT-RTX plans as listed in
:data:`trt_runtime.formats.PLAN_MAGICS`, TR01/TR02 blobs, ``.pte`` programs) with one
line naming them; ``--force`` takes such a file for a plan of unknown flavour, for
engines of a TensorRT version newer than this trt-runtime.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trt_runtime.cli.output import CliError, UsageError

__all__ = [
    "FORCE_HELP",
    "backend_reason",
    "check_backend_name",
    "check_engine_file",
    "check_file",
    "declared_magics",
    "engine_backend",
    "known_magics",
    "runnable_engine",
    "spec_dict",
    "unknown_magic",
]

FORCE_HELP = (
    "take a file whose magic is unknown for a plan of unknown flavour "
    "(engines of a newer TensorRT); by default such a file is refused"
)


def check_file(path: Path) -> None:
    """Refuse (:class:`CliError`) a path that does not exist, is a directory or is no regular file.

    Only ``stat`` is used: a FIFO or a device is refused without being opened.
    """
    if not path.exists():
        raise CliError(f"no such file: {path}")
    if path.is_dir():
        raise CliError(f"is a directory, not an engine file: {path}")
    if not path.is_file():
        raise CliError(f"not a regular file (a FIFO, device or socket), not an engine file: {path}")


def declared_magics() -> dict[bytes, str]:
    """``{magic: format}`` of the engine formats installed backends read (``.mem`` of 'memory')."""
    from trt_runtime.registry import engine_magics

    return {magic: what for magic, (_owner, what) in engine_magics().items()}


def known_magics() -> str:
    """The first bytes an engine file may start with, as one human-readable list."""
    from trt_runtime.formats import known_magics as listing

    return listing(declared_magics())


def unknown_magic(path: Path) -> str:
    """Why ``path`` is not an engine file by its first bytes, or '' when it may be one.

    The same check and message as :func:`trt_runtime.load`'s (an empty file is left to
    the format checks, whose "empty" says more).
    """
    from trt_runtime.formats import unknown_magic as reason
    from trt_runtime.formats.source import open_engine_file

    with os.fdopen(open_engine_file(path), "rb") as f:
        head = f.read(16)
    return reason(head, str(path), declared_magics())


def engine_backend(path: Path, name: str | None) -> str | None:
    """The backend ``trt_runtime.load`` would pick for ``path``: ``name``, the environment's,
    the one that declares the file's format, or ``None`` for the first available."""
    from trt_runtime.formats.source import open_engine_file
    from trt_runtime.registry import backend_for_engine

    with os.fdopen(open_engine_file(path), "rb") as f:
        head = f.read(16)
    return backend_for_engine(head, name)


def check_engine_file(path: Path, *, force: bool = False, out: Any = None) -> None:
    """Refuse a missing path, a directory, or a file that starts like no engine container.

    With ``force`` a file of unknown magic passes (a warning on ``out`` says so) and is
    then read as a plan of unknown flavour.
    """
    check_file(path)
    reason = unknown_magic(path)
    if not reason:
        return
    if not force:
        raise CliError(f"{reason} (pass --force to read it as a plan of unknown flavour)")
    if out is not None:
        out.warn(f"{reason}; reading it as a plan of unknown flavour (--force)")


def runnable_engine(path: Path, name: str | None, *, force: bool = False, out: Any = None) -> str | None:
    """Refuse a file that is no engine (:func:`check_engine_file`) or whose backend cannot run
    here (``cannot run FILE: why``); else the backend name ``trt_runtime.load`` will use."""
    check_engine_file(path, force=force, out=out)
    backend_name = engine_backend(path, name)
    reason = backend_reason(backend_name)
    if reason:
        raise CliError(f"cannot run {path}: {reason}")
    return backend_name


def check_backend_name(name: str | None, *, also: tuple[str, ...] = ()) -> None:
    """Refuse (:class:`UsageError`, exit 2) a ``--backend`` that names no installed backend."""
    if name is None or name in also:
        return
    from trt_runtime.registry import installed_backends

    names = installed_backends()
    if name not in names:
        allowed = ", ".join(map(repr, [*names, *also])) or "none"
        raise UsageError(f"--backend {name!r} is not an installed backend; installed: {allowed}")


def backend_reason(name: str | None) -> str:
    """Why ``get_backend(name)`` fails here, or '' if it succeeds."""
    from trt_runtime import get_backend

    try:
        get_backend(name)
    except Exception as exc:
        return str(exc)
    return ""


def spec_dict(spec: Any) -> dict[str, Any]:
    """A :class:`~trt_runtime.TensorSpec` as the JSON the commands print."""
    return {
        "name": spec.name,
        "io": "input" if spec.is_input else "output",
        "dtype": spec.dtype,
        "shape": list(spec.shape),
        "profiles": [[list(s) for s in triple] for triple in spec.profiles],
        "data_dependent": bool(spec.data_dependent),
    }

