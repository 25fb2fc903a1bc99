"""JSON request bodies parsed within limits, before any array is built.

A body is first scanned (linear time, no recursion) for its nesting depth, its number of
arrays and numbers, and anything that is not a number: ``true``, ``false``, ``null``,
strings other than the top-level object's keys, objects below the top level. Then
``json.loads`` parses it with hooks that refuse numbers of more than
:data:`MAX_NUMBER_CHARS` characters and the constants ``NaN`` and ``Infinity``. Every
refusal is a :class:`~trt_runtime.RequestError` with status 400 and one line naming the
problem; a ``RecursionError`` or Python's integer-digits limit is never reached.
"""

from __future__ import annotations

import json
import re
from typing import Any

from trt_runtime.errors import RequestError

__all__ = ["MAX_JSON_DEPTH", "MAX_JSON_ELEMENTS", "MAX_NUMBER_CHARS", "parse_json_body"]

#: An object keyed by input name, then arrays of up to 32 dimensions.
MAX_JSON_DEPTH = 33
#: Numbers and arrays in one body (each costs a Python object while it is parsed).
MAX_JSON_ELEMENTS = 2**22
#: Characters of one number: enough for any int64 or a float64 written out in full.
MAX_NUMBER_CHARS = 40

_TOKENS = re.compile(rb'[\[\]{}"\\]|true|false|null')
_KEY_END = re.compile(rb"\s*:")


def parse_json_body(body: bytes) -> Any:
    """The document of a JSON body of numbers; ``RequestError`` (400) past any limit."""
    _scan(body)

    def number(text: str, kind: type) -> Any:
        if len(text) > MAX_NUMBER_CHARS:
            raise RequestError(f"JSON number {text[:20]}... has {len(text)} characters; at most "
                               f"{MAX_NUMBER_CHARS} are allowed", 400)
        return kind(text)

    def constant(text: str) -> Any:
        raise RequestError(f"JSON constant {text} is not allowed; send finite numbers", 400)

    try:
        return json.loads(body, parse_int=lambda t: number(t, int), parse_float=lambda t: number(t, float),
                          parse_constant=constant)
    except RequestError:
        raise
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(f"request body is not valid JSON: {exc}", 400) from None
    except (RecursionError, ValueError, OverflowError) as exc:  # never expected after the scan
        raise RequestError(f"request body is not a JSON document of numbers: {exc}", 400) from None


def _scan(body: bytes) -> None:
    """Depth, element count and non-numbers, found without parsing (strings are skipped)."""
    depth = elements = 0
    in_string = False
    skip = -1  # the character after a backslash in a string
    opened = 0  # where the current string began
    for match in _TOKENS.finditer(body):
        at = match.start()
        token = match.group()
        if in_string:
            if at == skip:
                continue
            if token == b"\\":
                skip = at + 1
            elif token == b'"':
                in_string = False
                if depth and (depth != 1 or not _KEY_END.match(body, at + 1)):
                    text = body[opened + 1:at][:40].decode("utf-8", "replace")
                    raise RequestError("JSON strings are allowed only as the keys of the top-level object "
                                       f"(input names); got the string {text!r} where a number belongs", 400)
            continue
        if token == b'"':
            in_string, opened = True, at
        elif token in (b"[", b"{"):
            if token == b"{" and depth:
                raise RequestError("JSON objects are allowed only at the top level (keyed by input name); "
                                   f"found one at depth {depth + 1}", 400)
            depth += 1
            elements += 1
            if depth > MAX_JSON_DEPTH:
                raise RequestError(f"JSON nesting is deeper than {MAX_JSON_DEPTH} levels", 400)
        elif token in (b"]", b"}"):
            depth -= 1
        elif token != b"\\":
            raise RequestError(f"JSON {token.decode()} is not a number; arrays must hold numbers only", 400)
            if elements > MAX_JSON_ELEMENTS:
                raise RequestError(f"JSON body has more than {MAX_JSON_ELEMENTS} arrays and numbers", 400)
    # Every number but the last of its array is followed by a comma: a bound found without parsing.
    if elements + body.count(b",") > MAX_JSON_ELEMENTS:
        raise RequestError(f"JSON body has more than {MAX_JSON_ELEMENTS} arrays and numbers", 400)
