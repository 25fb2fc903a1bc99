"""Running a batch of validated requests: group, concatenate, execute, split back.

Requests are grouped by :data:`~trt_runtime.serve.validation.Signature` (dtype and
non-batch shape of every input); each group is packed, in arrival order and without
splitting a request, into engine calls of at most ``max_rows`` rows; each call's
outputs are split back along the batch axis by the requests' row counts. A failure
of one call is the answer of the requests in that call only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from trt_runtime.errors import EngineError
from trt_runtime.serve.validation import RequestChecker

__all__ = ["BatchRunner", "unsplittable"]

#: One request's answer: its outputs, or the exception its engine call raised.
Answer = list[Any] | BaseException

#: How many answers each of a runner's caches keeps (a few dtypes and shapes, and up to the
#: profile's maximum batch of row counts, in practice).
_REMEMBERED = 1024


class BatchRunner:
    """Executes batches for one engine; ``execute(*arrays) -> list`` is the engine call.

    ``copy_outputs``: copy each request's slice (needed when the engine returns arrays it
    will overwrite, as the outer graph's ``"view"`` mode does). ``on_call(rows)`` is told
    the rows of every engine call (metrics). ``pad_rows``: pad each call's rows up to the next
    power of two (at most :meth:`max_rows`) with copies of the last row; their outputs are
    dropped. Not thread-safe: one batch at a time per runner.
    """

    def __init__(
        self,
        execute: Callable[..., list[Any]],
        checker: RequestChecker,
        *,
        row_limit: int | None = None,
        copy_outputs: bool = False,
        on_call: Callable[[int], None] | None = None,
        pad_rows: bool = False,
    ) -> None:
        self._execute = execute
        self._checker = checker
        self._row_limit = row_limit
        self._copy = copy_outputs
        self._on_call = on_call
        self._pad = pad_rows
        #: :meth:`max_rows` by a group's key and :meth:`RequestChecker.fits` by a batch's shapes:
        #: the same few answers every batch (each costs tens of µs to work out).
        self._limits: dict[Any, int] = {}
        self._fits: dict[tuple[Any, ...], bool] = {}

    def max_rows(self, arrays: Sequence[Any]) -> int:
        rows = self._checker.max_rows(self._checker.signature(arrays))
        return rows if self._row_limit is None else max(1, min(rows, self._row_limit))

    def run(self, requests: Sequence[tuple[Any, ...]]) -> list[Answer]:
        """One answer per request, in order."""
        answers: list[Answer] = [EngineError("request was not run")] * len(requests)
        if not self._checker.batchable:
            for i in range(len(requests)):
                self._run_chunk([i], requests, answers)
            return answers
        # Grouped by dtype objects and shape tuples as they are: the same grouping as
        # :meth:`RequestChecker.signature` (which spells the dtypes out, at about 2.5 µs a
        # request) at a tenth of the cost; the signature itself is made once per group.
        groups: dict[Any, list[int]] = {}
        for i, arrays in enumerate(requests):
            key = (arrays[0].dtype, arrays[0].shape[1:]) if len(arrays) == 1 else tuple(
                [(a.dtype, a.shape[1:]) for a in arrays])
            members = groups.get(key)
            if members is None:
                groups[key] = [i]
            else:
                members.append(i)
        for key, members in groups.items():
            limit = _remembered(self._limits, key, functools.partial(self.max_rows, requests[members[0]]))
            chunk: list[int] = []
            rows = 0
            for i in members:
                n = requests[i][0].shape[0]
                if chunk and rows + n > limit:
                    self._run_chunk(chunk, requests, answers, limit if self._pad else 0)
                    chunk, rows = [], 0
                chunk.append(i)
                rows += n
            if chunk:
                self._run_chunk(chunk, requests, answers, limit if self._pad else 0)
        return answers

    def _run_chunk(
        self, chunk: list[int], requests: Sequence[tuple[Any, ...]], answers: list[Answer], pad_to: int = 0
    ) -> None:
        """Run ``chunk`` (request indices) in one call; ``pad_to``: the most rows padding may reach."""
        import numpy as np

        rows = sum(requests[i][0].shape[0] for i in chunk) if pad_to else 0
        padded = min(1 << (rows - 1).bit_length(), pad_to) if rows else 0
        if len(chunk) == 1 and padded <= rows:
            answers[chunk[0]] = self._call(requests[chunk[0]])
            return
        last = requests[chunk[-1]]
        batch = tuple(
            np.concatenate([*(requests[i][k] for i in chunk), *_padding(last[k], padded - rows)])
            for k in range(len(last))
        )
        shapes = tuple([a.shape for a in batch])
        fits = _remembered(self._fits, shapes, functools.partial(self._checker.fits, batch))
        if not fits:  # profiles whose min batch > 1: run one by one
            for i in chunk:
                answers[i] = self._call(requests[i])
            return
        result = self._call(batch)
        if isinstance(result, BaseException):
            for i in chunk:
                answers[i] = result
            return
        total = batch[0].shape[0]
        error = unsplittable(result, total)
        if error is not None:
            for i in chunk:
                answers[i] = error
            return
        start = 0
        for i in chunk:
            stop = start + requests[i][0].shape[0]
            answers[i] = [o[start:stop] for o in result]
            start = stop

    def _call(self, arrays: tuple[Any, ...]) -> Answer:
        if self._on_call is not None:
            self._on_call(arrays[0].shape[0] if arrays and arrays[0].ndim else 1)
        try:
            outputs = list(self._execute(*arrays))
        except Exception as exc:
            return exc
        return [o.copy() for o in outputs] if self._copy else outputs


def unsplittable(outputs: Sequence[Any], rows: int) -> EngineError | None:
    """The error for a batched call's ``outputs`` that cannot be split back by request: one that
    does not have the call's ``rows`` first; ``None`` when all do."""
    bad = [o.shape for o in outputs if o.ndim == 0 or o.shape[0] != rows]
    if not bad:
        return None
    return EngineError(f"engine outputs {bad} do not have the batch's {rows} rows first; cannot split")


def _remembered(cache: dict[Any, Any], key: Any, work_out: Callable[[], Any]) -> Any:
    """``cache[key]``, worked out and kept the first time (the cache emptied when it holds
    :data:`_REMEMBERED` answers)."""
    value = cache.get(key)
    if value is None:
        if len(cache) >= _REMEMBERED:
            cache.clear()
        value = cache[key] = work_out()
    return value


def _padding(last: Any, count: int) -> list[Any]:
    """``count`` copies of ``last``'s last row, as one array to concatenate (none for 0). A real
    array: with a broadcast view (stride 0) among its inputs, ``numpy.concatenate`` lays its
    result out in another order than C (which engines refuse)."""
    import numpy as np

    return [np.repeat(last[-1:], count, axis=0)] if count > 0 else []
