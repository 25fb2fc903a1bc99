"""A griffe extension for the docs build: Sphinx roles in docstrings become cross-references.

The package's docstrings use reStructuredText roles (``:class:`~trt_runtime.RuntimeCache```,
``:meth:`execute```, ``:mod:`.memory_format```). mkdocstrings renders Markdown, where a role
would show as raw text. This extension rewrites each role, when the docs are built, into an
autorefs cross-reference to the object's canonical path, resolved the way Sphinx would:
the name as written, then relative to the object, its parents, its module's package. A
role whose target is not a documented object (a private hook, an attribute of a local
variable) renders as code. The source docstrings are left as they are.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(class|func|meth|mod|data|attr|exc|obj):`(?P<target>[^`]+)`")


def _lookup(collection: Any, path: str) -> Any:
    try:
        found = collection[path]
    except Exception:
        return None
    try:
        return found.final_target if found.is_alias else found
    except Exception:  # an alias to an object outside the loaded packages
        return None


def _resolve(obj: Any, target: str) -> tuple[str | None, str]:
    """``(canonical path or None, text to show)`` of one role's target seen from ``obj``."""
    short = target.startswith("~")
    name = target.lstrip("~")
    if "<" in name and name.endswith(">"):  # :class:`title <path>`
        title, name = name[:-1].split("<", 1)
        shown = title.strip()
        name = name.strip()
    else:
        shown = name.rsplit(".", 1)[-1] if short else name.lstrip(".")
    collection = obj.modules_collection
    candidates: list[str] = []
    if name.startswith("."):
        package = obj.module.path if obj.module.is_init_module else obj.module.path.rsplit(".", 1)[0]
        candidates.append(package + name)
    else:
        candidates.append(name)
        scope = obj
        while scope is not None:
            candidates.append(f"{scope.path}.{name}")
            scope = scope.parent
        candidates.append(f"trt_runtime.{name}")
    for path in candidates:
        found = _lookup(collection, path)
        if found is not None:
            return found.canonical_path, shown
    return None, shown


def _rewrite(obj: Any, text: str) -> str:
    def replace(match: re.Match[str]) -> str:
        path, shown = _resolve(obj, match["target"])
        code = f"<code>{shown}</code>"
        if path is None:
            return f"`{shown}`"
        return f'<autoref identifier="{path}" optional>{code}</autoref>'

    return _ROLE.sub(replace, text)


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles of every docstring of a loaded package (see the module docstring)."""

    def on_package(self, *, pkg: Any, **kwargs: Any) -> None:
        self._walk(pkg, set())

    def _walk(self, obj: Any, seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is not None and ":" in obj.docstring.value:
            obj.docstring.value = _rewrite(obj, obj.docstring.value)
        for member in list(obj.members.values()):
            if member.is_alias:
                continue
            self._walk(member, seen)
