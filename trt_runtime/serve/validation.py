"""Checking a request against the engine's input specs, before it is batched or run.

:class:`RequestChecker` turns what a client sent (arrays by position or by input name)
into a tuple of C-contiguous numpy arrays in the engine's input order, or raises
:class:`~trt_runtime.RequestError` (HTTP 422) naming the bad value. It also knows the
engine's batch axis: the leading dimension, when every input and output has a dynamic
leading dimension and no output is data dependent; :meth:`RequestChecker.max_rows`
says how many rows one engine call may take for a given request signature.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trt_runtime.errors import RequestError
from trt_runtime.protocols import TensorSpec

__all__ = ["RequestChecker", "Signature"]

#: What requests must share to run in one batch: per input, dtype and non-batch shape.
Signature = tuple[tuple[str, tuple[int, ...]], ...]
_ACCEPTED_MAX = 1024


class RequestChecker:
    """Validates requests for one engine (its inputs and outputs as :class:`TensorSpec`)."""

    def __init__(self, name: str, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> None:
        self.name = name
        self.inputs = tuple(inputs)
        self.names = [s.name for s in self.inputs]
        # (input index, dtype, shape) already found to fit: the same few come on every request
        self._accepted: set[tuple[int, Any, tuple[int, ...]]] = set()
        self.batchable = bool(self.inputs) and all(
            s.shape and s.shape[0] < 0 and s.profiles for s in self.inputs
        ) and all(o.shape and o.shape[0] < 0 and not o.data_dependent for o in outputs)

    # -- one request --------------------------------------------------------------------
    def check(self, args: Sequence[Any], named: Mapping[str, Any]) -> tuple[Any, ...]:
        """The request's arrays in input order; ``RequestError`` if they do not fit the engine."""
        import numpy as np

        if args and named:
            raise RequestError(
                f"engine {self.name!r}: pass inputs either by position or by name, not both; "
                f"got {len(args)} positional and {sorted(named)}"
            )
        if named:
            unknown = sorted(set(named) - set(self.names))
            missing = [n for n in self.names if n not in named]
            if unknown or missing:
                raise RequestError(
                    f"engine {self.name!r} takes inputs {self.names}; "
                    + (f"unknown {unknown}" if unknown else "")
                    + ("; " if unknown and missing else "")
                    + (f"missing {missing}" if missing else "")
                )
            values = [named[n] for n in self.names]
        else:
            if len(args) != len(self.inputs):
                raise RequestError(
                    f"engine {self.name!r} takes {len(self.inputs)} input(s) {self.names}; got {len(args)}"
                )
            values = list(args)
        arrays = []
        accepted = self._accepted
        checks = zip(self.inputs, self._dtypes(), values, strict=True)
        for index, (spec, expected, value) in enumerate(checks):
            if not isinstance(value, np.ndarray):
                where = f"input {spec.name!r} of engine {self.name!r}"
                raise RequestError(f"{where} must be a numpy array; got {type(value).__name__}")
            seen = (index, value.dtype, value.shape)
            if seen not in accepted:
                where = f"input {spec.name!r} of engine {self.name!r}"
                if (str(value.dtype) if isinstance(expected, str) else value.dtype) != expected:
                    raise RequestError(f"{where} must have dtype {spec.dtype}; got {value.dtype}")
                self._check_shape(spec, tuple(value.shape), where)
                if len(accepted) < _ACCEPTED_MAX:
                    accepted.add(seen)
            arrays.append(np.ascontiguousarray(value))
        if self.batchable and len({a.shape[0] for a in arrays}) > 1:
            rows = {s.name: a.shape[0] for s, a in zip(self.inputs, arrays, strict=True)}
            raise RequestError(f"engine {self.name!r}: inputs must have the same batch size; got {rows}")
        return tuple(arrays)

    def _dtypes(self) -> list[Any]:
        """Each input's numpy dtype (its name where numpy lacks it), made once: comparing
        dtype objects is cheaper than formatting names on every request."""
        dtypes: list[Any] | None = getattr(self, "_numpy_dtypes", None)
        if dtypes is None:
            from trt_runtime.dtypes import to_numpy

            dtypes = []
            for spec in self.inputs:
                try:
                    dtypes.append(to_numpy(spec.dtype))
                except (TypeError, ValueError):
                    dtypes.append(spec.dtype)
            self._numpy_dtypes = dtypes
        return dtypes

    def _check_shape(self, spec: TensorSpec, shape: tuple[int, ...], where: str) -> None:
        if len(shape) != len(spec.shape) or any(
            d >= 0 and d != s for d, s in zip(spec.shape, shape, strict=True)
        ):
            raise RequestError(f"{where} must have shape {list(spec.shape)} (-1: any); got {list(shape)}")
        if spec.profiles and not any(_fits(shape, lo, hi) for lo, _opt, hi in spec.profiles):
            ranges = "; ".join(f"{list(lo)}..{list(hi)}" for lo, _o, hi in spec.profiles)
            raise RequestError(
                f"{where} has shape {list(shape)}, outside every optimization profile ({ranges})"
            )

    # -- batches ------------------------------------------------------------------------
    def signature(self, arrays: Sequence[Any]) -> Signature:
        return tuple((str(a.dtype), tuple(a.shape[1:])) for a in arrays)

    def max_rows(self, signature: Signature) -> int:
        """Most rows one engine call may take for requests of ``signature`` (1 if not batchable)."""
        if not self.batchable:
            return 1
        best = 1
        for k in range(min(len(s.profiles) for s in self.inputs)):
            rest = [(s.profiles[k], dims) for s, (_dt, dims) in zip(self.inputs, signature, strict=True)]
            if all(_fits(dims, lo[1:], hi[1:]) for (lo, _o, hi), dims in rest):
                best = max(best, min(hi[0] for (_lo, _o, hi), _d in rest))
        return best

    def fits(self, arrays: Sequence[Any]) -> bool:
        """Whether a concatenated batch still lies inside one optimization profile."""
        count = min(len(s.profiles) for s in self.inputs)
        return any(
            all(_fits(tuple(a.shape), s.profiles[k][0], s.profiles[k][2])
                for s, a in zip(self.inputs, arrays, strict=True))
            for k in range(count)
        )

    def warmup_arrays(self) -> tuple[Any, ...]:
        """Zeros at each input's first-profile ``opt`` shape (its static shape without profiles)."""
        import numpy as np

        from trt_runtime.dtypes import to_numpy

        return tuple(
            np.zeros(s.profiles[0][1] if s.profiles else s.shape, dtype=to_numpy(s.dtype))
            for s in self.inputs
        )


def _fits(shape: Sequence[int], lo: Sequence[int], hi: Sequence[int]) -> bool:
    return len(shape) == len(lo) and all(a <= s <= b for a, s, b in zip(lo, shape, hi, strict=True))
