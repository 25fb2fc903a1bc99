"""Input shapes as the command line writes them, and optimization-profile ranges.

``NAME:AxBxC`` names one input's shape, as trtexec and Polygraphy write it; several are
separated by commas (``x:1x3x64x64,mask:1x64``). The name is what comes before the
*last* colon, so names that contain colons work. :func:`profile_ranges` turns
``--shapes`` or ``--min-shapes``/``--opt-shapes``/``--max-shapes`` into one
``(min, opt, max)`` triple per input, and :func:`check_in_profiles` says whether a
concrete shape fits an input's :class:`~trt_runtime.TensorSpec` and its profiles.

Nothing here imports numpy or TensorRT. Errors are :class:`ValueError` naming the
option, the bad text and what was expected.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from trt_runtime.errors import SettingsError
from trt_runtime.protocols import TensorSpec

__all__ = [
    "Shape",
    "ShapeRange",
    "check_in_profiles",
    "format_shape",
    "parse_shape",
    "parse_shapes",
    "profile_ranges",
]

Shape = tuple[int, ...]
#: One input's optimization-profile range: ``(min, opt, max)`` shapes.
ShapeRange = tuple[Shape, Shape, Shape]


def format_shape(shape: Sequence[int]) -> str:
    """``1x3x64x64``; ``-1`` dimensions as ``?``; a scalar as ``scalar``."""
    return "x".join("?" if d < 0 else str(d) for d in shape) or "scalar"


def parse_shape(text: str, *, option: str = "shape") -> Shape:
    """``"1x3x64x64"`` -> ``(1, 3, 64, 64)``; every dimension a positive integer.

    ``option`` names where the text came from in the error message.
    """
    if not text.strip():
        raise SettingsError(f"{option}: empty shape; expected dimensions such as 1x3x64x64")
    dims = []
    for part in text.strip().lower().split("x"):
        if not part.isdigit() or int(part) < 1:
            raise SettingsError(
                f"{option}: dimension {part!r} of shape {text!r} is not a positive integer; "
                "expected dimensions such as 1x3x64x64"
            )
        dims.append(int(part))
    return tuple(dims)


def parse_shapes(items: str | Sequence[str], *, option: str = "--shapes") -> dict[str, Shape]:
    """``["x:1x3x64x64,y:2"]`` -> ``{"x": (1, 3, 64, 64), "y": (2,)}``.

    ``items`` are option values (each may hold several comma-separated entries); an
    input named twice, an entry without ``NAME:`` or a bad dimension is a ValueError.
    """
    values = [items] if isinstance(items, str) else list(items)
    shapes: dict[str, Shape] = {}
    for value in values:
        for entry in value.split(","):
            entry = entry.strip()
            name, sep, dims = entry.rpartition(":")
            if not sep or not name:
                raise SettingsError(f"{option}: {entry!r} is not NAME:SHAPE (for example x:1x3x64x64)")
            if name in shapes:
                raise SettingsError(f"{option}: input {name!r} is given twice")
            shapes[name] = parse_shape(dims, option=f"{option} {name}")
    return shapes


def profile_ranges(
    *,
    shapes: Mapping[str, Shape] | None = None,
    min_shapes: Mapping[str, Shape] | None = None,
    opt_shapes: Mapping[str, Shape] | None = None,
    max_shapes: Mapping[str, Shape] | None = None,
) -> dict[str, ShapeRange]:
    """One ``(min, opt, max)`` per input from ``shapes`` (fixed) or the three range maps.

    An input takes either a fixed shape or all three of min/opt/max (like trtexec); the
    three must have one rank and satisfy ``min <= opt <= max`` in every dimension.
    """
    shapes = dict(shapes or {})
    lo, opt, hi = dict(min_shapes or {}), dict(opt_shapes or {}), dict(max_shapes or {})
    ranges: dict[str, ShapeRange] = {name: (s, s, s) for name, s in shapes.items()}
    ranged = set(lo) | set(opt) | set(hi)
    both = sorted(ranged & set(shapes))
    if both:
        raise SettingsError(
            f"input(s) {both} have both --shapes and --min/opt/max-shapes; give a fixed shape or a range"
        )
    for name in sorted(ranged):
        missing = [flag for flag, table in (("--min-shapes", lo), ("--opt-shapes", opt), ("--max-shapes", hi))
                   if name not in table]
        if missing:
            raise SettingsError(
                f"input {name!r} needs --min-shapes, --opt-shapes and --max-shapes; "
                f"missing {', '.join(missing)}"
            )
        triple = (lo[name], opt[name], hi[name])
        if len({len(s) for s in triple}) != 1:
            raise SettingsError(
                f"input {name!r}: min/opt/max shapes {' / '.join(format_shape(s) for s in triple)} "
                "differ in rank"
            )
        if not all(a <= b <= c for a, b, c in zip(*triple, strict=True)):
            raise SettingsError(
                f"input {name!r}: need min <= opt <= max in every dimension; got "
                f"{' / '.join(format_shape(s) for s in triple)}"
            )
        ranges[name] = triple
    return ranges


def check_in_profiles(spec: TensorSpec, shape: Sequence[int], *, engine: str = "the engine") -> str:
    """Why ``shape`` cannot feed input ``spec``, or ``""`` when it can.

    It must have the input's rank, match its fixed dimensions and, when the input has
    optimization profiles, lie inside at least one of them.
    """
    shape = tuple(shape)
    fixed = zip(spec.shape, shape, strict=False)
    if len(shape) != len(spec.shape) or any(d >= 0 and d != s for d, s in fixed):
        return (
            f"shape {format_shape(shape)} does not fit input {spec.name!r} of {engine}, "
            f"whose shape is {format_shape(spec.shape)}"
        )
    if not spec.profiles:
        return ""
    for lo, _opt, hi in spec.profiles:
        if all(a <= s <= b for a, s, b in zip(lo, shape, hi, strict=True)):
            return ""
    ranges = "; ".join(
        f"profile {i}: {format_shape(lo)} .. {format_shape(hi)}"
        for i, (lo, _o, hi) in enumerate(spec.profiles)
    )
    return (
        f"shape {format_shape(shape)} of input {spec.name!r} is outside every optimization profile "
        f"of {engine} ({ranges})"
    )
