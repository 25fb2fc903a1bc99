"""Runtime settings: CUDA graph strategy, kernel specialization strategy, runtime cache.

Every invalid value raises :class:`~trt_runtime.SettingsError` (a ``ValueError``)
naming the field; a mapping with an unknown field or an argument of the wrong kind
raises ``TypeError``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import numbers
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from typing_extensions import Unpack

from trt_runtime.errors import SettingsError
from trt_runtime.validation import json_document, path_text, show

if TYPE_CHECKING:
    from trt_runtime.cache import RuntimeCache

__all__ = [
    "CudaGraphStrategy",
    "CudaGraphStrategyName",
    "DynamicShapesKernelSpecializationStrategy",
    "DynamicShapesKernelSpecializationStrategyName",
    "RuntimeSettings",
    "SettingsLike",
    "SettingsOverrides",
]


class _CodedEnum(str, enum.Enum):
    """A string enum whose members also carry TensorRT-RTX's integer code."""

    code: int

    def __new__(cls, value: str, code: int) -> _CodedEnum:
        member = str.__new__(cls, value)
        member._value_ = value
        member.code = code
        return member

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: object, field: str) -> Any:
        """Accept a member, its name, its string value or its integer code."""
        if isinstance(value, cls):
            return value
        if isinstance(value, bool):
            pass  # bool is an int; never a valid code
        elif isinstance(value, numbers.Integral):  # int, numpy integers
            for member in cls:
                if member.code == int(value):
                    return member
        elif isinstance(value, str):
            lowered = value.lower()
            for member in cls:
                if lowered in (member.value, member.name.lower()):
                    return member
        else:
            # Foreign enums (tensorrt_rtx.CudaGraphStrategy.WHOLE_GRAPH_CAPTURE) carry .name.
            name = getattr(value, "name", None)
            if isinstance(name, str):
                return cls.parse(name, field)
        allowed = ", ".join(repr(m.value) for m in cls)
        codes = ", ".join(str(m.code) for m in cls)
        raise SettingsError(f"{field} must be one of {allowed} (or codes {codes}); got {show(value)}")


class CudaGraphStrategy(_CodedEnum):
    """How TensorRT-RTX captures CUDA graphs; codes equal ``tensorrt_rtx.CudaGraphStrategy``."""

    DISABLED = ("disabled", 0)
    WHOLE_GRAPH_CAPTURE = ("whole_graph_capture", 1)


class DynamicShapesKernelSpecializationStrategy(_CodedEnum):
    """When shape-specialized kernels are compiled; codes equal TensorRT-RTX's enum."""

    LAZY = ("lazy", 0)
    EAGER = ("eager", 1)
    NONE = ("none", 2)


#: The string values :class:`CudaGraphStrategy` accepts (what a type checker allows).
CudaGraphStrategyName = Literal["disabled", "whole_graph_capture"]
#: The string values :class:`DynamicShapesKernelSpecializationStrategy` accepts.
DynamicShapesKernelSpecializationStrategyName = Literal["lazy", "eager", "none"]


class SettingsOverrides(TypedDict, total=False):
    """The keyword arguments of :meth:`RuntimeSettings.merge` and
    :func:`~trt_runtime.runtime_config`: each field by its enum member or its string value.

    Integer codes and member names are accepted at run time as well; the type lists the
    spellings the docs use, so that a type checker rejects ``cuda_graph="oops"``.
    """

    cuda_graph_strategy: CudaGraphStrategy | CudaGraphStrategyName
    dynamic_shapes_kernel_specialization_strategy: (
        DynamicShapesKernelSpecializationStrategy | DynamicShapesKernelSpecializationStrategyName
    )
    runtime_cache: RuntimeCache | str | os.PathLike[str] | None


_FIELDS = (
    "cuda_graph_strategy",
    "dynamic_shapes_kernel_specialization_strategy",
    "runtime_cache",
)


@dataclasses.dataclass(frozen=True, slots=True)
class RuntimeSettings:
    """Immutable runtime settings of an engine.

    ``runtime_cache`` is ``None`` (no cache), a path (a file the cache is loaded from
    and saved to) or a :class:`~trt_runtime.RuntimeCache` handle. Two settings with
    handles compare equal only if they hold the *same* handle object: handles compare
    by identity, paths by value.
    """

    cuda_graph_strategy: CudaGraphStrategy = CudaGraphStrategy.DISABLED
    dynamic_shapes_kernel_specialization_strategy: DynamicShapesKernelSpecializationStrategy = (
        DynamicShapesKernelSpecializationStrategy.LAZY
    )
    runtime_cache: RuntimeCache | Path | None = None

    if TYPE_CHECKING:
        # What the generated __init__ accepts, for type checkers: string values and codes
        # beside the enum members, any path-like for the cache (__post_init__ converts).
        def __init__(
            self,
            cuda_graph_strategy: CudaGraphStrategy | CudaGraphStrategyName | int = ...,
            dynamic_shapes_kernel_specialization_strategy: (
                DynamicShapesKernelSpecializationStrategy
                | DynamicShapesKernelSpecializationStrategyName
                | int
            ) = ...,
            runtime_cache: RuntimeCache | str | os.PathLike[str] | None = None,
        ) -> None: ...

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "cuda_graph_strategy",
            CudaGraphStrategy.parse(self.cuda_graph_strategy, "cuda_graph_strategy"),
        )
        object.__setattr__(
            self,
            "dynamic_shapes_kernel_specialization_strategy",
            DynamicShapesKernelSpecializationStrategy.parse(
                self.dynamic_shapes_kernel_specialization_strategy,
                "dynamic_shapes_kernel_specialization_strategy",
            ),
        )
        object.__setattr__(self, "runtime_cache", _parse_cache(self.runtime_cache))

    # -- derivation -------------------------------------------------------------
    def merge(self, **overrides: Unpack[SettingsOverrides]) -> RuntimeSettings:
        """Return a copy with ``overrides`` applied; unknown fields are an error."""
        unknown = sorted(set(overrides) - set(_FIELDS))
        if unknown:
            raise TypeError(
                f"unknown runtime setting(s) {', '.join(map(repr, unknown))}; "
                f"valid settings are {', '.join(map(repr, _FIELDS))}"
            )
        return dataclasses.replace(self, **overrides)  # type: ignore[arg-type]

    @classmethod
    def coerce(cls, value: SettingsLike) -> RuntimeSettings:
        """Accept ``None`` (defaults), a mapping of fields, or an instance."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            fields: dict[str, Any] = dict(value)
            return cls().merge(**fields)
        raise TypeError(
            f"runtime settings must be None, a mapping or RuntimeSettings; got {type(value).__name__}"
        )

    # -- round trips ------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain dict; enums as their string values, the cache as given (path or handle)."""
        return {
            "cuda_graph_strategy": self.cuda_graph_strategy.value,
            "dynamic_shapes_kernel_specialization_strategy": (
                self.dynamic_shapes_kernel_specialization_strategy.value
            ),
            "runtime_cache": self.runtime_cache,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RuntimeSettings:
        """Inverse of :meth:`to_dict`; missing fields take their defaults."""
        return cls.coerce(data)

    def to_json(self) -> str:
        """JSON text. A cache *handle* cannot be written; a cache path is written as a string."""
        data = self.to_dict()
        cache = data["runtime_cache"]
        if cache is not None and not isinstance(cache, Path):
            raise SettingsError(
                "a RuntimeCache handle cannot be written as JSON; "
                "give the settings a cache path instead"
            )
        data["runtime_cache"] = None if cache is None else os.fspath(cache)
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> RuntimeSettings:
        """Inverse of :meth:`to_json`."""
        data = json_document(text, "runtime settings JSON")
        if not isinstance(data, dict):
            raise SettingsError(f"runtime settings JSON must be an object; got {type(data).__name__}")
        return cls.from_dict(data)

    def to_codes(self) -> tuple[int, int]:
        """``(dynamic_shapes_code, cuda_graph_code)``: the integers TensorRT-RTX and
        torch-tensorrt's ``update_runtime_settings(ds, cg, handle)`` take."""
        return (
            self.dynamic_shapes_kernel_specialization_strategy.code,
            self.cuda_graph_strategy.code,
        )

    @classmethod
    def from_codes(
        cls,
        dynamic_shapes_code: int,
        cuda_graph_code: int,
        runtime_cache: RuntimeCache | str | os.PathLike[str] | None = None,
    ) -> RuntimeSettings:
        """Inverse of :meth:`to_codes`; the cache travels beside the codes."""
        for field, code in (
            ("dynamic_shapes_kernel_specialization_strategy", dynamic_shapes_code),
            ("cuda_graph_strategy", cuda_graph_code),
        ):
            if isinstance(code, bool) or not isinstance(code, numbers.Integral):
                raise SettingsError(f"{field} code must be an int; got {show(code)}")
        return cls(
            cuda_graph_strategy=cuda_graph_code,
            dynamic_shapes_kernel_specialization_strategy=dynamic_shapes_code,
            runtime_cache=runtime_cache,
        )


def _parse_cache(value: object) -> Any:
    from trt_runtime.cache import RuntimeCache

    if value is None or isinstance(value, RuntimeCache):
        return value
    if isinstance(value, (str, os.PathLike)):
        return Path(path_text(value, "runtime_cache path"))
    raise SettingsError(
        f"runtime_cache must be None, a path or a RuntimeCache; got {type(value).__name__} {show(value)}"
    )


SettingsLike = RuntimeSettings | Mapping[str, Any] | None
