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
from typing import Any, Protocol

from trt_runtime.errors import EngineError, SettingsError
from trt_runtime.serve.validation import RequestChecker

__all__ = ["BatchRunner", "StagedCall", "Stager", "Started", "unsplittable"]

#: One request's answer: its outputs, or the exception its engine call raised.
Answer = list[Any] | BaseException

#: How many answers each of a runner's caches keeps (a few dtypes and shapes, and up to the
#: profile's maximum batch of row counts, in practice).
_REMEMBERED = 1024


class StagedCall(Protocol):
    """One call that a :class:`Stager` starts and the caller collects later."""

    #: Host buffers of the call's rows, one per input, for the caller to fill before :meth:`launch`.
    inputs: list[Any]

    def launch(self) -> None:
        """Start the call with what :attr:`inputs` hold; returns without waiting for it."""

    def done(self) -> bool:
        """Whether the call has ended (raises the error it ended with)."""

    def outputs(self) -> list[Any]:
        """Its outputs, once :meth:`done`: arrays valid until :meth:`release`."""

    def release(self) -> None:
        """Hand its buffers back to the stager."""


class Stager(Protocol):
    """Starts engine calls without waiting for them (an engine process's overlapped calls:
    :class:`~trt_runtime.serve.local.staging.CudaStager`)."""

    #: The most rows one call takes.
    max_rows: int

    def call(self, rows: int) -> StagedCall:
        """A call of ``rows`` rows, its :attr:`StagedCall.inputs` to fill."""


class BatchRunner:
    """Executes batches for one engine; ``execute(*arrays) -> list`` is the engine call.

    ``copy_outputs``: copy each request's slice (needed when the engine returns arrays it
    will overwrite, as the outer graph's ``"view"`` mode does). ``on_call(rows)`` is told
    the rows of every engine call (metrics). ``pad_rows``: pad each call's rows up to the next
    power of two (at most :meth:`max_rows`) with copies of the last row; their outputs are
    dropped. ``stager``: :meth:`start` only starts the calls that it takes (rows gathered into its
    buffers), to be collected later (:class:`Started`); it needs ``pad_rows`` (a stager keeps a
    graph and static buffers per row count, a few when they are powers of two:
    :func:`~trt_runtime.serve.local.staging.stager_refusal`). Not thread-safe: one batch at a time
    per runner (with a stager: one thread).
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
        stager: Stager | None = None,
    ) -> None:
        if stager is not None and not pad_rows:
            raise SettingsError("a BatchRunner with a stager needs pad_rows=True (the stager keeps a graph "
                                "and static buffers for each row count a call has)")
        self._execute = execute
        self._stager = stager
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
        """One answer per request, in order (a runner without a stager: with one, :meth:`start`)."""
        if self._stager is not None:
            raise SettingsError("BatchRunner.run waits for its calls; a runner with a stager starts them "
                                "(start) and its caller collects them")
        return self.start(requests).answers

    def start(self, requests: Sequence[tuple[Any, ...]]) -> Started:
        """Run ``requests``: with a stager, the calls that it takes are only started (see
        :class:`Started`); every other call has run when this returns."""
        started = Started([EngineError("request was not run")] * len(requests))
        if not self._checker.batchable:
            for i in range(len(requests)):
                self._run_chunk([i], requests, started)
            return started
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
                    self._run_chunk(chunk, requests, started, limit if self._pad else 0)
                    chunk, rows = [], 0
                chunk.append(i)
                rows += n
            if chunk:
                self._run_chunk(chunk, requests, started, limit if self._pad else 0)
        return started

    def _run_chunk(
        self, chunk: list[int], requests: Sequence[tuple[Any, ...]], started: Started, pad_to: int = 0
    ) -> None:
        """Run ``chunk`` (request indices) in one call; ``pad_to``: the most rows padding may reach."""
        import numpy as np

        answers = started.answers
        rows = sum(requests[i][0].shape[0] for i in chunk) if pad_to else 0
        padded = min(1 << (rows - 1).bit_length(), pad_to) if rows else 0
        stager = self._stager
        if stager is not None and rows and self._stage(chunk, requests, started, rows, max(rows, padded)):
            return
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
        error = unsplittable(result, batch[0].shape[0])
        if error is not None:
            for i in chunk:
                answers[i] = error
            return
        _split(result, chunk, [requests[i][0].shape[0] for i in chunk], answers)

    def _stage(self, chunk: list[int], requests: Sequence[tuple[Any, ...]], started: Started, rows: int,
               padded: int) -> bool:
        """Start ``chunk``'s call of ``rows`` rows (``padded`` with padding) through the stager: its
        rows gathered into the call's host buffers. ``False``: the stager does not take it (too many
        rows, or rows outside every profile), and nothing was started."""
        import numpy as np

        stager = self._stager
        assert stager is not None
        if padded > stager.max_rows:
            return False
        call = stager.call(padded)
        buffers = call.inputs
        if not _remembered(self._fits, tuple([b.shape for b in buffers]),
                           functools.partial(self._checker.fits, buffers)):
            call.release()
            return False
        try:
            for k, buffer in enumerate(buffers):
                parts = [requests[i][k] for i in chunk]
                if len(parts) == 1:
                    buffer[:rows] = parts[0]
                else:
                    np.concatenate(parts, out=buffer[:rows])
                if padded > rows:
                    buffer[rows:] = parts[-1][-1:]
            if self._on_call is not None:
                self._on_call(padded)
            call.launch()
        except Exception as exc:  # (copies queued before the failure feed no call: the buffers can go back)
            call.release()
            for i in chunk:
                started.answers[i] = exc
            return True
        started.calls.append(_Launched(call, chunk, [requests[i][0].shape[0] for i in chunk], padded))
        return True

    def _call(self, arrays: tuple[Any, ...]) -> Answer:
        if self._on_call is not None:
            self._on_call(arrays[0].shape[0] if arrays and arrays[0].ndim else 1)
        try:
            outputs = list(self._execute(*arrays))
        except Exception as exc:
            return exc
        return [o.copy() for o in outputs] if self._copy else outputs


class Started:
    """A batch that :meth:`BatchRunner.start` ran or started: :attr:`answers` (one per request, in
    order) holds those of every call that has run; :attr:`calls` the stager's calls still to collect.
    Once :meth:`done`, :meth:`finish` splits their outputs into the answers; :meth:`release` then
    hands their buffers back."""

    __slots__ = ("answers", "calls")

    def __init__(self, answers: list[Answer]) -> None:
        self.answers = answers
        self.calls: list[_Launched] = []

    def done(self) -> bool:
        """Whether every started call has ended (a call that failed on the GPU has ended too)."""
        for launched in self.calls:
            if launched.error is None:
                try:
                    if not launched.call.done():
                        return False
                except Exception as exc:
                    launched.error = exc
        return True

    def finish(self) -> list[Answer]:
        """The answers, each call's outputs split back by request: views of the call's host buffers,
        valid until :meth:`release`. Call it once :meth:`done`."""
        answers = self.answers
        for launched in self.calls:
            if launched.error is not None:
                for i in launched.chunk:
                    answers[i] = launched.error
                continue
            _split(launched.call.outputs(), launched.chunk, launched.counts, answers)
        return answers

    def release(self) -> None:
        """Hand every call's buffers back (once it has ended, or once nothing will read them)."""
        for launched in self.calls:
            launched.call.release()
        self.calls = []


class _Launched:
    """One started call: the requests (indices) it holds, their row counts, its rows, and its error
    once known."""

    __slots__ = ("call", "chunk", "counts", "error", "rows")

    def __init__(self, call: StagedCall, chunk: list[int], counts: list[int], rows: int) -> None:
        self.call = call
        self.chunk = chunk
        self.counts = counts
        self.rows = rows  # the call's rows, padding included
        self.error: BaseException | None = None


def _split(outputs: Sequence[Any], chunk: list[int], counts: Sequence[int], answers: list[Answer]) -> None:
    """Each request of ``chunk`` its ``counts`` rows of ``outputs``, in order."""
    start = 0
    for i, n in zip(chunk, counts, strict=True):
        stop = start + n
        answers[i] = [o[start:stop] for o in outputs]
        start = stop


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
