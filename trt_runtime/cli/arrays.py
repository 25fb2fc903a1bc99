"""Arrays in and out of an engine: random or given inputs, outputs as numpy.

Random inputs are standard normal for floating-point bindings and integers in 0..7
otherwise, in the binding's dtype; a dynamic dimension takes the first optimization
profile's *opt* value (1 without a profile). numpy is imported only when needed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trt_runtime.cli.engine_files import check_file
from trt_runtime.cli.output import CliError, UsageError

__all__ = ["concrete_shape", "make_inputs", "output_to_numpy", "parse_given_inputs"]


def parse_given_inputs(items: Sequence[str]) -> dict[str, Path]:
    """``--input NAME=FILE.npy`` options as ``{name: path}``; malformed or repeated is a usage error."""
    given: dict[str, Path] = {}
    for item in items:
        name, sep, file = item.partition("=")
        if not sep or not name or not file:
            raise UsageError(f"--input must be NAME=FILE.npy; got {item!r}")
        if name in given:
            raise UsageError(f"--input {name!r} given twice")
        given[name] = Path(file)
    return given


def concrete_shape(spec: Any) -> tuple[int, ...]:
    """A shape to feed a binding: its own, or its profile's optimal one when dynamic."""
    if not spec.is_dynamic:
        return tuple(spec.shape)
    if spec.profiles:
        return tuple(spec.profiles[0][1])  # the profile's optimal shape
    return tuple(1 if d < 0 else d for d in spec.shape)


def make_inputs(specs: Sequence[Any], given: Mapping[str, Path] | None = None, seed: int = 0) -> list[Any]:
    """numpy arrays for ``specs``: loaded from ``given`` files by name, random otherwise."""
    import numpy as np

    from trt_runtime.dtypes import to_numpy as numpy_dtype

    given = dict(given or {})
    names = [s.name for s in specs]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise UsageError(f"--input names {unknown} are not inputs of the engine; its inputs are {names}")
    rng = np.random.default_rng(seed)
    arrays = []
    for spec in specs:
        dtype = numpy_dtype(spec.dtype)
        if spec.name in given:
            file = given[spec.name]
            array = _load_npy(spec.name, file)
            arrays.append(np.ascontiguousarray(array))
            continue
        shape = concrete_shape(spec)
        if dtype.kind == "f":
            array = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            array = rng.integers(0, 2, shape).astype(bool)
        else:
            array = rng.integers(0, 8, shape).astype(dtype)
        arrays.append(array)
    return arrays


_NPY_MAGIC = b"\x93NUMPY"


def _load_npy(name: str, file: Path) -> Any:
    """The array in ``file``, or one clear line on why it is not a ``.npy`` array."""
    import numpy as np

    check_file(file)
    with open(file, "rb") as f:
        head = f.read(len(_NPY_MAGIC))
    if head != _NPY_MAGIC:
        raise CliError(
            f"--input {name}={file} is not a .npy file: it starts with {head!r}; "
            f"expected {_NPY_MAGIC!r} (what numpy.save writes)"
        )
    try:
        return np.load(file, allow_pickle=False)
    except ValueError as exc:  # a header numpy reads but an object array, or truncated data
        detail = str(exc).split(";")[0].split(" when allow_pickle")[0]
        raise CliError(f"--input {name}={file} is not a plain .npy array: {detail}") from exc


def output_to_numpy(value: Any) -> Any:
    """An output (numpy, torch, cupy, DLPack) as a host numpy array."""
    import numpy as np

    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch
        return value.detach().cpu().numpy()
    if hasattr(value, "get") and hasattr(value, "__cuda_array_interface__"):  # cupy
        return value.get()
    if isinstance(value, np.ndarray):
        return value
    try:
        return np.asarray(value)
    except Exception:
        return np.from_dlpack(value)
