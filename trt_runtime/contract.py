"""The device contract of docs/device-contract.md, written once for every backend.

What an array given to an engine is (:class:`ArrayKind`), which kind a call is
(:class:`CallKind`) and so which kind its outputs are (:func:`output_kind`); shapes
and optimization profiles checked before any backend sees them (:class:`ShapeChecker`,
one set of messages); and the caller's stream turned into a ``cudaStream_t``
(:func:`stream_handle`) whatever object carries it. Backends import these; none keeps
its own copy.

Nothing here imports torch, numpy or a CUDA binding.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from trt_runtime.errors import EngineError, InputError
from trt_runtime.protocols import TensorSpec

__all__ = [
    "KIND_DEVICE",
    "KIND_HOST",
    "KIND_TORCH",
    "READ_DEVICE",
    "READ_HOST",
    "READ_TORCH_CUDA",
    "READ_TORCH_HOST",
    "ArrayKind",
    "CallKind",
    "ShapeChecker",
    "cuda_result",
    "device_address",
    "fmt_shape",
    "numel",
    "output_kind",
    "read_inputs",
    "require_outer_graph",
    "stream_handle",
]


class ArrayKind(str, enum.Enum):
    """The four kinds of arrays of the device contract (their values are the names the
    conformance kit parametrizes tests with)."""

    NUMPY = "numpy"  #: a host ``numpy.ndarray`` (or anything ``numpy.asarray`` takes)
    TORCH_CPU = "torch_cpu"  #: a ``torch.Tensor`` on the CPU
    TORCH_CUDA = "torch_cuda"  #: a ``torch.Tensor`` on a CUDA device
    CUDA_ARRAY = "cuda_array"  #: any other CUDA array (``__cuda_array_interface__`` / DLPack)

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:  # messages name a kind as the string the kit uses: 'torch_cpu'
        return repr(self.value)

    @property
    def on_host(self) -> bool:
        return self in (ArrayKind.NUMPY, ArrayKind.TORCH_CPU)


class CallKind(enum.IntEnum):
    """What a call is, from its inputs; it decides the kind of its outputs.

    ``TORCH``: any CUDA torch tensor among the inputs (outputs: CUDA torch tensors);
    ``DEVICE``: any other CUDA array and no CUDA torch tensor (outputs: device arrays);
    ``HOST``: host arrays only (outputs: host arrays; CPU torch tensors when any input
    was one, numpy arrays otherwise). Host inputs of any call are staged to the device.
    """

    TORCH = 0
    DEVICE = 1
    HOST = 2


# Module constants for hot paths: a global lookup, no attribute access on the enum class.
KIND_TORCH = CallKind.TORCH
KIND_DEVICE = CallKind.DEVICE
KIND_HOST = CallKind.HOST

_OUTPUT_ORDER = (ArrayKind.TORCH_CUDA, ArrayKind.CUDA_ARRAY, ArrayKind.TORCH_CPU)


def output_kind(kinds: Iterable[ArrayKind | str]) -> ArrayKind:
    """The kind of a call's outputs given the kinds of its inputs (the mixing rule):
    any CUDA torch tensor -> CUDA torch tensors; else any other CUDA array -> device
    arrays; else any CPU torch tensor -> CPU torch tensors; else numpy arrays."""
    found = {ArrayKind(k) for k in kinds}
    for kind in _OUTPUT_ORDER:
        if kind in found:
            return kind
    return ArrayKind.NUMPY


def call_kind(kinds: Iterable[ArrayKind | str]) -> CallKind:
    """The :class:`CallKind` of a call whose inputs have these kinds (the rule
    :func:`read_inputs` applies input by input)."""
    out = output_kind(kinds)
    if out is ArrayKind.TORCH_CUDA:
        return CallKind.TORCH
    return CallKind.DEVICE if out is ArrayKind.CUDA_ARRAY else CallKind.HOST


#: What a backend's ``read`` tells :func:`read_inputs` one input is (ints: the loop compares them).
READ_TORCH_CUDA = 0  #: a CUDA torch tensor
READ_DEVICE = 1  #: any other CUDA array
READ_HOST = 2  #: a host array that is not a torch tensor (numpy, a list, ...)
READ_TORCH_HOST = 3  #: a CPU torch tensor


def read_inputs(
    specs: Sequence[Any], inputs: Sequence[Any], read: Callable[[Any, Any], tuple[int, Any, Any]]
) -> tuple[CallKind, list[Any], tuple[Any, ...], list[int] | None, bool]:
    """The input-kind loop of every backend: each input checked by ``read``, the call's kind
    by the mixing rule (:func:`output_kind`).

    ``read(spec, x)`` checks one input against its ``spec`` (raising
    :class:`~trt_runtime.InputError`) and returns ``(what, value, shape)``: ``what`` one of
    ``READ_TORCH_CUDA``, ``READ_DEVICE``, ``READ_HOST``, ``READ_TORCH_HOST``; ``value`` what
    the backend runs with (a pointer, a tensor, a checked host array). The caller has
    checked the count. Returns ``(kind, values, shapes, host, torch_host)``: ``host`` the
    positions of host inputs (``None`` when there is none), ``torch_host`` whether one of
    them is a CPU torch tensor. On every call that is not a shortcut, so kept flat.
    """
    kind = KIND_HOST
    values: list[Any] = []
    shapes: list[Any] = []
    host: list[int] | None = None
    torch_host = False
    for spec, x in zip(specs, inputs, strict=False):
        what, value, shape = read(spec, x)
        if what == 0:  # READ_TORCH_CUDA (literals: no global lookup per input)
            kind = KIND_TORCH
        elif what == 1:  # READ_DEVICE
            if kind is KIND_HOST:
                kind = KIND_DEVICE
        else:
            if host is None:
                host = []
            host.append(len(values))
            if what == 3:  # READ_TORCH_HOST
                torch_host = True
        values.append(value)
        shapes.append(shape)
    return kind, values, tuple(shapes), host, torch_host


# -- shapes -------------------------------------------------------------------------------------


def fmt_shape(shape: Sequence[int]) -> str:
    """``(8, 256)``; ``(4,)`` for one dimension: how every message prints a shape."""
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class ShapeChecker:
    """Ranks, static dimensions and optimization profiles of one engine's inputs.

    :meth:`select` validates input shapes and returns the profile they run in; results
    are remembered per (shapes, requested profile), so a repeat costs one dict lookup.
    Dynamic inputs without profile ranges (a container that did not record them) are
    left to the engine.
    """

    __slots__ = ("_checked", "_dynamic", "_engine", "_inputs", "num_profiles")

    #: How many validated (shapes, profile) keys are remembered.
    REMEMBERED = 64

    def __init__(self, engine: str, inputs: Sequence[TensorSpec], num_profiles: int | None = None) -> None:
        self._engine = engine
        self._inputs = tuple(inputs)
        self._dynamic = [i for i, s in enumerate(self._inputs) if s.is_dynamic and s.profiles]
        if num_profiles is None:
            num_profiles = max((len(self._inputs[i].profiles) for i in self._dynamic), default=1)
        self.num_profiles = max(1, num_profiles)
        self._checked: dict[tuple[Any, int | None], int] = {}

    def check_profile_index(self, value: Any) -> int:
        """``value`` if it is a valid profile index; :class:`InputError` otherwise."""
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < self.num_profiles:
            raise InputError(
                f"engine {self._engine!r}: profile must be an int in 0..{self.num_profiles - 1}; "
                f"got {value!r}"
            )
        return value

    def select(self, shapes: tuple[Any, ...], profile: int | None = None) -> int:
        """Validate ``shapes`` (one per input, any sequence of ints) for ``profile``
        (``None``: the first profile holding every input); return the profile to use."""
        key = (shapes, profile)
        chosen = self._checked.get(key)
        if chosen is None:
            chosen = self._select(shapes, profile)
            if len(self._checked) >= self.REMEMBERED:
                self._checked.clear()
            self._checked[key] = chosen
        return chosen

    def _select(self, shapes: tuple[Any, ...], profile: int | None) -> int:
        engine = self._engine
        tuples = [tuple(int(d) for d in s) for s in shapes]
        for spec, shape in zip(self._inputs, tuples, strict=True):
            if len(shape) != len(spec.shape):
                raise InputError(
                    f"engine {engine!r}: input {spec.name!r} must have {len(spec.shape)} dimension(s) "
                    f"{fmt_shape(spec.shape)}; got shape {fmt_shape(shape)}"
                )
            if any(want >= 0 and want != got for want, got in zip(spec.shape, shape, strict=True)):
                raise InputError(
                    f"engine {engine!r}: input {spec.name!r} must have shape {fmt_shape(spec.shape)}; "
                    f"got {fmt_shape(shape)}"
                )
        if profile is not None:
            self.check_profile_index(profile)
        dynamic = [(self._inputs[i], tuples[i]) for i in self._dynamic]
        if not dynamic:
            return profile or 0
        if profile is not None:
            for spec, shape in dynamic:
                if not _in_profile(spec, shape, profile):
                    lo, _, hi = spec.profiles[profile]
                    raise InputError(
                        f"engine {engine!r}: input {spec.name!r} has shape {fmt_shape(shape)}, outside "
                        f"optimization profile {profile} (min {fmt_shape(lo)}, max {fmt_shape(hi)})"
                    )
            return profile
        for p in range(self.num_profiles):
            if all(_in_profile(spec, shape, p) for spec, shape in dynamic):
                return p
        profiles = range(self.num_profiles)
        nowhere = [(s, shape) for s, shape in dynamic if not any(_in_profile(s, shape, p) for p in profiles)]
        spec, shape = nowhere[0] if nowhere else dynamic[0]
        ranges = "; ".join(
            f"profile {p}: min {fmt_shape(lo)}, max {fmt_shape(hi)}"
            for p, (lo, _, hi) in enumerate(spec.profiles)
        )
        raise InputError(
            f"engine {engine!r}: input {spec.name!r} has shape {fmt_shape(shape)}, outside every "
            f"optimization profile (or no profile fits all inputs): {ranges}"
        )

    def check_count(self, count: int, what: str = "") -> None:
        """:class:`InputError` unless ``count`` matches the number of inputs."""
        if count != len(self._inputs):
            names = ", ".join(s.name for s in self._inputs)
            raise InputError(
                f"engine {self._engine!r} takes {len(self._inputs)} input(s) ({names}); "
                f"{what + ' ' if what else ''}got {count}{' shape(s)' if what else ''}"
            )


def _in_profile(spec: TensorSpec, shape: tuple[int, ...], profile: int) -> bool:
    profiles = spec.profiles
    if profile >= len(profiles):
        return False
    lo, _, hi = profiles[profile]
    return all(a <= d <= b for a, d, b in zip(lo, shape, hi, strict=False))


def require_outer_graph(engine: str, outer_graph: Any, what: str = "buffers") -> None:
    """The guard of ``static_inputs()``: :class:`EngineError` when no outer graph is set."""
    if outer_graph is None:
        raise EngineError(
            f"engine {engine!r}: static_inputs() needs the outer CUDA-graph wrap "
            "(engine.outer_graph, or trt_runtime.enable_cudagraphs(engine, outer=True)); "
            f"its {what} are dropped whenever the wrap changes"
        )


# -- streams ------------------------------------------------------------------------------------


def stream_handle(stream: Any) -> int:
    """The ``cudaStream_t`` of ``stream`` as an int.

    Accepts an int handle; any object with ``__cuda_stream__`` (an attribute or a method
    giving ``(version, handle)``: cuda.core ``Stream``, cupy, torch >= 2.6); a
    ``torch.cuda.Stream`` / ``ExternalStream`` (``cuda_stream``); a cupy stream (``ptr``);
    an object with an int ``handle``; a cuda-python ``CUstream`` / ``cudaStream_t``
    (``getPtr()``). Raises :class:`TypeError` naming what was given otherwise.
    """
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        value = proto() if callable(proto) else proto
        return int(value[1])
    for attr in ("cuda_stream", "handle", "ptr"):  # torch, cuda.core (older), cupy
        raw = getattr(stream, attr, None)
        if raw is not None and not callable(raw):
            return int(raw)
    get_ptr = getattr(stream, "getPtr", None)  # cuda.bindings CUstream / cudaStream_t
    if get_ptr is not None:
        return int(get_ptr())
    raise TypeError(
        "stream must be None, an int cudaStream_t, a cuda.core Stream, a torch.cuda.Stream, a cupy "
        f"Stream, a cuda-python CUstream or an object with __cuda_stream__; got {type(stream).__name__}"
    )


# -- cuda-python ------------------------------------------------------------------------------------
def cuda_result(result: Any, what: str) -> Any:
    """The value of a cuda-python call's ``result`` (``(error, value...)``): the value, a tuple of
    them for several, ``None`` for none; :class:`~trt_runtime.BackendError` naming ``what`` and the
    error (its name: ``cudaErrorMemoryAllocation``) when the call failed."""
    err = result[0]
    if int(err) != 0:
        from trt_runtime.errors import BackendError

        raise BackendError(f"{what} failed: {getattr(err, 'name', err)}")
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def device_address(array: Any) -> int:
    """Where the data of a CUDA array starts: a torch tensor's ``data_ptr()``, else its
    ``__cuda_array_interface__``."""
    data_ptr = getattr(array, "data_ptr", None)
    if data_ptr is not None and callable(data_ptr):
        return int(data_ptr())
    return int(array.__cuda_array_interface__["data"][0])
