"""Arrays in and out of an engine: random or given inputs, outputs as numpy.

Random inputs are standard normal for floating-point bindings and integers in 0..7
otherwise, in the binding's dtype; they take the shape ``--shapes`` gives, else a dynamic
dimension takes the first optimization profile's *opt* value (1 without a profile).
Inputs also come from ``.npy`` files (``--input``) or an ``.npz`` (``--load-inputs``);
outputs go to ``.npz`` files with :func:`save_npz`. numpy is imported only when needed.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from trt_runtime.cli.engine_files import check_file
from trt_runtime.cli.output import CliError, UsageError

__all__ = [
    "concrete_shape", "load_npz", "make_inputs", "npz_names", "output_to_numpy", "parse_given_inputs",
    "save_npz",
]


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


def make_inputs(
    specs: Sequence[Any],
    given: Mapping[str, Path] | None = None,
    seed: int = 0,
    *,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    loaded: Mapping[str, Any] | None = None,
) -> list[Any]:
    """numpy arrays for ``specs``: from ``given`` .npy files or ``loaded`` arrays by name,
    random otherwise, of the ``shapes`` given (``--shapes``) or :func:`concrete_shape`.

    Every shape is checked against the input and its optimization profiles first, so a
    shape the engine cannot take is one line naming it and the profile ranges.
    """
    import numpy as np

    from trt_runtime.dtypes import to_numpy as numpy_dtype
    from trt_runtime.shapes import check_in_profiles

    given, shapes, loaded = dict(given or {}), dict(shapes or {}), dict(loaded or {})
    names = [s.name for s in specs]
    for option, table in (("--input", given), ("--shapes", shapes), ("--load-inputs", loaded)):
        unknown = sorted(set(table) - set(names))
        if unknown:
            raise UsageError(
                f"{option} names {unknown}, which are not inputs of the engine; its inputs are {names}"
            )
    twice = sorted((set(given) & set(loaded)) | (set(shapes) & (set(given) | set(loaded))))
    if twice:
        raise UsageError(f"input(s) {twice} are given by more than one of --input, --load-inputs, --shapes")
    rng = np.random.default_rng(seed)
    arrays = []
    for spec in specs:
        dtype = numpy_dtype(spec.dtype)
        if spec.name in given or spec.name in loaded:
            if spec.name in given:
                array = _load_npy(spec.name, given[spec.name])
            else:
                array = loaded[spec.name]
            reason = check_in_profiles(spec, array.shape)
            if reason:  # a usage error, as the same shape from --shapes is
                flag = "--input" if spec.name in given else "--load-inputs"
                raise UsageError(f"{flag}: the array given for input {spec.name!r}: {reason}")
            arrays.append(np.ascontiguousarray(array))
            continue
        if spec.name in shapes:
            reason = check_in_profiles(spec, shapes[spec.name])
            if reason:
                raise UsageError(f"--shapes: {reason}")
        shape = shapes.get(spec.name) or concrete_shape(spec)
        if dtype.kind == "f":
            array = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            array = rng.integers(0, 2, shape).astype(bool)
        else:
            array = rng.integers(0, 8, shape).astype(dtype)
        arrays.append(array)
    return arrays


def load_npz(
    path: Path, option: str, *, specs: Sequence[Any] | None = None, names: Collection[str] | None = None,
    max_bytes: int | None = None,
) -> dict[str, Any]:
    """Arrays of an ``.npz`` file by name, read with :func:`trt_runtime.arrays_io.read_npz`.

    With ``specs`` (an engine's inputs): a member that is not an input is a usage error and
    each header's shape is checked against its input's profiles, before any data is
    inflated. With ``names``: only those members are read. One line naming the file (and
    member) if it is not an ``.npz`` of plain arrays or is over ``max_bytes``.
    """
    from trt_runtime.arrays_io import DEFAULT_MAX_BYTES, NpyHeader, read_npz
    from trt_runtime.errors import FormatError

    check_file(path)
    with open(path, "rb") as f:
        head = f.read(len(_NPY_MAGIC))
    if not head.startswith((_NPY_MAGIC, *_ZIP_MAGICS)):  # numpy would guess "pickled data"
        raise CliError(
            f"{option} {path} is not an .npz or .npy file: it starts with {head!r}; expected "
            f"{_ZIP_MAGICS[0]!r} (an .npz, what numpy.savez writes)"
        )
    by_name = {s.name: s for s in specs or ()}

    def check(name: str, header: NpyHeader) -> None:
        from trt_runtime.shapes import check_in_profiles

        reason = check_in_profiles(by_name[name], header.shape)
        if reason:
            raise UsageError(f"the array given for input {name!r}: {reason}")

    if specs is not None:
        unknown = sorted(set(npz_names(path, option)) - set(by_name))
        if unknown:
            raise UsageError(f"{option} names {unknown}, which are not inputs of the engine; "
                             f"its inputs are {list(by_name)}")
        names = list(by_name)
    try:
        return read_npz(path, f"{option} {path}", names=names, check=check if specs is not None else None,
                        max_bytes=max_bytes or DEFAULT_MAX_BYTES)
    except FormatError as exc:
        raise CliError(str(exc)) from exc


def npz_names(path: Path, option: str) -> list[str]:
    """The array names of an ``.npz`` file (its zip directory only: nothing is inflated)."""
    from trt_runtime.arrays_io import npz_members, open_npz
    from trt_runtime.errors import FormatError

    what = f"{option} {path}"
    try:
        with open_npz(path, what) as archive:
            return list(npz_members(archive, what))
    except FormatError as exc:
        raise CliError(str(exc)) from exc


def save_npz(path: Path, arrays: Mapping[str, Any]) -> None:
    """Write ``arrays`` to ``path`` as an ``.npz``, atomically (a failed write leaves no file)."""
    import numpy as np

    from trt_runtime.formats import atomic_writer

    with atomic_writer(path) as f:
        np.savez(f, **arrays)


_NPY_MAGIC = b"\x93NUMPY"
#: The first bytes of a zip archive (an .npz), and of an empty one.
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")


def _load_npy(name: str, file: Path) -> Any:
    """The array in ``file``, or one clear line on why it is not a ``.npy`` array."""
    from trt_runtime.arrays_io import NPY_MAGIC, read_npy_file
    from trt_runtime.errors import FormatError

    check_file(file)
    with open(file, "rb") as f:
        head = f.read(len(NPY_MAGIC))
    if head != NPY_MAGIC:
        raise CliError(
            f"--input {name}={file} is not a .npy file: it starts with {head!r}; "
            f"expected {NPY_MAGIC!r} (what numpy.save writes)"
        )
    try:
        return read_npy_file(file, f"--input {name}={file}")
    except FormatError as exc:
        raise CliError(str(exc)) from exc


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
