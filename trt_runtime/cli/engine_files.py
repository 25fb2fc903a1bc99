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

from trt_runtime.cli.output import CliError

__all__ = [
    "FORCE_HELP",
    "backend_reason",
    "check_engine_file",
    "check_file",
    "known_magics",
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


def known_magics() -> str:
    """The first bytes an engine file may start with, as one human-readable list."""
    from trt_runtime.formats import PLAN_MAGICS
    from trt_runtime.formats.tr01 import MAGIC_TR01, MAGIC_TR02

    plans = [f"{magic.decode('ascii')!r} ({flavour} plan)" for magic, flavour in PLAN_MAGICS.items()]
    blobs = f"{MAGIC_TR01.decode('ascii')!r} / {MAGIC_TR02.decode('ascii')!r} (ExecuTorch TensorRT blob)"
    return ", ".join([*plans, blobs, "'ET..' at byte 4 (.pte program)"])


def unknown_magic(path: Path) -> str:
    """Why ``path`` is not an engine file by its first bytes, or '' when it may be one.

    Files smaller than the smallest plan are left to the format checks, whose "empty" and
    "too small" say more than a magic would.
    """
    from trt_runtime.formats import MIN_PLAN_SIZE, PLAN_MAGICS, detect_format
    from trt_runtime.formats.source import open_engine_file

    with os.fdopen(open_engine_file(path), "rb") as f:
        head = f.read(MIN_PLAN_SIZE)
    if len(head) < MIN_PLAN_SIZE:
        return ""
    if detect_format(memoryview(head)) != "plan" or head[:4] in PLAN_MAGICS:
        return ""
    return (
        f"{path} is not a TensorRT engine: it starts with {head[:4]!r} (hex {head[:4].hex()}); "
        f"known magics: {known_magics()}"
    )


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

