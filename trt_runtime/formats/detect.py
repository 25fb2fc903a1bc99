"""Which container an engine file is, from its first bytes: :func:`detect_format`, and the
messages that name an unknown magic beside the known ones."""

from __future__ import annotations

import re
from collections.abc import Mapping

from trt_runtime.formats.plan import PLAN_MAGICS
from trt_runtime.formats.pte import is_pte
from trt_runtime.formats.source import EngineInput
from trt_runtime.formats.tr01 import MAGIC_TR01, MAGIC_TR02

__all__ = ["detect_format", "known_magics", "unknown_magic"]

_FUTURE_BLOB = re.compile(rb"TR[0-9]{2}")



def detect_format(view: memoryview) -> str:
    """``"TR01"``, ``"TR02"``, ``"pte"`` or ``"plan"`` from the first bytes.

    A raw plan is the fallback: anything that is not a blob or a program is taken for
    a plan and must then pass the plan checks. ``TR`` and two digits is reported as a
    blob, so that an unknown blob version is rejected instead of sent to TensorRT.
    """
    magic = bytes(view[:4])
    if magic in (MAGIC_TR01, MAGIC_TR02):
        return magic.decode("ascii")
    if _FUTURE_BLOB.fullmatch(magic):
        # A later blob version: parse_tr01 rejects it by name rather than letting it
        # pass for a raw plan.
        return "TR01"
    if is_pte(view):
        return "pte"
    return "plan"


def known_magics(extra: Mapping[bytes, str] | None = None) -> str:
    """The first bytes an engine file may start with, as one human-readable list.

    ``extra`` maps further magics to what they are (the engine formats backends declare).
    """
    plans = [f"{magic.decode('ascii')!r} ({flavour} plan)" for magic, flavour in PLAN_MAGICS.items()]
    blobs = f"{MAGIC_TR01.decode('ascii')!r} / {MAGIC_TR02.decode('ascii')!r} (ExecuTorch TensorRT blob)"
    others = [f"{magic.decode('latin-1')!r} ({what})" for magic, what in (extra or {}).items()]
    return ", ".join([*plans, blobs, "'ET..' at byte 4 (.pte program)", *others])


def unknown_magic(data: EngineInput, name: str, extra: Mapping[bytes, str] | None = None) -> str:
    """Why ``data`` is not an engine file by its first bytes, or '' when it may be one.

    Blobs, programs, plans of a known flavour and the magics in ``extra`` pass; so does an
    empty input (the format checks say "empty"). Anything else, however short, is named
    with its first bytes and the magics that are known.
    """
    view = memoryview(data)
    head = bytes(view[:16])
    if not head or detect_format(view) != "plan" or head[:4] in PLAN_MAGICS:
        return ""
    if any(head.startswith(magic) for magic in extra or {}):
        return ""
    return (
        f"{name} is not an engine file (unknown magic {head[:4]!r}, hex {head[:4].hex()}); "
        f"known magics: {known_magics(extra)}"
    )
