"""``path_to``: how an object reaches another through references (what the garbage collector sees),
for tests that a closed engine holds nothing native any more."""

from __future__ import annotations

import collections
import gc
import types
from typing import Any


def path_to(root: Any, target: Any, skip: tuple[Any, ...] = ()) -> list[str] | None:
    """The type names along a shortest reference path from ``root`` to ``target`` (a dict's key
    in brackets), or ``None`` when ``target`` is not reachable; objects in ``skip`` (a test
    double's call log, say), classes and modules are not followed."""
    seen = {id(root), *map(id, skip)}
    queue = collections.deque([(root, [type(root).__name__])])
    while queue:
        obj, path = queue.popleft()
        for ref in gc.get_referents(obj):
            if id(ref) in seen or isinstance(ref, (type, types.ModuleType)):
                continue
            seen.add(id(ref))
            label = type(ref).__name__
            if isinstance(obj, dict):
                label = "".join(f"[{k!r}]" for k, v in obj.items() if v is ref)[:40] + label
            if ref is target:
                return [*path, label]
            queue.append((ref, [*path, label]))
    return None
