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
            description = str(getattr(instance, "description", "") or "")
        except Exception:
            capabilities = None
            description = ""
        rows.append({
            "name": name,
            "description": description,
            "available": bool(availability),
            "installed": _installed(availability.reason, capabilities),
            "reason": availability.reason,
            "capabilities": capabilities,
        })
    return rows


def _installed(reason: str, capabilities: Mapping[str, Any] | None) -> bool:
    """False when the backend's packages are missing: it says what to install and declares
    no capability (it learns them from the packages)."""
    flags = [v for k, v in (capabilities or {}).items() if k.startswith("supports_")]
    return not ("pip install" in reason and not any(flags))



def _capability_text(row: Mapping[str, Any]) -> str:
    if not row["installed"]:
        hint = row["reason"][row["reason"].find("pip install"):]
        return f"not installed ({hint})"
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
        [[f"{r['name']} ({r['description']})" if r["description"] else r["name"], r["available"],
          _capability_text(r), r["reason"] or "-"] for r in rows],
    )
    return 0
