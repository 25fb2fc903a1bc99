"""Canonical dtype names shared by the formats, the backends and the reference model."""

from __future__ import annotations

from typing import Any

from trt_runtime.errors import SettingsError

__all__ = ["DTYPE_NAMES", "itemsize", "normalize_dtype", "to_numpy"]

#: Canonical names and their size in bytes.
DTYPE_NAMES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "int64": 8,
    "int32": 4,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}

_ALIASES = {
    "float": "float32",
    "fp32": "float32",
    "half": "float16",
    "fp16": "float16",
    "bf16": "bfloat16",
    "fp8": "float8_e4m3fn",
    "long": "int64",
    "int": "int32",
    "char": "int8",
    "byte": "uint8",
}


def normalize_dtype(value: Any) -> str:
    """Canonical name of a dtype given as a name, a numpy/torch dtype or a TensorRT DataType."""
    name = getattr(value, "name", None) if not isinstance(value, str) else value
    if name is None:
        name = str(value)
    text = str(name).lower().removeprefix("torch.").removeprefix("datatype.")
    text = _ALIASES.get(text, text)
    if text not in DTYPE_NAMES:
        raise SettingsError(f"unknown dtype {value!r}; expected one of {', '.join(DTYPE_NAMES)}")
    return text


def itemsize(name: str) -> int:
    """Bytes per element of the canonical dtype ``name``."""
    return DTYPE_NAMES[normalize_dtype(name)]


def to_numpy(name: str) -> Any:
    """The numpy dtype for a canonical name (needs numpy; bfloat16/fp8 need ml_dtypes)."""
    import numpy as np

    name = normalize_dtype(name)
    if name in ("bfloat16", "float8_e4m3fn"):
        try:
            import ml_dtypes
        except ImportError as exc:
            raise TypeError(f"numpy has no {name}; install ml_dtypes to use it") from exc
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)
