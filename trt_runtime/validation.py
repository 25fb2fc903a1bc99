"""Checks for values where they enter: paths, seconds, JSON text; failures are SettingsError.

Hostile values must fail here, with the name of the option, rather than deep inside
the standard library later (``embedded null byte`` at save time, ``OverflowError``
from ``float(10**400)``, ``RecursionError`` from ``json.loads``). :func:`show` renders a
bad value for a message without itself failing on it (an int of 5,000 digits cannot be
``repr``-ed under Python's int-digits limit).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import struct
from collections.abc import Iterator
from typing import Any

from trt_runtime.errors import SettingsError, TrtRuntimeError

__all__ = [
    "MAX_JSON_NESTING",
    "MAX_SECONDS",
    "json_document",
    "path_text",
    "python_limits",
    "seconds",
    "show",
]

#: Longest a timeout may be (about 31 years): longer ones are taken for a mistake.
MAX_SECONDS = 1e9
#: Deepest nesting of containers accepted in settings and cache-key JSON.
MAX_JSON_NESTING = 64
_SHOW_LIMIT = 80


def show(value: Any) -> str:
    """``repr(value)`` cut to a readable length; never raises (huge ints, broken reprs)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    try:
        text = repr(value)
    except Exception:
        return f"a {type(value).__name__}"
    return text if len(text) <= _SHOW_LIMIT else text[: _SHOW_LIMIT - 3] + "..."


def path_text(value: Any, field: str) -> str:
    """``value`` (``str`` or an ``os.PathLike`` of ``str``) as a non-empty path string.

    Bytes paths, a ``PathLike`` whose ``__fspath__`` fails or returns bytes, an empty
    path and a path with a NUL byte raise :class:`SettingsError` naming ``field``.
    """
    if not isinstance(value, (str, os.PathLike)):
        raise SettingsError(f"{field} must be a str or os.PathLike; got {type(value).__name__} {show(value)}")
    try:
        text = value if isinstance(value, str) else value.__fspath__()
    except Exception as exc:
        raise SettingsError(f"{field}: __fspath__() of {show(value)} failed: {exc}") from exc
    if not isinstance(text, str):
        raise SettingsError(
            f"{field} must be a text path; {type(value).__name__}.__fspath__() returned "
            f"{type(text).__name__} {show(text)} (decode bytes with os.fsdecode)"
        )
    if not text:
        raise SettingsError(f"{field} must not be empty")
    if "\x00" in text:
        raise SettingsError(f"{field} {show(text)} contains a NUL byte; no file system accepts it")
    return text


def seconds(value: Any, field: str, *, maximum: float = MAX_SECONDS) -> float:
    """``value`` as a finite number of seconds in ``[0, maximum]``, or :class:`SettingsError`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SettingsError(
            f"{field} must be a number of seconds >= 0; got {type(value).__name__} {show(value)}"
        )
    try:
        result = float(value)
    except OverflowError:
        result = math.inf
    if not math.isfinite(result) or not 0 <= result <= maximum:
        raise SettingsError(
            f"{field} must be a number of seconds >= 0, finite and at most {maximum:g}; got {show(value)}"
        )
    return result


def _depth(doc: Any) -> int:
    """Nesting depth of a decoded JSON document, without recursion."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, (list, dict)):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def json_document(text: str | bytes | bytearray, what: str, error: type[Exception] = SettingsError) -> Any:
    """``json.loads(text)`` with every failure, depth and number limit raised as ``error``.

    Containers nested deeper than :data:`MAX_JSON_NESTING` are refused: a settings or
    cache-key document is flat, and deep nesting is how hostile text reaches Python's
    recursion limit.
    """
    try:
        doc = json.loads(text)
    except RecursionError:
        raise error(f"{what} nests containers deeper than {MAX_JSON_NESTING} levels") from None
    except (ValueError, TypeError) as exc:  # JSONDecodeError, int-digits limit, bad bytes
        raise error(f"{what} is not valid JSON: {exc}") from exc
    if _depth(doc) > MAX_JSON_NESTING:
        raise error(f"{what} nests containers deeper than {MAX_JSON_NESTING} levels")
    return doc


@contextlib.contextmanager
def python_limits(error: type[Exception], what: str) -> Iterator[None]:
    """Raise Python's own limits met inside the block as ``error`` naming ``what``.

    A reader's checks raise its layer's class themselves; this catches what slips past
    them on hostile input (``RecursionError``, ``OverflowError``, the int-digits
    ``ValueError``, ``struct.error``, ``IndexError``), so one class per layer holds.
    """
    try:
        yield
    except TrtRuntimeError:
        raise
    except (RecursionError, OverflowError, ValueError, struct.error, IndexError) as exc:
        raise error(f"{what} is malformed ({type(exc).__name__}: {show(str(exc))})") from exc
