"""``trt-runtime backends``: installed backends, whether they run here and why not, capabilities.

A backend that cannot run here says why, usually with the extra to install (for example
``pip install -c constraints.txt -e '.[torchbind]'``); that text is printed as written.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from trt_runtime.cli.output import Output, jsonable

__all__ = ["backend_report", "backends_command"]


def backend_report() -> list[dict[str, Any]]:
    """Every installed backend: availability, reason, capabilities (JSON-ready)."""
    from trt_runtime import registry

    rows = []
    for name, availability in registry.backend_status().items():
        capabilities: dict[str, Any] | None = None
        try:
            # Capabilities do not depend on availability; registry has no public
            # accessor for an unavailable backend's instance.
            instance = registry.load_backend(name)
            capabilities = jsonable(instance.capabilities)
        except Exception:
            capabilities = None
        rows.append({
            "name": name,
            "available": bool(availability),
            "reason": availability.reason,
            "capabilities": capabilities,
        })
    return rows



def _capability_text(row: Mapping[str, Any]) -> str:
    if row["capabilities"] is None:
        return "unknown"
    flags = [k.removeprefix("supports_") for k, v in row["capabilities"].items() if v is True]
    return ", ".join(flags) or "none"


def backends_command(args: argparse.Namespace, out: Output) -> int:
    """``trt-runtime backends``."""
    rows = backend_report()
    out.emit({"backends": rows})
    if not rows:
        out.notice("no trt-runtime backends are installed")
        return 0
    out.table(
        "installed backends",
        ["backend", "available", "capabilities", "reason"],
        [[r["name"], r["available"], _capability_text(r), r["reason"] or "-"] for r in rows],
    )
    return 0
