"""Hypothesis strategies for runtime settings, cache payloads and operation sequences.

Needs ``hypothesis`` (``pip install -c constraints.txt -e '.[test]'``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from trt_runtime.protocols import BackendCapabilities
from trt_runtime.settings import (
    CudaGraphStrategy,
    DynamicShapesKernelSpecializationStrategy,
    RuntimeSettings,
)

__all__ = [
    "Operation",
    "cache_payloads",
    "cache_paths",
    "cache_values",
    "cuda_graph_strategies",
    "dynamic_shapes_strategies",
    "invalid_settings_inputs",
    "operations",
    "runtime_settings",
    "setting_spellings",
]

_SETTING_ENUMS: dict[str, type[Any]] = {
    "cuda_graph_strategy": CudaGraphStrategy,
    "dynamic_shapes_kernel_specialization_strategy": DynamicShapesKernelSpecializationStrategy,
}


def setting_spellings(member: Any) -> st.SearchStrategy[Any]:
    """Every accepted spelling of an enum member: itself, its value, name (any case), code."""
    spellings = [member, member.value, member.name, member.name.lower(), member.value.upper(), member.code]
    return st.sampled_from(spellings)


def cuda_graph_strategies(*, spelled: bool = False) -> st.SearchStrategy[Any]:
    """Members of :class:`CudaGraphStrategy` (or any accepted spelling of one)."""
    members = st.sampled_from(list(CudaGraphStrategy))
    return members.flatmap(setting_spellings) if spelled else members


def dynamic_shapes_strategies(*, spelled: bool = False) -> st.SearchStrategy[Any]:
    """Members of :class:`DynamicShapesKernelSpecializationStrategy` (or spellings)."""
    members = st.sampled_from(list(DynamicShapesKernelSpecializationStrategy))
    return members.flatmap(setting_spellings) if spelled else members


def cache_paths() -> st.SearchStrategy[Path]:
    """Non-empty relative or absolute cache paths (never touched on disk by settings)."""
    part = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-.", min_size=1, max_size=8).filter(
        lambda s: s not in (".", "..")
    )
    return st.builds(
        lambda root, parts: Path(root, *parts),
        st.sampled_from(["", "/tmp", "~", "caches"]),
        st.lists(part, min_size=1, max_size=3),
    ).map(lambda p: Path(str(p)))


def cache_values(*, paths: bool = True, handles: bool = True) -> st.SearchStrategy[Any]:
    """``None``, a cache path, or a fresh :class:`~trt_runtime.RuntimeCache` handle."""
    options: list[st.SearchStrategy[Any]] = [st.none()]
    if paths:
        options.append(cache_paths())
    if handles:
        from trt_runtime.cache import RuntimeCache

        options.append(st.builds(RuntimeCache))
    return st.one_of(*options)


def runtime_settings(
    *,
    caches: st.SearchStrategy[Any] | None = None,
    capabilities: BackendCapabilities | None = None,
) -> st.SearchStrategy[RuntimeSettings]:
    """Valid :class:`~trt_runtime.RuntimeSettings`.

    ``caches`` draws the ``runtime_cache`` field (default :func:`cache_values`: ``None``,
    paths and handles). With ``capabilities``, only settings that backend accepts are
    drawn (a field whose capability is missing keeps its default).
    """
    caps = capabilities
    cuda = cuda_graph_strategies()
    dyn = dynamic_shapes_strategies()
    cache = cache_values() if caches is None else caches
    if caps is not None:
        if not caps.supports_cuda_graph_strategy:
            cuda = st.just(CudaGraphStrategy.DISABLED)
        if not caps.supports_dynamic_shapes_kernel_specialization_strategy:
            dyn = st.just(DynamicShapesKernelSpecializationStrategy.LAZY)
        if not caps.supports_runtime_cache:
            cache = st.none()
    return st.builds(
        RuntimeSettings,
        cuda_graph_strategy=cuda,
        dynamic_shapes_kernel_specialization_strategy=dyn,
        runtime_cache=cache,
    )


def _is_valid_enum_input(enum_cls: type[Any], value: Any) -> bool:
    try:
        enum_cls.parse(value, "probe")
    except ValueError:
        return False
    return True


def _invalid_for(enum_cls: type[Any], values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return values.filter(lambda value: not _is_valid_enum_input(enum_cls, value))


def invalid_settings_inputs() -> st.SearchStrategy[tuple[str, Any]]:
    """``(field, bad_value)`` pairs that ``RuntimeSettings(**{field: bad_value})`` must refuse
    with a ``ValueError`` naming the field."""
    junk = st.one_of(
        st.text(max_size=12),
        st.integers(min_value=-5, max_value=50),
        st.booleans(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.none(),
        st.binary(max_size=4),
        st.lists(st.integers(), max_size=2),
    )
    enum_cases = [st.tuples(st.just(field), _invalid_for(cls, junk)) for field, cls in _SETTING_ENUMS.items()]
    cache_junk = st.one_of(
        st.just(""),
        st.integers(),
        st.booleans(),
        st.floats(allow_nan=False),
        st.binary(min_size=1, max_size=4),
        st.lists(st.text(max_size=3), max_size=2),
        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    )
    return st.one_of(*enum_cases, st.tuples(st.just("runtime_cache"), cache_junk))


def cache_payloads(*, max_size: int = 256) -> st.SearchStrategy[bytes]:
    """Raw cache bytes as a file or stream would hold them (opaque to the core)."""
    return st.binary(min_size=0, max_size=max_size)


@dataclasses.dataclass(frozen=True)
class Operation:
    """One step of an operation sequence.

    ``kind`` is one of ``"set"`` (``arg``: settings), ``"enter_config"`` (``arg``: a dict
    of overrides), ``"enter_cudagraphs"`` (``arg``: a strategy), ``"exit"``,
    ``"execute"``, ``"invalidate"``.
    """

    kind: str
    arg: Any = None


OPERATION_KINDS = ("set", "enter_config", "enter_cudagraphs", "exit", "execute", "invalidate")


def operations(
    *,
    settings: st.SearchStrategy[RuntimeSettings] | None = None,
    min_size: int = 0,
    max_size: int = 25,
    kinds: Sequence[str] = OPERATION_KINDS,
) -> st.SearchStrategy[list[Operation]]:
    """Sequences of engine operations (an ``"exit"`` with no open block is a no-op to skip).

    The default ``settings`` carry no cache, so the sequences can be replayed on any
    engine without touching disk.
    """
    unknown = sorted(set(kinds) - set(OPERATION_KINDS))
    if unknown:
        raise ValueError(f"unknown operation kind(s) {unknown}; expected some of {list(OPERATION_KINDS)}")
    values = settings if settings is not None else runtime_settings(caches=st.none())
    overrides = st.fixed_dictionaries(
        {},
        optional={
            "cuda_graph_strategy": cuda_graph_strategies(spelled=True),
            "dynamic_shapes_kernel_specialization_strategy": dynamic_shapes_strategies(spelled=True),
        },
    )
    makers = {
        "set": values.map(lambda s: Operation("set", s)),
        "enter_config": overrides.map(lambda o: Operation("enter_config", o)),
        "enter_cudagraphs": cuda_graph_strategies().map(lambda s: Operation("enter_cudagraphs", s)),
        "exit": st.just(Operation("exit")),
        "execute": st.just(Operation("execute")),
        "invalidate": st.just(Operation("invalidate")),
    }
    return st.lists(st.one_of(*(makers[k] for k in kinds)), min_size=min_size, max_size=max_size)
